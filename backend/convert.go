package backend

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync"
)

// This file holds the host-side conversions between F32 and the encodings
// of dtype.go: weight loading, GGUF conversion, benchmarks' synthetic
// weights, the CPU backend's kernels and tests all use these, so each
// rounding rule exists once.

// F32ToBF16 rounds f to bfloat16, nearest-even. NaN stays NaN (made quiet,
// sign kept); overflow rounds to infinity as IEEE rounding does.
func F32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x0040
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// BF16ToF32 widens a bfloat16 exactly.
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F16ToF32 widens an IEEE half exactly, subnormals, infinities and NaN
// payloads included.
func F16ToF32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	man := uint32(h) & 0x3ff
	switch exp {
	case 0:
		// Zero or subnormal: man * 2^-24, exact in f32.
		f := float32(man) * (1.0 / (1 << 24))
		return math.Float32frombits(math.Float32bits(f) | sign)
	case 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	}
	return math.Float32frombits(sign | (exp+112)<<23 | man<<13)
}

// F32ToF16 rounds f to an IEEE half, nearest-even, producing subnormals
// below 2^-14, infinity past 65504 (after rounding) and a quiet NaN for NaN.
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	man := b & 0x7fffff
	if exp == 0xff {
		if man == 0 {
			return sign | 0x7c00
		}
		return sign | 0x7e00 | uint16(man>>13)
	}
	e := exp - 127 + 15 // half's biased exponent
	switch {
	case e >= 0x1f:
		return sign | 0x7c00
	case e <= 0:
		// Half subnormal (or zero): value = m * 2^-24 with the implicit
		// bit made explicit. Below 2^-25 everything rounds to zero.
		if e < -10 {
			return sign
		}
		full := man | 0x800000
		shift := uint32(14 - e)
		m := full >> shift
		rem := full & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rem > half || (rem == half && m&1 == 1) {
			m++ // may carry into the smallest normal: still the right encoding
		}
		return sign | uint16(m)
	}
	h := uint32(e)<<10 | man>>13
	rem := man & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && h&1 == 1) {
		h++ // a carry into the exponent is correct, up to infinity
	}
	return sign | uint16(h)
}

// F16Table returns the f32 value of every half, indexed by its encoding:
// a 256 KiB table, built on first use, is the fastest pure-Go widening and
// fits in L2 next to a weight tile (the CPU backend's kernels index it per
// element). The table is shared: callers must not modify it.
func F16Table() *[1 << 16]float32 { return f16Table() }

var f16Table = sync.OnceValue(func() *[1 << 16]float32 {
	var t [1 << 16]float32
	for i := range t {
		t[i] = F16ToF32(uint16(i))
	}
	return &t
})

const qk = 32 // elements per Q8_0 / Q4_0 block

