package backend

import (
	"encoding/binary"
	"testing"

	"github.com/trigon-llm/trigon/backend/backendtest"
)

// Helpers of the conversion tests; what backend/cpu's tests share with
// them is in backend/backendtest.

// encode returns v in dt's encoding, using the conversions under test
// (they have their own tests against independent references).
func encode(t testing.TB, dt DType, v []float32) []byte {
	t.Helper()
	switch dt {
	case F32:
		return f32Bytes(v)
	case F16, BF16:
		b := make([]byte, 2*len(v))
		for i, f := range v {
			h := F32ToBF16(f)
			if dt == F16 {
				h = F32ToF16(f)
			}
			binary.LittleEndian.PutUint16(b[2*i:], h)
		}
		return b
	case Q8_0:
		b, err := QuantizeQ8_0(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	case Q4_0:
		b, err := QuantizeQ4_0(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	t.Fatalf("encode: dtype %v", dt)
	return nil
}

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

func decodeRef(t testing.TB, dt DType, b []byte, n int) []float64 {
	return backendtest.DecodeRef(t, dt.String(), b, n)
}
