package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/model"
)

func TestRopeSummary(t *testing.T) {
	cases := []struct {
		name string
		cfg  model.Config
		want string
	}{
		{"plain", model.Config{RopeTheta: 10000}, "theta 10000"},
		{"linear", model.Config{RopeTheta: 10000, RopeScaling: &model.RopeScaling{Type: model.RopeLinear, Factor: 2}},
			"theta 10000, linear scaling x2"},
		{"llama3", model.Config{RopeTheta: 500000, RopeScaling: &model.RopeScaling{Type: model.RopeLlama3, Factor: 8,
			LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 8192}},
			"theta 500000, llama3 scaling x8 (low freq factor 1, high freq factor 4, original context 8192)"},
		{"llama3 from GGUF", model.Config{RopeTheta: 500000, RopeFreqFactors: []float32{1, 1, 2.5, 8}},
			"theta 500000, llama3 frequency factors (rope_freqs.weight: 4 pairs, 1 to 8)"},
	}
	for _, c := range cases {
		if got := ropeSummary(c.cfg); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

// TestInspectCountsLikeConvert: inspect's tensor count is the one convert
// reports, for the HF checkpoint and for the GGUF file convert wrote from
// it (a Llama 3.1 fixture, whose GGUF form has rope_freqs.weight besides
// the weights).
func TestInspectCountsLikeConvert(t *testing.T) {
	const src = "../../testdata/models/llama3"
	dst := filepath.Join(t.TempDir(), "m.gguf")
	out, _, err := execute(t, "", "convert", "--type", "f16", src, dst)
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(out, ": ")
	n, _, ok2 := strings.Cut(after, " tensors")
	if !ok || !ok2 {
		t.Fatalf("convert output %q: no tensor count", out)
	}
	for _, path := range []string{src, dst} {
		info, _, err := execute(t, "", "inspect", path)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(info, " in "+n+" tensors\n") {
			t.Errorf("inspect %s: want %s tensors as convert wrote:\n%s", path, n, info)
		}
		if !strings.Contains(info, "llama3") {
			t.Errorf("inspect %s: rope line lacks the llama3 scaling:\n%s", path, info)
		}
	}
}
