package safetensors

import (
	"bytes"
	"encoding/binary"
	"flag"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/metrics"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the seed files in testdata/")

// seedFiles are small valid files that seed the fuzzers.
func seedFiles(t testing.TB) map[string][]byte {
	rng := rand.New(rand.NewPCG(11, 12))
	return map[string][]byte{
		"empty.safetensors":  build(`{}`, nil),
		"random.safetensors": encodeFile(t, randomTensors(rng, 6), map[string]string{"format": "pt"}),
		"edge.safetensors": build(`{"__metadata__":null,"s":{"dtype":"F64","shape":[],"data_offsets":[4,12]},`+
			`"z":{"dtype":"BF16","shape":[3,0],"data_offsets":[12,12]},"u":{"dtype":"U8","x":[1],"shape":[4],"data_offsets":[0,4]}}  `,
			make([]byte, 16)),
	}
}

// TestSeedFiles checks the committed seeds (run with -update to rewrite
// them) and that each parses.
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
				t.Fatalf("%s differs from the bytes the builders make now", path)
			}
			if _, err := Parse(got); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func addSeeds(f *testing.F, add func(b []byte)) {
	paths, _ := filepath.Glob(filepath.Join("testdata", "*.safetensors"))
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		add(b)
	}
}

// FuzzOpen drives Parse, which is Open after the mmap: it must never panic,
// must allocate in proportion to the input, and on success must return
// tensors inside the input whose sizes match dtype and shape.
func FuzzOpen(f *testing.F) {
	addSeeds(f, func(b []byte) { f.Add(b) })
	f.Fuzz(func(t *testing.T, in []byte) {
		before := heapAllocs()
		file, err := Parse(in)
		if alloc := heapAllocs() - before; alloc > 64*uint64(len(in))+1<<20 {
			t.Fatalf("Parse allocated %d bytes for a %d-byte input", alloc, len(in))
		}
		if err != nil {
			return
		}
		start := 8 + binary.LittleEndian.Uint64(in)
		for _, ti := range file.Tensors() {
			checkSize(t, ti)
			if len(ti.Data) == 0 {
				continue
			}
			// Find the tensor by address: it must lie in the data section.
			found := false
			for off := start; off+uint64(len(ti.Data)) <= uint64(len(in)); off++ {
				if &in[off] == &ti.Data[0] {
					found = true
					break
				}
			}
			if !found {
				t.Fatalf("tensor %q data is not inside the data section", ti.Name)
			}
		}
	})
}

// FuzzParseHeader fuzzes the JSON header alone against a data section of
// dataLen bytes: every accepted entry must fit in it and match its size.
func FuzzParseHeader(f *testing.F) {
	addSeeds(f, func(b []byte) {
		n := binary.LittleEndian.Uint64(b)
		f.Add(b[8:8+n], uint64(len(b))-8-n)
	})
	f.Add([]byte(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"I64","shape":[1,1],"data_offsets":[8,16]}}`), uint64(16))
	f.Fuzz(func(t *testing.T, hdr []byte, dataLen uint64) {
		h, err := parseHeader(hdr, dataLen)
		if err != nil {
			return
		}
		for _, e := range h.entries {
			if e.begin > e.end || e.end > dataLen {
				t.Fatalf("tensor %q at [%d, %d) outside %d bytes", e.info.Name, e.begin, e.end, dataLen)
			}
			e.info.Data = make([]byte, e.end-e.begin)
			checkSize(t, e.info)
		}
	})
}

// checkSize checks a tensor's byte count against its dtype and shape.
func checkSize(t *testing.T, ti TensorInfo) {
	t.Helper()
	size, ok := ElementSize(ti.DType)
	if !ok {
		t.Fatalf("tensor %q has unknown dtype %q", ti.Name, ti.DType)
	}
	n := 1
	for _, d := range ti.Shape {
		if d < 0 {
			t.Fatalf("tensor %q has shape %v", ti.Name, ti.Shape)
		}
		n *= d
	}
	if n*size != len(ti.Data) {
		t.Fatalf("tensor %q: %s %v with %d bytes", ti.Name, ti.DType, ti.Shape, len(ti.Data))
	}
}

// heapAllocs is the cumulative heap allocation in bytes, read without
// stopping the world (it may overcount by about a span per size class).
func heapAllocs() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}
