package cpu

import (
	"math"

	"github.com/trigon-llm/trigon/backend"
)

// RoPEStoreKV implements backend.Backend.
//
// For each token and head, the optional per-head RMS norm is applied first,
// then the rotate-half (NeoX) rotation as HF Llama computes it: with
// angle = f32(pos) * invFreq[i] rounded to f32, for i < headDim/2
//
//	out[i]           = x[i]*cos - x[i+headDim/2]*sin
//	out[i+headDim/2] = x[i+headDim/2]*cos + x[i]*sin
//
// V is stored unchanged. K and V are converted to the cache dtype on store.
// Every position and slot is checked before anything is written.
func (b *Backend) RoPEStoreKV(a backend.RoPEArgs) error {
	const op = "ropestorekv"
	q, err := tensorOf(op, "Q", a.Q)
	if err != nil {
		return err
	}
	qkv, err := tensorOf(op, "QKV", a.QKV)
	if err != nil {
		return err
	}
	pos, err := tensorOf(op, "Positions", a.Positions)
	if err != nil {
		return err
	}
	slots, err := tensorOf(op, "SlotMapping", a.SlotMapping)
	if err != nil {
		return err
	}
	kc, err := tensorOf(op, "KCache", a.KCache)
	if err != nil {
		return err
	}
	vc, err := tensorOf(op, "VCache", a.VCache)
	if err != nil {
		return err
	}
	invf, err := tensorOf(op, "InvFreq", a.InvFreq)
	if err != nil {
		return err
	}
	qn, err := optTensorOf(op, "QNorm", a.QNorm)
	if err != nil {
		return err
	}
	kn, err := optTensorOf(op, "KNorm", a.KNorm)
	if err != nil {
		return err
	}
	checked := a
	checked.QNorm, checked.KNorm = orNil(a.QNorm, qn), orNil(a.KNorm, kn)
	dims, err := backend.CheckRoPEStoreKV(checked)
	if err != nil {
		return opErr(err)
	}
	h, kvh, d, n := a.NumHeads, a.NumKVHeads, a.HeadDim, dims.NumTokens
	if err := checkF32(op, []string{"QKV", "Q"}, qkv, q); err != nil {
		return err
	}
	if overlaps(q.data, qkv.data) {
		return backend.ShapeError("cpu: "+op, "Q", "overlaps QKV")
	}
	var qw, kw []float32
	if qn != nil {
		qw = floatVector(qn)
	}
	if kn != nil {
		kw = floatVector(kn)
	}
	numBlocks, blockSize := dims.NumBlocks, dims.BlockSize
	numSlots := numBlocks * blockSize // no overflow: the cache's byte size fits
	pv, sv := pos.i32(), slots.i32()
	for t := range n {
		if pv[t] < 0 {
			return backend.ShapeError("cpu: "+op, "Positions", "Positions[%d] = %d is negative", t, pv[t])
		}
		if int(sv[t]) >= numSlots {
			return backend.ShapeError("cpu: "+op, "SlotMapping", "SlotMapping[%d] = %d outside %d slots", t, sv[t], numSlots)
		}
	}

	freq := invf.f32()
	xs, qs := qkv.f32(), q.f32()
	half := d / 2
	kp, vp := newKVPool(kc, a.KV, a.KVAux, true, kvh, d), newKVPool(vc, a.KV, a.KVAux, false, kvh, d)
	if a.KV.Scales == backend.KVScaleKIVI {
		for t := range n {
			if slot := int(sv[t]); slot >= 0 {
				if w := kp.winMap[slot/blockSize]; w < 0 || int(w) >= a.KVAux.KWindow.Shape()[0] {
					return backend.ShapeError("cpu: "+op, "WindowMap", "block %d of SlotMapping[%d] has window block %d of %d", slot/blockSize, t, w, a.KVAux.KWindow.Shape()[0])
				}
			}
		}
	}
	// kRow is token t's K of head j, normed and rotated, in dst; cos
	// and sin are scratch of half.
	kRow := func(t, j int, dst, cos, sin []float32) {
		p := float32(pv[t])
		for i, f := range freq {
			ang := float64(p * f) // f32 product, as HF computes it
			cos[i] = float32(math.Cos(ang))
			sin[i] = float32(math.Sin(ang))
		}
		k := xs[(t*(h+2*kvh)+h+j)*d : (t*(h+2*kvh)+h+j+1)*d]
		if kw != nil {
			rmsNorm(dst, k, kw, a.NormEps)
			k = dst
		}
		rotate(dst, k, cos, sin)
	}
	if a.KV.Scales == backend.KVScalePerHead {
		setFP8Scales(kp.perHead, vp.perHead, n, kvh, d, sv, xs[:], h, kRow)
	}
	b.parallel(n, b.grainFor(n, 1), func(w, lo, hi int) {
		buf := b.floatScratch(w, 2*half+d)
		cos, sin, tmp := buf[:half], buf[half:2*half], buf[2*half:]
		for t := lo; t < hi; t++ {
			p := float32(pv[t])
			for i, f := range freq {
				ang := float64(p * f) // f32 product, as HF computes it
				cos[i] = float32(math.Cos(ang))
				sin[i] = float32(math.Sin(ang))
			}
			row := xs[t*(h+2*kvh)*d : (t+1)*(h+2*kvh)*d]
			for j := range h {
				src := row[j*d : (j+1)*d]
				dst := qs[(t*h+j)*d : (t*h+j+1)*d]
				if qw != nil {
					rmsNorm(dst, src, qw, a.NormEps)
					src = dst
				}
				rotate(dst, src, cos, sin)
			}
			slot := int(sv[t])
			if slot < 0 {
				continue
			}
			for j := range kvh {
				k := row[(h+j)*d : (h+j+1)*d]
				if kw != nil {
					rmsNorm(tmp, k, kw, a.NormEps)
					k = tmp
				}
				rotate(tmp, k, cos, sin)
				kp.store(slot, j, tmp)
				vp.store(slot, j, row[(h+kvh+j)*d:(h+kvh+j+1)*d])
			}
		}
	})
	if a.KV.Scales == backend.KVScaleKIVI {
		// K blocks this call filled, quantized per channel now that all
		// their tokens are in the window pool.
		var full []int
		for t := range n {
			if slot := int(sv[t]); slot >= 0 && slot%blockSize == blockSize-1 {
				full = append(full, slot/blockSize)
			}
		}
		b.parallel(len(full)*kvh, 1, func(w, lo, hi int) {
			buf := b.floatScratch(w, 2*blockSize)
			for u := lo; u < hi; u++ {
				kp.quantizeBlock(full[u/kvh], u%kvh, buf)
			}
		})
	}
	return nil
}

