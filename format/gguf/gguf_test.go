package gguf

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
)

func TestParseHandBuilt(t *testing.T) {
	for _, version := range []uint32{2, 3} {
		t.Run("", func(t *testing.T) {
			s := baseSpec()
			s.version = version
			in := s.bytes()
			f, err := Parse(in)
			if err != nil {
				t.Fatal(err)
			}
			if f.Version != version || f.Alignment != 32 {
				t.Errorf("version %d alignment %d", f.Version, f.Alignment)
			}
			if arch, ok := f.String("general.architecture"); !ok || arch != "llama" {
				t.Errorf("architecture = %q, %v", arch, ok)
			}
			if n, ok := f.Uint("llama.block_count"); !ok || n != 2 {
				t.Errorf("block_count = %d, %v", n, ok)
			}
			if sc, ok := f.Floats("tokenizer.ggml.scores"); !ok || !reflect.DeepEqual(sc, []float32{0.5, -1, 2}) {
				t.Errorf("scores = %v, %v", sc, ok)
			}
			keys := []string{}
			for _, kv := range f.KVs {
				keys = append(keys, kv.Key)
			}
			if want := []string{"general.architecture", "llama.block_count", "tokenizer.ggml.scores"}; !reflect.DeepEqual(keys, want) {
				t.Errorf("keys %v, want file order %v", keys, want)
			}
			dataStart := len(in) - len(s.data)
			if f.DataOffset != uint64(dataStart) {
				t.Errorf("DataOffset %d, want %d", f.DataOffset, dataStart)
			}
			for i, name := range []string{"a", "b"} {
				ti, ok := f.Tensor(name)
				if !ok {
					t.Fatalf("tensor %q missing", name)
				}
				if ti.Type != TypeF32 || !reflect.DeepEqual(ti.Dims, []uint64{4, 2}) || ti.Offset != uint64(32*i) {
					t.Errorf("tensor %q = %+v", name, ti)
				}
				want := in[dataStart+32*i : dataStart+32*i+32]
				if !bytes.Equal(ti.Data, want) || &ti.Data[0] != &want[0] {
					t.Errorf("tensor %q data is not the file's bytes in place", name)
				}
				if cap(ti.Data) != len(ti.Data) {
					t.Errorf("tensor %q data has spare capacity %d: appends would clobber the next tensor", name, cap(ti.Data))
				}
			}
			if _, ok := f.Tensor("c"); ok {
				t.Error("found a tensor that does not exist")
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	big := uint64(1) << 60
	tests := []struct {
		name    string
		edit    func(*spec)
		bytes   []byte // used instead of the spec when set
		wantErr string
	}{
		{name: "empty", bytes: []byte{}, wantErr: "bad magic"},
		{name: "bad magic", edit: func(s *spec) { s.magic = "GGML" }, wantErr: "bad magic"},
		{name: "version 1", edit: func(s *spec) { s.version = 1 }, wantErr: "version 1 is not supported"},
		{name: "big-endian", edit: func(s *spec) { s.version = 0x03000000 }, wantErr: "big-endian"},
		{name: "version 4", edit: func(s *spec) { s.version = 4 }, wantErr: "unsupported GGUF version 4"},
		{name: "version 0", edit: func(s *spec) { s.version = 0 }, wantErr: "unsupported GGUF version 0"},
		{name: "truncated header", bytes: raw("GGUF").u32(3).u64(0), wantErr: "kv count: need 8 bytes"},
		{name: "kv count past eof", edit: func(s *spec) { s.kvCount = ptr(big) }, wantErr: "kv count"},
		{name: "tensor count past eof", edit: func(s *spec) { s.tensorCount = ptr(big) }, wantErr: "tensor count"},
		{name: "tensor count one too many", edit: func(s *spec) { s.tensorCount = ptr(uint64(3)) }, wantErr: "tensor 2"},
		{name: "key longer than file", bytes: raw("GGUF").u32(3).u64(0).u64(1).u64(big).u32(0).u8(0), wantErr: "key of 1152921504606846976 bytes"},
		{name: "string longer than file", edit: func(s *spec) {
			s.kvs[0].body = raw(nil).u64(big)
		}, wantErr: "string of 1152921504606846976 bytes"},
		{name: "array longer than file", edit: func(s *spec) {
			s.kvs[2].body = raw(nil).u32(uint32(TypeFloat32)).u64(big)
		}, wantErr: "array of float32 length"},
		{name: "string array longer than file", edit: func(s *spec) {
			s.kvs[2].body = raw(nil).u32(uint32(TypeString)).u64(100)
		}, wantErr: "array of string length 100"},
		{name: "nested array longer than file", edit: func(s *spec) {
			s.kvs[2].body = raw(nil).u32(uint32(TypeArray)).u64(1).u32(uint32(TypeUint64)).u64(big)
		}, wantErr: "array of uint64 length"},
		{name: "duplicate key", edit: func(s *spec) { s.kvs[1].key = s.kvs[0].key }, wantErr: "duplicate key"},
		{name: "duplicate tensor", edit: func(s *spec) { s.tensors[1].name = "a" }, wantErr: `duplicate tensor name "a"`},
		{name: "empty tensor name", edit: func(s *spec) { s.tensors[1].name = "" }, wantErr: "empty tensor name"},
		{name: "unknown value type", edit: func(s *spec) { s.kvs[1].typ = 13 }, wantErr: "unknown value type 13"},
		{name: "unknown array element type", edit: func(s *spec) {
			s.kvs[2].body = raw(nil).u32(99).u64(0)
		}, wantErr: "unknown array element type 99"},
		{name: "bad bool", edit: func(s *spec) { s.kvs[1] = rawKV{"x", uint32(TypeBool), raw(nil).u8(2)} }, wantErr: "bool byte 2"},
		{name: "bad bool in array", edit: func(s *spec) {
			s.kvs[2].body = raw(nil).u32(uint32(TypeBool)).u64(2).u8(1).u8(7)
		}, wantErr: "bool array element 1 is 7"},
		{name: "arrays nested too deep", edit: func(s *spec) {
			b := raw(nil)
			for range maxArrayDepth {
				b = b.u32(uint32(TypeArray)).u64(1)
			}
			s.kvs[2].body = b.u32(uint32(TypeUint8)).u64(0)
		}, wantErr: "nested deeper"},
		{name: "misaligned offset", edit: func(s *spec) { s.tensors[1].offset = 48 }, wantErr: "not a multiple of the alignment 32"},
		{name: "offset past eof", edit: func(s *spec) { s.tensors[1].offset = 64 }, wantErr: "past the end of the data section"},
		{name: "offset+size overflow", edit: func(s *spec) { s.tensors[1].offset = math.MaxUint64 &^ 31 }, wantErr: "past the end of the data section"},
		{name: "data section past eof", edit: func(s *spec) { s.data = nil; s.align = 1 }, wantErr: "data section starts at"},
		{name: "truncated data", edit: func(s *spec) { s.data = s.data[:63] }, wantErr: `tensor "b": data [32, 32+32)`},
		{name: "zero dims", edit: func(s *spec) { s.tensors[1].dims = nil }, wantErr: "n_dims 0"},
		{name: "five dims", edit: func(s *spec) { s.tensors[1].dims = []uint64{1, 1, 1, 1, 1} }, wantErr: "n_dims 5"},
		{name: "zero dim", edit: func(s *spec) { s.tensors[1].dims = []uint64{4, 0} }, wantErr: "dim 1 of [4 0] is zero"},
		{name: "element count overflow", edit: func(s *spec) {
			s.tensors[1].dims = []uint64{1 << 32, 1 << 32, 2}
		}, wantErr: "element count"},
		{name: "partial block row", edit: func(s *spec) {
			s.tensors[1].typ, s.tensors[1].dims = uint32(TypeQ8_0), []uint64{16}
		}, wantErr: "not a whole number of 32-element blocks"},
		{name: "unsupported tensor type", edit: func(s *spec) { s.tensors[1].typ = uint32(TypeIQ2_XS) }, wantErr: "IQ2_XS is not supported"},
		{name: "unknown tensor type", edit: func(s *spec) { s.tensors[1].typ = 77 }, wantErr: "GGMLType(77) is not supported"},
		{name: "overlapping tensors", edit: func(s *spec) {
			s.tensors[0].dims = []uint64{4, 3} // 48 bytes: runs into b at 32
		}, wantErr: `tensor "b" at [32, 64) overlaps tensor "a" at [0, 48)`},
		{name: "same offset", edit: func(s *spec) { s.tensors[1].offset = 0 }, wantErr: "overlaps"},
		{name: "alignment zero", edit: func(s *spec) {
			s.kvs = append(s.kvs, rawKV{AlignmentKey, uint32(TypeUint32), raw(nil).u32(0)})
		}, wantErr: "not a non-zero power of two"},
		{name: "alignment not power of two", edit: func(s *spec) {
			s.kvs = append(s.kvs, rawKV{AlignmentKey, uint32(TypeUint32), raw(nil).u32(48)})
		}, wantErr: "= 48 is not a non-zero power of two"},
		{name: "alignment wrong type", edit: func(s *spec) {
			s.kvs = append(s.kvs, rawKV{AlignmentKey, uint32(TypeUint64), raw(nil).u64(32)})
		}, wantErr: "has type uint64, want uint32"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := tt.bytes
			if in == nil {
				s := baseSpec()
				tt.edit(&s)
				in = s.bytes()
			}
			f, err := Parse(in)
			if err == nil {
				t.Fatalf("Parse succeeded: %+v", f)
			}
			var fe *FormatError
			if !errors.As(err, &fe) {
				t.Errorf("error %v is not a *FormatError", err)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error %q does not contain %q", err, tt.wantErr)
			}
		})
	}
}

// TestParseAlignment checks that general.alignment moves the data section
// and the offsets that are legal.
func TestParseAlignment(t *testing.T) {
	for _, align := range []int{1, 8, 64, 4096} {
		t.Run("", func(t *testing.T) {
			s := baseSpec()
			s.kvs = append(s.kvs, rawKV{AlignmentKey, uint32(TypeUint32), raw(nil).u32(uint32(align))})
			s.align = align
			s.tensors[1].offset = uint64(max(32, align))
			s.data = make([]byte, max(32, align)+32)
			in := s.bytes()
			f, err := Parse(in)
			if err != nil {
				t.Fatal(err)
			}
			if f.Alignment != uint64(align) || f.DataOffset%uint64(align) != 0 || f.DataOffset != uint64(len(in)-len(s.data)) {
				t.Errorf("alignment %d data offset %d (file %d bytes)", f.Alignment, f.DataOffset, len(in))
			}
		})
	}
}

// randomValue makes a value of type typ with random contents; depth limits
// nesting.
func randomValue(rng *rand.Rand, typ ValueType, depth int) Value {
	n := rng.IntN(6)
	switch typ {
	case TypeUint8:
		return Uint8Value(uint8(rng.Uint32()))
	case TypeInt8:
		return Int8Value(int8(rng.Uint32()))
	case TypeUint16:
		return Uint16Value(uint16(rng.Uint32()))
	case TypeInt16:
		return Int16Value(int16(rng.Uint32()))
	case TypeUint32:
		return Uint32Value(rng.Uint32())
	case TypeInt32:
		return Int32Value(int32(rng.Uint32()))
	case TypeFloat32:
		return Float32Value(math.Float32frombits(rng.Uint32()))
	case TypeBool:
		return BoolValue(rng.IntN(2) == 1)
	case TypeString:
		return StringValue(randomString(rng))
	case TypeUint64:
		return Uint64Value(rng.Uint64())
	case TypeInt64:
		return Int64Value(int64(rng.Uint64()))
	case TypeFloat64:
		return Float64Value(math.Float64frombits(rng.Uint64()))
	}
	// An array of a random element type.
	elem := ValueType(rng.IntN(13))
	if elem == TypeArray && depth >= 2 {
		elem = TypeString
	}
	switch elem {
	case TypeUint8:
		return Uint8sValue(randomSlice(rng, n, func() uint8 { return uint8(rng.Uint32()) }))
	case TypeInt8:
		return Int8sValue(randomSlice(rng, n, func() int8 { return int8(rng.Uint32()) }))
	case TypeUint16:
		return Uint16sValue(randomSlice(rng, n, func() uint16 { return uint16(rng.Uint32()) }))
	case TypeInt16:
		return Int16sValue(randomSlice(rng, n, func() int16 { return int16(rng.Uint32()) }))
	case TypeUint32:
		return Uint32sValue(randomSlice(rng, n, rng.Uint32))
	case TypeInt32:
		return Int32sValue(randomSlice(rng, n, func() int32 { return int32(rng.Uint32()) }))
	case TypeFloat32:
		return Float32sValue(randomSlice(rng, n, func() float32 { return math.Float32frombits(rng.Uint32()) }))
	case TypeBool:
		return BoolsValue(randomSlice(rng, n, func() bool { return rng.IntN(2) == 1 }))
	case TypeString:
		return StringsValue(randomSlice(rng, n, func() string { return randomString(rng) }))
	case TypeUint64:
		return Uint64sValue(randomSlice(rng, n, rng.Uint64))
	case TypeInt64:
		return Int64sValue(randomSlice(rng, n, func() int64 { return int64(rng.Uint64()) }))
	case TypeFloat64:
		return Float64sValue(randomSlice(rng, n, func() float64 { return math.Float64frombits(rng.Uint64()) }))
	}
	return ArraysValue(randomSlice(rng, n, func() Value { return randomValue(rng, TypeArray, depth+1) }))
}

func randomSlice[T any](rng *rand.Rand, n int, gen func() T) []T {
	out := make([]T, n)
	for i := range out {
		out[i] = gen()
	}
	return out
}

func randomString(rng *rand.Rand) string {
	b := make([]byte, rng.IntN(20))
	for i := range b {
		b[i] = byte(rng.Uint32()) // any bytes: GGUF strings are not validated
	}
	return string(b)
}

// valueEqual compares values bit for bit (NaNs included).
func valueEqual(a, b Value) bool {
	if a.typ != b.typ || a.bits != b.bits || a.str != b.str {
		return false
	}
	if a.typ != TypeArray {
		return true
	}
	if a.elem != b.elem || a.Len() != b.Len() {
		return false
	}
	for i := range a.Len() {
		if !valueEqual(a.index(i), b.index(i)) {
			return false
		}
	}
	return true
}

type testTensor struct {
	name string
	typ  GGMLType
	dims []uint64
	data []byte
}

var writableTypes = []GGMLType{TypeF32, TypeF16, TypeBF16, TypeQ4_0, TypeQ4_1, TypeQ5_0, TypeQ5_1, TypeQ8_0,
	TypeQ8_1, TypeQ2_K, TypeQ3_K, TypeQ4_K, TypeQ5_K, TypeQ6_K, TypeQ8_K, TypeI8, TypeI16, TypeI32, TypeI64, TypeF64}

func randomTensors(rng *rand.Rand, n int) []testTensor {
	ts := make([]testTensor, n)
	for i := range ts {
		typ := writableTypes[rng.IntN(len(writableTypes))]
		dims := make([]uint64, 1+rng.IntN(MaxDims))
		dims[0] = uint64(typ.BlockSize() * (1 + rng.IntN(3)))
		for j := 1; j < len(dims); j++ {
			dims[j] = uint64(1 + rng.IntN(3))
		}
		size, err := typ.Bytes(dims)
		if err != nil {
			panic(err)
		}
		data := make([]byte, size)
		for j := range data {
			data[j] = byte(rng.Uint32())
		}
		ts[i] = testTensor{name: "blk." + randomString(rng) + string(rune('a'+i%26)) + ".w" + string(rune('0'+i/26)), typ: typ, dims: dims, data: data}
	}
	return ts
}

// TestRoundTrip writes random metadata of every type and random tensors of
// every supported type, parses the result and compares everything bit for
// bit, under the default alignment and under general.alignment overrides.
func TestRoundTrip(t *testing.T) {
	for seed := range uint64(12) {
		t.Run("", func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 99))
			var kvs []KV
			for i := range 20 + rng.IntN(20) {
				typ := ValueType(i % 13)
				kvs = append(kvs, KV{Key: "k" + randomString(rng) + string(rune('A'+i)), Value: randomValue(rng, typ, 0)})
			}
			align := uint64(DefaultAlignment)
			if seed%3 == 1 {
				align = 1 << rng.IntN(8)
				kvs = append(kvs, KV{Key: AlignmentKey, Value: Uint32Value(uint32(align))})
			}
			tensors := randomTensors(rng, int(seed%5)*3) // some files have no tensors

			w := NewWriter()
			for _, kv := range kvs {
				w.AddKV(kv.Key, kv.Value)
			}
			for _, tt := range tensors {
				if err := w.AddTensor(tt.name, tt.typ, tt.dims, tt.data); err != nil {
					t.Fatal(err)
				}
			}
			var buf bytes.Buffer
			n, err := w.WriteTo(&buf)
			if err != nil {
				t.Fatal(err)
			}
			if n != int64(buf.Len()) {
				t.Errorf("WriteTo returned %d, wrote %d", n, buf.Len())
			}
			if buf.Len()%int(align) != 0 {
				t.Errorf("file length %d is not padded to %d", buf.Len(), align)
			}
			in := buf.Bytes()
			f, err := Parse(in)
			if err != nil {
				t.Fatal(err)
			}
			if f.Version != 3 || f.Alignment != align || f.DataOffset%align != 0 {
				t.Errorf("version %d alignment %d (want %d) data offset %d", f.Version, f.Alignment, align, f.DataOffset)
			}
			if len(f.KVs) != len(kvs) {
				t.Fatalf("%d kvs, want %d", len(f.KVs), len(kvs))
			}
			for i, kv := range kvs {
				got := f.KVs[i]
				if got.Key != kv.Key || !valueEqual(got.Value, kv.Value) {
					t.Errorf("kv %d = %q: %v, want %q: %v", i, got.Key, got.Value, kv.Key, kv.Value)
				}
				if v, ok := f.Value(kv.Key); !ok || !valueEqual(v, kv.Value) {
					t.Errorf("Value(%q) = %v, %v", kv.Key, v, ok)
				}
			}
			if len(f.Tensors) != len(tensors) {
				t.Fatalf("%d tensors, want %d", len(f.Tensors), len(tensors))
			}
			for i, tt := range tensors {
				got, ok := f.Tensor(tt.name)
				if !ok || got.Name != f.Tensors[i].Name {
					t.Fatalf("tensor %q missing or out of order", tt.name)
				}
				if got.Type != tt.typ || !reflect.DeepEqual(got.Dims, tt.dims) || !bytes.Equal(got.Data, tt.data) {
					t.Errorf("tensor %q: %v %v, want %v %v, data equal %v", tt.name, got.Type, got.Dims, tt.typ, tt.dims, bytes.Equal(got.Data, tt.data))
				}
				if got.Offset%align != 0 {
					t.Errorf("tensor %q offset %d not aligned to %d", tt.name, got.Offset, align)
				}
				start := f.DataOffset + got.Offset
				if &in[start] != &got.Data[0] {
					t.Errorf("tensor %q data does not alias the input at %d", tt.name, start)
				}
			}
		})
	}
}

