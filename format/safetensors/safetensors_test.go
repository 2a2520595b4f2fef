package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// build makes a file from a raw JSON header (so that tests can write what
// encoding/json never would, such as duplicate keys) and a data section.
func build(header string, data []byte) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	b = append(b, header...)
	return append(b, data...)
}

// testTensor is a tensor to encode with encodeFile.
type testTensor struct {
	name  string
	dtype string
	shape []int
	data  []byte
}

// encodeFile writes tensors the way the reference writer does: header via
// a JSON encoder, padded with spaces to a multiple of 8, data contiguous
// in the given order.
func encodeFile(t testing.TB, tensors []testTensor, metadata map[string]string) []byte {
	t.Helper()
	hdr := map[string]any{}
	if metadata != nil {
		hdr["__metadata__"] = metadata
	}
	var data []byte
	for _, tt := range tensors {
		begin := len(data)
		data = append(data, tt.data...)
		hdr[tt.name] = map[string]any{"dtype": tt.dtype, "shape": tt.shape, "data_offsets": []int{begin, len(data)}}
	}
	js, err := json.Marshal(hdr)
	if err != nil {
		t.Fatal(err)
	}
	for len(js)%8 != 0 {
		js = append(js, ' ')
	}
	return build(string(js), data)
}

var testDTypes = []string{"F32", "F16", "BF16", "I32", "I64", "U8", "I8", "F64", "BOOL", "U16", "I16", "U32", "U64", "F8_E4M3", "F8_E5M2"}

func randomTensors(rng *rand.Rand, n int) []testTensor {
	ts := make([]testTensor, n)
	for i := range ts {
		dtype := testDTypes[rng.IntN(len(testDTypes))]
		shape := make([]int, rng.IntN(4)) // rank 0 is a scalar
		elems := 1
		for j := range shape {
			shape[j] = rng.IntN(5) // zero-size tensors too
			elems *= shape[j]
		}
		data := make([]byte, elems*dtypeSizes[dtype])
		for j := range data {
			data[j] = byte(rng.Uint32())
		}
		ts[i] = testTensor{name: fmt.Sprintf("model.layers.%d.w%c", i, 'a'+rng.IntN(26)), dtype: dtype, shape: shape, data: data}
	}
	return ts
}

func TestParseRandom(t *testing.T) {
	for seed := range uint64(10) {
		t.Run("", func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 5))
			tensors := randomTensors(rng, int(seed)*4)
			meta := map[string]string{"format": "pt", "seed": fmt.Sprint(seed)}
			in := encodeFile(t, tensors, meta)
			f, err := Parse(in)
			if err != nil {
				t.Fatal(err)
			}
			if got := f.Metadata(); !reflect.DeepEqual(got, meta) {
				t.Errorf("metadata %v, want %v", got, meta)
			}
			all := f.Tensors()
			if len(all) != len(tensors) {
				t.Fatalf("%d tensors, want %d", len(all), len(tensors))
			}
			if !slices.IsSortedFunc(all, func(a, b TensorInfo) int { return strings.Compare(a.Name, b.Name) }) {
				t.Error("Tensors() is not sorted by name")
			}
			hdrLen := binary.LittleEndian.Uint64(in)
			var off uint64 = 8 + hdrLen
			for _, tt := range tensors {
				got, ok := f.Tensor(tt.name)
				if !ok {
					t.Fatalf("tensor %q missing", tt.name)
				}
				if got.DType != tt.dtype || !reflect.DeepEqual(got.Shape, tt.shape) || !bytes.Equal(got.Data, tt.data) {
					t.Errorf("tensor %q = %s %v (%d bytes), want %s %v (%d bytes)", tt.name, got.DType, got.Shape, len(got.Data), tt.dtype, tt.shape, len(tt.data))
				}
				if len(tt.data) > 0 && &got.Data[0] != &in[off] {
					t.Errorf("tensor %q data does not alias the file at %d", tt.name, off)
				}
				if cap(got.Data) != len(got.Data) {
					t.Errorf("tensor %q data has spare capacity", tt.name)
				}
				off += uint64(len(tt.data))
			}
			if _, ok := f.Tensor("__metadata__"); ok {
				t.Error("__metadata__ reported as a tensor")
			}
		})
	}
}

