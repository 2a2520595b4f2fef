package engine

import (
	"context"
	"encoding/binary"
	"math"
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/cpu"
	"github.com/trigon-llm/trigon/sample"
)

// TestLoadLeavesDynamicFP8ScalesUnset: the steps Load runs on made-up
// tokens (the step budget's probe; on a GPU the warm-up too) must not set
// an fp8 cache's dynamic scales, which the first real prompt sets: after
// Load every scale is still 0 ("not set"), and a request's first step
// sets every one.
func TestLoadLeavesDynamicFP8ScalesUnset(t *testing.T) {
	l, err := Load(LoadOptions{Model: "../models/default/hf", Backend: cpu.New(cpu.Options{Threads: 2}),
		KVCacheDType: "fp8", MaxSeqs: 4, StepTime: 0})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if !l.BudgetMeasured {
		t.Fatal("the budget was not measured: no load-time step ran")
	}
	b := l.runner.Backend()
	scales := func() (set, unset int) {
		for _, kv := range l.runner.KV() {
			for _, x := range []backend.Tensor{kv.Aux.KScale, kv.Aux.VScale} {
				n, _ := backend.NumElements(x.Shape())
				raw := make([]byte, 4*n)
				if err := b.Read(x, raw); err != nil {
					t.Fatal(err)
				}
				for i := range n {
					if math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:])) == 0 {
						unset++
					} else {
						set++
					}
				}
			}
		}
		return set, unset
	}
	if set, unset := scales(); set != 0 || unset == 0 {
		t.Errorf("after Load: %d fp8 scales set, %d unset; want none set", set, unset)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.Engine.Run(ctx) }()
	ch, err := l.Engine.Submit(ctx, &Request{Prompt: []int32{5, 17, 200, 31, 8, 99, 4}, N: 1,
		Params: sample.Params{Temperature: 0, TopP: 1, RepetitionPenalty: 1, MaxTokens: 2, IgnoreEOS: true}})
	if err != nil {
		t.Fatal(err)
	}
	for range ch {
	}
	cancel()
	<-done
	if set, unset := scales(); unset != 0 {
		t.Errorf("after a request: %d fp8 scales set, %d unset; want all set", set, unset)
	}
}
