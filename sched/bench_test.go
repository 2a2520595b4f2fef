package sched_test

import (
	"testing"

	"github.com/trigon-llm/trigon/kvcache"
	"github.com/trigon-llm/trigon/sched"
)

// BenchmarkDecodeStep is one Schedule+Update of 256 running decodes: the
// scheduler's per-step overhead on the engine's critical path.
func BenchmarkDecodeStep(b *testing.B) {
	pool, err := kvcache.NewPool(kvcache.Options{NumBlocks: 256*80 + 1, EnablePrefixCache: true})
	if err != nil {
		b.Fatal(err)
	}
	s, err := sched.New(sched.Config{MaxNumSeqs: 256, MaxNumBatchedTokens: 8192}, pool)
	if err != nil {
		b.Fatal(err)
	}
	next := sched.SeqID(0)
	add := func() {
		next++
		if err := s.Add(sched.Request{ID: next, Prompt: make([]int32, 128), MaxTokens: 1024}); err != nil {
			b.Fatal(err)
		}
	}
	for range 256 {
		add()
	}
	out := sched.StepOutput{Tokens: map[sched.SeqID]int32{}}
	b.ReportAllocs()
	for b.Loop() {
		plan := s.Schedule()
		clear(out.Tokens)
		for _, e := range plan.Seqs {
			if e.Sample {
				out.Tokens[e.ID] = 7
			}
		}
		fin, err := s.Update(plan, out)
		if err != nil {
			b.Fatal(err)
		}
		for range fin {
			add()
		}
	}
}
