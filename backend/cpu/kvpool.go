package cpu

import (
	"github.com/trigon-llm/trigon/backend"
)

// kvPool reads and writes one layer's K or V pool in the format its
// backend.KVSpec names (the byte layouts and codecs are backend.KVSpec's
// and backend's kvquant.go); RoPEStoreKV and Attention go through it, so
// the layout and the element encoding are written once.
//
//	head-major: element (block, head, offset, i) at ((block*heads+head)*blockSize+offset)*headDim+i
type kvPool struct {
	t                      *tensor
	spec                   backend.KVSpec
	heads, blockSize, dims int
	el                     int // bytes per element (plain, F8E4M3, I8); U4 packs two a byte
	isK                    bool

	perHead []float32 // KVScalePerHead: [heads] scales
	scales  []uint16  // KVScaleGroups, KVScaleKIVI: the F16 scale tensor
	win     []uint16  // KVScaleKIVI: the BF16 window pool
	winMap  []int32   // KVScaleKIVI: [numBlocks] window block ids
	groups  int       // channel groups per token row (dims/GroupSize)
}

// newKVPool wraps t and its side tensors, already checked against spec
// (backend.KVSpec.CheckPools) for heads KV heads of dims each; isK picks
// K's side tensors (and, for KIVI, K's per-channel format).
func newKVPool(t *tensor, spec backend.KVSpec, aux backend.KVAux, isK bool, heads, dims int) kvPool {
	p := kvPool{t: t, spec: spec, heads: heads, blockSize: spec.BlockSize, dims: dims, el: spec.DType.BlockBytes(), isK: isK}
	scale, win := aux.VScale, aux.VWindow
	if isK {
		scale, win = aux.KScale, aux.KWindow
	}
	if spec.GroupSize > 0 {
		p.groups = dims / spec.GroupSize
	}
	switch spec.Scales {
	case backend.KVScalePerHead:
		p.perHead = scale.(*tensor).f32()
	case backend.KVScaleGroups:
		p.scales = bytesAs[uint16](scale.(*tensor).data)
	case backend.KVScaleKIVI:
		p.scales = bytesAs[uint16](scale.(*tensor).data)
		p.win = bytesAs[uint16](win.(*tensor).data)
		p.winMap = aux.WindowMap.(*tensor).i32()
	}
	return p
}

// row is the bytes of token offset off of block blk's head head.
func (p kvPool) row(blk, head, off int) []byte {
	n := p.dims * p.el
	if p.spec.DType == backend.U4 {
		n = p.dims / 2
	}
	base := ((blk*p.heads+head)*p.blockSize + off) * n
	return p.t.data[base : base+n]
}

// groupScales is the F16 scales of token offset off of block blk's head:
// KVScaleGroups: [groups]; KVScaleKIVI V: [groups][2] (scale, zero point).
func (p kvPool) groupScales(blk, head, off int) []uint16 {
	n := p.groups
	if p.spec.Scales == backend.KVScaleKIVI {
		n *= 2
	}
	base := ((blk*p.heads+head)*p.blockSize + off) * n
	return p.scales[base : base+n]
}

// channelScales is KIVI K's [2][dims] F16 of block blk's head: the
// channels' scales, then their zero points.
func (p kvPool) channelScales(blk, head int) []uint16 {
	base := (blk*p.heads + head) * 2 * p.dims
	return p.scales[base : base+2*p.dims]
}

// winRow is the BF16 row of token offset off of window block w's head.
func (p kvPool) winRow(w, head, off int) []uint16 {
	base := ((w*p.heads+head)*p.blockSize + off) * p.dims
	return p.win[base : base+p.dims]
}

