package cuda

import "fmt"

// CheckAttention reports whether this backend's kernels take a model
// whose attention has these shapes, so that a model they cannot run is
// refused when it loads instead of failing every step. engine.Load calls
// it before it uploads the weights.
func (b *Backend) CheckAttention(numHeads, numKVHeads, headDim int) error {
	return checkAttention(numHeads, numKVHeads, headDim)
}

// checkAttention holds the shape limits that Attention and RoPEStoreKV
// check on every call: the attention kernels take the head dims of
// attnHeadDims and at most 65535 query heads, rope_store_kv rotates pairs
// of an even head dim up to 1024 (and its grid takes at most 4*65535
// query and KV heads), and both map query heads to KV heads in groups.
// (The fused QKV path wants a head dim that is a multiple of 16, but
// declines other shapes and the model falls back, so it sets no limit.)
func checkAttention(numHeads, numKVHeads, headDim int) error {
	switch {
	case numHeads <= 0 || numKVHeads <= 0 || numHeads%numKVHeads != 0:
		return fmt.Errorf("cuda: %d query heads and %d KV heads: want positive counts, the query heads a multiple of the KV heads", numHeads, numKVHeads)
	case numHeads > 65535 || numHeads+numKVHeads > 4*65535:
		return fmt.Errorf("cuda: %d query heads: the attention kernels take at most 65535", numHeads)
	case !attnHeadDims[headDim] || headDim%2 != 0 || headDim > 1024:
		return fmt.Errorf("cuda: head dim %d: the attention kernels take head dims 16, 32, 64, 128 and 256", headDim)
	}
	return nil
}
