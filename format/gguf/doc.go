// Package gguf reads and writes GGUF, the single-file model format of
// llama.cpp: metadata (architecture, hyperparameters, tokenizer) and tensors,
// often block-quantized, in one file that can be mapped and used in place.
//
// Open maps a file read-only and validates all of it up front, so that the
// loader never meets a short tensor or an out-of-range offset later: every
// count is checked against the bytes left before anything is allocated,
// every size is computed with overflow checks, and tensors must be aligned,
// in bounds and disjoint. Tensor data is returned as slices of the mapping
// (no copy); they are valid until Close. Parse does the same on a byte
// slice. Writer produces version 3 files for `trigon convert`.
//
// Versions 2 and 3 are read (they differ only in that v3 may be big-endian,
// which is refused here); version 1 used 32-bit counts and is refused.
//
// # On-disk layout
//
// All integers are little-endian. A string is a uint64 byte length followed
// by that many bytes of UTF-8, with no terminator.
//
//	offset 0
//	+--------------------------------------------------------------+
//	| magic "GGUF" (4 bytes) | version u32 (2 or 3)                |
//	| tensor_count u64       | kv_count u64                        |
//	+--------------------------------------------------------------+
//	| kv_count metadata entries:                                   |
//	|   key string | value_type u32 | value                        |
//	|                                                              |
//	|   value is, by value_type:                                   |
//	|     0 u8  1 i8  2 u16  3 i16  4 u32  5 i32  6 f32  7 bool(1) |
//	|     8 string   10 u64  11 i64  12 f64                        |
//	|     9 array:  elem_type u32 | count u64 | count values       |
//	|               (an array of arrays repeats elem_type, count,  |
//	|               values for each inner array)                   |
//	+--------------------------------------------------------------+
//	| tensor_count tensor infos:                                   |
//	|   name string | n_dims u32 (1..4) | ne u64[n_dims]           |
//	|   ggml_type u32 | offset u64 (from the data section start)   |
//	|   ne[0] is the innermost (row) dimension                     |
//	+--------------------------------------------------------------+
//	| zero padding to a multiple of the alignment                  |
//	+==============================================================+ <- File.DataOffset
//	| data section: each tensor at its offset (a multiple of the   |
//	| alignment), ggml_type's encoding of prod(ne) elements, rows  |
//	| of ne[0] elements made of whole blocks; zero padding between |
//	+--------------------------------------------------------------+
//
// The alignment is the uint32 entry general.alignment, 32 when absent.
//
// # Example
//
//	f, err := gguf.Open("model.gguf")
//	if err != nil {
//		return err
//	}
//	defer f.Close()
//	arch, _ := f.String("general.architecture")
//	layers, _ := f.Uint(arch + ".block_count")
//	emb, ok := f.Tensor("token_embd.weight") // emb.Dims = [hidden, vocab]
package gguf