// store writes v ([dims]) as token slot's row of head head. A KIVI pool's
// block must have a window block (the caller checks); KIVI K is quantized
// later, a whole block at once (quantizeBlock).
func (p kvPool) store(slot, head int, v []float32) {
	blk, off := slot/p.blockSize, slot%p.blockSize
	row := p.row(blk, head, off)
	switch p.spec.Scales {
	case backend.KVNoScales:
		fromFloat32(p.spec.DType, v, row)
	case backend.KVScalePerHead:
		s := p.perHead[head]
		for i, x := range v {
			if s > 0 {
				row[i] = backend.F32ToE4M3(x / s)
			} else {
				row[i] = 0
			}
		}
	case backend.KVScaleGroups:
		g, sc := p.spec.GroupSize, p.groupScales(blk, head, off)
		q := bytesAs[int8](row)
		for j := range p.groups {
			sc[j] = backend.QuantizeSym8(v[j*g:(j+1)*g], q[j*g:(j+1)*g])
		}
	case backend.KVScaleKIVI:
		w := p.winRow(int(p.winMap[blk]), head, off)
		for i, x := range v {
			w[i] = backend.F32ToBF16(x)
		}
		if p.isK {
			return
		}
		var q [128]uint8
		g, sc := p.spec.GroupSize, p.groupScales(blk, head, off)
		for j := range p.groups {
			sc[2*j], sc[2*j+1] = backend.QuantizeAsym4(v[j*g:(j+1)*g], q[:g])
			for i := 0; i < g; i += 2 {
				row[(j*g+i)/2] = q[i] | q[i+1]<<4
			}
		}
	}
}

// quantizeBlock quantizes KIVI K block blk's head from its window copy:
// each channel over the block's tokens. buf is scratch of 2*blockSize.
func (p kvPool) quantizeBlock(blk, head int, buf []float32) {
	w := int(p.winMap[blk])
	bs := p.blockSize
	x, q := buf[:bs], make([]uint8, bs)
	sc := p.channelScales(blk, head)
	for c := range p.dims {
		for off := range bs {
			x[off] = backend.BF16ToF32(p.winRow(w, head, off)[c])
		}
		sc[c], sc[p.dims+c] = backend.QuantizeAsym4(x, q)
		for off := range bs {
			b := &p.row(blk, head, off)[c/2]
			if c%2 == 0 {
				*b = *b&0xF0 | q[off]
			} else {
				*b = *b&0x0F | q[off]<<4
			}
		}
	}
}

// inWindow reports whether a KIVI pool reads position pos of a sequence
// of seqLen tokens, in block blk, from the window (see backend.KVSpec).
func (p kvPool) inWindow(blk int, pos, seqLen int) bool {
	if p.winMap[blk] < 0 {
		return false
	}
	full := (pos/p.blockSize+1)*p.blockSize <= seqLen
	return !full || pos >= seqLen-p.spec.Window
}

// load reads position pos of a sequence of seqLen tokens whose blocks
// table lists, for head head, into dst ([dims]).
func (p kvPool) load(table []int32, pos, seqLen, head int, dst []float32) {
	blk, off := int(table[pos/p.blockSize]), pos%p.blockSize
	row := p.row(blk, head, off)
	switch p.spec.Scales {
	case backend.KVNoScales:
		toFloat32(p.spec.DType, row, dst)
	case backend.KVScalePerHead:
		s, t := p.perHead[head], backend.E4M3Table()
		for i, b := range row {
			dst[i] = t[b] * s
		}
	case backend.KVScaleGroups:
		g, sc, t := p.spec.GroupSize, p.groupScales(blk, head, off), backend.F16Table()
		q := bytesAs[int8](row)
		for j := range p.groups {
			s := t[sc[j]]
			for i, v := range q[j*g : (j+1)*g] {
				dst[j*g+i] = float32(v) * s
			}
		}
	case backend.KVScaleKIVI:
		if p.inWindow(blk, pos, seqLen) {
			for i, h := range p.winRow(int(p.winMap[blk]), head, off) {
				dst[i] = backend.BF16ToF32(h)
			}
			return
		}
		// Each byte holds elements 2j (low nibble) and 2j+1; every
		// product is rounded before its add (no FMA), as the format says.
		t := backend.F16Table()
		codes := row[:p.dims/2]
		if p.isK {
			sc := p.channelScales(blk, head)
			s, z := sc[:p.dims], sc[p.dims:2*p.dims]
			for j, c := range codes {
				i := 2 * j
				dst[i] = float32(float32(c&0xF)*t[s[i]]) + t[z[i]]
				dst[i+1] = float32(float32(c>>4)*t[s[i+1]]) + t[z[i+1]]
			}
			return
		}
		g, sc := p.spec.GroupSize, p.groupScales(blk, head, off)
		for j := range p.groups {
			s, z := t[sc[2*j]], t[sc[2*j+1]]
			for k, c := range codes[j*g/2 : (j+1)*g/2] {
				i := j*g + 2*k
				dst[i] = float32(float32(c&0xF)*s) + z
				dst[i+1] = float32(float32(c>>4)*s) + z
			}
		}
	}
}
