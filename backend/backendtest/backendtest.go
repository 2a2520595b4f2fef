// Package backendtest holds what the tests of package backend and of its
// backends share: seeded random inputs, tolerance checks, and reference
// decoders of the dtypes' byte layouts written from their definitions
// (backend/dtype.go), so they check the packages' own decoders
// independently. It imports nothing of the project, so package backend's
// internal tests can use it too.
package backendtest

import (
	"encoding/binary"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"testing"
)

// NewRand returns a generator seeded from the test's name, so every test
// gets its own fresh inputs and a failure reproduces.
func NewRand(t testing.TB) *rand.Rand {
	h := fnv.New64a()
	h.Write([]byte(t.Name()))
	return rand.New(rand.NewPCG(h.Sum64(), 0x9e3779b97f4a7c15))
}

// RandFloats returns n normal values of standard deviation scale.
func RandFloats(r *rand.Rand, n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64() * scale)
	}
	return v
}

// F32Bytes is v's little-endian F32 encoding.
func F32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, f := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f))
	}
	return b
}

// RefF16 decodes an IEEE half from its definition, in f64.
func RefF16(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	exp, man := int(h>>10)&0x1f, float64(h&0x3ff)
	switch exp {
	case 0:
		return sign * man * math.Pow(2, -24)
	case 0x1f:
		if man == 0 {
			return sign * math.Inf(1)
		}
		return math.NaN()
	}
	return sign * (1 + man/1024) * math.Pow(2, float64(exp-15))
}

// DecodeRef decodes the bytes of n values of the dtype named dt (its
// String: F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K) straight from the
// documented layouts, in f64, element by element.
func DecodeRef(t testing.TB, dt string, b []byte, n int) []float64 {
	t.Helper()
	out := make([]float64, n)
	switch dt {
	case "F32":
		for i := range out {
			out[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
		}
	case "F16":
		for i := range out {
			out[i] = RefF16(binary.LittleEndian.Uint16(b[2*i:]))
		}
	case "BF16":
		for i := range out {
			out[i] = float64(math.Float32frombits(uint32(binary.LittleEndian.Uint16(b[2*i:])) << 16))
		}
	case "Q8_0":
		for blk := 0; blk < n/32; blk++ {
			p := b[blk*34:]
			d := RefF16(binary.LittleEndian.Uint16(p))
			for j := range 32 {
				out[blk*32+j] = d * float64(int8(p[2+j]))
			}
		}
	case "Q4_0":
		for blk := 0; blk < n/32; blk++ {
			p := b[blk*18:]
			d := RefF16(binary.LittleEndian.Uint16(p))
			for j := range 16 {
				out[blk*32+j] = d * float64(int(p[2+j]&15)-8)
				out[blk*32+j+16] = d * float64(int(p[2+j]>>4)-8)
			}
		}
	case "Q4_K", "Q5_K", "Q6_K":
		decodeKRef(dt, b, out)
	default:
		t.Fatalf("DecodeRef: dtype %s", dt)
	}
	return out
}

// Widen converts v to f64.
func Widen(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, f := range v {
		out[i] = float64(f)
	}
	return out
}

// CheckClose fails unless every got[i] is within tol of want[i], where tol
// is relative to scale[i] (the magnitude of the terms summed for element i;
// nil means |want[i]|) with an absolute floor.
func CheckClose(t testing.TB, what string, got []float32, want, scale []float64, rel, abs float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: got %d values, want %d", what, len(got), len(want))
	}
	bad := 0
	for i := range want {
		s := math.Abs(want[i])
		if scale != nil {
			s = scale[i]
		}
		if d := math.Abs(float64(got[i]) - want[i]); !(d <= rel*s+abs) {
			if bad++; bad <= 5 {
				t.Errorf("%s[%d] = %v, want %v (diff %.3g, tol %.3g)", what, i, got[i], want[i], d, rel*s+abs)
			}
		}
	}
	if bad > 5 {
		t.Errorf("%s: %d of %d values differ", what, bad, len(want))
	}
}

// RelNorm is ||got - want|| / ||want||.
func RelNorm(got []float32, want []float64) float64 {
	var num, den float64
	for i, w := range want {
		d := float64(got[i]) - w
		num += d * d
		den += w * w
	}
	return math.Sqrt(num / den)
}

// decodeKRef decodes K-quant super-blocks of 256 values, computing each
// element's position in the block from the layout's description.
func decodeKRef(dt string, b []byte, out []float64) {
	le := binary.LittleEndian
	for blk := 0; blk < len(out)/256; blk++ {
		o := out[blk*256 : blk*256+256]
		if dt == "Q6_K" {
			p := b[blk*210:]
			ql, qh, sc := p[:128], p[128:192], p[192:208]
			d := RefF16(le.Uint16(p[208:]))
			for i := range o {
				h, g, l := i/128, i%128/32, i%32
				lowByte := ql[64*h+32*(g%2)+l]
				low := int(lowByte & 15)
				if g >= 2 {
					low = int(lowByte >> 4)
				}
				high := int(qh[32*h+l]>>(2*g)) & 3
				o[i] = d * float64(int8(sc[i/16])) * float64(low|high<<4-32)
			}
			continue
		}
		size, qsAt := 144, 16
		if dt == "Q5_K" {
			size, qsAt = 176, 48
		}
		p := b[blk*size:]
		d, dmin := RefF16(le.Uint16(p)), RefF16(le.Uint16(p[2:]))
		s := p[4:16]
		for i := range o {
			c, upper, l := i/64, i%64/32, i%32
			j := 2*c + upper
			var sc, m int
			if j < 4 {
				sc, m = int(s[j]&63), int(s[j+4]&63)
			} else {
				sc = int(s[j+4]&15) | int(s[j-4]>>6)<<4
				m = int(s[j+4]>>4) | int(s[j]>>6)<<4
			}
			q := int(p[qsAt+32*c+l]>>(4*upper)) & 15
			if dt == "Q5_K" {
				q += 16 * (int(p[16+l]>>j) & 1)
			}
			o[i] = d*float64(sc)*float64(q) - dmin*float64(m)
		}
	}
}
