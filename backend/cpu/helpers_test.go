package cpu

import (
	"encoding/binary"
	"errors"
	"math"
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/backendtest"
)

// The dtypes the tests sweep: every float dtype (activations elsewhere,
// KV caches, norm weights, embedding outputs) and every weight dtype.
var (
	floatDTypes  = []backend.DType{backend.F32, backend.F16, backend.BF16}
	weightDTypes = []backend.DType{backend.F32, backend.F16, backend.BF16, backend.Q8_0, backend.Q4_0}
)

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
	case backend.Q4_K, backend.Q5_K, backend.Q6_K:
		b, err := backend.Quantize(dt, v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	t.Fatalf("encode: dtype %v", dt)
	return nil
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

func isShapeErr(err error) bool { return errors.Is(err, backend.ErrShape) }

// The shared helpers under this package's names (backend/backendtest).
var (
	newRand    = backendtest.NewRand
	randFloats = backendtest.RandFloats
	f32Bytes   = backendtest.F32Bytes
	refF16     = backendtest.RefF16
	widen      = backendtest.Widen
	checkClose = backendtest.CheckClose
	relNorm    = backendtest.RelNorm
)

func decodeRef(t testing.TB, dt backend.DType, b []byte, n int) []float64 {
	return backendtest.DecodeRef(t, dt.String(), b, n)
}
