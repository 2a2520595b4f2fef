package sched_test

import (
	"fmt"

	"github.com/trigon-llm/trigon/kvcache"
	"github.com/trigon-llm/trigon/sched"
)

// The engine's step loop around a scheduler, with a stand-in model that
// always samples the token after the last one.
func Example() {
	pool, err := kvcache.NewPool(kvcache.Options{NumBlocks: 64, BlockSize: 16, EnablePrefixCache: true})
	if err != nil {
		panic(err)
	}
	s, err := sched.New(sched.Config{MaxNumSeqs: 8, MaxNumBatchedTokens: 32, ChunkSize: 16}, pool)
	if err != nil {
		panic(err)
	}
	prompt := make([]int32, 40)
	for i := range prompt {
		prompt[i] = int32(i)
	}
	if err := s.Add(sched.Request{ID: 1, Prompt: prompt, MaxTokens: 3}); err != nil {
		panic(err)
	}
	for s.NumWaiting()+s.NumRunning() > 0 {
		plan := s.Schedule()
		out := sched.StepOutput{Tokens: map[sched.SeqID]int32{}}
		for _, e := range plan.Seqs {
			fmt.Printf("step %d: seq %d positions %d..%d sample=%v\n", plan.Step, e.ID, e.Start, e.Start+len(e.Tokens)-1, e.Sample)
			if e.Sample {
				out.Tokens[e.ID] = e.Tokens[len(e.Tokens)-1] + 1
			}
		}
		fin, err := s.Update(plan, out)
		if err != nil {
			panic(err)
		}
		for _, f := range fin {
			fmt.Println("finished", f.ID, f.Reason, f.Output)
		}
	}
	// Output:
	// step 1: seq 1 positions 0..15 sample=false
	// step 2: seq 1 positions 16..31 sample=false
	// step 3: seq 1 positions 32..39 sample=true
	// step 4: seq 1 positions 40..40 sample=true
	// step 5: seq 1 positions 41..41 sample=true
	// finished 1 length [40 41 42]
}
