package cpu

import (
	"math"

	"github.com/trigon-llm/trigon/backend"
)

// toFloat32 converts plain-typed src (F32, F16 or BF16 encoding viewed as
// raw bytes) into dst; a helper for the ops that read K/V caches and norm
// weights row by row.
func toFloat32(dt backend.DType, src []byte, dst []float32) {
	switch dt {
	case backend.F32:
		copy(dst, bytesAs[float32](src))
	case backend.BF16:
		s := bytesAs[uint16](src)[:len(dst)]
		for i := range dst {
			dst[i] = math.Float32frombits(uint32(s[i]) << 16)
		}
	case backend.F16:
		t := backend.F16Table()
		s := bytesAs[uint16](src)[:len(dst)]
		for i := range dst {
			dst[i] = t[s[i]]
		}
	default:
		// Callers validate dtypes; quantized sources take this path.
		_ = backend.DequantizeRow(dt, src, dst)
	}
}

// fromFloat32 encodes src into dst's dtype dt (F32, F16 or BF16).
func fromFloat32(dt backend.DType, src []float32, dst []byte) {
	switch dt {
	case backend.F32:
		copy(bytesAs[float32](dst), src)
	case backend.BF16:
		d := bytesAs[uint16](dst)[:len(src)]
		for i, v := range src {
			d[i] = backend.F32ToBF16(v)
		}
	case backend.F16:
		d := bytesAs[uint16](dst)[:len(src)]
		for i, v := range src {
			d[i] = backend.F32ToF16(v)
		}
	}
}
