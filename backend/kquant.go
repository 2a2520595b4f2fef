package backend

import (
	"encoding/binary"
	"fmt"
	"math"
)

// GGML's K-quants: super-blocks of 256 values whose sub-block scales are
// themselves quantized against one or two f16 super-block scales. The byte
// layouts are ggml's (block_q4_K, block_q5_K, block_q6_K), so that GGUF
// files carry them unchanged:
//
//	Q4_K, 144 bytes:  f16 d | f16 dmin | scales[12] | qs[128]
//	Q5_K, 176 bytes:  f16 d | f16 dmin | scales[12] | qh[32] | qs[128]
//	Q6_K, 210 bytes:  ql[128] | qh[64] | int8 scales[16] | f16 d
//
// Q4_K and Q5_K have 8 sub-blocks of 32 values, each with a 6-bit scale sc
// and a 6-bit min m packed into scales[12] (kScaleMin); value =
// d*sc*q - dmin*m with q unsigned, 4 bits (Q4_K) or 5 (Q5_K). The values
// come in four chunks of 64: byte l of chunk c's 32 qs bytes holds value
// 64c+l in its low nibble and 64c+32+l in its high nibble; Q5_K's fifth bit
// of those two values is bit 2c and bit 2c+1 of qh[l].
//
// Q6_K has 16 sub-blocks of 16 values with int8 scales; value =
// d*scale*(q-32), q 6 bits. Its values come in two halves of 128; in half
// h, for l < 32, ql[64h+l] holds the low 4 bits of values 128h+l (low
// nibble) and 128h+64+l (high nibble), ql[64h+32+l] those of 128h+32+l and
// 128h+96+l, and qh[32h+l] holds the high 2 bits of the four values
// 128h+l, +32, +64, +96 in its bit pairs 0-1, 2-3, 4-5, 6-7.
//
// Their numbers are kept clear of the iota block of dtype.go.
const (
	Q4_K DType = 32 + iota
	Q5_K
	Q6_K
)

// QK_K is the number of values in a K-quant super-block.
const QK_K = 256

// kQuant reports whether d is one of the K-quants.
func (d DType) kQuant() bool { return d == Q4_K || d == Q5_K || d == Q6_K }

func (d DType) kName() string {
	switch d {
	case Q4_K:
		return "Q4_K"
	case Q5_K:
		return "Q5_K"
	case Q6_K:
		return "Q6_K"
	}
	return ""
}

func (d DType) kBlockBytes() int {
	switch d {
	case Q4_K:
		return 144
	case Q5_K:
		return 176
	case Q6_K:
		return 210
	}
	return 0
}

// KScaleMin unpacks sub-block j's 6-bit scale and min (j < 8) from the
// 12 packed bytes of a Q4_K or Q5_K block: sub-blocks 0-3 keep theirs in
// the low 6 bits of bytes j (scale) and j+4 (min); sub-blocks 4-7 keep the
// low 4 bits in the nibbles of byte j+4 and the high 2 bits in the top
// bits of bytes j-4 (scale) and j (min).
func KScaleMin(s []byte, j int) (sc, m uint8) {
	if j < 4 {
		return s[j] & 63, s[j+4] & 63
	}
	return s[j+4]&0xf | (s[j-4]>>6)<<4, s[j+4]>>4 | (s[j]>>6)<<4
}

// kPackScaleMin is KScaleMin's inverse: it packs 8 scales and 8 mins of
// 6 bits into s[12].
func kPackScaleMin(s []byte, sc, m *[8]uint8) {
	for j := range 4 {
		s[j] = sc[j] | (sc[j+4]>>4)<<6
		s[j+4] = m[j] | (m[j+4]>>4)<<6
		s[j+8] = sc[j+4]&0xf | (m[j+4]&0xf)<<4
	}
}

// QuantizeQ4_K encodes src (a multiple of 256 values) as Q4_K blocks.
func QuantizeQ4_K(src []float32) ([]byte, error) { return quantizeKMin(Q4_K, src) }

// QuantizeQ5_K encodes src (a multiple of 256 values) as Q5_K blocks.
func QuantizeQ5_K(src []float32) ([]byte, error) { return quantizeKMin(Q5_K, src) }

