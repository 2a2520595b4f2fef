package sched_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/trigon-llm/trigon/kvcache"
	"github.com/trigon-llm/trigon/sched"
)

// TestRandomSimulation pushes random requests (shared prefixes, forks,
// priorities, salts, EOS, aborts, pool growth) through random
// configurations with a fake model until everything finishes, and checks:
// every sequence's output equals its run alone, every step respects the
// token budget and the sequence cap, the invariants hold after every call,
// no sequence is lost or finished twice, and all blocks come back.
func TestRandomSimulation(t *testing.T) {
	for seed := range uint64(60) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { simulate(t, seed, false, false) })
	}
}

// TestRandomSimulationSpec is TestRandomSimulation with drafts: before
// every Schedule each draft candidate gets a draft of random length whose
// first tokens are right and the rest wrong (fakeModel.propose), verified
// greedily; every other seed also plans ahead where it can (ScheduleAhead
// takes no plan with drafts). Outputs must equal each sequence's run
// alone, with the blocks of rejected tokens released.
func TestRandomSimulationSpec(t *testing.T) {
	total := 0
	for seed := range uint64(60) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { total += simulate(t, seed, seed%2 == 1, true) })
	}
	if total < 1000 {
		t.Fatalf("only %d draft tokens verified over all seeds: the test does not exercise drafts", total)
	}
	t.Logf("%d draft tokens verified", total)
}

// TestRandomSimulationAhead is TestRandomSimulation with the step loop
// the engine runs when it queues steps ahead: after each plan it asks
// ScheduleAhead for the next one, runs it with the tokens the first one
// sampled (fed, as the device feeds them) before Update of the first, and
// aborts sequences in between. The outputs must still equal each
// sequence's run alone.
func TestRandomSimulationAhead(t *testing.T) {
	total := 0
	for seed := range uint64(60) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { total += simulate(t, seed, true, false) })
	}
	if total < 500 {
		t.Fatalf("only %d steps were planned ahead over all seeds: the test does not exercise ScheduleAhead", total)
	}
	t.Logf("%d steps planned ahead", total)
}

type simReq struct {
	prompt    []int32
	maxTokens int
}

