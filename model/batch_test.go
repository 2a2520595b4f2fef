package model

import (
	"reflect"
	"strings"
	"testing"
)

// validBatch is two sequences with block size 4 over 10 blocks: a 6-token
// prefill (positions 0..5) and a decode at position 9 of a 10-token context.
func validBatch() *Batch {
	return &Batch{
		Tokens:      []int32{5, 6, 7, 8, 9, 10, 11},
		Positions:   []int32{0, 1, 2, 3, 4, 5, 9},
		SlotMapping: []int32{3*4 + 0, 3*4 + 1, 3*4 + 2, 3*4 + 3, 7*4 + 0, 7*4 + 1, 2*4 + 1},
		QueryStart:  []int32{0, 6, 7},
		SeqLens:     []int32{6, 10},
		BlockTables: [][]int32{{3, 7}, {9, 1, 2}},
		LogitsRows:  []int32{5, 6},
	}
}

func TestBatchValidate(t *testing.T) {
	if err := validBatch().Validate(4, 10); err != nil {
		t.Fatalf("valid batch: %v", err)
	}
	tests := []struct {
		name    string
		mutate  func(b *Batch)
		wantErr string
	}{
		{"empty", func(b *Batch) { *b = Batch{} }, "empty"},
		{"positions length", func(b *Batch) { b.Positions = b.Positions[:6] }, "positions"},
		{"query starts length", func(b *Batch) { b.QueryStart = []int32{0, 7} }, "query starts"},
		{"query starts do not cover tokens", func(b *Batch) { b.QueryStart[2] = 6 }, "want 0 to 7"},
		{"sequence without tokens", func(b *Batch) { b.QueryStart = []int32{0, 0, 7}; b.SeqLens = []int32{6, 10} }, "no tokens"},
		{"context shorter than query", func(b *Batch) { b.SeqLens[0] = 5 }, "context of 5"},
		{"block table too short", func(b *Batch) { b.BlockTables[1] = []int32{9, 1} }, "needs 3 blocks"},
		{"block outside pool", func(b *Batch) { b.BlockTables[0][1] = 10 }, "outside the pool"},
		{"negative block", func(b *Batch) { b.BlockTables[0][0] = -1 }, "outside the pool"},
		{"wrong position", func(b *Batch) { b.Positions[6] = 8 }, "want 9"},
		{"slot disagrees with table", func(b *Batch) { b.SlotMapping[4] = 7*4 + 1 }, "block table says 28"},
		{"logits row out of range", func(b *Batch) { b.LogitsRows[1] = 7 }, "outside 7 tokens"},
		{"negative token", func(b *Batch) { b.Tokens[2] = -3 }, "negative id"},
		{"block tables count", func(b *Batch) { b.BlockTables = b.BlockTables[:1] }, "block tables"},
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

func TestBatchHelpers(t *testing.T) {
	b := validBatch()
	if b.NumTokens() != 7 || b.NumSeqs() != 2 || b.MaxSeqLen() != 10 {
		t.Fatalf("counts: %d tokens, %d seqs, max len %d", b.NumTokens(), b.NumSeqs(), b.MaxSeqLen())
	}
	flat, width := b.DenseBlockTables()
	if want := []int32{3, 7, 0, 9, 1, 2}; width != 3 || !reflect.DeepEqual(flat, want) {
		t.Fatalf("dense tables %v width %d, want %v width 3", flat, width, want)
	}
}
