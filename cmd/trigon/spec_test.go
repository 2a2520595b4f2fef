package main

import (
	"strings"
	"testing"
)

// TestSpeculativeConfigFlag: a bad --speculative-config stops serve, run
// and bench latency before they load anything, naming the problem; a good
// one runs, and run reports the drafts' acceptance.
func TestSpeculativeConfigFlag(t *testing.T) {
	for _, args := range [][]string{
		{"serve", "--port", "0"},
		{"run", "x"},
		{"bench", "latency", "--arch", "tiny"},
	} {
		for bad, want := range map[string]string{
			`{"method":"ngram"`: "unexpected EOF",
			`{"method":"ngram","num_speculative_tokens":4,"draft_tensor_parallel_size":1}`: `unknown field "draft_tensor_parallel_size"`,
			`{"method":"eagle","num_speculative_tokens":4}`:                                `method "eagle"`,
		} {
			_, _, err := execute(t, "", append(args, "--model", "/nonexistent", "--speculative-config", bad)...)
			if err == nil || !strings.Contains(err.Error(), "--speculative-config") || !strings.Contains(err.Error(), want) {
				t.Errorf("%v with %s: %v, want an error about the flag containing %q", args, bad, err, want)
			}
		}
	}
	// The default model on Go code it can copy from its prompt, greedily:
	// sampled with the model's own temperature and a random seed, an
	// output can wander off the prompt so that no step has a draft.
	prompt := strings.Repeat("func (c *Client) Get(url string) (*Response, error) {\n\treturn c.Do(NewRequest(\"GET\", url))\n}\n\n", 4)
	_, errOut, err := execute(t, "", "run", "--model", "../../models/default/trigon-go.q8_0.gguf", "--device", "cpu", "-n", "32", "--temperature", "0",
		"--speculative-config", `{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_min":1,"prompt_lookup_max":3}`, prompt)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	if !strings.Contains(errOut, "generated in") || !strings.Contains(errOut, "[speculative: ") {
		t.Errorf("run printed no timing or no speculative line:\n%s", errOut)
	}
}
