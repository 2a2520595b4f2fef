package llama

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// hostBatch is the host image of a model.DeviceBatch (see its layout) that
// the harness builds for each step; Validate checks the harness's own
// bookkeeping before the model sees the batch.
type hostBatch struct {
	Tokens      []int32   // [numTokens]
	Positions   []int32   // [numTokens]
	SlotMapping []int32   // [numTokens]
	QueryStart  []int32   // [numSeqs+1], QueryStart[0] = 0, QueryStart[numSeqs] = numTokens
	SeqLens     []int32   // [numSeqs]
	BlockTables [][]int32 // [numSeqs][>= ceil(SeqLens[s]/blockSize)]
	LogitsRows  []int32   // [numLogits] token rows whose logits are wanted
}

// NumTokens is the number of token rows.
func (b *hostBatch) NumTokens() int { return len(b.Tokens) }

// NumSeqs is the number of sequences.
func (b *hostBatch) NumSeqs() int { return len(b.SeqLens) }

// MaxSeqLen is the longest context in the batch (0 for an empty batch).
func (b *hostBatch) MaxSeqLen() int {
	m := 0
	for _, l := range b.SeqLens {
		m = max(m, int(l))
	}
	return m
}

// Validate checks that the batch is self-consistent for a KV pool of
// numBlocks blocks of blockSize tokens: every index in range, positions
// matching the sequence lengths, and every slot agreeing with its block
// table. A batch that passes cannot make a kernel read or write out of
// bounds, so runners validate in tests and debug builds.
func (b *hostBatch) Validate(blockSize, numBlocks int) error {
	if blockSize <= 0 || numBlocks <= 0 {
		return fmt.Errorf("batch: block size %d and block count %d must be positive", blockSize, numBlocks)
	}
	nt, ns := len(b.Tokens), len(b.SeqLens)
	if nt == 0 || ns == 0 {
		return fmt.Errorf("batch: empty (%d tokens, %d sequences)", nt, ns)
	}
	if len(b.Positions) != nt || len(b.SlotMapping) != nt {
		return fmt.Errorf("batch: %d tokens but %d positions and %d slots", nt, len(b.Positions), len(b.SlotMapping))
	}
	if len(b.QueryStart) != ns+1 || len(b.BlockTables) != ns {
		return fmt.Errorf("batch: %d sequences but %d query starts (want %d) and %d block tables",
			ns, len(b.QueryStart), ns+1, len(b.BlockTables))
	}
	if b.QueryStart[0] != 0 || int(b.QueryStart[ns]) != nt {
		return fmt.Errorf("batch: query starts run from %d to %d, want 0 to %d", b.QueryStart[0], b.QueryStart[ns], nt)
	}
	for s := range ns {
		lo, hi := int(b.QueryStart[s]), int(b.QueryStart[s+1])
		if hi <= lo {
			return fmt.Errorf("batch: sequence %d has no tokens (query rows %d..%d)", s, lo, hi)
		}
		qLen, seqLen := hi-lo, int(b.SeqLens[s])
		if seqLen < qLen {
			return fmt.Errorf("batch: sequence %d has %d query tokens but a context of %d", s, qLen, seqLen)
		}
		table := b.BlockTables[s]
		need := (seqLen + blockSize - 1) / blockSize
		if len(table) < need {
			return fmt.Errorf("batch: sequence %d of %d tokens needs %d blocks, its table has %d", s, seqLen, need, len(table))
		}
		for i, blk := range table[:need] {
			if blk < 0 || int(blk) >= numBlocks {
				return fmt.Errorf("batch: sequence %d block %d is %d, outside the pool of %d", s, i, blk, numBlocks)
			}
		}
		for r := lo; r < hi; r++ {
			pos := seqLen - qLen + (r - lo)
			if int(b.Positions[r]) != pos {
				return fmt.Errorf("batch: row %d of sequence %d has position %d, want %d", r, s, b.Positions[r], pos)
			}
			slot := b.SlotMapping[r]
			if slot < 0 {
				continue
			}
			want := int(table[pos/blockSize])*blockSize + pos%blockSize
			if int(slot) != want {
				return fmt.Errorf("batch: row %d (sequence %d, position %d) has slot %d, its block table says %d", r, s, pos, slot, want)
			}
		}
	}
	for i, r := range b.LogitsRows {
		if r < 0 || int(r) >= nt {
			return fmt.Errorf("batch: logits row %d is %d, outside %d tokens", i, r, nt)
		}
	}
	for i, t := range b.Tokens {
		if t < 0 {
			return fmt.Errorf("batch: token %d has negative id %d", i, t)
		}
	}
	return nil
}

