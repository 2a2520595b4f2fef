package backend

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Weight-only quantized dtypes of pre-quantized Hugging Face checkpoints:
// AWQ's 4-bit groups (W4A16) and FP8 e4m3 weights with a scale per output
// feature (W8A8, activations quantized per token at run time). Loaders
// repack the checkpoint's tensors into these layouts (model/quantized.go);
// every backend reads only these.
//
// Their codes start at 40 so that dtypes added elsewhere with iota never
// collide with them.
//
// AWQ4G32, AWQ4G64, AWQ4G128: a row of a [outFeatures, inFeatures] weight
// is blocks of g = 32, 64 or 128 consecutive inputs, each block
//
//	{f16 scale; f16 zero; u32 qs[g/8]}   4 + g/2 bytes (20, 36, 68)
//
// where little-endian word w of qs holds elements 8w..8w+7, nibble i (bits
// 4i..4i+3) holding element 8w + AWQOrder[i] (AutoAWQ's interleave: the
// nibble pairs (i, i+4) are consecutive elements, which a GPU widens to a
// pair of 16-bit floats with one mask), zero is the group's zero point (an
// integer 0..15, exact in f16), and element k = (q[k] - zero) * scale,
// computed in f32. Blocks are self-contained, so rows concatenate and any
// run of whole blocks decodes on its own; block sizes are multiples of 4,
// so on a 4-byte aligned row every word is 4-byte aligned.
//
// F8E4M3Row: each row of inFeatures (a multiple of 16) e4m3fn values is
// followed by a 16-byte trailer: the row's f32 scale, then 12 zero bytes.
// Element k = e4m3(q[k]) * scale. The row stride, inFeatures + 16, keeps
// every row 16-byte aligned so the value bytes form a strided matrix that
// FP8 GEMM libraries read in place (leading dimension inFeatures + 16).
// A row is the unit: RowBytes(n) is n + 16 for one row of n, so decoding
// several rows as one run is refused (the byte count does not match)
// rather than misread. Per-tensor scales are stored in every row.
// Products against F8E4M3Row quantize each activation row to e4m3 with its
// own scale (max|x|/448, QuantizeActE4M3) before the dot product, as
// vLLM's dynamic FP8 does; the CPU backend does the same so that it is the
// oracle of the GPU kernels.
const (
	AWQ4G32 DType = iota + 40
	AWQ4G64
	AWQ4G128
	F8E4M3Row
)

// AWQOrder[i] is the element (of 8) that nibble i of an AWQ4 word holds.
var AWQOrder = [8]int{0, 2, 4, 6, 1, 3, 5, 7}

// f8RowTrailer is the bytes after each F8E4M3Row row.
const f8RowTrailer = 16

// AWQGroup returns the group size of an AWQ4 dtype, 0 for any other.
func AWQGroup(d DType) int {
	switch d {
	case AWQ4G32:
		return 32
	case AWQ4G64:
		return 64
	case AWQ4G128:
		return 128
	}
	return 0
}

// AWQDType returns the AWQ4 dtype of group size g (32, 64 or 128).
func AWQDType(g int) (DType, error) {
	switch g {
	case 32:
		return AWQ4G32, nil
	case 64:
		return AWQ4G64, nil
	case 128:
		return AWQ4G128, nil
	}
	return 0, fmt.Errorf("awq group size %d: want 32, 64 or 128", g)
}

// wquantBlock returns the block size and bytes of the dtypes of this
// file, (0, 0) for others.
func wquantBlock(d DType) (size, bytes int) {
	if g := AWQGroup(d); g != 0 {
		return g, 4 + g/2
	}
	if d == F8E4M3Row {
		return 16, 16
	}
	return 0, 0
}

// wquantName returns the names of the dtypes of this file.
func wquantName(d DType) (string, bool) {
	switch d {
	case AWQ4G32:
		return "AWQ4_G32", true
	case AWQ4G64:
		return "AWQ4_G64", true
	case AWQ4G128:
		return "AWQ4_G128", true
	case F8E4M3Row:
		return "F8_E4M3_ROW", true
	}
	return "", false
}