// quantizeKMin writes Q4_K or Q5_K. Each sub-block of 32 gets the scale
// and min of fitScaleMin; the super-block scales are the largest of each
// over 63, the 6-bit codes round to nearest, and the values are then
// quantized against the scales as stored, so that the codes match what a
// reader decodes.
func quantizeKMin(dt DType, src []float32) ([]byte, error) {
	if len(src)%QK_K != 0 {
		return nil, fmt.Errorf("quantize %v: %d values are not a whole number of %d-value blocks", dt, len(src), QK_K)
	}
	bb := dt.kBlockBytes()
	nmax := 15
	if dt == Q5_K {
		nmax = 31
	}
	out := make([]byte, len(src)/QK_K*bb)
	var q [QK_K]uint8
	for blk := range len(src) / QK_K {
		x := src[blk*QK_K : (blk+1)*QK_K]
		o := out[blk*bb : (blk+1)*bb]
		var scale, mins [8]float32
		var maxScale, maxMin float32
		for j := range 8 {
			scale[j], mins[j] = fitScaleMin(x[32*j:32*j+32], nmax)
			maxScale, maxMin = max(maxScale, scale[j]), max(maxMin, mins[j])
		}
		dh, mh := F32ToF16(maxScale/63), F32ToF16(maxMin/63)
		d, dmin := F16ToF32(dh), F16ToF32(mh)
		var sc, m [8]uint8
		for j := range 8 {
			sc[j], m[j] = code6(scale[j], d), code6(mins[j], dmin)
			step, off := d*float32(sc[j]), dmin*float32(m[j])
			for l := range 32 {
				q[32*j+l] = uint8(roundClamp(x[32*j+l]+off, step, 0, nmax))
			}
		}
		binary.LittleEndian.PutUint16(o[0:], dh)
		binary.LittleEndian.PutUint16(o[2:], mh)
		kPackScaleMin(o[4:16], &sc, &m)
		qs := o[16:]
		if dt == Q5_K {
			qh := o[16:48]
			clear(qh)
			qs = o[48:]
			for c := range 4 {
				for l := range 32 {
					qh[l] |= (q[64*c+l]>>4)<<(2*c) | (q[64*c+32+l]>>4)<<(2*c+1)
				}
			}
		}
		for c := range 4 {
			for l := range 32 {
				qs[32*c+l] = q[64*c+l]&0xf | (q[64*c+32+l]&0xf)<<4
			}
		}
	}
	return out, nil
}

// QuantizeQ6_K encodes src (a multiple of 256 values) as Q6_K blocks: each
// sub-block of 16 gets the scale of fitScale; the super-block scale d is
// minus the sub-block scale of largest magnitude over 128, so that one's
// code is -128, the int8 range's wider end (llama.cpp's choice, which its
// integer products reproduce more closely than a positive d's); the
// values are quantized against the int8 scales as stored.
func QuantizeQ6_K(src []float32) ([]byte, error) {
	if len(src)%QK_K != 0 {
		return nil, fmt.Errorf("quantize Q6_K: %d values are not a whole number of %d-value blocks", len(src), QK_K)
	}
	out := make([]byte, len(src)/QK_K*210)
	var q [QK_K]uint8
	for blk := range len(src) / QK_K {
		x := src[blk*QK_K : (blk+1)*QK_K]
		o := out[blk*210 : (blk+1)*210]
		var scale [16]float32
		var ms float32 // the sub-block scale of largest magnitude, signed
		for j := range 16 {
			scale[j] = fitScale(x[16*j:16*j+16], 32)
			if abs32(scale[j]) > abs32(ms) {
				ms = scale[j]
			}
		}
		dh := F32ToF16(-ms / 128)
		d := F16ToF32(dh)
		for j := range 16 {
			var sc int8
			if d != 0 {
				sc = int8(roundClamp(scale[j], d, -128, 127))
			}
			o[192+j] = byte(sc)
			step := d * float32(sc)
			for l := range 16 {
				q[16*j+l] = uint8(roundClamp(x[16*j+l], step, -32, 31) + 32)
			}
		}
		binary.LittleEndian.PutUint16(o[208:], dh)
		ql, qh := o[0:128], o[128:192]
		clear(qh)
		for h := range 2 {
			for l := range 32 {
				v := q[128*h:]
				ql[64*h+l] = v[l]&0xf | (v[l+64]&0xf)<<4
				ql[64*h+32+l] = v[l+32]&0xf | (v[l+96]&0xf)<<4
				qh[32*h+l] = v[l]>>4 | (v[l+32]>>4)<<2 | (v[l+64]>>4)<<4 | (v[l+96]>>4)<<6
			}
		}
	}
	return out, nil
}

