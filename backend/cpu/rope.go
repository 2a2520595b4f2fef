package cpu

import (
	"math"

	"github.com/trigon-llm/trigon/backend"
)

// kvDTypes are the KV cache dtypes the CPU stores.
var kvDTypes = []backend.DType{backend.F32, backend.BF16, backend.F16}

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
	h, kvh, d := a.NumHeads, a.NumKVHeads, a.HeadDim
	if h <= 0 || kvh <= 0 || d <= 0 || d%2 != 0 || h%kvh != 0 {
		return backend.ShapeError("cpu: "+op, "heads", "NumHeads %d, NumKVHeads %d, HeadDim %d: want positive counts, NumHeads a multiple of NumKVHeads and an even HeadDim", h, kvh, d)
	}
	if err := checkDType(op, "QKV", qkv, backend.F32); err != nil {
		return err
	}
	if err := checkShape(op, "QKV", qkv, -1, (h+2*kvh)*d); err != nil {
		return err
	}
	n := qkv.shape[0]
	if err := checkDType(op, "Q", q, backend.F32); err != nil {
		return err
	}
	if err := checkShape(op, "Q", q, n, h*d); err != nil {
		return err
	}
	if overlaps(q.data, qkv.data) {
		return backend.ShapeError("cpu: "+op, "Q", "overlaps QKV")
	}
	for _, c := range []struct {
		name string
		t    *tensor
	}{{"Positions", pos}, {"SlotMapping", slots}} {
		if err := checkDType(op, c.name, c.t, backend.I32); err != nil {
			return err
		}
		if err := checkShape(op, c.name, c.t, n); err != nil {
			return err
		}
	}
	if err := checkDType(op, "KCache", kc, kvDTypes...); err != nil {
		return err
	}
	if err := checkShape(op, "KCache", kc, -1, kvh, -1, d); err != nil {
		return err
	}
	if err := checkDType(op, "VCache", vc, kvDTypes...); err != nil {
		return err
	}
	if err := checkShape(op, "VCache", vc, kc.shape...); err != nil {
		return err
	}
	if err := checkDType(op, "InvFreq", invf, backend.F32); err != nil {
		return err
	}
	if err := checkShape(op, "InvFreq", invf, d/2); err != nil {
		return err
	}
	var qw, kw []float32
	for _, c := range []struct {
		name string
		t    *tensor
		v    *[]float32
	}{{"QNorm", qn, &qw}, {"KNorm", kn, &kw}} {
		if c.t == nil {
			continue
		}
		if err := checkDType(op, c.name, c.t, floatDTypes...); err != nil {
			return err
		}
		if err := checkShape(op, c.name, c.t, d); err != nil {
			return err
		}
		*c.v = floatVector(c.t)
	}
	if (qn != nil || kn != nil) && !(a.NormEps >= 0) {
		return backend.ShapeError("cpu: "+op, "NormEps", "%v is not a non-negative number", a.NormEps)
	}
	numBlocks, blockSize := kc.shape[0], kc.shape[2]
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
	kEl, vEl := kc.dt.BlockBytes(), vc.dt.BlockBytes()
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
			blk, off := slot/blockSize, slot%blockSize
			for j := range kvh {
				// Cache element index of [blk, j, off, 0].
				base := ((blk*kvh+j)*blockSize + off) * d
				k := row[(h+j)*d : (h+j+1)*d]
				if kw != nil {
					rmsNorm(tmp, k, kw, a.NormEps)
					k = tmp
				}
				rotate(tmp, k, cos, sin)
				fromFloat32(kc.dt, tmp, kc.data[base*kEl:(base+d)*kEl])
				v := row[(h+kvh+j)*d : (h+kvh+j+1)*d]
				fromFloat32(vc.dt, v, vc.data[base*vEl:(base+d)*vEl])
			}
		}
	})
	return nil
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
