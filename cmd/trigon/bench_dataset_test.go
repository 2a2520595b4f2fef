package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/engine"
)

func writeDataset(t *testing.T, prompts ...string) string {
	t.Helper()
	var b strings.Builder
	for _, p := range prompts {
		line, err := json.Marshal(map[string]string{"prompt": p})
		if err != nil {
			t.Fatal(err)
		}
		b.Write(line)
		b.WriteByte('\n')
	}
	path := filepath.Join(t.TempDir(), "prompts.jsonl")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestBenchServeDatasetLoopback sends a custom dataset's text prompts to the
// real API and engine on the fixture model: every prompt once by default,
// each request running to --custom-output-len, the input tokens the
// server's own counts.
func TestBenchServeDatasetLoopback(t *testing.T) {
	hs, _ := startServer(t, engine.LoadOptions{MaxSeqs: 4, MaxBatchedTokens: 256, ChunkSize: 64})
	path := writeDataset(t, "func main() {", "package strings\n\nimport (\n", "// Sum returns")
	for _, tc := range []struct {
		name      string
		args      []string
		completed int
	}{
		{"every prompt", nil, 3},
		{"cycling", []string{"--num-prompts", "5"}, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"serve", "--url", hs.URL, "--dataset-name", "custom", "--dataset-path", path,
				"--custom-output-len", "6", "--max-concurrency", "1", "--json", "--progress=false"}, tc.args...)
			out, err := runBench(t, args...)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			var r struct {
				Completed    int      `json:"completed"`
				Failed       int      `json:"failed"`
				Errors       []string `json:"errors"`
				Dataset      string   `json:"dataset"`
				IgnoreEOS    bool     `json:"ignore_eos"`
				InputTokens  int      `json:"input_tokens"`
				OutputTokens int      `json:"output_tokens"`
				OutputLen    string   `json:"output_len"`
			}
			if err := json.Unmarshal([]byte(out), &r); err != nil {
				t.Fatalf("not the JSON report: %v\n%s", err, out)
			}
			if r.Completed != tc.completed || r.Failed != 0 {
				t.Fatalf("completed %d, failed %d: %v", r.Completed, r.Failed, r.Errors)
			}
			if r.OutputTokens != 6*tc.completed || r.OutputLen != "fixed:6" || !r.IgnoreEOS || r.Dataset != path {
				t.Errorf("report %+v: want %d output tokens (6 each, ignore_eos) from %s", r, 6*tc.completed, path)
			}
			// Each prompt is a few tokens of the fixture's tokenizer.
			if r.InputTokens < tc.completed || r.InputTokens > 20*tc.completed {
				t.Errorf("%d input tokens for %d short prompts", r.InputTokens, tc.completed)
			}
		})
	}
}

func TestBenchServeDatasetFlagErrors(t *testing.T) {
	good := writeDataset(t, "x")
	bad := filepath.Join(t.TempDir(), "bad.jsonl")
	if err := os.WriteFile(bad, []byte("{\"text\": \"x\"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--dataset-name", "custom"}, "needs --dataset-path"},
		{[]string{"--dataset-name", "sharegpt", "--dataset-path", good}, "want random or custom"},
		{[]string{"--dataset-name", "random", "--dataset-path", good}, "--dataset-path needs --dataset-name custom"},
		{[]string{"--custom-output-len", "8"}, "--custom-output-len needs --dataset-name custom"},
		{[]string{"--dataset-path", good, "--input-len", "fixed:8"}, "--input-len is for random prompts"},
		{[]string{"--dataset-path", good, "--output-len", "fixed:8"}, "--output-len is for random prompts"},
		{[]string{"--dataset-path", good, "--token-ids", "1-9"}, "--token-ids is for random prompts"},
		{[]string{"--dataset-path", good, "--custom-output-len", "0"}, "--custom-output-len 0"},
		{[]string{"--dataset-path", bad}, "line 1: no string field"},
		{[]string{"--dataset-path", bad + ".missing"}, "no such file"},
	} {
		_, err := runBench(t, append([]string{"serve", "--url", "http://127.0.0.1:1", "--progress=false"}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one mentioning %q", tc.args, err, tc.want)
		}
	}
}
