package cpu

import (
	"encoding/binary"
	"math"
	"unsafe"

	"github.com/trigon-llm/trigon/backend"
)

// Products against K-quant weights (Q4_K, Q5_K, Q6_K; layouts in
// backend/kquant.go) as llama.cpp computes them: the x row is quantized
// per 256-value super-block to int8 with one f32 scale and the sums of
// each 16 values (llama.cpp's Q8_K), and each sub-block's integer dot
// product is exact in int32; the weight's sub-block scales and mins are
// applied as integers and the two super-block scales once per block.

const qkK = backend.QK_K

// kDot returns the dot product of nb K-quant weight blocks at w with nb
// Q8_K blocks of x: int8 values xq, scales xd and per-16 sums xs.
type kDot func(w *byte, xq *int8, xd *float32, xs *int16, nb int) float32

// quantizeQ8K quantizes x (a multiple of 256 values) per 256-value block:
// d = max|x|/127, q = round(x/d) (half away from zero), so |x - d*q| <=
// d/2 element-wise, and sums[j] = the sum of q over values 16j..16j+15.
func quantizeQ8K(x []float32, q []int8, d []float32, sums []int16) {
	for blk := range len(x) / qkK {
		xx := x[blk*qkK : (blk+1)*qkK : (blk+1)*qkK]
		qq := q[blk*qkK : (blk+1)*qkK : (blk+1)*qkK]
		var amax float32
		for _, v := range xx {
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		s := amax / 127
		d[blk] = s
		ss := sums[blk*16 : blk*16+16 : blk*16+16]
		if s == 0 {
			clear(qq)
			clear(ss)
			continue
		}
		id := 1 / s
		for j := range 16 {
			var sum int16
			for l := 16 * j; l < 16*j+16; l++ {
				v := int8(max(-127, min(127, math.Round(float64(xx[l]*id)))))
				qq[l] = v
				sum += int16(v)
			}
			ss[j] = sum
		}
	}
}

// kDots returns the Go reference kernel for a K-quant dtype.
func kDots(dt backend.DType) kDot {
	switch dt {
	case backend.Q4_K:
		return dotQ4K
	case backend.Q5_K:
		return dotQ5K
	case backend.Q6_K:
		return dotQ6K
	}
	return nil
}

// kquantDot is decodeDot for K-quant weights: the n x rows are quantized
// to Q8_K once (into b.xq, b.xs, b.xk) and each product runs the set's
// kernel for dt, or the Go one. The result differs from the f32 product by
// at most, per super-block, d_x/2 times the block's sum of |w|.
func (b *Backend) kquantDot(dt backend.DType, x []float32, n, inF int) func(i int, w []byte) float32 {
	nb := inF / qkK
	if cap(b.xq) < n*inF {
		b.xq = make([]int8, n*inF)
	}
	if cap(b.xs) < n*nb {
		b.xs = make([]float32, n*nb)
	}
	if cap(b.xk) < n*nb*16 {
		b.xk = make([]int16, n*nb*16)
	}
	xq, xd, xs := b.xq[:n*inF], b.xs[:n*nb], b.xk[:n*nb*16]
	quantizeQ8K(x[:n*inF], xq, xd, xs)
	kd := b.k.kDot(dt)
	return func(i int, w []byte) float32 {
		return kd(unsafe.SliceData(w), &xq[i*inF], &xd[i*nb], &xs[i*nb*16], nb)
	}
}

// kDot returns the set's kernel for a K-quant dtype, the Go one where the
// set has none.
func (k *kernels) kDot(dt backend.DType) kDot {
	var kd kDot
	switch dt {
	case backend.Q4_K:
		kd = k.dotQ4K
	case backend.Q5_K:
		kd = k.dotQ5K
	case backend.Q6_K:
		kd = k.dotQ6K
	}
	if kd == nil {
		kd = kDots(dt)
	}
	return kd
}

// kSlices views the kernel arguments as Go slices.
func kSlices(w *byte, wBytes int, xq *int8, xd *float32, xs *int16, nb int) ([]byte, []int8, []float32, []int16) {
	return unsafe.Slice(w, nb*wBytes), unsafe.Slice(xq, nb*qkK), unsafe.Slice(xd, nb), unsafe.Slice(xs, nb*16)
}

// dotQ4K is the Go reference for Q4_K (dotKMin).
func dotQ4K(w *byte, xq *int8, xd *float32, xs *int16, nb int) float32 {
	return dotKMin(false, w, xq, xd, xs, nb)
}

// dotQ5K is the Go reference for Q5_K (dotKMin).
func dotQ5K(w *byte, xq *int8, xd *float32, xs *int16, nb int) float32 {
	return dotKMin(true, w, xq, xd, xs, nb)
}

// dotKMin sums, per super-block, d_x * (d * sum_j sc_j*dot_j - dmin *
// sum_j m_j*sum_j(x)) over the 8 sub-blocks j, where dot_j is the integer
// product of the unsigned 4- or 5-bit weights with the int8 x values and
// sum_j(x) the sum of those x values (two of the per-16 sums).
func dotKMin(five bool, w *byte, xq *int8, xd *float32, xs *int16, nb int) float32 {
	bb := 144
	if five {
		bb = 176
	}
	ws, q, d, s := kSlices(w, bb, xq, xd, xs, nb)
	f16 := backend.F16Table()
	var sum float32
	for blk := range nb {
		b := ws[blk*bb : (blk+1)*bb : (blk+1)*bb]
		scales := b[4:16]
		qs, qh := b[16:144], []byte(nil)
		if five {
			qh, qs = b[16:48:48], b[48:176:176]
		}
		xx := q[blk*qkK : (blk+1)*qkK : (blk+1)*qkK]
		bs := s[blk*16 : blk*16+16 : blk*16+16]
		var sumi, summ int32
		for c := range 4 {
			sc0, m0 := backend.KScaleMin(scales, 2*c)
			sc1, m1 := backend.KScaleMin(scales, 2*c+1)
			qq := qs[32*c : 32*c+32 : 32*c+32]
			lo := xx[64*c : 64*c+32 : 64*c+32]
			hi := xx[64*c+32 : 64*c+64 : 64*c+64]
			var s0, s1 int32
			if qh == nil {
				for l := range 32 {
					s0 += int32(qq[l]&0xf) * int32(lo[l])
					s1 += int32(qq[l]>>4) * int32(hi[l])
				}
			} else {
				h := qh[:32]
				for l := range 32 {
					s0 += int32(qq[l]&0xf|(h[l]>>(2*c)&1)<<4) * int32(lo[l])
					s1 += int32(qq[l]>>4|(h[l]>>(2*c+1)&1)<<4) * int32(hi[l])
				}
			}
			sumi += int32(sc0)*s0 + int32(sc1)*s1
			summ += int32(m0)*int32(bs[4*c]+bs[4*c+1]) + int32(m1)*int32(bs[4*c+2]+bs[4*c+3])
		}
		dw := f16[binary.LittleEndian.Uint16(b)]
		dmin := f16[binary.LittleEndian.Uint16(b[2:])]
		sum += d[blk] * (dw*float32(sumi) - dmin*float32(summ))
	}
	return sum
}

// dotQ6K sums, per super-block, d_x * d * sum_j sc_j*(dot_j - 32*sum_j(x))
// over the 16 sub-blocks j: dot_j is the integer product of the unsigned
// 6-bit weights with the int8 x values, and the offset 32 of the stored
// weights comes off through the per-16 sums.
func dotQ6K(w *byte, xq *int8, xd *float32, xs *int16, nb int) float32 {
	ws, q, d, s := kSlices(w, 210, xq, xd, xs, nb)
	f16 := backend.F16Table()
	var sum float32
	for blk := range nb {
		b := ws[blk*210 : (blk+1)*210 : (blk+1)*210]
		xx := q[blk*qkK : (blk+1)*qkK : (blk+1)*qkK]
		bs := s[blk*16 : blk*16+16 : blk*16+16]
		sc := b[192:208:208]
		var sumi int32
		for h := range 2 {
			ql, qh := b[64*h:64*h+64:64*h+64], b[128+32*h:160+32*h:160+32*h]
			x := xx[128*h : 128*h+128 : 128*h+128]
			// acc[g][half]: the four 32-value groups g, each two sub-blocks.
			var acc [4][2]int32
			for l := range 32 {
				hb := qh[l]
				a, c := ql[l], ql[l+32]
				p := l / 16
				acc[0][p] += int32(a&0xf|(hb&3)<<4) * int32(x[l])
				acc[1][p] += int32(c&0xf|(hb>>2&3)<<4) * int32(x[l+32])
				acc[2][p] += int32(a>>4|(hb>>4&3)<<4) * int32(x[l+64])
				acc[3][p] += int32(c>>4|(hb>>6&3)<<4) * int32(x[l+96])
			}
			for g := range 4 {
				for p := range 2 {
					j := 8*h + 2*g + p // sub-block of 16
					sumi += int32(int8(sc[j])) * (acc[g][p] - 32*int32(bs[j]))
				}
			}
		}
		sum += d[blk] * f16[binary.LittleEndian.Uint16(b[208:])] * float32(sumi)
	}
	return sum
}

// gemmK computes out = x . w^T for Q4_K and Q5_K weights through the int8
// GEMM: a sub-block j of 32 values is d*sc_j*q - dmin*m_j with q unsigned,
// so x . w is the int8 product of x (quantized per 32 values, as for
// Q8_0) with the codes q at block scale d*sc_j (gemmQ, whose panels
// packKPanel fills), minus sum_j dmin*m_j * xsum_j, where xsum_j is the
// sum of x's quantized block j times its scale: a product 32 times
// smaller, [n, inF/32] . [outF, inF/32]^T, run through the f32 GEMM. The
// result differs from the f32 product by the quantization of x, at most
// sum over 32-value blocks of d_x/2 * sum|w|.
func (b *Backend) gemmK(out, x []float32, w *tensor, n, inF, outF int) {
	b.gemmQ(out, x, w, n, inF, outF)
	nb := inF / qk
	if cap(b.kMins) < outF*nb {
		b.kMins = make([]float32, outF*nb)
	}
	if cap(b.kSums) < n*nb+n*outF {
		b.kSums = make([]float32, n*nb+n*outF)
	}
	mins, sums, minus := b.kMins[:outF*nb], b.kSums[:n*nb], b.kSums[n*nb:n*nb+n*outF]
	rowBytes := w.rowBytes()
	bb := w.dt.BlockBytes()
	f16 := backend.F16Table()
	b.parallel(outF, b.grainFor(outF, minWork/(8*nb)), func(_, lo, hi int) {
		for o := lo; o < hi; o++ {
			row := w.data[o*rowBytes : (o+1)*rowBytes]
			for blk := range inF / qkK {
				src := row[blk*bb : (blk+1)*bb]
				dmin := f16[binary.LittleEndian.Uint16(src[2:])]
				for j := range 8 {
					_, m := backend.KScaleMin(src[4:16], j)
					mins[o*nb+blk*8+j] = dmin * float32(m)
				}
			}
		}
	})
	// quantizeRows left each block's scale and -128 times its sum of q in b.xm.
	xm := b.xm[:2*n*nb]
	for i := range sums {
		sums[i] = math.Float32frombits(xm[2*i]) * float32(-int32(xm[2*i+1])/128)
	}
	mt := &tensor{dt: backend.F32, shape: []int{outF, nb}, data: unsafe.Slice((*byte)(unsafe.Pointer(&mins[0])), 4*len(mins))}
	b.gemm(minus, sums, mt, n, nb, outF)
	for i, v := range minus {
		out[i] -= v
	}
}

// packKPanel is packQPanel for Q4_K and Q5_K rows: each 32-value
// sub-block j becomes a block of the unsigned codes q (plus flip, which
// cannot carry: q < 32) at scale d*sc_j; the mins are gemmK's.
func packKPanel(panel []byte, w *tensor, rowBytes, o0, cols, nr, nb int, flip byte) {
	f16 := backend.F16Table()
	bb := w.dt.BlockBytes()
	five := w.dt == backend.Q5_K
	stride := nr * qPanelBlockBytes
	flip32 := uint32(flip) * 0x01010101
	le := binary.LittleEndian
	for j := range nr {
		if j >= cols {
			for blk := range nb {
				base := blk*stride + 4*j
				for grp := range 8 {
					le.PutUint32(panel[base+grp*4*nr:], 0)
				}
				le.PutUint32(panel[base+qk*nr:], 0)
			}
			continue
		}
		row := w.data[(o0+j)*rowBytes : (o0+j+1)*rowBytes]
		for sb := range nb / 8 {
			src := row[sb*bb : (sb+1)*bb]
			d := f16[le.Uint16(src)]
			qs, qh := src[16:144], []byte(nil)
			if five {
				qh, qs = src[16:48], src[48:176]
			}
			for s := range 8 {
				sc, _ := backend.KScaleMin(src[4:16], s)
				q := qs[32*(s/2) : 32*(s/2)+32]
				shift := uint(4 * (s & 1))
				base := (sb*8+s)*stride + 4*j
				for grp := range 8 {
					v := le.Uint32(q[4*grp:]) >> shift & 0x0f0f0f0f
					if five {
						v |= (le.Uint32(qh[4*grp:]) >> uint(s) & 0x01010101) << 4
					}
					le.PutUint32(panel[base+grp*4*nr:], v|flip32)
				}
				le.PutUint32(panel[base+qk*nr:], math.Float32bits(d*float32(sc)))
			}
		}
	}
}
