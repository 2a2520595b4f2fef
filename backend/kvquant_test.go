package backend_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/trigon-llm/trigon/backend"
)

// TestE4M3 checks the e4m3fn codec against a brute-force reference: every
// finite code decodes and re-encodes to itself, and random values (and
// the edges: halfway points, subnormals, saturation) encode to the
// nearest finite code, ties to the even mantissa, saturating at 448.
func TestE4M3(t *testing.T) {
	var finite []uint8
	for c := range 256 {
		v := backend.E4M3ToF32(uint8(c))
		if c&0x7F == 0x7F {
			if !math.IsNaN(float64(v)) {
				t.Errorf("code %#x decodes to %v, want NaN", c, v)
			}
			continue
		}
		if c&0x7F != 0 && backend.F32ToE4M3(v) != uint8(c) {
			t.Errorf("code %#x: %v encodes to %#x", c, v, backend.F32ToE4M3(v))
		}
		finite = append(finite, uint8(c))
	}
	if got := backend.E4M3ToF32(0x7E); got != 448 {
		t.Errorf("0x7E decodes to %v, want 448", got)
	}
	nearest := func(x float32) uint8 {
		best := uint8(0)
		bd := math.Inf(1)
		for _, c := range finite {
			if (c&0x80 != 0) != math.Signbit(float64(x)) {
				continue
			}
			d := math.Abs(float64(backend.E4M3ToF32(c)) - float64(x))
			if d < bd || (d == bd && c&1 == 0) {
				best, bd = c, d
			}
		}
		return best
	}
	r := rand.New(rand.NewPCG(1, 2))
	var xs []float32
	for range 2000 {
		xs = append(xs, float32(r.NormFloat64()*math.Exp2(float64(r.IntN(22)-12))))
	}
	for c := 1; c < 0x7E; c++ { // the halfway points between neighbours
		a, b := backend.E4M3ToF32(uint8(c)), backend.E4M3ToF32(uint8(c+1))
		xs = append(xs, (a+b)/2, -(a+b)/2)
	}
	xs = append(xs, 0, 447, 449, 1e6, -1e6, float32(math.Inf(1)), 1.0/1024, 1.0/512*1.5)
	for _, x := range xs {
		want := nearest(x)
		if math.Abs(float64(x)) >= 448 {
			want = nearest(float32(math.Copysign(448, float64(x))))
		}
		if got := backend.F32ToE4M3(x); got != want && !(got&0x7F == 0 && want&0x7F == 0) {
			t.Errorf("F32ToE4M3(%v) = %#x (%v), want %#x (%v)", x, got, backend.E4M3ToF32(got), want, backend.E4M3ToF32(want))
		}
	}
	if got := backend.F32ToE4M3(float32(math.NaN())); got != 0x7F {
		t.Errorf("NaN encodes to %#x, want 0x7F", got)
	}
}

// TestQuantizeGroups round-trips fresh random groups (some with an
// outlier 10-100x the rest, some constant, some zero) through the int8
// and int4 group codecs: every value decodes within half a quantization
// step of itself, the stored scale is the F16 of the group's range over
// the level count, and the extreme values use the end levels.
func TestQuantizeGroups(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{8, 16, 32, 128} {
		for trial := range 40 {
			x := make([]float32, n)
			for i := range x {
				x[i] = float32(r.NormFloat64())
			}
			switch trial % 4 {
			case 1:
				x[r.IntN(n)] *= float32(10 + r.IntN(91))
			case 2:
				for i := range x {
					x[i] = 0.75
				}
			case 3:
				clear(x)
			}
			lo, hi, amax := math.Inf(1), math.Inf(-1), 0.0
			for _, v := range x {
				lo, hi, amax = math.Min(lo, float64(v)), math.Max(hi, float64(v)), math.Max(amax, math.Abs(float64(v)))
			}
			q8 := make([]int8, n)
			s8 := float64(backend.F16ToF32(backend.QuantizeSym8(x, q8)))
			if want := float64(backend.F16ToF32(backend.F32ToF16(float32(amax / 127)))); s8 != want {
				t.Fatalf("int8 scale %v, want %v", s8, want)
			}
			q4 := make([]uint8, n)
			sb, zb := backend.QuantizeAsym4(x, q4)
			s4, z4 := float64(backend.F16ToF32(sb)), float64(backend.F16ToF32(zb))
			for i, v := range x {
				if e := math.Abs(float64(q8[i])*s8 - float64(v)); e > s8/2*1.002+1e-7 {
					t.Errorf("int8 n=%d: %v decodes to %v (scale %v)", n, v, float64(q8[i])*s8, s8)
				}
				if q4[i] > 15 {
					t.Fatalf("int4 level %d", q4[i])
				}
				// z is min rounded to F16, so the error bound adds that rounding.
				if e := math.Abs(float64(q4[i])*s4 + z4 - float64(v)); e > s4/2*1.002+math.Abs(z4-lo)+1e-7 {
					t.Errorf("int4 n=%d: %v decodes to %v (scale %v, zero %v)", n, v, float64(q4[i])*s4+z4, s4, z4)
				}
			}
			if s4 > 0 {
				for i, v := range x {
					if float64(v) == hi && q4[i] < 14 || float64(v) == lo && q4[i] > 1 {
						t.Errorf("int4 n=%d: extreme %v at level %d", n, v, q4[i])
					}
				}
			}
		}
	}
}
