package backend

import "fmt"

// DType is an element type. Quantized types use the GGML block layouts:
// Q8_0 is blocks of 32 values as {f16 scale; int8 q[32]} (34 bytes), value =
// scale*q; Q4_0 is blocks of 32 as {f16 scale; uint8 qs[16]} (18 bytes),
// where qs[j] holds value j in its low nibble and value j+16 in its high
// nibble, value = scale*(nibble-8). Q4_K, Q5_K and Q6_K are GGML's
// K-quants, super-blocks of 256 values (kquant.go).
//
// F8E4M3, I8 and U4 are the element types of quantized KV caches (see
// KVSpec): their values mean nothing without the scales the spec names.
// F8E4M3 is OCP e4m3fn (1 sign, 4 exponent bits biased by 7, 3 mantissa
// bits; no infinities, 0x7F and 0xFF are NaN, largest finite 448); I8 a
// two's-complement byte; U4 unsigned 4-bit values packed two to a byte,
// element 2i in the low nibble of byte i and 2i+1 in the high one.
type DType uint8

const (
	F32 DType = iota + 1
	F16
	BF16
	Q8_0
	Q4_0
	I32
	F8E4M3
	I8
	U4
)

var dtypeNames = map[DType]string{F32: "F32", F16: "F16", BF16: "BF16", Q8_0: "Q8_0", Q4_0: "Q4_0", I32: "I32", F8E4M3: "F8_E4M3", I8: "I8", U4: "U4"}

func (d DType) String() string {
	if s, ok := dtypeNames[d]; ok {
		return s
	}
	if d.kQuant() {
		return d.kName()
	}
	if s, ok := wquantName(d); ok {
		return s
	}
	return fmt.Sprintf("DType(%d)", uint8(d))
}

// BlockSize is the number of elements per encoding block (1 for plain types).
func (d DType) BlockSize() int {
	switch d {
	case Q8_0, Q4_0:
		return 32
	case U4:
		return 2
	case Q4_K, Q5_K, Q6_K:
		return QK_K
	}
	if bs, _ := wquantBlock(d); bs != 0 {
		return bs
	}
	return 1
}

// BlockBytes is the byte size of one encoding block.
func (d DType) BlockBytes() int {
	switch d {
	case F32, I32:
		return 4
	case F16, BF16:
		return 2
	case F8E4M3, I8, U4:
		return 1
	case Q8_0:
		return 34
	case Q4_0:
		return 18
	case Q4_K, Q5_K, Q6_K:
		return d.kBlockBytes()
	}
	_, bb := wquantBlock(d)
	return bb
}

// Quantized reports whether d is a block-quantized type.
// U4, packed but not block-scaled, is not.
func (d DType) Quantized() bool {
	bs, _ := wquantBlock(d)
	return d == Q8_0 || d == Q4_0 || d.kQuant() || bs != 0
}

// RowBytes is the byte size of a row of n elements, an error when n is not a
// whole number of blocks or d is unknown.
func (d DType) RowBytes(n int) (int, error) {
	bs, bb := d.BlockSize(), d.BlockBytes()
	if bb == 0 {
		return 0, fmt.Errorf("unknown dtype %v", d)
	}
	if n < 0 || n%bs != 0 {
		return 0, fmt.Errorf("%v row of %d elements is not a whole number of %d-element blocks", d, n, bs)
	}
	if n/bs > (1<<62)/bb {
		return 0, fmt.Errorf("%v row of %d elements overflows", d, n)
	}
	if d == F8E4M3Row {
		return n + f8RowTrailer, nil // the row's scale trailer (wquant.go)
	}
	return n / bs * bb, nil
}

// Bytes is the byte size of a tensor of shape in dtype d; the innermost
// dimension is the row that quantization blocks run along.
func (d DType) Bytes(shape []int) (int, error) {
	n, err := NumElements(shape)
	if err != nil {
		return 0, err
	}
	if len(shape) == 0 {
		return d.RowBytes(1)
	}
	row, err := d.RowBytes(shape[len(shape)-1])
	if err != nil {
		return 0, err
	}
	rows := n / shape[len(shape)-1]
	if rows > 0 && row > (1<<62)/rows {
		return 0, fmt.Errorf("%v tensor %v overflows", d, shape)
	}
	return rows * row, nil
}
