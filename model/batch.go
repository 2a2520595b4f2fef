package model

import (
	"fmt"

	"github.com/trigon-llm/trigon/backend"
)

// Batch is one engine step on the host: the tokens of several sequences
// (prefill chunks and single-token decodes mixed), where each token sits and
// where its K/V go. The runner fills it from the scheduler's plan and copies
// it into a DeviceBatch.
//
// Sequence s owns token rows [QueryStart[s], QueryStart[s+1]). Its context
// after this step is SeqLens[s] tokens, this step's included, so its rows
// sit at positions SeqLens[s]-qLen .. SeqLens[s]-1. Position p of sequence s
// lives at offset p%blockSize of block BlockTables[s][p/blockSize]; the row's
// SlotMapping entry is that block*blockSize + offset (negative: a padding
// row whose K/V are not written).
type Batch struct {
	Tokens      []int32   // [numTokens]
	Positions   []int32   // [numTokens]
	SlotMapping []int32   // [numTokens]
	QueryStart  []int32   // [numSeqs+1], QueryStart[0] = 0, QueryStart[numSeqs] = numTokens
	SeqLens     []int32   // [numSeqs]
	BlockTables [][]int32 // [numSeqs][>= ceil(SeqLens[s]/blockSize)]
	LogitsRows  []int32   // [numLogits] token rows whose logits are wanted
}

// NumTokens is the number of token rows.
func (b *Batch) NumTokens() int { return len(b.Tokens) }

// NumSeqs is the number of sequences.
func (b *Batch) NumSeqs() int { return len(b.SeqLens) }

// MaxSeqLen is the longest context in the batch (0 for an empty batch).
func (b *Batch) MaxSeqLen() int {
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
func (b *Batch) Validate(blockSize, numBlocks int) error {
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
func (b *Batch) DenseBlockTables() (flat []int32, width int) {
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

// DeviceBatch is a Batch in device memory, the input of a forward pass.
// All tensors are I32.
type DeviceBatch struct {
	Tokens      backend.Tensor // [NumTokens]
	Positions   backend.Tensor // [NumTokens]
	SlotMapping backend.Tensor // [NumTokens]
	QueryStart  backend.Tensor // [NumSeqs+1]
	SeqLens     backend.Tensor // [NumSeqs]
	BlockTables backend.Tensor // [NumSeqs, maxBlocksPerSeq]
	LogitsRows  backend.Tensor // [NumLogits]
	// LogitsAll says LogitsRows is 0, 1, ..., NumTokens-1 (every row, in
	// order: a decode step), so the model may take the rows as they are
	// instead of gathering them. False is always correct.
	LogitsAll   bool
	NumTokens   int
	NumSeqs     int
	NumLogits   int
	MaxSeqLen   int // upper bound of SeqLens, for kernel tiling
	MaxQueryLen int // most query rows of one sequence (1: decode only; 0: unknown)
}

// LayerKV is one layer's paged KV cache. Block b's slice for KV head h is
// contiguous: [blockSize, headDim] at K[b][h].
type LayerKV struct {
	K backend.Tensor // [numBlocks, numKVHeads, blockSize, headDim]
	V backend.Tensor // [numBlocks, numKVHeads, blockSize, headDim]
}
