package sched_test

import (
	"testing"

	"github.com/trigon-llm/trigon/kvcache"
	"github.com/trigon-llm/trigon/sched"
)

// TestScheduleAheadRefusals walks ScheduleAhead through what it must
// refuse and what it takes, checking the invariants after every call.
func TestScheduleAheadRefusals(t *testing.T) {
	var pool *kvcache.Pool
	newSched := func(t *testing.T, blocks, maxSeqs, chunk int) (*sched.Scheduler, *fakeModel) {
		var err error
		pool, err = kvcache.NewPool(kvcache.Options{NumBlocks: blocks, BlockSize: 4, EnablePrefixCache: true})
		if err != nil {
			t.Fatal(err)
		}
		s, err := sched.New(sched.Config{MaxNumSeqs: maxSeqs, MaxNumBatchedTokens: 64, ChunkSize: chunk}, pool)
		if err != nil {
			t.Fatal(err)
		}
		return s, &fakeModel{bs: 4, vocab: 50, eos: -1}
	}
	prompt := func(n int) []int32 {
		p := make([]int32, n)
		for i := range p {
			p[i] = int32(1 + i%40)
		}
		return p
	}
	// run schedules and executes a plan, calls between (as the engine
	// admits requests between a step's launch and its landing), asks for
	// an ahead plan, executes it, and updates both; it returns what
	// ScheduleAhead said.
	run := func(t *testing.T, s *sched.Scheduler, m *fakeModel, between func()) bool {
		t.Helper()
		plan := s.Schedule()
		out, err := m.execute(plan)
		if err != nil {
			t.Fatal(err)
		}
		if between != nil {
			between()
		}
		next, ok := s.ScheduleAhead()
		if err := s.Verify(); err != nil {
			t.Fatal(err)
		}
		var nextOut sched.StepOutput
		if ok {
			if _, again := s.ScheduleAhead(); again {
				t.Fatal("a second ScheduleAhead before Update planned another step")
			}
			if nextOut, err = m.executeFed(next, out); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.Update(plan, out); err != nil {
			t.Fatal(err)
		}
		if ok {
			if _, err := s.Update(next, nextOut); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Verify(); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	t.Run("prefill chunks, then decodes, then the last tokens", func(t *testing.T) {
		s, m := newSched(t, 32, 4, 8)
		if err := s.Add(sched.Request{ID: 1, Prompt: prompt(12), MaxTokens: 5}); err != nil {
			t.Fatal(err)
		}
		// Chunk 1 (8 of 12 tokens) samples nothing: no ahead step. Chunk 2
		// ends the prompt and samples token 1: the first decode (token 2)
		// goes ahead. Then tokens 3 and 4; token 5 is the last (MaxTokens),
		// so its step is not followed.
		for i, want := range []bool{false, true, true, false} {
			if got := run(t, s, m, nil); got != want {
				t.Fatalf("call %d: ScheduleAhead %v, want %v", i, got, want)
			}
		}
		if s.NumRunning() != 0 {
			t.Fatalf("%d running after MaxTokens", s.NumRunning())
		}
	})
	t.Run("a waiting request that fits stops it, one that does not fit does not", func(t *testing.T) {
		s, m := newSched(t, 64, 2, 64)
		add := func(id sched.SeqID) func() {
			return func() {
				if err := s.Add(sched.Request{ID: id, Prompt: prompt(5), MaxTokens: 20}); err != nil {
					t.Fatal(err)
				}
			}
		}
		add(1)()
		if run(t, s, m, add(2)) { // 2 arrives while 1's prefill runs, and fits
			t.Fatal("an ahead step while a waiting request could be admitted")
		}
		if !run(t, s, m, add(3)) { // 1 decodes, 2 prefills; 3 arrives, the cap (2) is full
			t.Fatal("no ahead step with the sequence cap full")
		}
		if run(t, s, m, func() { s.Abort(2) }) { // the plan's 2 is gone
			t.Fatal("an ahead step after a sequence of its plan was aborted")
		}
	})
	t.Run("out of blocks", func(t *testing.T) {
		// 3 usable blocks of 4 tokens; two 4-token prompts fill two. Their
		// first decodes need a second block each: one is left.
		s, m := newSched(t, 4, 2, 64)
		for _, id := range []sched.SeqID{1, 2} {
			if err := s.Add(sched.Request{ID: id, Prompt: prompt(4), MaxTokens: 5}); err != nil {
				t.Fatal(err)
			}
		}
		if run(t, s, m, nil) {
			t.Fatal("an ahead step without the blocks for it")
		}
		// The block the refused call gave sequence 1 is its own; the rest
		// runs as without ahead steps, and every block comes back.
		for i := 0; s.NumRunning()+s.NumWaiting() > 0; i++ {
			if i > 100 {
				t.Fatal("not done after 100 steps")
			}
			run(t, s, m, nil)
		}
		if free := pool.NumFree(); free != 3 {
			t.Fatalf("%d blocks free at the end, want 3", free)
		}
	})
}

// TestTokensWithoutPlaceholder: while an ahead plan waits for the
// outstanding step's token, Tokens leaves out its placeholder; after the
// Update that writes it, the token is there.
func TestTokensWithoutPlaceholder(t *testing.T) {
	pool, err := kvcache.NewPool(kvcache.Options{NumBlocks: 16, BlockSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	s, err := sched.New(sched.Config{MaxNumSeqs: 2, MaxNumBatchedTokens: 64, ChunkSize: 16}, pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Add(sched.Request{ID: 1, Prompt: []int32{7, 8, 9}, MaxTokens: 8}); err != nil {
		t.Fatal(err)
	}
	if s.Tokens(2) != nil {
		t.Error("Tokens of an unknown sequence is not nil")
	}
	prefill := s.Schedule()
	if _, err := s.Update(prefill, sched.StepOutput{Tokens: map[sched.SeqID]int32{1: 10}}); err != nil {
		t.Fatal(err)
	}
	decode := s.Schedule()
	ahead, ok := s.ScheduleAhead()
	if !ok {
		t.Fatal("no ahead plan after a decode step")
	}
	if got := s.Tokens(1); len(got) != 4 || got[3] != 10 {
		t.Errorf("Tokens with an ahead plan outstanding: %v, want [7 8 9 10]", got)
	}
	if _, err := s.Update(decode, sched.StepOutput{Tokens: map[sched.SeqID]int32{1: 11}}); err != nil {
		t.Fatal(err)
	}
	if got := s.Tokens(1); len(got) != 5 || got[4] != 11 {
		t.Errorf("Tokens after the decode's Update: %v, want [7 8 9 10 11]", got)
	}
	if _, err := s.Update(ahead, sched.StepOutput{Tokens: map[sched.SeqID]int32{1: 12}}); err != nil {
		t.Fatal(err)
	}
	if got := s.Tokens(1); len(got) != 6 || got[5] != 12 {
		t.Errorf("Tokens after the ahead step's Update: %v, want [7 8 9 10 11 12]", got)
	}
}
