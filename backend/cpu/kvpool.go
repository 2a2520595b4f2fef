package cpu

import "github.com/trigon-llm/trigon/backend"

// kvPool reads and writes one layer's K or V pool in the format its
// backend.KVSpec names; RoPEStoreKV and Attention go through it, so the
// layout and the element encoding are written once.
//
//	head-major: element (block, head, offset, i) at ((block*heads+head)*blockSize+offset)*headDim+i
type kvPool struct {
	t                      *tensor
	dt                     backend.DType
	heads, blockSize, dims int
	el                     int // bytes per element
}

// newKVPool wraps t, already checked against spec (backend.KVSpec.CheckPools)
// for heads KV heads of dims each.
func newKVPool(t *tensor, spec backend.KVSpec, heads, dims int) kvPool {
	return kvPool{t: t, dt: spec.DType, heads: heads, blockSize: spec.BlockSize, dims: dims, el: spec.DType.BlockBytes()}
}

// row is the bytes of token offset off of block blk's head head.
func (p kvPool) row(blk, head, off int) []byte {
	base := ((blk*p.heads+head)*p.blockSize + off) * p.dims * p.el
	return p.t.data[base : base+p.dims*p.el]
}

// store writes v ([dims]) as token slot's row of head head.
func (p kvPool) store(slot, head int, v []float32) {
	fromFloat32(p.dt, v, p.row(slot/p.blockSize, head, slot%p.blockSize))
}

// load reads position pos of a sequence whose blocks table lists, for
// head head, into dst ([dims]).
func (p kvPool) load(table []int32, pos, head int, dst []float32) {
	toFloat32(p.dt, p.row(int(table[pos/p.blockSize]), head, pos%p.blockSize), dst)
}