// roundClamp returns round(x/step) clamped to [lo, hi], 0 for a zero step
// or a NaN quotient.
func roundClamp(x, step float32, lo, hi int) int {
	if step == 0 {
		return max(lo, min(hi, 0))
	}
	r := math.Round(float64(x / step))
	if r != r {
		return max(lo, min(hi, 0))
	}
	return int(max(float64(lo), min(float64(hi), r)))
}

// code6 is the 6-bit code of v against step d (0 when d is 0).
func code6(v, d float32) uint8 { return uint8(roundClamp(v, d, 0, 63)) }

func abs32(v float32) float32 { return float32(math.Abs(float64(v))) }

// scaleSearchSteps is how many candidate grids, either side of the one
// that spans the data exactly, fitScaleMin and fitScale try.
const scaleSearchSteps = 8

// fitScaleMin fits x by scale*q - min with q integers in [0, nmax] and
// min >= 0 (the lowest value, or 0 when every value is positive): for a
// few grids around the one spanning [min(x,0), max(x)] it rounds x to the
// grid, fits scale and min to those q by weighted least squares, and keeps
// the pair of smallest weighted squared error. Value l weighs rms(x) +
// |x_l|: large weights matter more to a layer's output than their share
// of the plain squared error says (this weighting is llama.cpp's, and
// measurably lowers the perplexity of a quantized model).
func fitScaleMin(x []float32, nmax int) (scale, minv float32) {
	lo, hi := x[0], x[0]
	var sumSq float64
	for _, v := range x {
		lo, hi = min(lo, v), max(hi, v)
		sumSq += float64(v) * float64(v)
	}
	lo = min(lo, 0)
	if hi == lo {
		return 0, -lo
	}
	rms := math.Sqrt(sumSq / float64(len(x)))
	var wt [QK_K]float64
	for l, v := range x {
		wt[l] = rms + math.Abs(float64(v))
	}
	bestErr := math.Inf(1)
	scale, minv = (hi-lo)/float32(nmax), -lo
	for s := -scaleSearchSteps; s <= scaleSearchSteps; s++ {
		iscale := (float64(nmax) + 0.1*float64(s)) / float64(hi-lo)
		var sw, swq, swqq, swx, swxq float64
		for l, v := range x {
			q := math.Max(0, math.Min(float64(nmax), math.Round(iscale*float64(v-lo))))
			w := wt[l]
			sw += w
			swq += w * q
			swqq += w * q * q
			swx += w * float64(v)
			swxq += w * float64(v) * q
		}
		den := sw*swqq - swq*swq
		if den <= 0 {
			continue
		}
		a := (sw*swxq - swx*swq) / den
		b := (swx - a*swq) / sw // x ~ a*q + b
		if b > 0 {
			b, a = 0, swxq/swqq
		}
		if a <= 0 {
			continue
		}
		var e float64
		for l, v := range x {
			q := math.Max(0, math.Min(float64(nmax), math.Round((float64(v)-b)/a)))
			r := a*q + b - float64(v)
			e += wt[l] * r * r
		}
		if e < bestErr {
			bestErr, scale, minv = e, float32(a), float32(-b)
		}
	}
	return scale, minv
}

