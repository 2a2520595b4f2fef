package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/backend/cuda"
)

// execute runs the trigon command line in-process.
func execute(t *testing.T, stdin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	root := newRoot()
	var out, errb bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errb)
	root.SetIn(strings.NewReader(stdin))
	root.SetArgs(args)
	err = root.Execute()
	return out.String(), errb.String(), err
}

func TestRunStreamsCompletion(t *testing.T) {
	out, errOut, err := execute(t, "", "run", "--model", fixtureModel, "--device", "cpu", "--temperature", "0", "--max-tokens", "6", "--seed", "1", "hello world")
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	if !strings.HasPrefix(out, "hello world") || len(out) <= len("hello world\n") {
		t.Errorf("stdout %q: want the prompt followed by generated text", out)
	}
	if !strings.Contains(errOut, "tokens/s") {
		t.Errorf("stderr %q: want a tokens/s line", errOut)
	}
	// Greedy runs repeat exactly.
	again, _, err := execute(t, "", "run", "--model", fixtureModel, "--device", "cpu", "--temperature", "0", "--max-tokens", "6", "hello world")
	if err != nil || again != out {
		t.Errorf("greedy rerun: %q (%v), first %q", again, err, out)
	}
}

func TestRunInteractiveChat(t *testing.T) {
	out, errOut, err := execute(t, "hi there\n/clear\nagain\n/exit\n", "run", "--model", fixtureModel, "--device", "cpu", "-i", "--max-tokens", "4", "--temperature", "0")
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	if n := strings.Count(out, ">>> "); n != 4 {
		t.Errorf("%d prompts in %q, want 4", n, out)
	}
	if strings.Count(errOut, "tokens/s") != 2 {
		t.Errorf("stderr %q: want two generation reports", errOut)
	}
}

func TestRunErrors(t *testing.T) {
	for name, args := range map[string][]string{
		"no prompt":     {"run", "--model", fixtureModel, "--device", "cpu"},
		"missing model": {"run", "--model", "/nonexistent", "--device", "cpu", "x"},
		"bad device":    {"run", "--model", fixtureModel, "--device", "tpu", "x"},
		"long prompt":   {"run", "--model", fixtureModel, "--device", "cpu", "--max-context", "8", strings.Repeat("word ", 50)},
	} {
		if _, _, err := execute(t, "", args...); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	// --device cuda without a usable GPU fails with the reason, rather than
	// falling back as --device auto does.
	if reason := cuda.Available(); reason != nil {
		_, _, err := execute(t, "", "run", "--model", fixtureModel, "--device", "cuda", "x")
		if err == nil || !strings.Contains(err.Error(), "--device cuda") {
			t.Errorf("--device cuda without a GPU: %v", err)
		}
		out, errOut, err := execute(t, "", "run", "-v", "--model", fixtureModel, "--device", "auto", "--max-tokens", "2", "x")
		if err != nil || !strings.Contains(errOut, "using the CPU backend") {
			t.Errorf("--device auto without a GPU: %v, stderr %q, stdout %q", err, errOut, out)
		}
	}
}

func TestInspectAndConvert(t *testing.T) {
	out, _, err := execute(t, "", "inspect", fixtureModel)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"architecture:    llama", "tokenizer:", "context:"} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect output lacks %q:\n%s", want, out)
		}
	}
	dst := t.TempDir() + "/m.gguf"
	if _, _, err := execute(t, "", "convert", "--type", "f16", fixtureModel, dst); err != nil {
		t.Fatal(err)
	}
	out, _, err = execute(t, "", "inspect", dst)
	if err != nil || !strings.Contains(out, "F16") {
		t.Errorf("inspect of the converted file: %v\n%s", err, out)
	}
}

// TestRunFlagErrors: sampling flags out of range, an empty prompt and a
// prompt the context cannot hold are refused naming the flag (or the
// prompt), without the engine's internal prefix, and before the prompt
// is echoed to stdout.
func TestRunFlagErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"-n", "-1", "hello"}, "--max-tokens -1"},
		{[]string{"--max-tokens", "0", "hello"}, "--max-tokens 0"},
		{[]string{"--temperature", "-1", "hello"}, "--temperature -1"},
		{[]string{"--top-p", "2", "hello"}, "--top-p 2"},
		{[]string{"--top-k", "-5", "hello"}, "--top-k -5"},
		{[]string{"--min-p", "3", "hello"}, "--min-p 3"},
		{[]string{"--repetition-penalty", "0", "hello"}, "--repetition-penalty 0"},
		{[]string{"--stop", "", "hello"}, "--stop"},
		{[]string{"--seed", "-2", "hello"}, "--seed -2: want -1 for random, or 0 and up"},
		{[]string{"--seed", "-9223372036854775808", "hello"}, "--seed -9223372036854775808"},
		{[]string{""}, "empty"},
		{[]string{"--max-context", "8", strings.Repeat("word ", 50)}, "maximum context length is 8 tokens"},
		{[]string{"--max-context", "8", "-n", "100", "hi"}, "maximum context length is 8 tokens"},
	} {
		args := append([]string{"run", "--model", fixtureModel, "--device", "cpu"}, c.args...)
		out, _, err := execute(t, "", args...)
		if err == nil || !strings.Contains(err.Error(), c.msg) || strings.Contains(err.Error(), "engine:") {
			t.Errorf("run %q: %v, want an error saying %q without 'engine:'", c.args, err, c.msg)
		}
		if out != "" {
			t.Errorf("run %q: stdout %q, want nothing before the error", c.args, out)
		}
	}
}