// DenseBlockTables packs BlockTables into the [numSeqs, width] row-major
// layout the attention kernels read, padding short tables with block 0 (the
// null block). width is the longest table's length (at least 1).
func (b *hostBatch) DenseBlockTables() (flat []int32, width int) {
	width = 1
	for _, t := range b.BlockTables {
		width = max(width, len(t))
	}
	flat = make([]int32, len(b.BlockTables)*width)
	for s, t := range b.BlockTables {
		copy(flat[s*width:], t)
	}
	return flat, width
}

// validBatch is two sequences with block size 4 over 10 blocks: a 6-token
// prefill (positions 0..5) and a decode at position 9 of a 10-token context.
func validBatch() *hostBatch {
	return &hostBatch{
		Tokens:      []int32{5, 6, 7, 8, 9, 10, 11},
		Positions:   []int32{0, 1, 2, 3, 4, 5, 9},
		SlotMapping: []int32{3*4 + 0, 3*4 + 1, 3*4 + 2, 3*4 + 3, 7*4 + 0, 7*4 + 1, 2*4 + 1},
		QueryStart:  []int32{0, 6, 7},
		SeqLens:     []int32{6, 10},
		BlockTables: [][]int32{{3, 7}, {9, 1, 2}},
		LogitsRows:  []int32{5, 6},
	}
}

func TestHostBatchValidate(t *testing.T) {
	if err := validBatch().Validate(4, 10); err != nil {
		t.Fatalf("valid batch: %v", err)
	}
	tests := []struct {
		name    string
		mutate  func(b *hostBatch)
		wantErr string
	}{
		{"empty", func(b *hostBatch) { *b = hostBatch{} }, "empty"},
		{"positions length", func(b *hostBatch) { b.Positions = b.Positions[:6] }, "positions"},
		{"query starts length", func(b *hostBatch) { b.QueryStart = []int32{0, 7} }, "query starts"},
		{"query starts do not cover tokens", func(b *hostBatch) { b.QueryStart[2] = 6 }, "want 0 to 7"},
		{"sequence without tokens", func(b *hostBatch) { b.QueryStart = []int32{0, 0, 7}; b.SeqLens = []int32{6, 10} }, "no tokens"},
		{"context shorter than query", func(b *hostBatch) { b.SeqLens[0] = 5 }, "context of 5"},
		{"block table too short", func(b *hostBatch) { b.BlockTables[1] = []int32{9, 1} }, "needs 3 blocks"},
		{"block outside pool", func(b *hostBatch) { b.BlockTables[0][1] = 10 }, "outside the pool"},
		{"negative block", func(b *hostBatch) { b.BlockTables[0][0] = -1 }, "outside the pool"},
		{"wrong position", func(b *hostBatch) { b.Positions[6] = 8 }, "want 9"},
		{"slot disagrees with table", func(b *hostBatch) { b.SlotMapping[4] = 7*4 + 1 }, "block table says 28"},
		{"logits row out of range", func(b *hostBatch) { b.LogitsRows[1] = 7 }, "outside 7 tokens"},
		{"negative token", func(b *hostBatch) { b.Tokens[2] = -3 }, "negative id"},
		{"block tables count", func(b *hostBatch) { b.BlockTables = b.BlockTables[:1] }, "block tables"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := validBatch()
			tc.mutate(b)
			err := b.Validate(4, 10)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("got %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
	t.Run("padding slot is allowed", func(t *testing.T) {
		b := validBatch()
		b.SlotMapping[3] = -1
		if err := b.Validate(4, 10); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("bad pool", func(t *testing.T) {
		if err := validBatch().Validate(0, 10); err == nil {
			t.Fatal("no error for block size 0")
		}
	})
}

func TestHostBatchHelpers(t *testing.T) {
	b := validBatch()
	if b.NumTokens() != 7 || b.NumSeqs() != 2 || b.MaxSeqLen() != 10 {
		t.Fatalf("counts: %d tokens, %d seqs, max len %d", b.NumTokens(), b.NumSeqs(), b.MaxSeqLen())
	}
	flat, width := b.DenseBlockTables()
	if want := []int32{3, 7, 0, 9, 1, 2}; width != 3 || !reflect.DeepEqual(flat, want) {
		t.Fatalf("dense tables %v width %d, want %v width 3", flat, width, want)
	}
}