func TestParseAccepts(t *testing.T) {
	tests := []struct {
		name   string
		header string
		data   int
		check  func(*testing.T, *File)
	}{
		{"empty header object", `{}`, 0, func(t *testing.T, f *File) {
			if len(f.Tensors()) != 0 || len(f.Metadata()) != 0 {
				t.Error("not empty")
			}
		}},
		{"null metadata", `{"__metadata__":null,"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, 4, nil},
		{"scalar", `{"a":{"dtype":"F64","shape":[],"data_offsets":[0,8]}}`, 8, func(t *testing.T, f *File) {
			if a, _ := f.Tensor("a"); len(a.Shape) != 0 || len(a.Data) != 8 {
				t.Errorf("scalar = %+v", a)
			}
		}},
		{"zero-size tensors anywhere", `{"a":{"dtype":"F32","shape":[0,3],"data_offsets":[4,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"c":{"dtype":"I8","shape":[0],"data_offsets":[0,0]}}`, 4, nil},
		{"gaps and trailing bytes", `{"a":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}}`, 9, func(t *testing.T, f *File) {
			if a, _ := f.Tensor("a"); len(a.Data) != 2 {
				t.Errorf("a = %+v", a)
			}
		}},
		{"unknown field skipped", `{"a":{"dtype":"U8","extra":{"x":[1,{"y":null}]},"shape":[1],"data_offsets":[0,1]}}`, 1, nil},
		{"space padding", `{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}       `, 1, nil},
		{"escaped names", `{"a\u00e9\n":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`, 1, func(t *testing.T, f *File) {
			if _, ok := f.Tensor("a\u00e9\n"); !ok {
				t.Error("escaped name not decoded")
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := Parse(build(tt.header, make([]byte, tt.data)))
			if err != nil {
				t.Fatal(err)
			}
			if tt.check != nil {
				tt.check(t, f)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	const a = `"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}`
	tests := []struct {
		name    string
		in      []byte
		wantErr string
	}{
		{"short file", []byte{1, 0, 0}, "shorter than the 8-byte header length"},
		{"header past eof", binary.LittleEndian.AppendUint64(nil, 100), "header length 100 runs past the end"},
		{"header absurd", append(binary.LittleEndian.AppendUint64(nil, 1<<40), "{}"...), "exceeds the cap"},
		{"header max uint64", binary.LittleEndian.AppendUint64(nil, math.MaxUint64), "exceeds the cap"},
		{"invalid json", build(`{"a":`, nil), "unexpected end of JSON"},
		{"invalid json token", build(`{"a" 1}`, nil), "invalid JSON"},
		{"not an object", build(`[1,2]`, nil), "want a JSON object"},
		{"empty header", build(``, nil), "unexpected end of JSON"},
		{"trailing garbage", build(`{}x`, nil), "after the header object"},
		{"second object", build(`{}{}`, nil), "after the header object"},
		{"duplicate tensor", build(`{`+a+`,`+a+`}`, make([]byte, 8)), `duplicate key "a"`},
		{"duplicate via escape", build(`{`+a+`,"\u0061":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, make([]byte, 8)), `duplicate key "a"`},
		{"duplicate field", build(`{"a":{"dtype":"F32","dtype":"F16","shape":[2],"data_offsets":[0,8]}}`, make([]byte, 8)), `duplicate key "dtype"`},
		{"duplicate metadata key", build(`{"__metadata__":{"k":"1","k":"2"}}`, nil), `duplicate key "k"`},
		{"metadata not strings", build(`{"__metadata__":{"k":1}}`, nil), "want a string, got number 1"},
		{"metadata not object", build(`{"__metadata__":[]}`, nil), "want a JSON object"},
		{"tensor null", build(`{"a":null}`, nil), "want a JSON object, got null"},
		{"missing field", build(`{"a":{"dtype":"F32","shape":[2]}}`, make([]byte, 8)), "want dtype, shape and data_offsets"},
		{"unknown dtype", build(`{"a":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}}`, make([]byte, 8)), `unknown dtype "F4"`},
		{"dtype not string", build(`{"a":{"dtype":4,"shape":[2],"data_offsets":[0,8]}}`, make([]byte, 8)), "want a string"},
		{"negative dim", build(`{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}`, make([]byte, 8)), "negative value -2"},
		{"fractional dim", build(`{"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,8]}}`, make([]byte, 8)), "1.5 is not an integer"},
		{"exponent dim", build(`{"a":{"dtype":"F32","shape":[2e0],"data_offsets":[0,8]}}`, make([]byte, 8)), "is not an integer"},
		{"overflowing dim", build(`{"a":{"dtype":"F32","shape":[99999999999999999999],"data_offsets":[0,8]}}`, make([]byte, 8)), "overflows"},
		{"dim past int", build(`{"a":{"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,8]}}`, make([]byte, 8)), "overflows"},
		{"shape not array", build(`{"a":{"dtype":"F32","shape":2,"data_offsets":[0,8]}}`, make([]byte, 8)), "want an array"},
		{"shape of strings", build(`{"a":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}}`, make([]byte, 8)), "want a number"},
		{"element count overflow", build(`{"a":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,8]}}`, make([]byte, 8)), "element count of shape"},
		{"byte size overflow", build(`{"a":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]}}`, make([]byte, 8)), "byte size of F64 [4611686018427387904] overflows"},
		{"three offsets", build(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}}`, make([]byte, 8)), "is not [begin, end]"},
		{"one offset", build(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[8]}}`, make([]byte, 8)), "is not [begin, end]"},
		{"begin after end", build(`{"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}}`, make([]byte, 8)), "begin <= end"},
		{"negative offset", build(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}}`, make([]byte, 8)), "negative value -8"},
		{"end past data", build(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, make([]byte, 7)), "past the end of the data section (7 bytes)"},
		{"huge end", build(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551615]}}`, make([]byte, 8)), "overflows"},
		{"size mismatch", build(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, make([]byte, 12)), "F32 [3] needs 3*4 bytes, data_offsets [0, 8] hold 8"},
		{"overlap", build(`{`+a+`,"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`, make([]byte, 12)), `tensor "b" at [4, 12) overlaps tensor "a" at [0, 8)`},
		{"same range", build(`{`+a+`,"b":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}}`, make([]byte, 8)), "overlaps"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := Parse(tt.in)
			if err == nil {
				t.Fatalf("Parse succeeded: %+v", f.Tensors())
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

func TestOpen(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	tensors := randomTensors(rng, 8)
	path := filepath.Join(t.TempDir(), "m.safetensors")
	if err := os.WriteFile(path, encodeFile(t, tensors, nil), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tensors {
		if got, ok := f.Tensor(tt.name); !ok || !bytes.Equal(got.Data, tt.data) {
			t.Errorf("tensor %q differs after Open", tt.name)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}

	bad := filepath.Join(t.TempDir(), "bad.safetensors")
	if err := os.WriteFile(bad, build(`{"a":1}`, nil), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(bad); err == nil || !strings.Contains(err.Error(), bad) {
		t.Errorf("Open(bad) error = %v, want one naming the path", err)
	}
	if _, err := Open(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("Open of a missing file succeeded")
	}
}

// TestHeaderAllocation checks that a hostile header length is refused
// without allocating for it.
func TestHeaderAllocation(t *testing.T) {
	in := append(binary.LittleEndian.AppendUint64(nil, MaxHeaderSize), make([]byte, 4096)...)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := Parse(in)
	runtime.ReadMemStats(&after)
	if err == nil {
		t.Fatal("Parse succeeded")
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 64<<10 {
		t.Errorf("allocated %d bytes", got)
	}
}
