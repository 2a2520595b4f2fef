package safetensors

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// writeShards writes tensors split over shards as a sharded model
// directory, with weightMap as the index (nil: the true map).
func writeShards(t *testing.T, dir string, shards map[string][]testTensor, weightMap map[string]string) {
	t.Helper()
	if weightMap == nil {
		weightMap = map[string]string{}
		for shard, ts := range shards {
			for _, tt := range ts {
				weightMap[tt.name] = shard
			}
		}
	}
	for shard, ts := range shards {
		if err := os.WriteFile(filepath.Join(dir, shard), encodeFile(t, ts, map[string]string{"format": "pt"}), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	idx, err := json.Marshal(map[string]any{"metadata": map[string]any{"total_size": 123}, "weight_map": weightMap})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, IndexFile), idx, 0o644); err != nil {
		t.Fatal(err)
	}
}

func checkSet(t *testing.T, s *Set, want []testTensor) {
	t.Helper()
	var names []string
	for _, tt := range want {
		names = append(names, tt.name)
		got, ok := s.Tensor(tt.name)
		if !ok {
			t.Fatalf("tensor %q missing", tt.name)
		}
		if got.DType != tt.dtype || !reflect.DeepEqual(got.Shape, tt.shape) || !bytes.Equal(got.Data, tt.data) {
			t.Errorf("tensor %q differs", tt.name)
		}
	}
	slices.Sort(names)
	if got := s.Names(); !reflect.DeepEqual(got, names) {
		t.Errorf("Names() = %v, want %v", got, names)
	}
	if _, ok := s.Tensor("nope"); ok {
		t.Error("found a tensor that does not exist")
	}
}

func TestOpenDirSingle(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	tensors := randomTensors(rng, 5)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, SingleFile), encodeFile(t, tensors, nil), 0o644); err != nil {
		t.Fatal(err)
	}
	// A stale index beside the single file is ignored, as transformers does.
	if err := os.WriteFile(filepath.Join(dir, IndexFile), []byte("garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	checkSet(t, s, tensors)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestOpenDirSharded(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 2))
	tensors := randomTensors(rng, 9)
	shards := map[string][]testTensor{
		"model-00001-of-00003.safetensors": tensors[:4],
		"model-00002-of-00003.safetensors": tensors[4:5],
		"model-00003-of-00003.safetensors": tensors[5:],
	}
	dir := t.TempDir()
	writeShards(t, dir, shards, nil)
	s, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.files) != 3 {
		t.Errorf("opened %d files, want each of 3 shards once", len(s.files))
	}
	checkSet(t, s, tensors)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestOpenDirErrors(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	tensors := randomTensors(rng, 4)
	two := map[string][]testTensor{"s1.safetensors": tensors[:2], "s2.safetensors": tensors[2:]}
	trueMap := func() map[string]string {
		m := map[string]string{}
		for shard, ts := range two {
			for _, tt := range ts {
				m[tt.name] = shard
			}
		}
		return m
	}
	tests := []struct {
		name    string
		setup   func(t *testing.T, dir string)
		wantErr string
	}{
		{"empty dir", func(t *testing.T, dir string) {}, "has neither model.safetensors nor model.safetensors.index.json"},
		{"tensor missing from map", func(t *testing.T, dir string) {
			m := trueMap()
			delete(m, tensors[1].name)
			writeShards(t, dir, two, m)
		}, "is in shard s1.safetensors but not in the weight_map"},
		{"mapped to the wrong shard", func(t *testing.T, dir string) {
			m := trueMap()
			m[tensors[0].name] = "s2.safetensors"
			writeShards(t, dir, two, m)
		}, "but the weight_map puts it in s2.safetensors"},
		{"mapped tensor absent", func(t *testing.T, dir string) {
			m := trueMap()
			m["ghost"] = "s2.safetensors"
			writeShards(t, dir, two, m)
		}, `puts tensor "ghost" in shard s2.safetensors, which does not hold it`},
		{"tensor in two shards", func(t *testing.T, dir string) {
			dup := map[string][]testTensor{"s1.safetensors": tensors[:2], "s2.safetensors": tensors[1:]}
			m := trueMap()
			writeShards(t, dir, dup, m)
		}, "but the weight_map puts it in"},
		{"missing shard file", func(t *testing.T, dir string) {
			m := trueMap()
			m[tensors[0].name] = "s3.safetensors"
			writeShards(t, dir, two, m)
		}, "s3.safetensors: no such file"},
		{"shard outside dir", func(t *testing.T, dir string) {
			m := trueMap()
			m[tensors[0].name] = "../s1.safetensors"
			writeShards(t, dir, two, m)
		}, "not a path inside the model directory"},
		{"absolute shard", func(t *testing.T, dir string) {
			m := trueMap()
			m[tensors[0].name] = "/etc/passwd"
			writeShards(t, dir, two, m)
		}, "not a path inside the model directory"},
		{"bad shard", func(t *testing.T, dir string) {
			writeShards(t, dir, two, nil)
			os.WriteFile(filepath.Join(dir, "s2.safetensors"), []byte("short"), 0o644)
		}, "shorter than the 8-byte header length"},
		{"index without weight_map", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, IndexFile), []byte(`{"metadata":{}}`), 0o644)
		}, "index has no weight_map"},
		{"index not json", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, IndexFile), []byte(`{"weight_map":`), 0o644)
		}, "unexpected end of JSON"},
		{"index duplicate name", func(t *testing.T, dir string) {
			writeShards(t, dir, two, nil)
			idx := `{"weight_map":{"` + tensors[0].name + `":"s1.safetensors","` + tensors[0].name + `":"s2.safetensors"}}`
			os.WriteFile(filepath.Join(dir, IndexFile), []byte(idx), 0o644)
		}, "duplicate key"},
		{"single file invalid", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, SingleFile), build(`{"a":{}}`, nil), 0o644)
		}, "want dtype, shape and data_offsets"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			tt.setup(t, dir)
			s, err := OpenDir(dir)
			if err == nil {
				s.Close()
				t.Fatal("OpenDir succeeded")
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error %q does not contain %q", err, tt.wantErr)
			}
		})
	}
}
