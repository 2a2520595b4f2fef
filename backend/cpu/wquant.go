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
// of g. Per block it tabulates the 16 values (q - zero) * scale once (as
// dequantAWQ4 computes them) and looks every nibble up. Byte b of a word
// holds nibbles 2b and 2b+1, elements AWQOrder[2b] and AWQOrder[2b+1]:
// (0, 2), (4, 6), (1, 3), (5, 7).
func dotAWQ4(g int) func(x []float32, w []byte) float32 {
	bb := 4 + g/2
	return func(x []float32, w []byte) float32 {
		t := backend.F16Table()
		nb := len(x) / g
		w = w[:nb*bb]
		var sum float32
		var tab [16]float32
		for blk := range nb {
			b := w[blk*bb : (blk+1)*bb : (blk+1)*bb]
			s := t[binary.LittleEndian.Uint16(b)]
			z := t[binary.LittleEndian.Uint16(b[2:])]
			for i := range tab {
				tab[i] = (float32(i) - z) * s
			}
			q := b[4:bb:bb]
			xx := x[blk*g : (blk+1)*g : (blk+1)*g]
			var s0, s1, s2, s3 float32
			for j := 0; j+3 < len(q); j += 4 {
				xw := xx[2*j : 2*j+8 : 2*j+8]
				b0, b1, b2, b3 := q[j], q[j+1], q[j+2], q[j+3]
				s0 += xw[0]*tab[b0&15] + xw[2]*tab[b0>>4]
				s1 += xw[4]*tab[b1&15] + xw[6]*tab[b1>>4]
				s2 += xw[1]*tab[b2&15] + xw[3]*tab[b2>>4]
				s3 += xw[5]*tab[b3&15] + xw[7]*tab[b3>>4]
			}
			sum += (s0 + s1) + (s2 + s3)
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
