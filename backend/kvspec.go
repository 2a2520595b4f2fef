package backend

import (
	"fmt"
	"slices"
)

// KVSpec is the format of a paged KV cache: what every op that writes or
// reads the cache must agree on beyond the pools' shapes. The runner owns
// it (it allocates the pools from it) and hands it, with the pools, to
// the model, which passes it to RoPEStoreKV and Attention.
//
// The model's shape (KV heads, head dim) is not part of the format. In
// layout KVHeadMajor, per layer a K pool and a V pool of
//
//	[numBlocks][numKVHeads][BlockSize][headDim] DType
//
// so one head's slice of a block is contiguous (BlockSize*headDim
// elements). Token position p of a sequence lives at offset p%BlockSize
// of block table[p/BlockSize].
//
// Scales and Window describe quantized formats: where per-block scales
// live and how many of a sequence's newest tokens stay in full precision.
// Every format that exists today is unquantized: KVNoScales, Window 0.
type KVSpec struct {
	DType     DType
	BlockSize int
	Layout    KVLayout
	Scales    KVScales
	Window    int
}

// KVLayout is the order of a pool's dimensions.
type KVLayout uint8

const (
	// KVHeadMajor is [numBlocks][numKVHeads][blockSize][headDim].
	KVHeadMajor KVLayout = iota + 1
)

// KVScales says where a quantized cache keeps its scales.
type KVScales uint8

const (
	// KVNoScales: the pools hold the values themselves.
	KVNoScales KVScales = iota + 1
)

// KVDTypes are the pool dtypes a KVSpec may name.
var kvDTypes = []DType{F32, F16, BF16}

// Validate reports a spec no backend can take: a dtype that is not a
// KV dtype, non-positive sizes, an unknown layout, scales or a window
// that no format uses yet.
func (s KVSpec) Validate() error {
	if !slices.Contains(kvDTypes, s.DType) {
		return fmt.Errorf("kv spec: dtype %v, want one of %v", s.DType, kvDTypes)
	}
	if s.BlockSize <= 0 {
		return fmt.Errorf("kv spec: block size %d is not positive", s.BlockSize)
	}
	if s.Layout != KVHeadMajor {
		return fmt.Errorf("kv spec: layout %d, want head-major (%d)", s.Layout, KVHeadMajor)
	}
	if s.Scales != KVNoScales || s.Window != 0 {
		return fmt.Errorf("kv spec: scales %d and a full-precision window of %d tokens: no %v format has either", s.Scales, s.Window, s.DType)
	}
	return nil
}

// PlainKV is the spec of an unquantized head-major cache.
func PlainKV(dt DType, blockSize int) KVSpec {
	return KVSpec{DType: dt, BlockSize: blockSize, Layout: KVHeadMajor, Scales: KVNoScales}
}

// PoolShape is the shape of one K or V pool of numBlocks blocks for a
// model with numKVHeads heads of headDim.
func (s KVSpec) PoolShape(numBlocks, numKVHeads, headDim int) []int {
	return []int{numBlocks, numKVHeads, s.BlockSize, headDim}
}

// BlockBytes is the size of one block of one pool (K or V) of one layer.
func (s KVSpec) BlockBytes(numKVHeads, headDim int) int {
	n, err := s.DType.Bytes(s.PoolShape(1, numKVHeads, headDim))
	if err != nil {
		return 0
	}
	return n
}

func (s KVSpec) String() string {
	return fmt.Sprintf("%v head-major, %d-token blocks", s.DType, s.BlockSize)
}

// CheckPools reports (ShapeError, under op) pools k and v that do not
// have the spec's dtype and layout for numKVHeads heads of headDim, or a
// spec that is not valid. It returns the pools' block count.
func (s KVSpec) CheckPools(op string, k, v Tensor, numKVHeads, headDim int) (numBlocks int, err error) {
	if err := s.Validate(); err != nil {
		return 0, ShapeError(op, "KV", "%v", err)
	}
	for _, p := range []struct {
		name string
		t    Tensor
	}{{"KCache", k}, {"VCache", v}} {
		if p.t == nil {
			return 0, ShapeError(op, p.name, "nil tensor")
		}
		if p.t.DType() != s.DType {
			return 0, ShapeError(op, p.name, "dtype %v, the KV spec says %v", p.t.DType(), s.DType)
		}
		sh := p.t.Shape()
		if want := s.PoolShape(0, numKVHeads, headDim); len(sh) != 4 || sh[0] <= 0 || !slices.Equal(sh[1:], want[1:]) {
			return 0, ShapeError(op, p.name, "shape %v, want [numBlocks %d %d %d] (%v)", sh, want[1], want[2], want[3], s)
		}
	}
	if !slices.Equal(k.Shape(), v.Shape()) {
		return 0, ShapeError(op, "VCache", "shape %v differs from KCache's %v", v.Shape(), k.Shape())
	}
	return k.Shape()[0], nil
}
