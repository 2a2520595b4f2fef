package main

import (
	"strings"
	"testing"
)

// TestRunTensorParallel: trigon run over 2 CPU ranks prints the greedy text
// of one rank; a size the model's heads cannot take is refused with the
// reason, and so is a negative size.
func TestRunTensorParallel(t *testing.T) {
	args := func(tp string) []string {
		return []string{"run", "--model", fixtureModel, "--device", "cpu", "--temperature", "0", "--max-tokens", "8", "--tensor-parallel-size", tp, "hello world"}
	}
	want, errOut, err := execute(t, "", args("1")...)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	got, errOut, err := execute(t, "", args("2")...)
	if err != nil {
		t.Fatalf("--tensor-parallel-size 2: %v\n%s", err, errOut)
	}
	if got != want {
		t.Errorf("--tensor-parallel-size 2 printed %q, 1 printed %q", got, want)
	}
	for tp, reason := range map[string]string{"3": "tensor parallel size 3", "-1": "want at least 1"} {
		if _, _, err := execute(t, "", args(tp)...); err == nil || !strings.Contains(err.Error(), reason) {
			t.Errorf("--tensor-parallel-size %s: %v, want an error containing %q", tp, err, reason)
		}
	}
}