// fitScale fits x by scale*q with q integers in [-nmax, nmax-1]: the value
// of largest magnitude sets the sign of scale so that it maps to -nmax
// (the wider side), and a few grids around that one are rounded to and
// refitted by least squares weighted by x^2 (as llama.cpp weighs Q6_K's
// values), the best kept.
func fitScale(x []float32, nmax int) float32 {
	var m float32
	for _, v := range x {
		if abs32(v) > abs32(m) {
			m = v
		}
	}
	if m == 0 {
		return 0
	}
	best, bestFit := float32(0), -1.0
	for s := -scaleSearchSteps; s <= scaleSearchSteps; s++ {
		iscale := -(float64(nmax) + 0.1*float64(s)) / float64(m)
		var sxq, sqq float64
		for _, v := range x {
			q := math.Max(-float64(nmax), math.Min(float64(nmax-1), math.Round(iscale*float64(v))))
			w := float64(v) * float64(v)
			sxq += w * float64(v) * q
			sqq += w * q * q
		}
		// The weighted squared error of the least-squares scale sxq/sqq
		// is sum(w x^2) - sxq^2/sqq: the larger sxq^2/sqq, the better.
		if sqq > 0 && sxq*sxq/sqq > bestFit {
			bestFit, best = sxq*sxq/sqq, float32(sxq/sqq)
		}
	}
	return best
}

// dequantKMin decodes whole Q4_K or Q5_K blocks.
func dequantKMin(dt DType, src []byte, dst []float32) {
	t := f16Table()
	bb := dt.kBlockBytes()
	for blk := range len(dst) / QK_K {
		b := src[blk*bb : (blk+1)*bb]
		d, dmin := t[binary.LittleEndian.Uint16(b)], t[binary.LittleEndian.Uint16(b[2:])]
		scales := b[4:16]
		qs, qh := b[16:], []byte(nil)
		if dt == Q5_K {
			qh, qs = b[16:48], b[48:]
		}
		o := dst[blk*QK_K : (blk+1)*QK_K]
		for c := range 4 {
			sc0, m0 := KScaleMin(scales, 2*c)
			sc1, m1 := KScaleMin(scales, 2*c+1)
			d0, o0 := d*float32(sc0), dmin*float32(m0)
			d1, o1 := d*float32(sc1), dmin*float32(m1)
			q := qs[32*c : 32*c+32]
			for l := range 32 {
				lo, hi := q[l]&0xf, q[l]>>4
				if qh != nil {
					lo |= (qh[l] >> (2 * c) & 1) << 4
					hi |= (qh[l] >> (2*c + 1) & 1) << 4
				}
				o[64*c+l] = d0*float32(lo) - o0
				o[64*c+32+l] = d1*float32(hi) - o1
			}
		}
	}
}

// dequantQ6K decodes whole Q6_K blocks.
func dequantQ6K(src []byte, dst []float32) {
	t := f16Table()
	for blk := range len(dst) / QK_K {
		b := src[blk*210 : (blk+1)*210]
		d := t[binary.LittleEndian.Uint16(b[208:])]
		for h := range 2 {
			ql, qh := b[64*h:64*h+64], b[128+32*h:128+32*h+32]
			sc := b[192+8*h : 192+8*h+8]
			o := dst[blk*QK_K+128*h : blk*QK_K+128*h+128]
			for l := range 32 {
				is := l / 16
				q0 := int(ql[l]&0xf|(qh[l]&3)<<4) - 32
				q1 := int(ql[l+32]&0xf|(qh[l]>>2&3)<<4) - 32
				q2 := int(ql[l]>>4|(qh[l]>>4&3)<<4) - 32
				q3 := int(ql[l+32]>>4|(qh[l]>>6&3)<<4) - 32
				o[l] = d * float32(int8(sc[is])) * float32(q0)
				o[l+32] = d * float32(int8(sc[is+2])) * float32(q1)
				o[l+64] = d * float32(int8(sc[is+4])) * float32(q2)
				o[l+96] = d * float32(int8(sc[is+6])) * float32(q3)
			}
		}
	}
}

// Quantize encodes src in the block-quantized dtype dt (Q8_0, Q4_0 or a
// K-quant); len(src) must be a whole number of dt's blocks.
func Quantize(dt DType, src []float32) ([]byte, error) {
	switch dt {
	case Q8_0:
		return QuantizeQ8_0(src)
	case Q4_0:
		return QuantizeQ4_0(src)
	case Q4_K:
		return QuantizeQ4_K(src)
	case Q5_K:
		return QuantizeQ5_K(src)
	case Q6_K:
		return QuantizeQ6_K(src)
	}
	return nil, fmt.Errorf("quantize: %v is not a block-quantized dtype", dt)
}
