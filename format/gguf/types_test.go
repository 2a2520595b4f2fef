package gguf

import (
	"strings"
	"testing"
)

func TestTypeSizes(t *testing.T) {
	// Block sizes and byte sizes from the ggml block structs: e.g. Q4_K is
	// {f16 d, dmin; u8 scales[12]; u8 qs[128]} per 256 values.
	tests := []struct {
		typ       GGMLType
		name      string
		blockSize int
		typeSize  int
	}{
		{TypeF32, "F32", 1, 4},
		{TypeF16, "F16", 1, 2},
		{TypeBF16, "BF16", 1, 2},
		{TypeQ4_0, "Q4_0", 32, 18},
		{TypeQ4_1, "Q4_1", 32, 20},
		{TypeQ5_0, "Q5_0", 32, 22},
		{TypeQ5_1, "Q5_1", 32, 24},
		{TypeQ8_0, "Q8_0", 32, 34},
		{TypeQ8_1, "Q8_1", 32, 36},
		{TypeQ2_K, "Q2_K", 256, 84},
		{TypeQ3_K, "Q3_K", 256, 110},
		{TypeQ4_K, "Q4_K", 256, 144},
		{TypeQ5_K, "Q5_K", 256, 176},
		{TypeQ6_K, "Q6_K", 256, 210},
		{TypeQ8_K, "Q8_K", 256, 292},
		{TypeI8, "I8", 1, 1},
		{TypeI16, "I16", 1, 2},
		{TypeI32, "I32", 1, 4},
		{TypeI64, "I64", 1, 8},
		{TypeF64, "F64", 1, 8},
		{TypeIQ2_XXS, "IQ2_XXS", 0, 0},
		{TypeMXFP4, "MXFP4", 0, 0},
		{GGMLType(4), "GGMLType(4)", 0, 0},
		{GGMLType(1000), "GGMLType(1000)", 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.typ.String(); got != tt.name {
				t.Errorf("String() = %q, want %q", got, tt.name)
			}
			if got := tt.typ.BlockSize(); got != tt.blockSize {
				t.Errorf("BlockSize() = %d, want %d", got, tt.blockSize)
			}
			if got := tt.typ.TypeSize(); got != tt.typeSize {
				t.Errorf("TypeSize() = %d, want %d", got, tt.typeSize)
			}
			if got := tt.typ.Supported(); got != (tt.blockSize > 0) {
				t.Errorf("Supported() = %v", got)
			}
			row, err := tt.typ.RowBytes(uint64(tt.blockSize) * 3)
			if tt.blockSize == 0 {
				if err == nil || !strings.Contains(err.Error(), "not supported") {
					t.Errorf("RowBytes of unsupported type: err = %v", err)
				}
				return
			}
			if err != nil || row != uint64(3*tt.typeSize) {
				t.Errorf("RowBytes(3 blocks) = %d, %v; want %d", row, err, 3*tt.typeSize)
			}
		})
	}
}

func TestTypeBytes(t *testing.T) {
	tests := []struct {
		name    string
		typ     GGMLType
		dims    []uint64
		want    uint64
		wantErr string
	}{
		{"f32 matrix", TypeF32, []uint64{5, 7}, 5 * 7 * 4, ""},
		{"q8_0 rows", TypeQ8_0, []uint64{64, 3}, 2 * 3 * 34, ""},
		{"q6_k 4d", TypeQ6_K, []uint64{512, 2, 3, 4}, 2 * 210 * 24, ""},
		{"no dims", TypeF32, nil, 0, "0 dims"},
		{"five dims", TypeF32, []uint64{1, 1, 1, 1, 1}, 0, "5 dims"},
		{"zero dim", TypeF32, []uint64{4, 0}, 0, "is zero"},
		{"partial block", TypeQ4_0, []uint64{48}, 0, "whole number"},
		{"count overflow", TypeI8, []uint64{1 << 32, 1 << 32}, 0, "element count"},
		{"count past int64", TypeI8, []uint64{1 << 62, 2}, 0, "element count"},
		{"byte overflow", TypeF64, []uint64{1 << 61, 2}, 0, "overflows"},
		{"row byte overflow", TypeF64, []uint64{1 << 61}, 0, "overflows"},
		{"unsupported", TypeIQ4_XS, []uint64{256}, 0, "not supported"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.typ.Bytes(tt.dims)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Bytes(%v) = %d, %v; want error containing %q", tt.dims, got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("Bytes(%v) = %d, %v; want %d", tt.dims, got, err, tt.want)
			}
		})
	}
}
