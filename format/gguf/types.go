package gguf

import (
	"fmt"
	"math"
	"math/bits"
)

// GGMLType is a tensor element type, numbered as in llama.cpp's ggml_type,
// which is what GGUF files store.
type GGMLType uint32

// Tensor types. The gaps are numbers ggml has retired; they must not be
// reused.
const (
	TypeF32     GGMLType = 0
	TypeF16     GGMLType = 1
	TypeQ4_0    GGMLType = 2
	TypeQ4_1    GGMLType = 3
	TypeQ5_0    GGMLType = 6
	TypeQ5_1    GGMLType = 7
	TypeQ8_0    GGMLType = 8
	TypeQ8_1    GGMLType = 9
	TypeQ2_K    GGMLType = 10
	TypeQ3_K    GGMLType = 11
	TypeQ4_K    GGMLType = 12
	TypeQ5_K    GGMLType = 13
	TypeQ6_K    GGMLType = 14
	TypeQ8_K    GGMLType = 15
	TypeIQ2_XXS GGMLType = 16
	TypeIQ2_XS  GGMLType = 17
	TypeIQ3_XXS GGMLType = 18
	TypeIQ1_S   GGMLType = 19
	TypeIQ4_NL  GGMLType = 20
	TypeIQ3_S   GGMLType = 21
	TypeIQ2_S   GGMLType = 22
	TypeIQ4_XS  GGMLType = 23
	TypeI8      GGMLType = 24
	TypeI16     GGMLType = 25
	TypeI32     GGMLType = 26
	TypeI64     GGMLType = 27
	TypeF64     GGMLType = 28
	TypeIQ1_M   GGMLType = 29
	TypeBF16    GGMLType = 30
	TypeTQ1_0   GGMLType = 34
	TypeTQ2_0   GGMLType = 35
	TypeMXFP4   GGMLType = 39
)

// typeInfo is the encoding of one type: blockSize elements take typeSize
// bytes. A zero blockSize marks a type that is named but whose layout this
// package does not handle.
type typeInfo struct {
	name      string
	blockSize int
	typeSize  int
}

// qk is the super-block size of the K-quants.
const qk = 256

var typeInfos = map[GGMLType]typeInfo{
	TypeF32:  {"F32", 1, 4},
	TypeF16:  {"F16", 1, 2},
	TypeQ4_0: {"Q4_0", 32, 2 + 16},          // f16 d; 32 nibbles
	TypeQ4_1: {"Q4_1", 32, 2 + 2 + 16},      // f16 d, m; 32 nibbles
	TypeQ5_0: {"Q5_0", 32, 2 + 4 + 16},      // f16 d; 32 high bits; 32 nibbles
	TypeQ5_1: {"Q5_1", 32, 2 + 2 + 4 + 16},  // f16 d, m; 32 high bits; 32 nibbles
	TypeQ8_0: {"Q8_0", 32, 2 + 32},          // f16 d; int8 q[32]
	TypeQ8_1: {"Q8_1", 32, 2 + 2 + 32},      // f16 d, s; int8 q[32]
	TypeQ2_K: {"Q2_K", qk, 16 + 64 + 2 + 2}, // scales; 2-bit quants; f16 d, dmin
	TypeQ3_K: {"Q3_K", qk, 32 + 64 + 12 + 2},
	TypeQ4_K: {"Q4_K", qk, 2 + 2 + 12 + 128},
	TypeQ5_K: {"Q5_K", qk, 2 + 2 + 12 + 32 + 128},
	TypeQ6_K: {"Q6_K", qk, 128 + 64 + 16 + 2},
	TypeQ8_K: {"Q8_K", qk, 4 + 256 + 2*16}, // f32 d; int8 q[256]; int16 bsums[16]
	TypeI8:   {"I8", 1, 1},
	TypeI16:  {"I16", 1, 2},
	TypeI32:  {"I32", 1, 4},
	TypeI64:  {"I64", 1, 8},
	TypeF64:  {"F64", 1, 8},
	TypeBF16: {"BF16", 1, 2},

	TypeIQ2_XXS: {name: "IQ2_XXS"},
	TypeIQ2_XS:  {name: "IQ2_XS"},
	TypeIQ3_XXS: {name: "IQ3_XXS"},
	TypeIQ1_S:   {name: "IQ1_S"},
	TypeIQ4_NL:  {name: "IQ4_NL"},
	TypeIQ3_S:   {name: "IQ3_S"},
	TypeIQ2_S:   {name: "IQ2_S"},
	TypeIQ4_XS:  {name: "IQ4_XS"},
	TypeIQ1_M:   {name: "IQ1_M"},
	TypeTQ1_0:   {name: "TQ1_0"},
	TypeTQ2_0:   {name: "TQ2_0"},
	TypeMXFP4:   {name: "MXFP4"},
}

// String returns ggml's name for t, such as "Q4_K".
func (t GGMLType) String() string {
	if ti, ok := typeInfos[t]; ok {
		return ti.name
	}
	return fmt.Sprintf("GGMLType(%d)", uint32(t))
}

// Supported reports whether this package knows t's byte layout, and so can
// size, validate and write tensors of it.
func (t GGMLType) Supported() bool { return typeInfos[t].blockSize > 0 }

// BlockSize is the number of elements in one encoding block (1 for plain
// types, 0 for unsupported ones).
func (t GGMLType) BlockSize() int { return typeInfos[t].blockSize }

// TypeSize is the byte size of one encoding block (0 for unsupported types).
func (t GGMLType) TypeSize() int { return typeInfos[t].typeSize }

// RowBytes is the byte size of a row of n elements. A row must hold whole
// blocks, since quantization blocks never straddle rows.
func (t GGMLType) RowBytes(n uint64) (uint64, error) {
	ti, ok := typeInfos[t]
	if !ok || ti.blockSize == 0 {
		return 0, fmt.Errorf("ggml type %v is not supported", t)
	}
	bs := uint64(ti.blockSize)
	if n%bs != 0 {
		return 0, fmt.Errorf("%v row of %d elements is not a whole number of %d-element blocks", t, n, bs)
	}
	hi, lo := bits.Mul64(n/bs, uint64(ti.typeSize))
	if hi != 0 || lo > math.MaxInt64 {
		return 0, fmt.Errorf("%v row of %d elements overflows", t, n)
	}
	return lo, nil
}

// Bytes is the byte size of a tensor of type t with dims in GGUF order
// (innermost first: dims[0] is the row length). It checks what a tensor
// header must satisfy: 1 to MaxDims dims, none zero, an element count that
// fits in an int64, and rows of whole blocks.
func (t GGMLType) Bytes(dims []uint64) (uint64, error) {
	if len(dims) == 0 || len(dims) > MaxDims {
		return 0, fmt.Errorf("%d dims, want 1 to %d", len(dims), MaxDims)
	}
	var n uint64 = 1
	for i, d := range dims {
		if d == 0 {
			return 0, fmt.Errorf("dim %d of %v is zero", i, dims)
		}
		hi, lo := bits.Mul64(n, d)
		if hi != 0 || lo > math.MaxInt64 {
			return 0, fmt.Errorf("element count of %v overflows", dims)
		}
		n = lo
	}
	row, err := t.RowBytes(dims[0])
	if err != nil {
		return 0, err
	}
	hi, size := bits.Mul64(row, n/dims[0])
	if hi != 0 || size > math.MaxInt64 {
		return 0, fmt.Errorf("byte size of %v tensor %v overflows", t, dims)
	}
	return size, nil
}
