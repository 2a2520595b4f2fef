package cpu

import (
	"unsafe"

	"github.com/trigon-llm/trigon/backend"
)

// tileRows is how many weight rows are converted to f32 together: each x
// row loaded from cache then feeds four dot products.
const tileRows = 4

// fusedMaxRows is the batch size below which the pure-Go MatMul dots x
// rows straight against the stored weight encoding instead of converting
// weight tiles.
const fusedMaxRows = 4

// dotsMaxRows is the most x rows MatMul dots straight against the stored
// weight rows (matmulDots) for weights of dtype dt. The GEMMs pack (and,
// but for the int8 one, convert) the whole weight before the first
// product, a cost that n vector dot passes over rows held in cache
// undercut for small n: up to about ten rows against the int8 GEMM (Q8_0,
// Q4_0), and at least up to the 17 rows of a speculative verify step of 16
// draft tokens against the others. Where the set has no vector dot for dt (and without
// vector kernels, where the tile path converts each weight row once for
// all x rows) fusedMaxRows holds.
func (k *kernels) dotsMaxRows(dt backend.DType) int {
	var vec bool
	switch dt {
	case backend.Q8_0:
		if k.gemmQ != nil && k.dotQ8 != nil {
			return 9
		}
		vec = k.dotQ8 != nil
	case backend.Q4_0:
		if k.gemmQ != nil && k.dotQ4 != nil {
			return 9
		}
		vec = k.dotQ4 != nil
	case backend.F32:
		vec = k.dotF32 != nil
	case backend.F16:
		vec = k.dotF16 != nil
	case backend.BF16:
		vec = k.dotBF16 != nil
	case backend.Q4_K:
		vec = k.dotQ4K != nil
	case backend.Q5_K:
		vec = k.dotQ5K != nil
	case backend.Q6_K:
		vec = k.dotQ6K != nil
	case backend.AWQ4G32, backend.AWQ4G64, backend.AWQ4G128:
		vec = k.dotAWQ4 != nil
	case backend.F8E4M3Row:
		vec = k.dotF8 != nil
	}
	if !vec {
		return fusedMaxRows - 1
	}
	return 17
}

// dotsChunkBytes bounds the weight rows matmulDots runs each x row over
// in one rows-kernel call, so that they stay in L2 for the next x row.
const dotsChunkBytes = 256 << 10

// minWork is the fewest multiply-adds worth handing to another goroutine
// (tens of microseconds): smaller products, as in tiny test models, run
// on the calling goroutine.
const minWork = 1 << 17

// xBlockBytes bounds the x rows processed against one weight tile so that
// they stay in L2 while every tile of a worker's range streams past.
const xBlockBytes = 256 << 10

