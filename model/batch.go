package model

import "github.com/trigon-llm/trigon/backend"

// DeviceBatch is one engine step in device memory, the input of a forward
// pass: the tokens of several sequences (prefill chunks and single-token
// decodes mixed), where each token sits and where its K/V go. The runner
// fills it from the scheduler's plan. All tensors are I32.
//
// Sequence s owns token rows [QueryStart[s], QueryStart[s+1]). Its context
// after this step is SeqLens[s] tokens, this step's included, so its rows
// sit at positions SeqLens[s]-qLen .. SeqLens[s]-1. Position p of sequence s
// lives at offset p%blockSize of block BlockTables[s][p/blockSize]; the
// row's SlotMapping entry is that block*blockSize + offset (negative: a
// padding row whose K/V are not written).
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
	// StepKeys is the attention's StepKeys (backend.AttentionArgs): how
	// many of each sequence's last positions this step writes, where that
	// is more than its own rows (a verify step run as decode rows); 0
	// otherwise.
	StepKeys int
}

// LayerKV is one layer's paged KV cache: its pools and their format,
// which the runner owns and the model hands to every op that writes or
// reads the cache.
type LayerKV struct {
	K    backend.Tensor // [numBlocks, numKVHeads, blockSize, headDim]
	V    backend.Tensor // [numBlocks, numKVHeads, blockSize, headDim]
	Spec backend.KVSpec
	Aux  backend.KVAux // scales and window of a quantized Spec
}

// KVScales are one layer's FP8 KV cache scales from a checkpoint (the
// k_scale and v_scale tensors): one value for the layer, or one per KV
// head.
type KVScales struct {
	K, V []float32
}
