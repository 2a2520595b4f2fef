package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/backend"
)

func TestKVWindowOption(t *testing.T) {
	for _, c := range []struct {
		flag, want int
		err        bool
	}{
		{flag: backend.DefaultKVWindow, want: backend.DefaultKVWindow},
		{flag: 16, want: 16},
		{flag: 0, want: backend.KVNoWindow}, // the flag's 0 is none, not the default
		{flag: -1, err: true},
	} {
		got, err := kvWindowOption(c.flag)
		if (err != nil) != c.err || (err == nil && got != c.want) {
			t.Errorf("kvWindowOption(%d) = %d, %v; want %d (error %v)", c.flag, got, err, c.want, c.err)
		}
	}
}

// TestEvalGreedy runs `eval greedy` on the fixture model: a format
// compared with itself agrees everywhere, and a negative
// --kv-cache-window is refused, on eval as on serve, run and bench.
func TestEvalGreedy(t *testing.T) {
	text := filepath.Join(t.TempDir(), "text.txt")
	if err := os.WriteFile(text, []byte(strings.Repeat("func main() { fmt.Println(\"hello, world\") }\n", 20)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, err := execute(t, "", "eval", "greedy", "--model", fixtureModel, "--device", "cpu", "--prompts", "2", "--prompt-len", "8",
		"--tokens", "6", "--baseline", "bf16", "--kv-cache-dtype", "bf16,fp8", "--kv-cache-window", "0", "--json", text)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	var res struct {
		Results []struct {
			DType     string  `json:"kv_cache_dtype"`
			Prefix    float64 `json:"prefix"`
			Overall   float64 `json:"overall"`
			Identical int     `json:"identical"`
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v: %q", err, out)
	}
	if len(res.Results) != 2 || res.Results[0].DType != "bf16" || res.Results[1].DType != "fp8" {
		t.Fatalf("results %+v, want bf16 and fp8", res.Results)
	}
	if r := res.Results[0]; r.Prefix != 1 || r.Overall != 1 || r.Identical != 2 {
		t.Errorf("bf16 against itself: %+v, want full agreement", r)
	}
	for _, cmd := range [][]string{
		{"eval", "greedy", "--model", fixtureModel, "--device", "cpu", "--kv-cache-window", "-1", text},
		{"eval", "perplexity", "--model", fixtureModel, "--device", "cpu", "--kv-cache-window", "-1", text},
		{"run", "--model", fixtureModel, "--device", "cpu", "--kv-cache-window", "-1", "hello"},
	} {
		if _, _, err := execute(t, "", cmd...); err == nil || !strings.Contains(err.Error(), "--kv-cache-window -1") {
			t.Errorf("%s %s --kv-cache-window -1: %v, want an error naming the flag", cmd[0], cmd[1], err)
		}
	}
}

// TestKVCacheGroupNeedsAGroupedDType: --kv-cache-group is refused, before
// any model work, with a --kv-cache-dtype that has no channel groups
// (bf16, fp8, auto) and outside the group sizes; int8 and int4 take it.
func TestKVCacheGroupNeedsAGroupedDType(t *testing.T) {
	for _, c := range []struct {
		dtype string
		group int
		msg   string // "": no error
	}{
		{"int8", 16, ""},
		{"int4", 128, ""},
		{"bf16", 0, ""},
		{"bf16", 16, "--kv-cache-group 16 with --kv-cache-dtype bf16"},
		{"fp8", 8, "--kv-cache-group 8 with --kv-cache-dtype fp8"},
		{"auto", 32, "--kv-cache-group 32 with --kv-cache-dtype auto"},
		{"int8", 7, "--kv-cache-group 7"},
		{"int8", -8, "--kv-cache-group -8"},
	} {
		err := checkKVGroup(c.dtype, c.group)
		if (c.msg == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.msg)) {
			t.Errorf("checkKVGroup(%q, %d) = %v; want %q", c.dtype, c.group, err, c.msg)
		}
	}
	// The command refuses it before it reads the text (there is none).
	_, _, err := execute(t, "", "eval", "perplexity", "--model", fixtureModel, "--device", "cpu",
		"--kv-cache-dtype", "bf16", "--kv-cache-group", "16", filepath.Join(t.TempDir(), "missing.txt"))
	if err == nil || !strings.Contains(err.Error(), "--kv-cache-group 16 with --kv-cache-dtype bf16") {
		t.Errorf("eval perplexity --kv-cache-dtype bf16 --kv-cache-group 16: %v, want the refusal", err)
	}
}

// TestEvalRefusesUnknownKVDTypes: eval's KV cache formats are checked
// before any model work (the text file here does not even exist), not
// when the run that uses one comes after the baseline's.
func TestEvalRefusesUnknownKVDTypes(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.txt")
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"eval", "greedy", "--kv-cache-dtype", "fp8,int9"}, "--kv-cache-dtype int9: want one of"},
		{[]string{"eval", "greedy", "--baseline", "bogus"}, "--baseline bogus: want one of"},
		{[]string{"eval", "perplexity", "--kv-cache-dtype", "bogus"}, "--kv-cache-dtype bogus: want one of"},
	} {
		args := append(c.args, "--model", fixtureModel, "--device", "cpu", missing)
		if _, _, err := execute(t, "", args...); err == nil || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: %v, want an error saying %q", strings.Join(c.args, " "), err, c.msg)
		}
	}
}

// TestEvalGreedyKVGroup: eval greedy's --kv-cache-group reaches the
// grouped formats' runs (a group wider than the fixture's head dim is
// refused there, by the runner) and is refused before any model work
// when no format compared has channel groups.
func TestEvalGreedyKVGroup(t *testing.T) {
	text := filepath.Join(t.TempDir(), "text.txt")
	if err := os.WriteFile(text, []byte(strings.Repeat("func main() { fmt.Println(\"hello, world\") }\n", 20)), 0o644); err != nil {
		t.Fatal(err)
	}
	base := []string{"eval", "greedy", "--model", fixtureModel, "--device", "cpu", "--prompts", "2", "--prompt-len", "8", "--tokens", "4", "--json"}
	out, errOut, err := execute(t, "", append(base, "--kv-cache-dtype", "fp8,int8", "--kv-cache-group", "8", text)...)
	if err != nil {
		t.Fatalf("--kv-cache-dtype fp8,int8 --kv-cache-group 8: %v\n%s", err, errOut)
	}
	if !strings.Contains(out, `"kv_cache_group":8`) {
		t.Errorf("output %q does not state the group", out)
	}
	if _, _, err := execute(t, "", append(base, "--kv-cache-dtype", "int8", "--kv-cache-group", "128", text)...); err == nil || !strings.Contains(err.Error(), "group size 128") {
		t.Errorf("--kv-cache-group 128 over the fixture's head dim: %v, want the runner's refusal", err)
	}
	missing := filepath.Join(t.TempDir(), "missing.txt")
	if _, _, err := execute(t, "", append(base, "--kv-cache-dtype", "fp8", "--kv-cache-group", "16", missing)...); err == nil || !strings.Contains(err.Error(), "none of --baseline bf16 and --kv-cache-dtype fp8 has channel groups") {
		t.Errorf("--kv-cache-dtype fp8 --kv-cache-group 16: %v, want the refusal", err)
	}
	if _, _, err := execute(t, "", append(base, "--kv-cache-dtype", "int4", "--kv-cache-group", "7", missing)...); err == nil || !strings.Contains(err.Error(), "--kv-cache-group 7") {
		t.Errorf("--kv-cache-group 7: %v, want the refusal", err)
	}
}
