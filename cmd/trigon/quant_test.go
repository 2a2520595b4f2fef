package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEvalGreedyCompareModels: `eval greedy --compare-models` compares
// other checkpoints against --model with the baseline cache only; the
// fixture against itself agrees everywhere.
func TestEvalGreedyCompareModels(t *testing.T) {
	text := filepath.Join(t.TempDir(), "text.txt")
	if err := os.WriteFile(text, []byte(strings.Repeat("func main() { fmt.Println(\"hello, world\") }\n", 20)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, err := execute(t, "", "eval", "greedy", "--model", fixtureModel, "--device", "cpu", "--prompts", "2", "--prompt-len", "8",
		"--tokens", "6", "--compare-models", fixtureModel, "--json", text)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	var res struct {
		Results []struct {
			Model     string  `json:"model"`
			DType     string  `json:"kv_cache_dtype"`
			Prefix    float64 `json:"prefix"`
			Identical int     `json:"identical"`
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v: %q", err, out)
	}
	if len(res.Results) != 1 || res.Results[0].Model != fixtureModel || res.Results[0].Prefix != 1 || res.Results[0].Identical != 2 {
		t.Fatalf("results %+v, want one full agreement of %s", res.Results, fixtureModel)
	}
}

// TestQuantizationFlag: --quantization names its values, and an already
// quantized checkpoint is refused.
func TestQuantizationFlag(t *testing.T) {
	if _, _, err := execute(t, "", "run", "--model", fixtureModel, "--device", "cpu", "--quantization", "int3", "hello"); err == nil || !strings.Contains(err.Error(), "int3") {
		t.Errorf("--quantization int3: %v", err)
	}
	if _, _, err := execute(t, "", "bench", "latency", "--device", "cpu", "--arch", "tiny", "--dtype", "q8_0", "--quantization", "fp8",
		"--input-len", "8", "--output-len", "2", "--iters", "1", "--warmup", "0"); err == nil || !strings.Contains(err.Error(), "already Q8_0") {
		t.Errorf("bench latency q8_0 + fp8: %v", err)
	}
}

// TestEvalQuantization: --quantization on eval perplexity and eval greedy
// reaches the models it names. Perplexity of the default model's bf16
// checkpoint quantized to FP8 at load differs from bf16's, by little
// (docs/quantization.md has the whole held-out text's figure); greedy
// quantizes --compare-models' checkpoints when given (an already-Q8_0 one
// is refused, a Q8_0 --model is not) and --model's otherwise; a value
// other than fp8 or none is refused before anything loads.
func TestEvalQuantization(t *testing.T) {
	text := filepath.Join(t.TempDir(), "text.txt")
	if err := os.WriteFile(text, []byte(strings.Repeat("func main() { fmt.Println(\"hello, world\") }\n", 20)), 0o644); err != nil {
		t.Fatal(err)
	}
	held, err := os.ReadFile("../../models/default/heldout.go.txt")
	if err != nil {
		t.Fatal(err)
	}
	heldText := filepath.Join(t.TempDir(), "heldout.txt")
	if err := os.WriteFile(heldText, held[:4000], 0o644); err != nil {
		t.Fatal(err)
	}
	const hf, q8 = "../../models/default/hf", "../../models/default/trigon-go.q8_0.gguf"
	ppl := func(quant string) float64 {
		t.Helper()
		out, errOut, err := execute(t, "", "eval", "perplexity", "--model", hf, "--device", "cpu", "--window", "320", "--quantization", quant, "--json", heldText)
		if err != nil {
			t.Fatalf("--quantization %s: %v\n%s", quant, err, errOut)
		}
		var res struct {
			PPL   float64 `json:"ppl"`
			Quant string  `json:"quantization"`
		}
		if err := json.Unmarshal([]byte(out), &res); err != nil || res.Quant != quant {
			t.Fatalf("--quantization %s: %v, quantization %q in %q", quant, err, res.Quant, out)
		}
		return res.PPL
	}
	base, fp8 := ppl("none"), ppl("fp8")
	if d := fp8/base - 1; d == 0 || d > 0.01 || d < -0.01 {
		t.Errorf("perplexity %.5f with --quantization fp8 against %.5f as stored (%+.3f%%): want a change of under 1%%", fp8, base, 100*d)
	}
	greedy := func(args ...string) error {
		_, _, err := execute(t, "", append([]string{"eval", "greedy", "--device", "cpu", "--prompts", "1", "--prompt-len", "8", "--tokens", "2"}, append(args, text)...)...)
		return err
	}
	for _, c := range []struct {
		name string
		args []string
		err  string // "" for success
	}{
		{"compared Q8_0 refused", []string{"--model", hf, "--compare-models", q8, "--quantization", "fp8"}, "already Q8_0"},
		{"reference Q8_0 as stored", []string{"--model", q8, "--compare-models", hf, "--quantization", "fp8"}, ""},
		{"model Q8_0 refused", []string{"--model", q8, "--kv-cache-dtype", "fp8", "--quantization", "fp8"}, "already Q8_0"},
		{"greedy bad value", []string{"--model", fixtureModel, "--quantization", "int3"}, "--quantization: quantization \"int3\""},
	} {
		err := greedy(c.args...)
		if c.err == "" && err != nil || c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
			t.Errorf("%s: %v, want %q", c.name, err, c.err)
		}
	}
	if _, _, err := execute(t, "", "eval", "perplexity", "--model", fixtureModel, "--device", "cpu", "--quantization", "int3", text); err == nil || !strings.Contains(err.Error(), "--quantization: quantization \"int3\"") {
		t.Errorf("perplexity --quantization int3: %v", err)
	}
}
