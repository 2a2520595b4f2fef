package model_test

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/format/safetensors"
	"github.com/trigon-llm/trigon/model"
	"github.com/trigon-llm/trigon/model/internal/modeltest"
)

// stTensor is one tensor to write into a safetensors file.
type stTensor struct {
	name, dtype string
	shape       []int
	data        []byte
}

// writeSafetensors writes tensors as a safetensors file at path: an
// 8-byte little-endian header length, the JSON header, the data.
func writeSafetensors(t *testing.T, path string, tensors []stTensor) {
	t.Helper()
	hdr := map[string]any{}
	var data []byte
	for _, tn := range tensors {
		hdr[tn.name] = map[string]any{"dtype": tn.dtype, "shape": append([]int{}, tn.shape...), "data_offsets": []int{len(data), len(data) + len(tn.data)}}
		data = append(data, tn.data...)
	}
	js, err := json.Marshal(hdr)
	if err != nil {
		t.Fatal(err)
	}
	for len(js)%8 != 0 {
		js = append(js, ' ')
	}
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(js)))
	out = append(append(out, js...), data...)
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
}

func f32s(v ...float32) []byte {
	b := make([]byte, 4*len(v))
	for i, f := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f))
	}
	return b
}

func bf16s(v ...float32) []byte {
	b := make([]byte, 2*len(v))
	for i, f := range v {
		binary.LittleEndian.PutUint16(b[2*i:], backend.F32ToBF16(f))
	}
	return b
}

// withScales copies the llama3 fixture (2 layers, 2 KV heads) into a
// temporary directory, its safetensors file with extra tensors added.
func withScales(t *testing.T, extra []stTensor) string {
	t.Helper()
	src := filepath.Join(modeltest.ModelsDir(), "llama3")
	dir := t.TempDir()
	for _, f := range []string{"config.json", "generation_config.json"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f, err := safetensors.Open(filepath.Join(src, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var ts []stTensor
	for _, ti := range f.Tensors() {
		ts = append(ts, stTensor{ti.Name, ti.DType, ti.Shape, slices.Clone(ti.Data)})
	}
	writeSafetensors(t, filepath.Join(dir, "model.safetensors"), append(ts, extra...))
	return dir
}

// TestReadKVScales reads FP8 KV cache scales from safetensors checkpoints
// written here: scalar and per-head, F32 and BF16, under both names vLLM
// and compressed-tensors use; a checkpoint without them reads as nil, and
// one with some missing is an error.
func TestReadKVScales(t *testing.T) {
	scalar := func(l int, kv string, v float32) stTensor {
		return stTensor{fmt.Sprintf("model.layers.%d.self_attn.%s_scale", l, kv), "F32", nil, f32s(v)}
	}
	perHead := func(l int, kv string, v ...float32) stTensor {
		return stTensor{fmt.Sprintf("model.layers.%d.self_attn.%s_proj.%s_scale", l, kv, kv), "BF16", []int{len(v)}, bf16s(v...)}
	}
	for _, c := range []struct {
		name  string
		extra []stTensor
		want  []model.KVScales // nil: none
		err   string
	}{
		{"none", nil, nil, ""},
		{"scalar", []stTensor{scalar(0, "k", 0.5), scalar(0, "v", 0.25), scalar(1, "k", 2), scalar(1, "v", 0.125)},
			[]model.KVScales{{K: []float32{0.5}, V: []float32{0.25}}, {K: []float32{2}, V: []float32{0.125}}}, ""},
		{"per head, proj names", []stTensor{perHead(0, "k", 0.5, 1), perHead(0, "v", 0.25, 4), perHead(1, "k", 3, 0.75), perHead(1, "v", 8, 0.0625)},
			[]model.KVScales{{K: []float32{0.5, 1}, V: []float32{0.25, 4}}, {K: []float32{3, 0.75}, V: []float32{8, 0.0625}}}, ""},
		{"mixed", []stTensor{scalar(0, "k", 0.5), perHead(0, "v", 0.25, 4), perHead(1, "k", 3, 0.75), scalar(1, "v", 1)},
			[]model.KVScales{{K: []float32{0.5}, V: []float32{0.25, 4}}, {K: []float32{3, 0.75}, V: []float32{1}}}, ""},
		{"a layer lacks v", []stTensor{scalar(0, "k", 0.5), scalar(0, "v", 0.25), scalar(1, "k", 2)}, nil, "layer 1 lacks"},
		{"two names for one", []stTensor{scalar(0, "k", 0.5), perHead(0, "k", 1, 1), scalar(0, "v", 1), scalar(1, "k", 1), scalar(1, "v", 1)}, nil, "has two"},
		{"layer out of range", []stTensor{scalar(0, "k", 1), scalar(0, "v", 1), scalar(1, "k", 1), scalar(1, "v", 1), scalar(2, "k", 1)}, nil, "layer 2 of 2"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, _, w, err := model.OpenWeights(withScales(t, c.extra))
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			got, err := model.ReadKVScales(w, cfg.NumLayers)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("ReadKVScales = %v, %v; want an error containing %q", got, err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (got == nil) != (c.want == nil) || len(got) != len(c.want) {
				t.Fatalf("ReadKVScales = %v, want %v", got, c.want)
			}
			for l := range c.want {
				if !slices.Equal(got[l].K, c.want[l].K) || !slices.Equal(got[l].V, c.want[l].V) {
					t.Errorf("layer %d: %v, want %v", l, got[l], c.want[l])
				}
			}
		})
	}
}
