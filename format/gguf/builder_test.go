package gguf

import (
	"encoding/binary"
	"math"
)

// This file builds GGUF bytes field by field, independently of Writer, so
// that the reader is checked against the spec rather than against our own
// writer, and so that malformed files can be made one field at a time.

type raw []byte

func (r raw) u8(x uint8) raw    { return append(r, x) }
func (r raw) u32(x uint32) raw  { return binary.LittleEndian.AppendUint32(r, x) }
func (r raw) u64(x uint64) raw  { return binary.LittleEndian.AppendUint64(r, x) }
func (r raw) f32(x float32) raw { return r.u32(math.Float32bits(x)) }
func (r raw) str(s string) raw  { return append(r.u64(uint64(len(s))), s...) }

func (r raw) pad(align int) raw {
	for len(r)%align != 0 {
		r = append(r, 0)
	}
	return r
}

// rawKV is one metadata entry: body is the encoded value without its tag.
type rawKV struct {
	key  string
	typ  uint32
	body raw
}

type rawTensor struct {
	name   string
	dims   []uint64
	nDims  int // if > 0, written instead of len(dims)
	typ    uint32
	offset uint64
}

// spec is the content of a file to hand-build; zero counts mean "the
// real count", the override fields write something else.
type spec struct {
	magic       string
	version     uint32
	kvCount     *uint64
	tensorCount *uint64
	kvs         []rawKV
	tensors     []rawTensor
	align       int // padding used before the data section
	data        []byte
}

func (s spec) bytes() []byte {
	r := raw(s.magic).u32(s.version)
	tc, kc := uint64(len(s.tensors)), uint64(len(s.kvs))
	if s.tensorCount != nil {
		tc = *s.tensorCount
	}
	if s.kvCount != nil {
		kc = *s.kvCount
	}
	r = r.u64(tc).u64(kc)
	for _, kv := range s.kvs {
		r = r.str(kv.key).u32(kv.typ)
		r = append(r, kv.body...)
	}
	for _, t := range s.tensors {
		nd := len(t.dims)
		if t.nDims > 0 {
			nd = t.nDims
		}
		r = r.str(t.name).u32(uint32(nd))
		for _, d := range t.dims {
			r = r.u64(d)
		}
		r = r.u32(t.typ).u64(t.offset)
	}
	r = r.pad(s.align)
	return append(r, s.data...)
}

// baseSpec is a small valid file: three KVs and two F32 tensors of 4x2
// (32 bytes each, so both offsets are multiples of 32).
func baseSpec() spec {
	data := make([]byte, 64)
	for i := range data {
		data[i] = byte(i*7 + 3)
	}
	return spec{
		magic:   "GGUF",
		version: 3,
		kvs: []rawKV{
			{"general.architecture", uint32(TypeString), raw(nil).str("llama")},
			{"llama.block_count", uint32(TypeUint32), raw(nil).u32(2)},
			{"tokenizer.ggml.scores", uint32(TypeArray), raw(nil).u32(uint32(TypeFloat32)).u64(3).f32(0.5).f32(-1).f32(2)},
		},
		tensors: []rawTensor{
			{name: "a", dims: []uint64{4, 2}, typ: uint32(TypeF32), offset: 0},
			{name: "b", dims: []uint64{4, 2}, typ: uint32(TypeF32), offset: 32},
		},
		align: 32,
		data:  data,
	}
}

func ptr[T any](x T) *T { return &x }