// simulate runs one random workload; with ahead it plans steps ahead
// where the scheduler allows, with spec it drafts before every Schedule.
// It returns how many steps it planned ahead, or with spec how many draft
// tokens were verified.
func simulate(t *testing.T, seed uint64, ahead, spec bool) int {
	rng := rand.New(rand.NewPCG(seed, 1234))
	bs := []int{1, 2, 4, 8, 16}[rng.IntN(5)]
	// Room for one to four typical requests (up to 80 tokens): tight
	// enough to preempt often; some requests do not fit at all.
	numBlocks := 1 + (60+bs-1)/bs*(1+rng.IntN(4))
	maxSeqs := 1 + rng.IntN(8)
	cfg := sched.Config{
		MaxNumSeqs:          maxSeqs,
		MaxNumBatchedTokens: maxSeqs + rng.IntN(64),
		Policy:              sched.Policy(rng.IntN(2)),
	}
	if rng.IntN(2) == 0 {
		cfg.ChunkSize = 1 + rng.IntN(cfg.MaxNumBatchedTokens)
	}
	pool, err := kvcache.NewPool(kvcache.Options{NumBlocks: numBlocks, BlockSize: bs, EnablePrefixCache: rng.IntN(4) != 0})
	if err != nil {
		t.Fatal(err)
	}
	s, err := sched.New(cfg, pool)
	if err != nil {
		t.Fatal(err)
	}
	model := &fakeModel{bs: bs, vocab: 50, eos: 0}
	t.Logf("block size %d, %d blocks, %+v, prefix cache %v", bs, numBlocks, cfg, pool.PrefixCacheEnabled())

	bases := make([][]int32, 3)
	for i := range bases {
		bases[i] = make([]int32, 1+rng.IntN(40))
		for j := range bases[i] {
			bases[i][j] = 1 + rng.Int32N(49)
		}
	}
	live := map[sched.SeqID]*simReq{}         // added, not finished or aborted
	done := map[sched.SeqID]bool{}            // finished or aborted
	parentOf := map[sched.SeqID]sched.SeqID{} // forks not yet created
	nextID := sched.SeqID(1)
	added, toAdd := 0, 30

	addOne := func() {
		base := bases[rng.IntN(len(bases))]
		prompt := slices.Clone(base[:rng.IntN(len(base)+1)])
		for range rng.IntN(20) {
			prompt = append(prompt, 1+rng.Int32N(49))
		}
		if len(prompt) == 0 {
			prompt = append(prompt, 1)
		}
		req := sched.Request{
			ID:        nextID,
			Prompt:    prompt,
			MaxTokens: 1 + rng.IntN(20),
			Priority:  rng.IntN(3),
		}
		if rng.IntN(5) == 0 {
			req.CacheSalt = "other"
		}
		nextID++
		if rng.IntN(4) == 0 {
			for range 1 + rng.IntN(2) {
				req.Forks = append(req.Forks, nextID)
				nextID++
			}
		}
		added++
		err := s.Add(req)
		fits := pool.BlocksFor(len(prompt)+req.MaxTokens-1) <= pool.NumBlocks()-1 && 1+len(req.Forks) <= maxSeqs
		if fits != (err == nil) || (err != nil && !errors.Is(err, sched.ErrTooLarge)) {
			t.Fatalf("Add(prompt %d, max %d, %d forks) = %v with %d blocks of %d", len(prompt), req.MaxTokens, len(req.Forks), err, pool.NumBlocks()-1, bs)
		}
		if err != nil {
			return
		}
		for _, id := range append([]sched.SeqID{req.ID}, req.Forks...) {
			live[id] = &simReq{prompt: prompt, maxTokens: req.MaxTokens}
		}
		for _, f := range req.Forks {
			parentOf[f] = req.ID
		}
	}
	abort := func() {
		ids := make([]sched.SeqID, 0, len(live))
		for id := range live {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		id := ids[rng.IntN(len(ids))]
		if !s.Abort(id) {
			t.Fatalf("Abort(%d) of a live sequence returned false", id)
		}
		delete(live, id)
		done[id] = true
		// Forks not created yet die with their parent.
		for f, p := range parentOf {
			if p == id {
				delete(live, f)
				done[f] = true
				delete(parentOf, f)
			}
		}
		delete(parentOf, id)
	}
	verify := func(when string) {
		t.Helper()
		if err := s.Verify(); err != nil {
			t.Fatalf("%s: %v", when, err)
		}
	}

	initialBlocks := pool.NumBlocks() - 1
	grown, aheadSteps, drafted := 0, 0, 0
	for step := 0; added < toAdd || len(live) > 0; step++ {
		if step > 20000 {
			t.Fatalf("not done after %d steps: %d live, %d waiting, %d running", step, len(live), s.NumWaiting(), s.NumRunning())
		}
		for added < toAdd && rng.IntN(3) == 0 {
			addOne()
			verify("add")
		}
		if len(live) > 0 && rng.IntN(40) == 0 {
			abort()
			verify("abort")
		}
		if rng.IntN(200) == 0 {
			n := rng.IntN(4)
			if err := pool.Grow(n); err != nil {
				t.Fatal(err)
			}
			grown += n
		}
		if spec {
			for _, c := range s.DraftCandidates() {
				if err := s.SetDraft(c.ID, model.propose(c, 1+rng.IntN(6), uint64(step))); err != nil {
					t.Fatalf("step %d: SetDraft: %v", step, err)
				}
			}
			verify("draft")
		}
		plan := s.Schedule()
		verify("schedule")
		for _, e := range plan.Seqs {
			drafted += e.NumDraft
		}
		if plan.NumTokens > cfg.MaxNumBatchedTokens || len(plan.Seqs) > cfg.MaxNumSeqs {
			t.Fatalf("step %d: %d tokens, %d seqs break budget %d or cap %d", step, plan.NumTokens, len(plan.Seqs), cfg.MaxNumBatchedTokens, cfg.MaxNumSeqs)
		}
		if s.NumWaiting() > 0 && len(plan.Seqs) == 0 && s.NumRunning() == 0 {
			t.Fatalf("step %d: idle with %d waiting", step, s.NumWaiting())
		}
		out, err := model.execute(plan)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		for plan != nil {
			var next *sched.Plan
			var nextOut sched.StepOutput
			if ahead {
				if p, ok := s.ScheduleAhead(); ok {
					verify("schedule ahead")
					aheadSteps++
					if len(p.Seqs) != len(plan.Seqs) || p.Step != plan.Step+1 {
						t.Fatalf("step %d: ahead plan %d of %d sequences after plan %d of %d", step, p.Step, len(p.Seqs), plan.Step, len(plan.Seqs))
					}
					// Before the outstanding plan's Update, as on the device.
					next = p
					if nextOut, err = model.executeFed(p, out); err != nil {
						t.Fatalf("step %d (ahead): %v", step, err)
					}
				}
			}
			if len(live) > 0 && rng.IntN(60) == 0 {
				abort() // between Schedule and Update
				verify("abort in flight")
			}
			fin, err := s.Update(plan, out)
			if err != nil {
				t.Fatal(err)
			}
			verify("update")
			for _, e := range plan.Seqs {
				for _, f := range e.Forks {
					delete(parentOf, f) // created now, unless aborted (then already gone)
				}
			}
			for _, f := range fin {
				ref := live[f.ID]
				if ref == nil || done[f.ID] {
					t.Fatalf("step %d: sequence %d finished but is not live", step, f.ID)
				}
				if f.Reason == sched.FinishError {
					t.Fatalf("step %d: sequence %d failed: %v", step, f.ID, f.Err)
				}
				want, reason := model.solo(ref.prompt, f.ID, ref.maxTokens)
				if !slices.Equal(f.Output, want) || f.Reason != reason {
					t.Fatalf("step %d: sequence %d: %v %v, alone %v %v", step, f.ID, f.Reason, f.Output, reason, want)
				}
				delete(live, f.ID)
				done[f.ID] = true
			}
			plan, out = next, nextOut
		}
	}
	if s.NumWaiting() != 0 || s.NumRunning() != 0 {
		t.Fatalf("%d waiting, %d running after all finished", s.NumWaiting(), s.NumRunning())
	}
	if free := pool.NumFree(); free != initialBlocks+grown {
		t.Fatalf("%d blocks free at the end, want %d", free, initialBlocks+grown)
	}
	st := s.Stats()
	t.Logf("%d steps (%d ahead), %d draft tokens, %d preemptions, prefix hits %d/%d", st.Steps, aheadSteps, drafted, st.Preemptions, st.PrefixHitTokens, st.PrefixQueryTokens)
	if spec {
		return drafted
	}
	return aheadSteps
}
