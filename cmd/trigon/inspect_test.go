package main

import (
	"encoding/json"
	"os"
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

// TestGGUFWithoutSuffix: a GGUF file is one by its magic, not its name
// (Ollama stores its models as sha256-... blobs): the weights open by
// magic, so its tokenizer must too, for inspect, run, eval and convert.
func TestGGUFWithoutSuffix(t *testing.T) {
	dir := t.TempDir()
	gguf := filepath.Join(dir, "m.gguf")
	if _, _, err := execute(t, "", "convert", "--type", "f16", fixtureModel, gguf); err != nil {
		t.Fatal(err)
	}
	blob := filepath.Join(dir, "sha256-0123")
	if err := os.Rename(gguf, blob); err != nil {
		t.Fatal(err)
	}
	text := filepath.Join(dir, "text.txt")
	if err := os.WriteFile(text, []byte(strings.Repeat("hello world ", 10)), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"inspect", blob},
		{"run", "--model", blob, "--device", "cpu", "-n", "2", "hello"},
		{"run", "--model", fixtureModel, "--tokenizer", blob, "--device", "cpu", "-n", "2", "hello"},
		{"eval", "perplexity", "--model", blob, "--device", "cpu", text},
		{"convert", "--type", "f16", blob, filepath.Join(dir, "again.gguf")},
	} {
		if _, _, err := execute(t, "", args...); err != nil {
			t.Errorf("%s: %v", strings.Join(args, " "), err)
		}
	}
	// A file that is neither says so, naming it.
	if _, _, err := execute(t, "", "run", "--model", fixtureModel, "--tokenizer", text, "--device", "cpu", "hello"); err == nil ||
		!strings.Contains(err.Error(), text) {
		t.Errorf("--tokenizer on a text file: %v, want an error naming it", err)
	}
}

// TestInspectWarnsOfTokensPastTheVocabulary: a tokenizer with more tokens
// than the model's embedding has rows is described, with a warning that
// run and serve refuse the model and why; a model whose tokenizer fits
// gets no warning.
func TestInspectWarnsOfTokensPastTheVocabulary(t *testing.T) {
	// big: the fixture with one added token past its 512-token vocabulary.
	big := t.TempDir()
	for _, name := range []string{"config.json", "generation_config.json", "model.safetensors", "tokenizer_config.json"} {
		abs, err := filepath.Abs(filepath.Join(fixtureModel, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(abs, filepath.Join(big, name)); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := os.ReadFile(filepath.Join(fixtureModel, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	var tj map[string]any
	if err := json.Unmarshal(raw, &tj); err != nil {
		t.Fatal(err)
	}
	tj["added_tokens"] = append(tj["added_tokens"].([]any), map[string]any{"id": 512, "content": "<|extra|>", "special": true})
	if raw, err = json.Marshal(tj); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(big, "tokenizer.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path string
		warning    string // "": none
	}{
		{"fits", fixtureModel, ""},
		{"past the vocabulary", big, "warning: run and serve will refuse this model: tokenizer has 513 tokens but the model's vocabulary is 512"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, err := execute(t, "", "inspect", tc.path)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out, "vocabulary:") {
				t.Errorf("stdout lacks the description:\n%s", out)
			}
			if tc.warning == "" && strings.Contains(errOut, "warning") {
				t.Errorf("stderr %q: want no warning", errOut)
			}
			if tc.warning != "" && !strings.Contains(errOut, tc.warning) {
				t.Errorf("stderr %q: want %q", errOut, tc.warning)
			}
		})
	}
}