// PackAWQ4 writes one row of AWQ4 blocks of group g into dst (RowBytes
// of len(q) bytes): q holds the row's 4-bit values (0..15, one a byte),
// scales and zeros one entry per group (scales as f16 bits, zeros 0..15).
func PackAWQ4(dst []byte, q []uint8, scales []uint16, zeros []uint8, g int) error {
	if g <= 0 || len(q)%g != 0 || len(scales) != len(q)/g || len(zeros) != len(q)/g {
		return fmt.Errorf("pack awq4: %d values, %d scales, %d zeros for groups of %d: %w", len(q), len(scales), len(zeros), g, ErrShape)
	}
	bb := 4 + g/2
	if len(dst) != len(q)/g*bb {
		return fmt.Errorf("pack awq4: dst holds %d bytes, want %d: %w", len(dst), len(q)/g*bb, ErrShape)
	}
	for b := range scales {
		o := dst[b*bb : (b+1)*bb]
		if zeros[b] > 15 {
			return fmt.Errorf("pack awq4: zero point %d of group %d is not 4-bit: %w", zeros[b], b, ErrShape)
		}
		binary.LittleEndian.PutUint16(o, scales[b])
		binary.LittleEndian.PutUint16(o[2:], F32ToF16(float32(zeros[b])))
		qs := q[b*g : (b+1)*g]
		for w := range g / 8 {
			var word uint32
			for i, e := range AWQOrder {
				v := qs[8*w+e]
				if v > 15 {
					return fmt.Errorf("pack awq4: value of group %d is not 4-bit: %w", b, ErrShape)
				}
				word |= uint32(v) << (4 * i)
			}
			binary.LittleEndian.PutUint32(o[4+4*w:], word)
		}
	}
	return nil
}

// QuantizeAWQ4 quantizes a row round-to-nearest into 4-bit groups of g
// with a zero point, as AutoAWQ's pseudo-quantizer does without its
// activation-aware search: per group, over the range [min, max] widened to
// hold 0 (so a constant group stays exact within a step), scale =
// (max - min) / 15 rounded to f16 (1 for a group of zeros), zero =
// clamp(round(-min / scale), 0, 15), q = clamp(round(x / scale) + zero,
// 0, 15). It returns the values, scales (f16 bits) and zeros PackAWQ4
// takes.
func QuantizeAWQ4(src []float32, g int) (q []uint8, scales []uint16, zeros []uint8, err error) {
	if g <= 0 || len(src)%g != 0 {
		return nil, nil, nil, fmt.Errorf("quantize awq4: %d values are not whole groups of %d: %w", len(src), g, ErrShape)
	}
	n := len(src) / g
	q, scales, zeros = make([]uint8, len(src)), make([]uint16, n), make([]uint8, n)
	for b := range n {
		x := src[b*g : (b+1)*g]
		var lo, hi float32
		for _, v := range x {
			if v != v || math.IsInf(float64(v), 0) {
				return nil, nil, nil, fmt.Errorf("quantize awq4: value %v is not finite", v)
			}
			lo, hi = min(lo, v), max(hi, v)
		}
		s := F16ToF32(F32ToF16((hi - lo) / 15))
		if s == 0 {
			s = 1
		}
		z := min(15, max(0, math.Round(float64(-lo/s))))
		scales[b], zeros[b] = F32ToF16(s), uint8(z)
		for j, v := range x {
			q[b*g+j] = uint8(min(15, max(0, math.Round(float64(v/s))+z)))
		}
	}
	return q, scales, zeros, nil
}

// EncodeAWQ4 quantizes one row (QuantizeAWQ4) into AWQ4 blocks of g.
func EncodeAWQ4(src []float32, g int) ([]byte, error) {
	q, s, z, err := QuantizeAWQ4(src, g)
	if err != nil {
		return nil, err
	}
	out := make([]byte, len(src)/g*(4+g/2))
	return out, PackAWQ4(out, q, s, z, g)
}

// dequantAWQ4 decodes whole AWQ4 blocks of g; len(src) = len(dst)/g*(4+g/2).
func dequantAWQ4(src []byte, dst []float32, g int) {
	t := f16Table()
	bb := 4 + g/2
	for blk := 0; blk < len(dst)/g; blk++ {
		b := src[blk*bb : (blk+1)*bb]
		s := t[binary.LittleEndian.Uint16(b)]
		z := t[binary.LittleEndian.Uint16(b[2:])]
		var tab [16]float32 // the block's 16 values, computed once
		for i := range tab {
			tab[i] = (float32(i) - z) * s
		}
		o := dst[blk*g : (blk+1)*g]
		for w := range g / 8 {
			q := b[4+4*w : 8+4*w : 8+4*w]
			ow := o[8*w : 8*w+8 : 8*w+8]
			// Byte j holds nibbles 2j, 2j+1: elements AWQOrder[2j], AWQOrder[2j+1].
			ow[0], ow[2] = tab[q[0]&15], tab[q[0]>>4]
			ow[4], ow[6] = tab[q[1]&15], tab[q[1]>>4]
			ow[1], ow[3] = tab[q[2]&15], tab[q[2]>>4]
			ow[5], ow[7] = tab[q[3]&15], tab[q[3]>>4]
		}
	}
}

