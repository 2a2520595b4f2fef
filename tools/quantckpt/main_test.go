package main

import (
	"path/filepath"
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/bench"
	"github.com/trigon-llm/trigon/model"
)

// TestPresetConfigs: every bench preset writes a config.json that parses
// back to its shapes (presetConfig checks), so -random works for each.
func TestPresetConfigs(t *testing.T) {
	for _, name := range []string{"llama-3-8b", "qwen2.5-7b", "qwen3-8b", "llama-3.2-1b", "tiny"} {
		cfg, err := bench.Arch(name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := presetConfig(cfg); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestRun writes each format from the tiny preset and from the default
// model's directory and checks every projection loads in its dtype.
func TestRun(t *testing.T) {
	for _, c := range []struct {
		o    options
		src  string
		want backend.DType
	}{
		{options{format: "awq", group: 128, random: true, seed: 1}, "tiny", backend.AWQ4G128},
		{options{format: "fp8", scale: "tensor", random: true, seed: 1}, "tiny", backend.F8E4M3Row},
		{options{format: "awq", group: 32}, "../../models/default/hf", backend.AWQ4G32},
		{options{format: "fp8", scale: "channel"}, "../../models/default/hf", backend.F8E4M3Row},
	} {
		dst := filepath.Join(t.TempDir(), "out")
		if err := run(c.o, c.src, dst); err != nil {
			t.Fatalf("%+v %s: %v", c.o, c.src, err)
		}
		_, _, w, err := model.OpenWeights(dst)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, name := range w.Names() {
			x, _ := w.Tensor(name)
			if model.IsProjection(name) {
				n++
				if x.DType != c.want {
					t.Errorf("%s: %s is %v, want %v", c.src, name, x.DType, c.want)
				}
			}
		}
		w.Close()
		if n == 0 {
			t.Errorf("%s: no projections", c.src)
		}
	}
	if err := run(options{format: "awq", group: 48}, "../../models/default/hf", t.TempDir()); err == nil {
		t.Error("group 48: no error")
	}
}