// setFP8Scales sets the per-head FP8 scales that are still 0 (not set)
// from the tokens of this call with a slot: max|x| / KVFP8DynamicTarget
// over the head's K (normed and rotated, by kRow) or V values. A head
// whose values are all 0 stays unset.
func setFP8Scales(ks, vs []float32, n, kvh, d int, slots []int32, xs []float32, h int, kRow func(t, j int, dst, cos, sin []float32)) {
	unset := false
	for j := range kvh {
		unset = unset || ks[j] == 0 || vs[j] == 0
	}
	if !unset {
		return
	}
	kmax, vmax := make([]float32, kvh), make([]float32, kvh)
	tmp, cs := make([]float32, d), make([]float32, d)
	for t := range n {
		if slots[t] < 0 {
			continue
		}
		for j := range kvh {
			kRow(t, j, tmp, cs[:d/2], cs[d/2:])
			for _, x := range tmp {
				kmax[j] = max(kmax[j], float32(math.Abs(float64(x))))
			}
			for _, x := range xs[(t*(h+2*kvh)+h+kvh+j)*d : (t*(h+2*kvh)+h+kvh+j+1)*d] {
				vmax[j] = max(vmax[j], float32(math.Abs(float64(x))))
			}
		}
	}
	for j := range kvh {
		if ks[j] == 0 {
			ks[j] = kmax[j] / backend.KVFP8DynamicTarget
		}
		if vs[j] == 0 {
			vs[j] = vmax[j] / backend.KVFP8DynamicTarget
		}
	}
}

// rotate applies the rotate-half rotation of src into dst; dst may alias
// src.
func rotate(dst, src, cos, sin []float32) {
	half := len(cos)
	x1, x2 := src[:half], src[half:2*half]
	o1, o2 := dst[:half], dst[half:2*half]
	sin = sin[:half]
	for i, c := range cos {
		a, bb := x1[i], x2[i]
		o1[i] = float32(a*c) - float32(bb*sin[i])
		o2[i] = float32(bb*c) + float32(a*sin[i])
	}
}
