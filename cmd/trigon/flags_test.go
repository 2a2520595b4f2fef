package main

import (
	"strings"
	"testing"
)

// TestModelFlagErrors: run and serve refuse out-of-range sizes with an
// error naming the flag, before the model loads, rather than replacing
// them by the engine's defaults (a --max-seqs 0 running 64 sequences, a
// --gpu-memory-utilization 2 taking 90%) or failing deep in the runner.
func TestModelFlagErrors(t *testing.T) {
	for _, c := range []struct {
		flags []string
		msg   string
	}{
		{[]string{"--max-model-len", "-5"}, "--max-model-len -5"},
		{[]string{"--max-context", "-1"}, "--max-model-len -1"},
		{[]string{"--max-model-len", "4096"}, "--max-model-len 4096 is more than the model's context of 1024 tokens"},
		{[]string{"--max-seqs", "0"}, "--max-seqs 0"},
		{[]string{"--max-seqs", "-1"}, "--max-seqs -1"},
		{[]string{"--max-num-batched-tokens", "-5"}, "--max-num-batched-tokens -5"},
		{[]string{"--kv-blocks", "-3"}, "--kv-blocks -3"},
		{[]string{"--kv-blocks", "1"}, "--kv-blocks 1"},
		{[]string{"--kv-memory", "-1"}, "--kv-memory -1"},
		{[]string{"--kv-memory", "0"}, "--kv-memory 0"},
		{[]string{"--gpu-memory-utilization", "0"}, "--gpu-memory-utilization 0"},
		{[]string{"--gpu-memory-utilization", "2"}, "--gpu-memory-utilization 2"},
		{[]string{"--gpu-memory-utilization", "-0.5"}, "--gpu-memory-utilization -0.5"},
		{[]string{"--gpu-memory-utilization", "NaN"}, "--gpu-memory-utilization NaN"},
		{[]string{"--cuda-graph-memory", "-1"}, "--cuda-graph-memory -1"},
		{[]string{"--threads", "-3"}, "--threads -3"},
		{[]string{"--gpu", "-1"}, "--gpu -1"},
		{[]string{"--tensor-parallel-size", "0"}, "--tensor-parallel-size 0"},
	} {
		for _, sub := range []string{"run", "serve"} {
			args := append([]string{sub, "--model", fixtureModel, "--device", "cpu"}, c.flags...)
			if sub == "run" {
				args = append(args, "-n", "2", "hello")
			} else {
				args = append(args, "--port", "0")
			}
			out, _, err := execute(t, "", args...)
			if err == nil || !strings.Contains(err.Error(), c.msg) {
				t.Errorf("%s %s: %v, want an error naming %s", sub, strings.Join(c.flags, " "), err, c.msg)
			}
			if out != "" {
				t.Errorf("%s %s: stdout %q before the error, want none", sub, strings.Join(c.flags, " "), out)
			}
		}
	}
	for _, c := range []struct {
		flags []string
		msg   string
	}{
		{[]string{"--port", "99999"}, "--port 99999"},
		{[]string{"--port", "-1"}, "--port -1"},
		{[]string{"--port", "0", "--max-queue", "0"}, "--max-queue 0"},
		{[]string{"--port", "0", "--max-queue", "-1"}, "--max-queue -1"},
		{[]string{"--port", "0", "--shutdown-timeout", "-1s"}, "--shutdown-timeout -1s"},
		{[]string{"--port", "0", "--max-mixed-step-ratio", "1"}, "--max-mixed-step-ratio 1"},
		{[]string{"--port", "0", "--max-mixed-step-ratio", "-2"}, "--max-mixed-step-ratio -2"},
		{[]string{"--port", "0", "--max-mixed-step-ratio", "NaN"}, "--max-mixed-step-ratio NaN"},
		{[]string{"--port", "0", "--max-mixed-step-ratio", "+Inf"}, "--max-mixed-step-ratio +Inf"},
	} {
		args := append([]string{"serve", "--model", fixtureModel, "--device", "cpu"}, c.flags...)
		if _, _, err := execute(t, "", args...); err == nil || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("serve %s: %v, want an error naming %s", strings.Join(c.flags, " "), err, c.msg)
		}
	}
}
