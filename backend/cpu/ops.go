package cpu

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/trigon-llm/trigon/backend"
)

// Embed implements backend.Backend: out[i] = table[ids[i]], converted to
// out's dtype. Every id is checked before anything is written.
//
//	out   [n, dim] F32, F16 or BF16
//	table [rows, dim] F32, F16, BF16, Q8_0 or Q4_0
//	ids   [n] I32
func (b *Backend) Embed(out, table, ids backend.Tensor) error {
	return b.embed("embed", out, table, ids, 0, false)
}

// embed is Embed and, with shard set, EmbedShard: the table holds the
// vocabulary rows [base, base+rows) and ids outside them give zero rows
// instead of an error.
func (b *Backend) embed(op string, out, table, ids backend.Tensor, base int, shard bool) error {
	o, err := tensorOf(op, "out", out)
	if err != nil {
		return err
	}
	tt, err := tensorOf(op, "table", table)
	if err != nil {
		return err
	}
	it, err := tensorOf(op, "ids", ids)
	if err != nil {
		return err
	}
	dims, err := backend.CheckEmbed(o, tt, it)
	if err != nil {
		return opErr(err)
	}
	if base < 0 {
		return backend.ShapeError("cpu: "+op, "base", "%d is negative", base)
	}
	n, rows, dim := dims.N, dims.Rows, dims.Dim
	if overlaps(o.data, tt.data) || overlaps(o.data, it.data) {
		return backend.ShapeError("cpu: "+op, "out", "overlaps an input")
	}
	idv := it.i32()
	for i, id := range idv {
		if id < 0 {
			return backend.ShapeError("cpu: "+op, "ids", "ids[%d] = %d is negative", i, id)
		}
		if !shard && int(id) >= rows {
			return backend.ShapeError("cpu: "+op, "ids", "ids[%d] = %d outside table of %d rows", i, id, rows)
		}
	}
	tRow, oRow := tt.rowBytes(), o.rowBytes()
	b.parallel(n, b.grainFor(n, 16), func(w, lo, hi int) {
		var buf []float32
		if o.dt != backend.F32 {
			buf = b.floatScratch(w, dim)
		}
		for i := lo; i < hi; i++ {
			dst := o.data[i*oRow : (i+1)*oRow]
			id := int(idv[i]) - base
			if id < 0 || id >= rows {
				clear(dst) // another shard's row: zero in every float dtype
				continue
			}
			src := tt.data[id*tRow : (id+1)*tRow]
			if o.dt == tt.dt {
				copy(dst, src)
				continue
			}
			row := buf
			if o.dt == backend.F32 {
				row = bytesAs[float32](dst)
			}
			toFloat32(tt.dt, src, row)
			if o.dt != backend.F32 {
				fromFloat32(o.dt, row, dst)
			}
		}
	})
	return nil
}

// AddRMSNorm implements backend.Backend. With residual nil:
// out = rmsnorm(x) * weight; otherwise residual += x in place first and
// out = rmsnorm(residual) * weight. The sum of squares is accumulated in
// f64; the scaling follows HF's order, (x * rsqrt(mean(x^2) + eps)) * weight,
// each product rounded to f32. out may alias x.
//
//	out, x, residual [rows, dim] F32
//	weight           [dim] F32, F16 or BF16
func (b *Backend) AddRMSNorm(out, x, residual, weight backend.Tensor, eps float32) error {
	const op = "addrmsnorm"
	o, err := tensorOf(op, "out", out)
	if err != nil {
		return err
	}
	xt, err := tensorOf(op, "x", x)
	if err != nil {
		return err
	}
	rt, err := optTensorOf(op, "residual", residual)
	if err != nil {
		return err
	}
	wt, err := tensorOf(op, "weight", weight)
	if err != nil {
		return err
	}
	dims, err := backend.CheckAddRMSNorm(o, xt, orNil(residual, rt), wt, eps)
	if err != nil {
		return opErr(err)
	}
	rows, dim := dims.Rows, dims.Dim
	// residual has x's dtype: F32 too once x is.
	if err := checkF32(op, []string{"x", "out"}, xt, o); err != nil {
		return err
	}
	if rt != nil && (overlaps(rt.data, xt.data) || overlaps(rt.data, o.data)) {
		return backend.ShapeError("cpu: "+op, "residual", "overlaps x or out")
	}
	wv := floatVector(wt)
	xs, os := xt.f32(), o.f32()
	var rs []float32
	if rt != nil {
		rs = rt.f32()
	}
	b.parallel(rows, b.grainFor(rows, max(1, 4096/dim)), func(_, lo, hi int) {
		for i := lo; i < hi; i++ {
			src := xs[i*dim : (i+1)*dim]
			if rs != nil {
				r := rs[i*dim : (i+1)*dim]
				for j, v := range src {
					r[j] += v
				}
				src = r
			}
			rmsNorm(os[i*dim:(i+1)*dim], src, wv, eps)
		}
	})
	return nil
}

