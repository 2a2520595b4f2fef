package engine_test

import (
	"context"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/cpu"
	"github.com/trigon-llm/trigon/engine"
)

func TestQuantizationDType(t *testing.T) {
	for _, c := range []struct {
		in   string
		want backend.DType
		ok   bool
	}{{"", 0, true}, {"none", 0, true}, {"FP8", backend.F8E4M3Row, true}, {"awq", 0, false}, {"int8", 0, false}} {
		got, err := engine.QuantizationDType(c.in)
		if got != c.want || (err == nil) != c.ok {
			t.Errorf("%q: %v, %v", c.in, got, err)
		}
	}
}

// TestLoadQuantizationFP8 loads the default model's HF weights with
// --quantization fp8 and generates from them; a model whose rows FP8 cannot
// hold (the fixture's 172-wide MLP) is refused at load.
func TestLoadQuantizationFP8(t *testing.T) {
	b := cpu.New(cpu.Options{Threads: 2})
	l, err := engine.Load(engine.LoadOptions{Model: "../models/default/hf", Backend: b, MaxBatchedTokens: 64, Quantization: "fp8"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.Engine.Run(ctx) }()
	defer func() { cancel(); <-done; l.Close() }()
	ch, err := l.Engine.Submit(ctx, &engine.Request{Prompt: []int32{1, 2, 3}, N: 1, Params: greedy(5)})
	if err != nil {
		t.Fatal(err)
	}
	if res := collect(t, ch, 1); len(res[0].tokens) != 5 {
		t.Errorf("%d tokens, want 5", len(res[0].tokens))
	}
	_, err = engine.Load(engine.LoadOptions{Model: fixture, Backend: b, MaxBatchedTokens: 64, Quantization: "fp8"})
	if err == nil || !strings.Contains(err.Error(), "whole 16-value blocks") {
		t.Errorf("fixture with fp8: %v", err)
	}
}
