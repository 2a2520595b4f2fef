package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEvalFlagErrors: sizes that score nothing or that the library would
// replace by its default are refused, naming the flag, rather than
// printing a NaN perplexity or a result for other settings than the
// ones reported.
func TestEvalFlagErrors(t *testing.T) {
	text := filepath.Join(t.TempDir(), "text.txt")
	if err := os.WriteFile(text, []byte(strings.Repeat("func main() { fmt.Println(\"hello, world\") }\n", 20)), 0o644); err != nil {
		t.Fatal(err)
	}
	ppl := []string{"eval", "perplexity", "--model", fixtureModel, "--device", "cpu"}
	greedy := []string{"eval", "greedy", "--model", fixtureModel, "--device", "cpu", "--prompts", "1", "--prompt-len", "8", "--kv-cache-dtype", "fp8"}
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{append(ppl, "--window", "1", text), "--window 1"},
		{append(ppl, "--window", "0", text), "--window 0"},
		{append(ppl, "--window", "-5", text), "--window -5"},
		{append(ppl, "--chunk", "0", text), "--chunk 0"},
		{append(ppl, "--chunk", "-4", text), "--chunk -4"},
		{append(greedy, "--tokens", "0", text), "--tokens 0"},
		{append(greedy, "--tokens", "-3", text), "--tokens -3"},
	} {
		out, _, err := execute(t, "", c.args...)
		if err == nil || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: %v (stdout %q), want an error naming %s", strings.Join(c.args[6:], " "), err, out, c.msg)
		}
	}
}
