package gguf

import (
	"bytes"
	"flag"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/metrics"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the seed files in testdata/")

// seedFiles are small valid files covering every value type, nested
// arrays, every supported tensor type and a non-default alignment. They
// seed the fuzzer and pin the writer's output byte for byte.
func seedFiles(t testing.TB) map[string][]byte {
	files := map[string][]byte{
		"handbuilt_v2.gguf": func() []byte { s := baseSpec(); s.version = 2; return s.bytes() }(),
		"handbuilt_v3.gguf": baseSpec().bytes(),
	}
	for i, align := range []uint32{0, 16} {
		rng := rand.New(rand.NewPCG(uint64(i), 1234))
		w := NewWriter()
		for j := range 13 {
			w.AddKV("k."+ValueType(j).String(), randomValue(rng, ValueType(j), 0))
		}
		w.AddKV("nested", ArraysValue([]Value{Int32sValue([]int32{1, -2}), StringsValue([]string{"x"}), ArraysValue(nil)}))
		if align != 0 {
			w.AddKV(AlignmentKey, Uint32Value(align))
		}
		for k, typ := range writableTypes[i*10 : i*10+10] {
			dims := []uint64{uint64(typ.BlockSize()), uint64(1 + k%2)}
			size, _ := typ.Bytes(dims)
			data := make([]byte, size)
			for j := range data {
				data[j] = byte(rng.Uint32())
			}
			if err := w.AddTensor("t."+typ.String(), typ, dims, data); err != nil {
				t.Fatal(err)
			}
		}
		var buf bytes.Buffer
		if _, err := w.WriteTo(&buf); err != nil {
			t.Fatal(err)
		}
		files[[]string{"writer_a.gguf", "writer_b.gguf"}[i]] = buf.Bytes()
	}
	return files
}

// TestSeedFiles checks the committed seeds against what the builders make
// now (run with -update to rewrite them), and that each parses.
func TestSeedFiles(t *testing.T) {
	for name, want := range seedFiles(t) {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join("testdata", name)
			if *update {
				if err := os.WriteFile(path, want, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%s differs from the bytes the builders make now (%d vs %d bytes)", path, len(got), len(want))
			}
			if _, err := Parse(got); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// FuzzParse checks that Parse never panics, allocates in proportion to its
// input, and on success returns tensors that lie inside the input, are
// aligned and disjoint, and survive a write and re-parse unchanged.
func FuzzParse(f *testing.F) {
	paths, _ := filepath.Glob(filepath.Join("testdata", "*.gguf"))
	more, _ := filepath.Glob(filepath.Join("testdata", "*", "*.gguf"))
	for _, p := range append(paths, more...) {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		before := heapAllocs()
		file, err := Parse(in)
		if alloc := heapAllocs() - before; alloc > 64*uint64(len(in))+1<<20 {
			t.Fatalf("Parse allocated %d bytes for a %d-byte input", alloc, len(in))
		}
		if err != nil {
			return
		}
		checkParsed(t, in, file)
		if file.Alignment > 1<<16 {
			// Legal, but re-writing would pad to gigabytes in memory.
			return
		}

		// What was read must be writable and read back the same.
		w := NewWriter()
		for _, kv := range file.KVs {
			w.AddKV(kv.Key, kv.Value)
		}
		for _, ti := range file.Tensors {
			if err := w.AddTensor(ti.Name, ti.Type, ti.Dims, ti.Data); err != nil {
				t.Fatalf("re-adding tensor %q: %v", ti.Name, err)
			}
		}
		var buf bytes.Buffer
		if _, err := w.WriteTo(&buf); err != nil {
			t.Fatalf("re-writing: %v", err)
		}
		again, err := Parse(buf.Bytes())
		if err != nil {
			t.Fatalf("re-parsing the re-written file: %v", err)
		}
		if len(again.KVs) != len(file.KVs) || len(again.Tensors) != len(file.Tensors) {
			t.Fatalf("re-parse has %d kvs %d tensors, want %d %d", len(again.KVs), len(again.Tensors), len(file.KVs), len(file.Tensors))
		}
		for i, kv := range file.KVs {
			if again.KVs[i].Key != kv.Key || !valueEqual(again.KVs[i].Value, kv.Value) {
				t.Fatalf("kv %d changed in the round trip", i)
			}
		}
		for i, ti := range file.Tensors {
			a := again.Tensors[i]
			if a.Name != ti.Name || a.Type != ti.Type || !bytes.Equal(a.Data, ti.Data) {
				t.Fatalf("tensor %q changed in the round trip", ti.Name)
			}
		}
	})
}

// checkParsed checks the invariants of a successfully parsed file.
func checkParsed(t *testing.T, in []byte, f *File) {
	t.Helper()
	if f.Alignment == 0 || f.Alignment&(f.Alignment-1) != 0 {
		t.Fatalf("alignment %d", f.Alignment)
	}
	for i, kv := range f.KVs {
		if v, ok := f.Value(kv.Key); !ok || !valueEqual(v, f.KVs[i].Value) {
			t.Fatalf("lookup of key %q does not find entry %d", kv.Key, i)
		}
	}
	type span struct{ lo, hi uint64 }
	var spans []span
	for _, ti := range f.Tensors {
		size, err := ti.Type.Bytes(ti.Dims)
		if err != nil || uint64(len(ti.Data)) != size {
			t.Fatalf("tensor %q: %d bytes of data, type says %d (%v)", ti.Name, len(ti.Data), size, err)
		}
		if ti.Offset%f.Alignment != 0 {
			t.Fatalf("tensor %q offset %d not aligned", ti.Name, ti.Offset)
		}
		lo := f.DataOffset + ti.Offset
		hi := lo + size
		if lo < f.DataOffset || hi < lo || hi > uint64(len(in)) {
			t.Fatalf("tensor %q spans [%d, %d) of a %d-byte input", ti.Name, lo, hi, len(in))
		}
		if &in[lo] != &ti.Data[0] {
			t.Fatalf("tensor %q data is not the input at %d", ti.Name, lo)
		}
		for _, s := range spans {
			if lo < s.hi && s.lo < hi {
				t.Fatalf("tensor %q overlaps another", ti.Name)
			}
		}
		spans = append(spans, span{lo, hi})
		if got, ok := f.Tensor(ti.Name); !ok || got.Offset != ti.Offset {
			t.Fatalf("lookup of tensor %q failed", ti.Name)
		}
	}
}

// heapAllocs is the cumulative heap allocation in bytes. runtime/metrics is
// used rather than ReadMemStats because it does not stop the world, which
// keeps the fuzzer fast; it may overcount by about a span per size class,
// hence the slack in the bound above.
func heapAllocs() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}
