package cpu

import (
	"encoding/binary"
	"errors"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/trigon-llm/trigon/backend"
)

// The dtypes the tests sweep: every float dtype (activations elsewhere,
// KV caches, norm weights, embedding outputs) and every weight dtype.
var (
	floatDTypes  = []backend.DType{backend.F32, backend.F16, backend.BF16}
	weightDTypes = []backend.DType{backend.F32, backend.F16, backend.BF16, backend.Q8_0, backend.Q4_0}
)

// newRand returns a generator seeded from the test's name, so every test
// gets its own fresh inputs and a failure reproduces.
func newRand(t testing.TB) *rand.Rand {
	h := fnv.New64a()
	h.Write([]byte(t.Name()))
	return rand.New(rand.NewPCG(h.Sum64(), 0x9e3779b97f4a7c15))
}

func randFloats(r *rand.Rand, n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64() * scale)
	}
	return v
}

func f32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, f := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f))
	}
	return b
}

func i32Bytes(v []int32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(x))
	}
	return b
}

// encode returns v in dt's encoding, using the conversions under test
// (they have their own tests against independent references).
func encode(t testing.TB, dt backend.DType, v []float32) []byte {
	t.Helper()
	switch dt {
	case backend.F32:
		return f32Bytes(v)
	case backend.F16, backend.BF16:
		b := make([]byte, 2*len(v))
		for i, f := range v {
			h := backend.F32ToBF16(f)
			if dt == backend.F16 {
				h = backend.F32ToF16(f)
			}
			binary.LittleEndian.PutUint16(b[2*i:], h)
		}
		return b
	case backend.Q8_0:
		b, err := backend.QuantizeQ8_0(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	case backend.Q4_0:
		b, err := backend.QuantizeQ4_0(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	t.Fatalf("encode: dtype %v", dt)
	return nil
}

// refF16 decodes an IEEE half from its definition, in f64.
func refF16(h uint16) float64 {
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

// decodeRef decodes the bytes of n values of dtype dt straight from the
// layouts documented in backend/dtype.go, in f64, independently of the
// package's decoders.
func decodeRef(t testing.TB, dt backend.DType, b []byte, n int) []float64 {
	t.Helper()
	out := make([]float64, n)
	switch dt {
	case backend.F32:
		for i := range out {
			out[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
		}
	case backend.F16:
		for i := range out {
			out[i] = refF16(binary.LittleEndian.Uint16(b[2*i:]))
		}
	case backend.BF16:
		for i := range out {
			out[i] = float64(math.Float32frombits(uint32(binary.LittleEndian.Uint16(b[2*i:])) << 16))
		}
	case backend.Q8_0:
		for blk := 0; blk < n/32; blk++ {
			p := b[blk*34:]
			d := refF16(binary.LittleEndian.Uint16(p))
			for j := range 32 {
				out[blk*32+j] = d * float64(int8(p[2+j]))
			}
		}
	case backend.Q4_0:
		for blk := 0; blk < n/32; blk++ {
			p := b[blk*18:]
			d := refF16(binary.LittleEndian.Uint16(p))
			for j := range 16 {
				out[blk*32+j] = d * float64(int(p[2+j]&15)-8)
				out[blk*32+j+16] = d * float64(int(p[2+j]>>4)-8)
			}
		}
	default:
		t.Fatalf("decodeRef: dtype %v", dt)
	}
	return out
}

func upload(t testing.TB, b *Backend, dt backend.DType, shape []int, data []byte) backend.Tensor {
	t.Helper()
	x, err := b.Upload(dt, shape, data)
	if err != nil {
		t.Fatalf("upload %v %v: %v", dt, shape, err)
	}
	return x
}

func uploadF32(t testing.TB, b *Backend, v []float32, shape ...int) backend.Tensor {
	t.Helper()
	return upload(t, b, backend.F32, shape, f32Bytes(v))
}

func uploadI32(t testing.TB, b *Backend, v []int32, shape ...int) backend.Tensor {
	t.Helper()
	return upload(t, b, backend.I32, shape, i32Bytes(v))
}

// alloc returns a tensor filled with NaN-ish garbage so that an op that
// forgets to write an element is caught.
func alloc(t testing.TB, b *Backend, dt backend.DType, shape ...int) backend.Tensor {
	t.Helper()
	x, err := b.Alloc(dt, shape...)
	if err != nil {
		t.Fatalf("alloc %v %v: %v", dt, shape, err)
	}
	raw := x.(*tensor).data
	for i := range raw {
		raw[i] = 0xff // NaN in every float dtype
	}
	return x
}

func readF32(t testing.TB, b *Backend, x backend.Tensor) []float32 {
	t.Helper()
	buf := make([]byte, len(x.(*tensor).data))
	if err := b.Read(x, buf); err != nil {
		t.Fatal(err)
	}
	v := make([]float32, len(buf)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(buf[4*i:]))
	}
	return v
}

func widen(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, f := range v {
		out[i] = float64(f)
	}
	return out
}

// checkClose fails unless every got[i] is within tol of want[i], where tol
// is relative to scale[i] (the magnitude of the terms summed for element i;
// nil means |want[i]|) with an absolute floor.
func checkClose(t testing.TB, what string, got []float32, want, scale []float64, rel, abs float64) {
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

// relNorm is ||got - want|| / ||want||.
func relNorm(got []float32, want []float64) float64 {
	var num, den float64
	for i, w := range want {
		d := float64(got[i]) - w
		num += d * d
		den += w * w
	}
	return math.Sqrt(num / den)
}

func isShapeErr(err error) bool { return errors.Is(err, backend.ErrShape) }