// MatMul implements backend.Backend: out = x . w^T (+ bias), f32 accumulate.
//
// Up to dotsMaxRows rows it dots x against the stored encoding
// (decodeDot; K-quant weights against x quantized as llama.cpp's Q8_K,
// kquant.go); above, Q8_0/Q4_0 weights go through the int8 GEMM (gemmQ)
// and the rest through the f32 GEMM (gemm) where the kernel set has
// them. Without vector kernels, output features are split across
// workers: each converts tileRows weight rows at a time to f32 (F32
// weights are used in place) and runs them against blocks of x rows, so
// the expensive weight read is amortised over every row of the batch.
//
//	out  [n, outFeatures] F32
//	x    [n, inFeatures] F32
//	w    [outFeatures, inFeatures] F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, AWQ4_G* or F8_E4M3_ROW
//	bias [outFeatures] F32, F16 or BF16, or nil
func (b *Backend) MatMul(out, x, w, bias backend.Tensor) error {
	const op = "matmul"
	o, err := tensorOf(op, "out", out)
	if err != nil {
		return err
	}
	xt, err := tensorOf(op, "x", x)
	if err != nil {
		return err
	}
	wt, err := tensorOf(op, "w", w)
	if err != nil {
		return err
	}
	bt, err := optTensorOf(op, "bias", bias)
	if err != nil {
		return err
	}
	dims, err := backend.CheckMatMul(o, xt, wt, orNil(bias, bt))
	if err != nil {
		return opErr(err)
	}
	n, inF, outF := dims.N, dims.In, dims.Out
	if err := checkF32(op, []string{"x", "out"}, xt, o); err != nil {
		return err
	}
	var bv []float32
	if bt != nil {
		bv = floatVector(bt)
	}
	if overlaps(o.data, xt.data) {
		return backend.ShapeError("cpu: "+op, "out", "overlaps x")
	}

	xs, os := xt.f32(), o.f32()
	if wt.dt == backend.F8E4M3Row {
		xs = b.quantizeActF8(xs, n, inF)
	}
	rowBytes := wt.rowBytes()
	if rk := b.decodeRows(wt.dt); n == 1 && rk != nil {
		// One token: each worker's rows in one kernel call.
		xq, xm := b.quantizeRows(xs, n, inF)
		nb := inF / qk
		b.parallel(outF, b.grainFor(outF, minWork/inF), func(_, lo, hi int) {
			rk(&xq[0], &xm[0], &wt.data[lo*rowBytes], nb, hi-lo, &os[lo])
		})
		addBias(os, bv, n, outF)
		return nil
	}
	if n <= b.k.dotsMaxRows(wt.dt) {
		b.matmulDots(os, xs, wt, n, inF, outF)
		addBias(os, bv, n, outF)
		return nil
	}
	if b.k.gemmQ != nil && b.k.gemm != nil && (wt.dt == backend.Q4_K || wt.dt == backend.Q5_K) {
		b.gemmK(os, xs, wt, n, inF, outF)
		addBias(os, bv, n, outF)
		return nil
	}
	if b.k.gemmQ != nil && (wt.dt == backend.Q8_0 || wt.dt == backend.Q4_0) {
		b.gemmQ(os, xs, wt, n, inF, outF)
		addBias(os, bv, n, outF)
		return nil
	}
	if b.k.gemm != nil {
		b.gemm(os, xs, wt, n, inF, outF)
		addBias(os, bv, n, outF)
		return nil
	}
	xBlock := max(tileRows, xBlockBytes/(4*inF)/tileRows*tileRows)
	tiles := (outF + tileRows - 1) / tileRows
	grain := b.grainFor(tiles, minWork/(n*tileRows*inF))
	b.parallel(tiles, grain, func(worker, lo, hi int) {
		var tile [tileRows][]float32
		var buf []float32
		if wt.dt != backend.F32 {
			buf = b.floatScratch(worker, tileRows*inF)
		}
		for i0 := 0; i0 < n; i0 += xBlock {
			i1 := min(n, i0+xBlock)
			for t := lo; t < hi; t++ {
				o0 := t * tileRows
				r := min(tileRows, outF-o0)
				for k := range r {
					src := wt.data[(o0+k)*rowBytes : (o0+k+1)*rowBytes]
					if wt.dt == backend.F32 {
						tile[k] = bytesAs[float32](src)
					} else {
						tile[k] = buf[k*inF : (k+1)*inF]
						toFloat32(wt.dt, src, tile[k])
					}
				}
				matmulTile(os, xs, tile[:r], i0, i1, inF, outF, o0)
			}
		}
	})
	addBias(os, bv, n, outF)
	return nil
}

// matmulDots computes out = x . w^T by dotting each x row straight
// against the stored weight rows: for a few x rows, where converting or
// packing the weight first would cost as much as the dot products. Q8_0
// and Q4_0 go through the set's rows kernel a chunk of weight rows at a
// time (the chunk stays in L2 while every x row meets it), the rest
// through decodeDot a weight row at a time (the row stays in L1); either
// way the weight is read from memory once.
func (b *Backend) matmulDots(out, x []float32, w *tensor, n, inF, outF int) {
	rowBytes := w.rowBytes()
	if rk := b.decodeRows(w.dt); rk != nil {
		// The set's rows kernel over a chunk of weight rows small enough to
		// stay in L2 while each x row meets it: one call a chunk and row.
		xq, xm := b.quantizeRows(x, n, inF)
		nb := inF / qk
		chunk := max(1, dotsChunkBytes/rowBytes)
		b.parallel(outF, b.grainFor(outF, minWork/(n*inF)), func(_, lo, hi int) {
			for r0 := lo; r0 < hi; r0 += chunk {
				r1 := min(hi, r0+chunk)
				for i := range n {
					rk(&xq[i*inF], &xm[2*i*nb], &w.data[r0*rowBytes], nb, r1-r0, &out[i*outF+r0])
				}
			}
		})
		return
	}
	dotRow := b.decodeDot(w.dt, x, n, inF)
	b.parallel(outF, b.grainFor(outF, minWork/(n*inF)), func(_, lo, hi int) {
		for r := lo; r < hi; r++ {
			wrow := w.data[r*rowBytes : (r+1)*rowBytes]
			for i := range n {
				out[i*outF+r] = dotRow(i, wrow)
			}
		}
	})
}