// TestWriterMatchesHandBuilt checks the writer's bytes against the
// independent hand-built encoding of the same content.
func TestWriterMatchesHandBuilt(t *testing.T) {
	s := baseSpec()
	want := append(s.bytes(), make([]byte, 0)...)
	w := NewWriter()
	w.AddKV("general.architecture", StringValue("llama"))
	w.AddKV("llama.block_count", Uint32Value(2))
	w.AddKV("tokenizer.ggml.scores", Float32sValue([]float32{0.5, -1, 2}))
	if err := w.AddTensor("a", TypeF32, []uint64{4, 2}, s.data[:32]); err != nil {
		t.Fatal(err)
	}
	if err := w.AddTensor("b", TypeF32, []uint64{4, 2}, s.data[32:]); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), want) {
		t.Fatalf("writer output differs from the hand-built file:\n got %x\nwant %x", buf.Bytes(), want)
	}
}

func TestWriterErrors(t *testing.T) {
	tests := []struct {
		name    string
		build   func(w *Writer) error // error from AddTensor, or nil to try WriteTo
		wantErr string
	}{
		{"short data", func(w *Writer) error { return w.AddTensor("t", TypeF32, []uint64{4}, make([]byte, 15)) }, "needs 16 bytes, got 15"},
		{"partial block", func(w *Writer) error { return w.AddTensor("t", TypeQ8_0, []uint64{16}, make([]byte, 17)) }, "whole number"},
		{"zero dim", func(w *Writer) error { return w.AddTensor("t", TypeF32, []uint64{0}, nil) }, "is zero"},
		{"unsupported type", func(w *Writer) error { return w.AddTensor("t", TypeIQ1_S, []uint64{256}, make([]byte, 50)) }, "not supported"},
		{"empty name", func(w *Writer) error { return w.AddTensor("", TypeF32, []uint64{1}, make([]byte, 4)) }, "empty tensor name"},
		{"duplicate tensor", func(w *Writer) error {
			if err := w.AddTensor("t", TypeF32, []uint64{1}, make([]byte, 4)); err != nil {
				return nil
			}
			return w.AddTensor("t", TypeF32, []uint64{1}, make([]byte, 4))
		}, `duplicate tensor "t"`},
		{"duplicate key", func(w *Writer) error {
			w.AddKV("k", Uint8Value(1))
			w.AddKV("k", Uint8Value(2))
			return nil
		}, `duplicate key "k"`},
		{"bad alignment", func(w *Writer) error { w.AddKV(AlignmentKey, Uint32Value(24)); return nil }, "power of two"},
		{"alignment type", func(w *Writer) error { w.AddKV(AlignmentKey, Uint64Value(64)); return nil }, "want uint32"},
		{"array of non-arrays", func(w *Writer) error {
			w.AddKV("k", ArraysValue([]Value{StringValue("x")}))
			return nil
		}, "is a string"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := NewWriter()
			err := tt.build(w)
			if err == nil {
				_, err = w.WriteTo(&bytes.Buffer{})
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestGetters(t *testing.T) {
	w := NewWriter()
	w.AddKV("u8", Uint8Value(200))
	w.AddKV("i32neg", Int32Value(-5))
	w.AddKV("u64big", Uint64Value(math.MaxUint64))
	w.AddKV("f32", Float32Value(1.5))
	w.AddKV("f64", Float64Value(-2.25))
	w.AddKV("b", BoolValue(true))
	w.AddKV("s", StringValue("hi"))
	w.AddKV("ss", StringsValue([]string{"a", "", "c"}))
	w.AddKV("ff", Float32sValue([]float32{1, 2}))
	w.AddKV("dd", Float64sValue([]float64{1, 2}))
	w.AddKV("ii", Int32sValue([]int32{-1, 7}))
	w.AddKV("u8s", Uint8sValue([]uint8{1, 255}))
	w.AddKV("i64s", Int64sValue([]int64{1, -1 << 40}))
	w.AddKV("u64s", Uint64sValue([]uint64{3, 1 << 63}))
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	f, err := Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		v  any
		ok bool
	}
	r := func(v any, ok bool) result { return result{v, ok} }
	tests := []struct {
		name string
		got  result
		want result
	}{
		{"Uint u8", r(f.Uint("u8")), result{uint64(200), true}},
		{"Uint negative", r(f.Uint("i32neg")), result{uint64(0), false}},
		{"Uint u64", r(f.Uint("u64big")), result{uint64(math.MaxUint64), true}},
		{"Uint of float", r(f.Uint("f32")), result{uint64(0), false}},
		{"Uint missing", r(f.Uint("nope")), result{uint64(0), false}},
		{"Int negative", r(f.Int("i32neg")), result{int64(-5), true}},
		{"Int u8", r(f.Int("u8")), result{int64(200), true}},
		{"Int too big", r(f.Int("u64big")), result{int64(0), false}},
		{"Float f32", r(f.Float("f32")), result{1.5, true}},
		{"Float f64", r(f.Float("f64")), result{-2.25, true}},
		{"Float of int", r(f.Float("i32neg")), result{-5.0, true}},
		{"Float of string", r(f.Float("s")), result{0.0, false}},
		{"Bool", r(f.Bool("b")), result{true, true}},
		{"Bool of int", r(f.Bool("u8")), result{false, false}},
		{"String", r(f.String("s")), result{"hi", true}},
		{"String of array", r(f.String("ss")), result{"", false}},
		{"Strings", r(f.Strings("ss")), result{[]string{"a", "", "c"}, true}},
		{"Strings of floats", r(f.Strings("ff")), result{[]string(nil), false}},
		{"Floats", r(f.Floats("ff")), result{[]float32{1, 2}, true}},
		{"Floats of f64 array", r(f.Floats("dd")), result{[]float32(nil), false}},
		{"Ints i32", r(f.Ints("ii")), result{[]int32{-1, 7}, true}},
		{"Ints u8", r(f.Ints("u8s")), result{[]int32{1, 255}, true}},
		{"Ints i64 out of range", r(f.Ints("i64s")), result{[]int32(nil), false}},
		{"Ints u64 out of range", r(f.Ints("u64s")), result{[]int32(nil), false}},
		{"Ints of strings", r(f.Ints("ss")), result{[]int32(nil), false}},
		{"Has", result{f.Has("b"), true}, result{true, true}},
		{"Has missing", result{f.Has("nope"), true}, result{false, true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !reflect.DeepEqual(tt.got, tt.want) {
				t.Errorf("got %#v, want %#v", tt.got, tt.want)
			}
		})
	}
	// Returned arrays are copies: changing one must not change the file.
	ss, _ := f.Strings("ss")
	ss[0] = "changed"
	if again, _ := f.Strings("ss"); again[0] != "a" {
		t.Error("Strings returned the file's own slice")
	}
}

func TestOpen(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	w := NewWriter()
	w.AddKV("general.name", StringValue("tiny"))
	tensors := randomTensors(rng, 6)
	for _, tt := range tensors {
		if err := w.AddTensor(tt.name, tt.typ, tt.dims, tt.data); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), "m.gguf")
	out, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteTo(out); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tensors {
		got, ok := f.Tensor(tt.name)
		if !ok || !bytes.Equal(got.Data, tt.data) {
			t.Errorf("tensor %q differs after Open", tt.name)
		}
	}
	if name, _ := f.String("general.name"); name != "tiny" {
		t.Errorf("general.name = %q", name)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}

	// A malformed file is reported with its path, and nothing stays mapped.
	bad := filepath.Join(t.TempDir(), "bad.gguf")
	if err := os.WriteFile(bad, []byte("GGUF\x01\x00\x00\x00"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(bad); err == nil || !strings.Contains(err.Error(), bad) {
		t.Errorf("Open(bad) error = %v, want one naming the path", err)
	}
	if _, err := Open(filepath.Join(t.TempDir(), "missing.gguf")); err == nil {
		t.Error("Open of a missing file succeeded")
	}
}

// TestHostileCountsAllocateLittle checks that counts claiming far more
// entries than the file holds are refused before anything is allocated
// for them.
func TestHostileCountsAllocateLittle(t *testing.T) {
	inputs := map[string][]byte{
		"kv count":     raw("GGUF").u32(3).u64(0).u64(1 << 40).pad(4096),
		"tensor count": raw("GGUF").u32(3).u64(1 << 40).u64(0).pad(4096),
		"array":        raw("GGUF").u32(3).u64(0).u64(1).str("k").u32(uint32(TypeArray)).u32(uint32(TypeUint8)).u64(1 << 40).pad(4096),
		"strings":      raw("GGUF").u32(3).u64(0).u64(1).str("k").u32(uint32(TypeArray)).u32(uint32(TypeString)).u64(1 << 30).pad(4096),
	}
	for name, in := range inputs {
		t.Run(name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err := Parse(in)
			runtime.ReadMemStats(&after)
			if err == nil {
				t.Fatal("Parse succeeded")
			}
			if got := after.TotalAlloc - before.TotalAlloc; got > 64<<10 {
				t.Errorf("allocated %d bytes for a %d-byte input", got, len(in))
			}
		})
	}
}

func TestValueString(t *testing.T) {
	tests := []struct {
		v    Value
		want string
	}{
		{StringValue("a\"b"), `"a\"b"`},
		{Int8Value(-3), "-3"},
		{Uint64Value(math.MaxUint64), "18446744073709551615"},
		{Float32Value(0.1), "0.1"},
		{BoolValue(false), "false"},
		{Int32sValue([]int32{1, 2}), "[int32 x 2]{1, 2}"},
		{Uint8sValue(make([]uint8, 10)), "[uint8 x 10]{0, 0, 0, 0, 0, 0, 0, 0, ...}"},
		{ArraysValue([]Value{StringsValue([]string{"x"})}), `[array x 1]{[string x 1]{"x"}}`},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			if got := tt.v.String(); got != tt.want {
				t.Errorf("String() = %s, want %s", got, tt.want)
			}
		})
	}
}

// TestIndependentWriter reads a header written by another implementation
// (testdata/hfjs/write.mjs says how it was made).
func TestIndependentWriter(t *testing.T) {
	f, err := Open(filepath.Join("testdata", "hfjs", "metadata.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := []KV{
		{"general.architecture", StringValue("qwen2")},
		{"qwen2.block_count", Uint32Value(24)},
		{"qwen2.rope.freq_base", Float32Value(1e6)},
		{"x.neg", Int32Value(-12345)},
		{"x.big", Uint64Value(1234567890123)},
		{"x.flag", BoolValue(true)},
		{"tokenizer.ggml.tokens", StringsValue([]string{"a", "ü", ""})},
		{"tokenizer.ggml.scores", Float32sValue([]float32{0.5, -0.25})},
	}
	if len(f.KVs) != len(want) || len(f.Tensors) != 0 {
		t.Fatalf("%d kvs %d tensors, want %d and 0", len(f.KVs), len(f.Tensors), len(want))
	}
	for i, kv := range want {
		if got := f.KVs[i]; got.Key != kv.Key || !valueEqual(got.Value, kv.Value) {
			t.Errorf("kv %d = %s: %v, want %s: %v", i, got.Key, got.Value, kv.Key, kv.Value)
		}
	}
}