// E4M3Table returns the f32 value of every e4m3fn byte (NaN for 0x7F and
// 0xFF). The table is shared: callers must not modify it.
func E4M3Table() *[256]float32 { return &e4m3Table }

var e4m3Table = func() (t [256]float32) {
	for i := range t {
		t[i] = E4M3ToF32(uint8(i))
	}
	return t
}()

// F8RowScale returns the scale of an F8E4M3Row row (RowBytes(n) bytes).
func F8RowScale(row []byte) float32 {
	return math.Float32frombits(binary.LittleEndian.Uint32(row[len(row)-f8RowTrailer:]))
}

// PackF8E4M3Row writes one F8E4M3Row row: q (e4m3 bytes, a multiple of 16)
// and its scale.
func PackF8E4M3Row(dst, q []byte, scale float32) error {
	if len(q)%16 != 0 || len(dst) != len(q)+f8RowTrailer {
		return fmt.Errorf("pack f8 row: %d values into %d bytes: %w", len(q), len(dst), ErrShape)
	}
	copy(dst, q)
	tr := dst[len(q):]
	clear(tr)
	binary.LittleEndian.PutUint32(tr, math.Float32bits(scale))
	return nil
}

// EncodeF8E4M3Row quantizes one row to e4m3 with scale (max|x|/448 when
// scale is 0: a scale per output feature) into an F8E4M3Row row.
func EncodeF8E4M3Row(src []float32, scale float32) ([]byte, error) {
	if len(src)%16 != 0 {
		return nil, fmt.Errorf("encode f8 row: %d values are not a multiple of 16: %w", len(src), ErrShape)
	}
	if scale == 0 {
		scale = E4M3Scale(src)
	}
	q := make([]byte, len(src))
	inv := 1 / scale
	for i, v := range src {
		q[i] = F32ToE4M3(v * inv)
	}
	out := make([]byte, len(src)+f8RowTrailer)
	return out, PackF8E4M3Row(out, q, scale)
}

// E4M3Scale returns max|x|/448, the scale that maps x's largest magnitude
// to e4m3's largest finite value, or 1 when x is all zeros (any scale
// encodes zeros exactly; 1 keeps 1/scale finite). A NaN is ignored.
func E4M3Scale(x []float32) float32 {
	var amax float32
	for _, v := range x {
		if a := float32(math.Abs(float64(v))); a > amax { // false for NaN
			amax = a
		}
	}
	if amax == 0 || math.IsInf(float64(amax), 0) {
		return 1
	}
	return amax / E4M3Max
}

// QuantizeActE4M3 is the activation side of an F8E4M3Row product: it
// quantizes x to e4m3 with scale = E4M3Scale(x) and writes, into dst, the
// values the product multiplies (e4m3(x/scale) * scale, in f32), returning
// the scale. GPU kernels compute the same codes from their BF16
// activations; dst may be x.
func QuantizeActE4M3(x, dst []float32) float32 {
	s := E4M3Scale(x)
	inv := 1 / s
	t := E4M3Table()
	for i, v := range x {
		dst[i] = t[F32ToE4M3(v*inv)] * s
	}
	return s
}

// dequantF8Row decodes one F8E4M3Row row; len(src) = len(dst)+16.
func dequantF8Row(src []byte, dst []float32) {
	s := F8RowScale(src)
	t := E4M3Table()
	for i := range dst {
		dst[i] = t[src[i]] * s
	}
}

// DequantizeRows decodes a whole [rows, cols] tensor of dtype dt, row by
// row (the unit of F8E4M3Row), into a new slice.
func DequantizeRows(dt DType, src []byte, rows, cols int) ([]float32, error) {
	rb, err := dt.RowBytes(cols)
	if err != nil {
		return nil, err
	}
	if rows < 0 || len(src) != rows*rb {
		return nil, fmt.Errorf("dequantize %d rows of %d %v: got %d bytes, want %d: %w", rows, cols, dt, len(src), rows*rb, ErrShape)
	}
	out := make([]float32, rows*cols)
	for r := range rows {
		if err := DequantizeRow(dt, src[r*rb:(r+1)*rb], out[r*cols:(r+1)*cols]); err != nil {
			return nil, err
		}
	}
	return out, nil
}
