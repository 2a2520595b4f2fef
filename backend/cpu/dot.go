package cpu

import (
	"math"

	"github.com/trigon-llm/trigon/backend"
)

// The fused dot products below read one weight row in its stored encoding
// (rows of whole blocks for the quantized types) against an f32 x row, for
// the decode path of MatMul. Integers are widened through small tables: a
// load is cheaper than an int-to-float conversion in Go's scalar code.

const qk = 32 // elements per Q8_0 / Q4_0 block

// i8Table[b] is float32(int8(b)).
var i8Table = func() (t [256]float32) {
	for i := range t {
		t[i] = float32(int8(uint8(i)))
	}
	return t
}()

// q4Table[b] holds the low and high nibbles of b minus 8, as float32.
var q4Table = func() (t [256][2]float32) {
	for i := range t {
		t[i] = [2]float32{float32(i&15 - 8), float32(i>>4 - 8)}
	}
	return t
}()

// fusedDot returns the dot kernel for weight rows of dtype dt.
func fusedDot(dt backend.DType) func(x []float32, w []byte) float32 {
	switch dt {
	case backend.F16:
		return dotF16
	case backend.BF16:
		return dotBF16
	case backend.Q8_0:
		return dotQ8
	case backend.Q4_0:
		return dotQ4
	case backend.AWQ4G32, backend.AWQ4G64, backend.AWQ4G128:
		return dotAWQ4(backend.AWQGroup(dt))
	case backend.F8E4M3Row:
		return dotF8Row
	}
	return func(x []float32, w []byte) float32 { return dot(x, bytesAs[float32](w)) }
}

func dotBF16(x []float32, wb []byte) float32 {
	n := len(x)
	w := bytesAs[uint16](wb)[:n]
	var s0, s1, s2, s3 float32
	k := 0
	for ; k+3 < n; k += 4 {
		s0 += x[k] * math.Float32frombits(uint32(w[k])<<16)
		s1 += x[k+1] * math.Float32frombits(uint32(w[k+1])<<16)
		s2 += x[k+2] * math.Float32frombits(uint32(w[k+2])<<16)
		s3 += x[k+3] * math.Float32frombits(uint32(w[k+3])<<16)
	}
	for ; k < n; k++ {
		s0 += x[k] * math.Float32frombits(uint32(w[k])<<16)
	}
	return (s0 + s1) + (s2 + s3)
}

func dotF16(x []float32, wb []byte) float32 {
	t := backend.F16Table()
	n := len(x)
	w := bytesAs[uint16](wb)[:n]
	var s0, s1, s2, s3 float32
	k := 0
	for ; k+3 < n; k += 4 {
		s0 += x[k] * t[w[k]]
		s1 += x[k+1] * t[w[k+1]]
		s2 += x[k+2] * t[w[k+2]]
		s3 += x[k+3] * t[w[k+3]]
	}
	for ; k < n; k++ {
		s0 += x[k] * t[w[k]]
	}
	return (s0 + s1) + (s2 + s3)
}

// dotQ8 sums each block's integer-weighted x in f32 and scales it once.
func dotQ8(x []float32, w []byte) float32 {
	t := backend.F16Table()
	nb := len(x) / qk
	w = w[:nb*34]
	var sum float32
	for blk := range nb {
		b := w[blk*34 : blk*34+34 : blk*34+34]
		q := b[2:34:34]
		xx := x[blk*qk : blk*qk+qk : blk*qk+qk]
		var s0, s1, s2, s3 float32
		for j := 0; j < qk; j += 4 {
			s0 += xx[j] * i8Table[q[j]]
			s1 += xx[j+1] * i8Table[q[j+1]]
			s2 += xx[j+2] * i8Table[q[j+2]]
			s3 += xx[j+3] * i8Table[q[j+3]]
		}
		sum += t[uint16(b[0])|uint16(b[1])<<8] * ((s0 + s1) + (s2 + s3))
	}
	return sum
}

// dotQ4 is dotQ8 for Q4_0: byte j holds values j (low nibble) and j+16.
func dotQ4(x []float32, w []byte) float32 {
	t := backend.F16Table()
	nb := len(x) / qk
	w = w[:nb*18]
	var sum float32
	for blk := range nb {
		b := w[blk*18 : blk*18+18 : blk*18+18]
		q := b[2:18:18]
		lo := x[blk*qk : blk*qk+16 : blk*qk+16]
		hi := x[blk*qk+16 : blk*qk+32 : blk*qk+32]
		var s0, s1, s2, s3 float32
		for j := 0; j < 16; j += 2 {
			p0, p1 := &q4Table[q[j]], &q4Table[q[j+1]]
			s0 += lo[j] * p0[0]
			s1 += hi[j] * p0[1]
			s2 += lo[j+1] * p1[0]
			s3 += hi[j+1] * p1[1]
		}
		sum += t[uint16(b[0])|uint16(b[1])<<8] * ((s0 + s1) + (s2 + s3))
	}
	return sum
}
