package cpu

import (
	"encoding/binary"

	"github.com/trigon-llm/trigon/backend"
)

// Products against the weight-quantized dtypes of backend/wquant.go. AWQ
// weights meet f32 activations as they are (W4A16: the activations are not
// quantized); prefill goes through the f32 GEMM, which decodes each panel
// of weight rows to f32 once (packPanel), and decode through dotAWQ4,
// which reads the packed nibbles directly. F8E4M3Row products first
// quantize each activation row to e4m3 with its own scale
// (backend.QuantizeActE4M3), as the GPU's FP8 GEMMs do, and then run the
// same way on the decoded values, so this backend is the oracle of the
// GPU's W8A8 path and not of an unquantized product.

// u4Table[b] holds the low and high nibbles of b as float32.
var u4Table = func() (t [256][2]float32) {
	for i := range t {
		t[i] = [2]float32{float32(i & 15), float32(i >> 4)}
	}
	return t
}()

// quantizeActF8 returns x's n rows of inF quantized to e4m3 per row and
// decoded back (b.xf8, reused by the next call).
func (b *Backend) quantizeActF8(x []float32, n, inF int) []float32 {
	if cap(b.xf8) < n*inF {
		b.xf8 = make([]float32, n*inF)
	}
	out := b.xf8[:n*inF]
	b.parallel(n, b.grainFor(n, minWork/max(1, inF)), func(_, lo, hi int) {
		for i := lo; i < hi; i++ {
			backend.QuantizeActE4M3(x[i*inF:(i+1)*inF], out[i*inF:(i+1)*inF])
		}
	})
	return out
}

// dotAWQ4 returns the dot product of an f32 row with a row of AWQ4 blocks
// of g: per block, scale * (sum x*q - zero * sum x).
func dotAWQ4(g int) func(x []float32, w []byte) float32 {
	bb := 4 + g/2
	return func(x []float32, w []byte) float32 {
		t := backend.F16Table()
		nb := len(x) / g
		w = w[:nb*bb]
		var sum float32
		for blk := range nb {
			b := w[blk*bb : (blk+1)*bb : (blk+1)*bb]
			q := b[4:bb:bb]
			xx := x[blk*g : (blk+1)*g : (blk+1)*g]
			var s0, s1, s2, s3, x0, x1 float32
			for j := 0; j+1 < len(q); j += 2 {
				p0, p1 := &u4Table[q[j]], &u4Table[q[j+1]]
				a, c, d, e := xx[2*j], xx[2*j+1], xx[2*j+2], xx[2*j+3]
				s0 += a * p0[0]
				s1 += c * p0[1]
				s2 += d * p1[0]
				s3 += e * p1[1]
				x0 += a + c
				x1 += d + e
			}
			s := t[binary.LittleEndian.Uint16(b)]
			z := t[binary.LittleEndian.Uint16(b[2:])]
			sum += s * (((s0 + s1) + (s2 + s3)) - z*(x0+x1))
		}
		return sum
	}
}

// dotF8Row returns the dot product of an f32 row (already quantized to
// e4m3 values by quantizeActF8) with an F8E4M3Row row, scaled once.
func dotF8Row(x []float32, w []byte) float32 {
	t := backend.E4M3Table()
	n := len(x)
	q := w[:n]
	var s0, s1, s2, s3 float32
	k := 0
	for ; k+3 < n; k += 4 {
		s0 += x[k] * t[q[k]]
		s1 += x[k+1] * t[q[k+1]]
		s2 += x[k+2] * t[q[k+2]]
		s3 += x[k+3] * t[q[k+3]]
	}
	for ; k < n; k++ {
		s0 += x[k] * t[q[k]]
	}
	return ((s0 + s1) + (s2 + s3)) * backend.F8RowScale(w[:n+16])
}