// addBias adds bias (nil: none) to each of the n rows of out.
func addBias(out, bias []float32, n, outF int) {
	if bias == nil {
		return
	}
	for i := range n {
		row := out[i*outF : (i+1)*outF]
		for j, v := range bias {
			row[j] += v
		}
	}
}

// matmulTile writes out[i, o0+k] = x[i] . tile[k] for rows i in [i0, i1).
func matmulTile(out, x []float32, tile [][]float32, i0, i1, inF, outF, o0 int) {
	xrow := func(i int) []float32 { return x[i*inF : (i+1)*inF] }
	i := i0
	if len(tile) == tileRows {
		w0, w1, w2, w3 := tile[0], tile[1], tile[2], tile[3]
		for ; i+4 <= i1; i += 4 {
			x0, x1, x2, x3 := xrow(i), xrow(i+1), xrow(i+2), xrow(i+3)
			s00, s01, s10, s11, s20, s21, s30, s31 := dot4x2(x0, x1, x2, x3, w0, w1)
			s02, s03, s12, s13, s22, s23, s32, s33 := dot4x2(x0, x1, x2, x3, w2, w3)
			copy(out[i*outF+o0:], []float32{s00, s01, s02, s03})
			copy(out[(i+1)*outF+o0:], []float32{s10, s11, s12, s13})
			copy(out[(i+2)*outF+o0:], []float32{s20, s21, s22, s23})
			copy(out[(i+3)*outF+o0:], []float32{s30, s31, s32, s33})
		}
		for ; i < i1; i++ {
			s0, s1, s2, s3 := dot1x4(xrow(i), w0, w1, w2, w3)
			copy(out[i*outF+o0:], []float32{s0, s1, s2, s3})
		}
		return
	}
	for ; i < i1; i++ {
		for k, w := range tile {
			out[i*outF+o0+k] = dot(xrow(i), w)
		}
	}
}

// dot4x2 returns the eight dot products of four x rows with two weight
// rows: eight independent accumulators hide the add latency, and each
// loaded element feeds two or four multiplies.
func dot4x2(x0, x1, x2, x3, w0, w1 []float32) (s00, s01, s10, s11, s20, s21, s30, s31 float32) {
	n := len(w0)
	w1, x0, x1, x2, x3 = w1[:n], x0[:n], x1[:n], x2[:n], x3[:n]
	for k := range n {
		a, c := w0[k], w1[k]
		v0, v1, v2, v3 := x0[k], x1[k], x2[k], x3[k]
		s00 += v0 * a
		s01 += v0 * c
		s10 += v1 * a
		s11 += v1 * c
		s20 += v2 * a
		s21 += v2 * c
		s30 += v3 * a
		s31 += v3 * c
	}
	return
}

// dot1x4 returns x . w0..w3, unrolled by two for eight accumulators.
func dot1x4(x, w0, w1, w2, w3 []float32) (s0, s1, s2, s3 float32) {
	n := len(x)
	w0, w1, w2, w3 = w0[:n], w1[:n], w2[:n], w3[:n]
	var t0, t1, t2, t3 float32
	k := 0
	for ; k+1 < n; k += 2 {
		a, c := x[k], x[k+1]
		s0 += a * w0[k]
		t0 += c * w0[k+1]
		s1 += a * w1[k]
		t1 += c * w1[k+1]
		s2 += a * w2[k]
		t2 += c * w2[k+1]
		s3 += a * w3[k]
		t3 += c * w3[k+1]
	}
	if k < n {
		a := x[k]
		s0 += a * w0[k]
		s1 += a * w1[k]
		s2 += a * w2[k]
		s3 += a * w3[k]
	}
	return s0 + t0, s1 + t1, s2 + t2, s3 + t3
}

// dot returns a . b with four accumulators.
func dot(a, b []float32) float32 {
	n := len(a)
	b = b[:n]
	var s0, s1, s2, s3 float32
	k := 0
	for ; k+3 < n; k += 4 {
		s0 += a[k] * b[k]
		s1 += a[k+1] * b[k+1]
		s2 += a[k+2] * b[k+2]
		s3 += a[k+3] * b[k+3]
	}
	for ; k < n; k++ {
		s0 += a[k] * b[k]
	}
	return (s0 + s1) + (s2 + s3)
}

// overlaps reports whether two byte slices share memory.
func overlaps(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	pa, pb := uintptr(unsafe.Pointer(unsafe.SliceData(a))), uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return pa < pb+uintptr(len(b)) && pb < pa+uintptr(len(a))
}
