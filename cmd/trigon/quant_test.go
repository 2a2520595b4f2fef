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