// QuantizeQ8_0 encodes src as GGML Q8_0 blocks: per 32 values the scale
// d = max|x|/127 (stored as f16) and q = round(x/d), rounding half away from
// zero as GGML's reference quantizer does. len(src) must be a multiple of 32.
func QuantizeQ8_0(src []float32) ([]byte, error) {
	if len(src)%qk != 0 {
		return nil, fmt.Errorf("quantize Q8_0: %d values are not a whole number of %d-value blocks", len(src), qk)
	}
	out := make([]byte, len(src)/qk*34)
	for blk := 0; blk < len(src)/qk; blk++ {
		x := src[blk*qk : blk*qk+qk]
		o := out[blk*34 : blk*34+34]
		var amax float32
		for _, v := range x {
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		d := amax / 127
		var id float32
		if d != 0 {
			id = 1 / d
		}
		binary.LittleEndian.PutUint16(o, F32ToF16(d))
		for j, v := range x {
			q := math.Round(float64(v * id))
			if q != q { // NaN input or an infinite scale
				q = 0
			}
			o[2+j] = byte(int8(min(127, max(-128, q))))
		}
	}
	return out, nil
}

// QuantizeQ4_0 encodes src as GGML Q4_0 blocks: per 32 values the scale
// d = m/-8 where m is the value of largest magnitude (sign kept, so m maps
// to nibble 0), and nibble = min(15, trunc(x/d + 8.5)); value j goes to the
// low nibble of byte j, value j+16 to its high nibble. len(src) must be a
// multiple of 32.
func QuantizeQ4_0(src []float32) ([]byte, error) {
	if len(src)%qk != 0 {
		return nil, fmt.Errorf("quantize Q4_0: %d values are not a whole number of %d-value blocks", len(src), qk)
	}
	out := make([]byte, len(src)/qk*18)
	nibble := func(v, id float32) byte {
		x := float64(float32(v*id) + 8.5) // no fused multiply-add: GGML rounds the product
		if x != x || x < 0 {
			return 0
		}
		return byte(min(15, int(x)))
	}
	for blk := 0; blk < len(src)/qk; blk++ {
		x := src[blk*qk : blk*qk+qk]
		o := out[blk*18 : blk*18+18]
		var amax, m float32
		for _, v := range x {
			if a := float32(math.Abs(float64(v))); a > amax {
				amax, m = a, v
			}
		}
		d := m / -8
		var id float32
		if d != 0 {
			id = 1 / d
		}
		binary.LittleEndian.PutUint16(o, F32ToF16(d))
		for j := range qk / 2 {
			o[2+j] = nibble(x[j], id) | nibble(x[j+qk/2], id)<<4
		}
	}
	return out, nil
}

// DequantizeRow decodes len(dst) values of dtype dt from src into dst.
// dt may be F32, F16, BF16, Q8_0, Q4_0, a K-quant or a wquant.go dtype;
// src must hold exactly that many values' encoding (one row, for
// F8E4M3Row).
func DequantizeRow(dt DType, src []byte, dst []float32) error {
	want, err := dt.RowBytes(len(dst))
	if err != nil {
		return fmt.Errorf("dequantize: %w", err)
	}
	if len(src) != want {
		return fmt.Errorf("dequantize %d %v values: got %d bytes, want %d: %w", len(dst), dt, len(src), want, ErrShape)
	}
	switch dt {
	case F32:
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	case F16:
		t := f16Table()
		for i := range dst {
			dst[i] = t[binary.LittleEndian.Uint16(src[2*i:])]
		}
	case BF16:
		for i := range dst {
			dst[i] = BF16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case Q8_0:
		dequantQ8(src, dst)
	case Q4_0:
		dequantQ4(src, dst)
	case Q4_K, Q5_K:
		dequantKMin(dt, src, dst)
	case Q6_K:
		dequantQ6K(src, dst)
	case AWQ4G32, AWQ4G64, AWQ4G128:
		dequantAWQ4(src, dst, AWQGroup(dt))
	case F8E4M3Row:
		dequantF8Row(src, dst)
	default:
		return fmt.Errorf("dequantize: dtype %v is not a float or weight type", dt)
	}
	return nil
}

// i8Table[b] is float32(int8(b)); q4Table[b] holds the low and high
// nibbles of b minus 8, as float32. A load is cheaper than an int-to-float
// conversion in Go's scalar code.
var (
	i8Table = func() (t [256]float32) {
		for i := range t {
			t[i] = float32(int8(uint8(i)))
		}
		return t
	}()
	q4Table = func() (t [256][2]float32) {
		for i := range t {
			t[i] = [2]float32{float32(i&15 - 8), float32(i>>4 - 8)}
		}
		return t
	}()
)

// dequantQ8 decodes whole Q8_0 blocks; len(src) = len(dst)/32*34.
func dequantQ8(src []byte, dst []float32) {
	t := f16Table()
	for blk := 0; blk < len(dst)/qk; blk++ {
		b := src[blk*34 : blk*34+34]
		d := t[uint16(b[0])|uint16(b[1])<<8]
		q := b[2:34]
		o := dst[blk*qk : blk*qk+qk]
		for j := range o {
			o[j] = d * i8Table[q[j]]
		}
	}
}

// dequantQ4 decodes whole Q4_0 blocks; len(src) = len(dst)/32*18.
func dequantQ4(src []byte, dst []float32) {
	t := f16Table()
	for blk := 0; blk < len(dst)/qk; blk++ {
		b := src[blk*18 : blk*18+18]
		d := t[uint16(b[0])|uint16(b[1])<<8]
		q := b[2:18]
		o := dst[blk*qk : blk*qk+qk]
		lo, hi := o[:16], o[16:32]
		for j := range q {
			p := &q4Table[q[j]]
			lo[j] = d * p[0]
			hi[j] = d * p[1]
		}
	}
}