// rmsNorm writes dst = (src * rsqrt(mean(src^2) + eps)) * w. dst may alias
// src.
func rmsNorm(dst, src, w []float32, eps float32) {
	var ss float64
	for _, v := range src {
		ss += float64(v) * float64(v)
	}
	r := float32(1 / math.Sqrt(ss/float64(len(src))+float64(eps)))
	dst, w = dst[:len(src)], w[:len(src)]
	for j, v := range src {
		dst[j] = float32(v*r) * w[j]
	}
}

// SiLUMul implements backend.Backend: out = silu(gate) * up with
// silu(g) = g / (1 + exp(-g)), evaluated in f64 and rounded once per factor.
//
//	out    [n, inter] F32
//	gateUp [n, 2*inter] F32: gate, then up
func (b *Backend) SiLUMul(out, gateUp backend.Tensor) error {
	const op = "silumul"
	o, err := tensorOf(op, "out", out)
	if err != nil {
		return err
	}
	g, err := tensorOf(op, "gateUp", gateUp)
	if err != nil {
		return err
	}
	dims, err := backend.CheckSiLUMul(o, g)
	if err != nil {
		return opErr(err)
	}
	n, inter := dims.N, dims.Inter
	if err := checkF32(op, []string{"out", "gateUp"}, o, g); err != nil {
		return err
	}
	if overlaps(o.data, g.data) {
		return backend.ShapeError("cpu: "+op, "out", "overlaps gateUp")
	}
	os, gs := o.f32(), g.f32()
	b.parallel(n, b.grainFor(n, max(1, 4096/inter)), func(_, lo, hi int) {
		for i := lo; i < hi; i++ {
			gate := gs[i*2*inter : i*2*inter+inter]
			up := gs[i*2*inter+inter : (i+1)*2*inter]
			dst := os[i*inter : (i+1)*inter]
			for j, v := range gate {
				dst[j] = silu(v) * up[j]
			}
		}
	})
	return nil
}

func silu(v float32) float32 {
	return float32(float64(v) / (1 + math.Exp(-float64(v))))
}

// FillNormal implements backend.RandomFiller.
func (b *Backend) FillNormal(t backend.Tensor, seed uint64, mean, std float32) error {
	const op = "fillnormal"
	x, err := tensorOf(op, "t", t)
	if err != nil {
		return err
	}
	if err := backend.CheckDType(op, "t", x, backend.F32, backend.BF16); err != nil {
		return opErr(err)
	}
	n, err := backend.NumElements(x.shape)
	if err != nil {
		return fmt.Errorf("cpu: %s: %w", op, err)
	}
	const grain = 1 << 16
	b.parallel((n+grain-1)/grain, 1, func(_, lo, hi int) {
		for c := lo; c < hi; c++ {
			for i := c * grain; i < min(n, (c+1)*grain); i++ {
				v := backend.SyntheticValue(seed, int64(i), mean, std)
				if x.dt == backend.F32 {
					binary.LittleEndian.PutUint32(x.data[4*i:], math.Float32bits(v))
				} else {
					binary.LittleEndian.PutUint16(x.data[2*i:], backend.F32ToBF16(v))
				}
			}
		}
	})
	return nil
}
