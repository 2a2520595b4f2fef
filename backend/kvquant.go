package backend

import "math"

// The element codecs of the quantized KV formats (KVSpec says where the
// scales live). They are the reference every backend's kernels must match
// bit for bit on the stored bytes: rounding is to nearest, ties to even,
// and a value is always quantized with its scale already rounded to the
// dtype the scale is stored in.

// E4M3Max is the largest finite e4m3fn value.
const E4M3Max = 448

// F32ToE4M3 encodes f as e4m3fn, rounding to nearest even; magnitudes
// past 448 (infinities included) saturate to +-448 and NaN becomes 0x7F.
func F32ToE4M3(f float32) uint8 {
	if f != f {
		return 0x7F
	}
	var sign uint8
	if math.Signbit(float64(f)) {
		sign, f = 0x80, -f
	}
	a := float64(f)
	if a >= E4M3Max {
		return sign | 0x7E
	}
	if a < 1.0/64 { // subnormals: steps of 2^-9; 8 steps is the smallest normal, code 0x08
		return sign | uint8(math.RoundToEven(a*512))
	}
	frac, exp := math.Frexp(a)       // a = frac * 2^exp, frac in [0.5, 1)
	q := math.RoundToEven(frac * 16) // 8..16: the implicit bit and three mantissa bits
	e := exp - 1 + 7
	if q == 16 {
		q, e = 8, e+1
	}
	code := uint8(e)<<3 | uint8(q-8)
	if code > 0x7E {
		code = 0x7E
	}
	return sign | code
}

// E4M3ToF32 decodes an e4m3fn byte.
func E4M3ToF32(b uint8) float32 {
	e, m := int(b>>3)&0xF, float64(b&7)
	var v float64
	switch {
	case e == 0xF && m == 7:
		v = math.NaN()
	case e == 0:
		v = m / 512
	default:
		v = math.Ldexp(1+m/8, e-7)
	}
	if b&0x80 != 0 {
		v = -v
	}
	return float32(v)
}

// QuantizeSym8 quantizes the group x symmetrically into q (len(x)):
// s = f16(max|x|/127), q = clamp(round(x/s), -127, 127); it returns s's F16
// bits. x ~ q*s.
func QuantizeSym8(x []float32, q []int8) uint16 {
	var amax float32
	for _, v := range x {
		amax = max(amax, float32(math.Abs(float64(v))))
	}
	sb := F32ToF16(amax / 127)
	s := F16ToF32(sb)
	for i, v := range x {
		q[i] = int8(quantStep(v, 0, s, -127, 127))
	}
	return sb
}

// QuantizeAsym4 quantizes the group x asymmetrically into q (len(x), one
// value 0..15 a byte): s = f16((max-min)/15), z = f16(min),
// q = clamp(round((x-z)/s), 0, 15); it returns the F16 bits of s and z.
// x ~ q*s + z.
func QuantizeAsym4(x []float32, q []uint8) (scale, zero uint16) {
	lo, hi := float32(math.Inf(1)), float32(math.Inf(-1))
	for _, v := range x {
		lo, hi = min(lo, v), max(hi, v)
	}
	sb, zb := F32ToF16((hi-lo)/15), F32ToF16(lo)
	s, z := F16ToF32(sb), F16ToF32(zb)
	for i, v := range x {
		q[i] = uint8(quantStep(v, z, s, 0, 15))
	}
	return sb, zb
}

// quantStep is clamp(round((v-z)/s), lo, hi), 0 when s is 0 (or not a
// positive finite number: a group of equal values, or of values too small
// for an F16 scale) or the quotient is NaN.
func quantStep(v, z, s float32, lo, hi int) int {
	if !(s > 0) || math.IsInf(float64(s), 0) {
		return max(lo, 0)
	}
	r := math.RoundToEven(float64((v - z) / s))
	if r != r {
		return max(lo, 0)
	}
	return int(min(max(r, float64(lo)), float64(hi)))
}
