package bench

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/model"
)

// paramCount sums the elements of every tensor cfg needs.
func paramCount(cfg model.Config) int64 {
	var n int64
	for _, s := range model.ExpectedWeights(cfg) {
		e := int64(1)
		for _, d := range s.Shape {
			e *= int64(d)
		}
		n += e
	}
	return n
}

// TestPresetsMatchPublishedParameterCounts checks each preset against the
// parameter count its publisher states (the sizes of the safetensors
// checkpoints on the Hugging Face hub), which pins every shape at once.
func TestPresetsMatchPublishedParameterCounts(t *testing.T) {
	for _, tc := range []struct {
		name   string
		params int64
		kvDim  int // NumKVHeads * HeadDim
		tied   bool
	}{
		{"llama-3-8b", 8_030_261_248, 1024, false},
		{"llama-3.1-70b", 70_553_706_496, 1024, false},
		{"Llama-3.1-8B", 8_030_261_248, 1024, false},
		{"qwen2.5-7b", 7_615_616_512, 512, false},
		{"qwen3-8b", 8_190_735_360, 1024, false},
		{"llama-3.2-1b", 1_235_814_400, 512, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Arch(tc.name)
			if err != nil {
				t.Fatal(err)
			}
			if got := paramCount(cfg); got != tc.params {
				t.Errorf("%d parameters, published %d", got, tc.params)
			}
			if got := cfg.NumKVHeads * cfg.HeadDim; got != tc.kvDim {
				t.Errorf("KV width %d, want %d", got, tc.kvDim)
			}
			if label := ArchLabel(tc.name); label != strings.ToLower(strings.Replace(tc.name, "3.1", "3", 1)) {
				t.Errorf("ArchLabel(%q) = %q", tc.name, label)
			}
			if cfg.TieEmbeddings != tc.tied {
				t.Errorf("tied embeddings %v, want %v", cfg.TieEmbeddings, tc.tied)
			}
		})
	}
}

// TestArchDefaultMatchesHFConfig reads the embedded GGUF's config and
// compares it with the Hugging Face config.json the GGUF was converted from.
func TestArchDefaultMatchesHFConfig(t *testing.T) {
	got, err := Arch("default")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile("../models/default/hf/config.json")
	if err != nil {
		t.Fatal(err)
	}
	want, err := model.ParseHFConfig(data)
	if err != nil {
		t.Fatal(err)
	}
	type shape struct {
		Vocab, Hidden, Inter, Layers, Heads, KV, HeadDim int
		Tied                                             bool
		Theta                                            float64
	}
	of := func(c model.Config) shape {
		return shape{c.VocabSize, c.Hidden, c.Intermediate, c.NumLayers, c.NumHeads, c.NumKVHeads, c.HeadDim, c.TieEmbeddings, c.RopeTheta}
	}
	if of(got) != of(want) {
		t.Errorf("default arch %+v, config.json %+v", of(got), of(want))
	}
}

func TestArchConfigPath(t *testing.T) {
	file := "../testdata/models/llama3/config.json"
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	want, err := model.ParseHFConfig(data)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, path string }{
		{"file", file},
		{"directory", filepath.Dir(file)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Arch(tc.path)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("Arch(%s) = %+v, want %+v", tc.path, got, want)
			}
		})
	}
}

func TestArchErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "config.json")
	if err := os.WriteFile(bad, []byte(`{"model_type": "gpt2"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, arg, want string }{
		{"unknown name", "llama-9-9000b", "not a known architecture"},
		{"unsupported config", bad, "config"},
		{"dir without config", t.TempDir(), "config.json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Arch(tc.arg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Arch(%q) error %v, want one mentioning %q", tc.arg, err, tc.want)
			}
		})
	}
}
