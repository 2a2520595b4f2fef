package sched

import (
	"errors"
	"fmt"
	"slices"

	"github.com/trigon-llm/trigon/kvcache"
)

// Plan is one step's work, as data. Its slices alias scheduler state that
// is never written again (token and block lists only grow by appending),
// so a Plan stays valid after Update; callers must not modify it.
type Plan struct {
	Step      uint64
	BlockSize int
	// Seqs are the scheduled sequences: decodes first, then running
	// prefills, then newly admitted ones.
	Seqs []ScheduledSeq
	// NumTokens is the sum of len(Seqs[i].Tokens), at most the budget.
	NumTokens int
	// Copies must be done before any KV write of this step: each copies
	// a forked sequence's partially filled block (all layers, K, V and
	// scales) from its parent's block.
	Copies []kvcache.BlockCopy
	// Preempted sequences lost their KV blocks this step and wait to be
	// recomputed; the runner may drop any per-sequence state.
	Preempted []SeqID
}

// ScheduledSeq is one sequence's share of a step. The runner derives the
// rest: positions Start .. Start+len(Tokens)-1, slot mapping (AppendSlots),
// attention context length Start+len(Tokens), block table Blocks.
type ScheduledSeq struct {
	ID SeqID
	// Tokens are fed this step: token i sits at position Start+i.
	Tokens []int32
	// Start is the number of tokens whose KV is already in the cache.
	Start int
	// Blocks is the block table after this step's allocation; it covers
	// at least Start+len(Tokens) tokens.
	Blocks []kvcache.BlockID
	// Sample is set when Tokens reach the end of the known tokens: the
	// runner computes logits of the last row and samples the next token.
	Sample bool
	// Forks, with Sample, asks for one more sample from the same logits
	// row for each id (n>1 requests); report them in StepOutput.Tokens.
	Forks []SeqID
	// NumCachedTokens is the prefix-cache hit taken when this step
	// admitted the sequence (Start includes it).
	NumCachedTokens int
	// NumDraft > 0 marks a verify step of a decoding sequence (SetDraft):
	// Tokens are its last sampled token and NumDraft proposed tokens,
	// Tokens[1:]. The runner computes logits for every token; the engine
	// reports the accepted draft tokens in StepOutput.Accepted and the
	// token after them in StepOutput.Tokens.
	NumDraft int

	seq *sequence
}

// AppendSlots appends to dst the KV cache slot (block*blockSize + offset)
// of each token of e, as the runner's slot mapping wants them.
func (e *ScheduledSeq) AppendSlots(dst []int32, blockSize int) []int32 {
	for i := range e.Tokens {
		p := e.Start + i
		dst = append(dst, int32(e.Blocks[p/blockSize])*int32(blockSize)+int32(p%blockSize))
	}
	return dst
}

// StepOutput is what the engine reports after running a plan.
type StepOutput struct {
	// Tokens holds the sampled token of every plan entry with Sample set,
	// and of each of its Forks.
	Tokens map[SeqID]int32
	// Finish marks sequences the engine saw end in this step: EOS or a
	// stop string (FinishStop), or a length limit of its own.
	Finish map[SeqID]FinishReason
	// Accepted holds, for a verify entry (NumDraft > 0), the draft tokens
	// the engine accepted: a prefix of Tokens[1:] (nil: none). The step's
	// output is Accepted, then Tokens[id]. A stop condition within them
	// is the engine's to cut: it reports the tokens up to the stop (the
	// last as Tokens[id]) with Finish.
	Accepted map[SeqID][]int32
}

// Schedule plans the next step. Running decodes come first (one token
// each), then running prefills in admission order with what remains of the
// token budget, then waiting sequences in policy order, each with its
// prefix-cache hit and a chunk of at most ChunkSize tokens. A long prompt
// so takes at most a chunk per step and never stalls the decodes.
//
// When the pool runs out of blocks for a running sequence, the newest
// running sequence (under Priority, the lowest priority) is preempted: its
// blocks are freed and it goes back to the waiting queue, to be recomputed
// from its prompt and the tokens it generated. No new sequence is admitted
// in a step that preempted, and a waiting sequence never preempts a running
// one (not even under Priority): it waits for blocks to free up.
//
// Until Update consumes it, Schedule returns the same plan again.
func (s *Scheduler) Schedule() *Plan {
	if s.pending != nil {
		return s.pending
	}
	s.step++
	plan := &Plan{
		Step:      s.step,
		BlockSize: s.pool.BlockSize(),
		Seqs:      make([]ScheduledSeq, 0, min(len(s.running)+len(s.waiting), s.cfg.MaxNumSeqs)),
	}
	budget := s.cfg.MaxNumBatchedTokens

	running := slices.Clone(s.running)
	// A draft takes only the budget the step's other work leaves: the
	// token of every decode still to schedule (decodes), and reserve, the
	// chunks of the running prefills and of the queue's head when it could
	// be admitted, so that drafts never hold back a prompt.
	decodes, reserve := 0, 0
	if len(s.drafts) > 0 {
		slots := 0
		for _, q := range running {
			switch r := len(q.tokens) - q.numComputed; {
			case r == 1:
				decodes++
			case r > 1:
				reserve += min(r, s.cfg.ChunkSize)
			}
			slots += q.slots()
		}
		if len(s.waiting) > 0 && slots+s.waiting[0].slots() <= s.cfg.MaxNumSeqs {
			reserve += min(len(s.waiting[0].tokens), s.cfg.ChunkSize)
		}
	}
	for _, decode := range []bool{true, false} {
		if !decode {
			// The decodes are in: what they leave is the prefill's, within
			// the mixed-step cap.
			budget = min(budget, s.cfg.prefillCap(s.cfg.MaxNumBatchedTokens-budget))
		}
		for _, q := range running {
			if !q.running || q.schedStep == s.step {
				continue
			}
			remaining := len(q.tokens) - q.numComputed
			if (remaining == 1) != decode || remaining < 1 {
				continue
			}
			n := min(remaining, s.cfg.ChunkSize, budget)
			if n < 1 {
				continue
			}
			if !s.allocRunning(q, q.numComputed+n, plan, &budget) {
				continue
			}
			if decode && len(s.drafts) > 0 && len(q.forks) == 0 {
				decodes--
				if d := s.fitDraft(q, s.drafts[q.id], budget-1-decodes-reserve); len(d) > 0 {
					s.addDraftEntry(plan, q, d)
					budget -= 1 + len(d)
					continue
				}
			}
			s.addEntry(plan, q, n, 0)
			budget -= n
		}
	}
	if len(s.drafts) > 0 {
		clear(s.drafts)
	}

	if len(plan.Preempted) == 0 {
		s.admit(plan, &budget)
	}

	// Drop entries of sequences preempted after they were scheduled, and
	// hand the runner the block copies owed to the scheduled sequences.
	plan.Seqs = slices.DeleteFunc(plan.Seqs, func(e ScheduledSeq) bool { return e.seq == nil })
	for i := range plan.Seqs {
		e := &plan.Seqs[i]
		plan.NumTokens += len(e.Tokens)
		plan.Copies = append(plan.Copies, e.seq.copies...)
	}
	s.pending = plan
	s.checkInvariants()
	return plan
}

// admit moves waiting sequences to running while the budget, the sequence
// cap and the pool allow, strictly in queue order.
func (s *Scheduler) admit(plan *Plan, budget *int) {
	slots := 0
	for _, q := range s.running {
		slots += q.slots()
	}
	for len(s.waiting) > 0 && *budget > 0 {
		q := s.waiting[0]
		if slots+q.slots() > s.cfg.MaxNumSeqs {
			return
		}
		m := s.pool.MatchPrefix(q.table, q.tokens)
		n := min(len(q.tokens)-m.NumTokens, s.cfg.ChunkSize, *budget)
		if err := s.pool.AllocatePrefix(q.table, m, m.NumTokens+n); err != nil {
			if errors.Is(err, kvcache.ErrNoBlocks) {
				return
			}
			s.deferred = s.finish(q, FinishError, fmt.Errorf("sched: admit sequence %d: %w", q.id, err), s.deferred)
			continue
		}
		s.waiting = slices.Delete(s.waiting, 0, 1)
		q.running = true
		q.numComputed = m.NumTokens
		s.running = append(s.running, q)
		slots += q.slots()
		s.addEntry(plan, q, n, m.NumTokens)
		*budget -= n
	}
}

// allocRunning makes room for q to cover numTokens, preempting victims
// while the pool is short. It reports false when q itself was preempted
// (or failed).
func (s *Scheduler) allocRunning(q *sequence, numTokens int, plan *Plan, budget *int) bool {
	for {
		err := s.pool.Allocate(q.table, numTokens)
		if err == nil {
			return true
		}
		if !errors.Is(err, kvcache.ErrNoBlocks) {
			s.unschedule(q, plan, budget)
			s.deferred = s.finish(q, FinishError, fmt.Errorf("sched: allocate for sequence %d: %w", q.id, err), s.deferred)
			return false
		}
		v := s.victim()
		s.preempt(v, plan, budget)
		if v == q {
			return false
		}
	}
}

// victim is the running sequence that loses its blocks first: the last in
// policy order.
func (s *Scheduler) victim() *sequence {
	v := s.running[0]
	for _, q := range s.running[1:] {
		if s.before(v, q) {
			v = q
		}
	}
	return v
}

// preempt frees v's blocks and queues it for recompute. Its tokens,
// generated ones included, stay: they are its prompt now.
func (s *Scheduler) preempt(v *sequence, plan *Plan, budget *int) {
	s.unschedule(v, plan, budget)
	i := slices.Index(s.running, v)
	s.running = slices.Delete(s.running, i, i+1)
	v.running = false
	s.pool.Free(v.table)
	v.numComputed = 0
	v.copies = nil
	s.insertWaiting(v)
	plan.Preempted = append(plan.Preempted, v.id)
	s.preemptions++
}

// unschedule takes q's entry out of the plan being built, if any, and
// returns its tokens to the budget.
func (s *Scheduler) unschedule(q *sequence, plan *Plan, budget *int) {
	if q.schedStep != s.step {
		return
	}
	e := &plan.Seqs[q.entry]
	*budget += len(e.Tokens)
	e.seq = nil
	q.schedStep = 0
}

// fitDraft cuts q's draft to what its step can verify: room in the token
// budget (room, after every other decode's token and the prompt chunks
// reserved), ChunkSize, MaxTokens
// (the step yields up to 1+len(draft) tokens) and the blocks: those q
// holds, and free ones only while nothing waits, never by preempting (a
// draft is never worth a preemption or a delayed admission). q's table
// covers its one decode token already.
func (s *Scheduler) fitDraft(q *sequence, draft []int32, room int) []int32 {
	k := min(len(draft), room, s.cfg.ChunkSize-1, q.maxTokens-q.numOutput()-1)
	if k <= 0 {
		return nil
	}
	bs := s.pool.BlockSize()
	held := q.table.Len()*bs - q.numComputed - 1 // slots q's blocks hold past its decode token
	if k <= held {
		return draft[:k]
	}
	if len(s.waiting) > 0 {
		// Blocks a waiting sequence could be admitted with are not the
		// draft's: taken every step, they would keep it waiting for good.
		return draft[:max(held, 0)]
	}
	k = min(k, held+s.pool.NumFree()*bs)
	if err := s.pool.Allocate(q.table, q.numComputed+1+k); err != nil {
		return draft[:max(held, 0)]
	}
	return draft[:k]
}

// addDraftEntry schedules q's decode with a draft to verify: its last
// token, then the draft, in a fresh slice (the draft is not q's tokens).
func (s *Scheduler) addDraftEntry(plan *Plan, q *sequence, draft []int32) {
	tokens := make([]int32, 0, 1+len(draft))
	tokens = append(append(tokens, q.tokens[q.numComputed]), draft...)
	q.schedStep = s.step
	q.entry = len(plan.Seqs)
	plan.Seqs = append(plan.Seqs, ScheduledSeq{
		ID:       q.id,
		Tokens:   tokens,
		Start:    q.numComputed,
		Blocks:   slices.Clip(q.table.Blocks()),
		Sample:   true,
		NumDraft: len(draft),
		seq:      q,
	})
}

func (s *Scheduler) addEntry(plan *Plan, q *sequence, n, cached int) {
	end := q.numComputed + n
	e := ScheduledSeq{
		ID:              q.id,
		Tokens:          q.tokens[q.numComputed:end:end],
		Start:           q.numComputed,
		Blocks:          slices.Clip(q.table.Blocks()),
		Sample:          end == len(q.tokens),
		NumCachedTokens: cached,
		seq:             q,
	}
	if e.Sample && len(q.forks) > 0 {
		e.Forks = slices.Clone(q.forks)
	}
	q.schedStep = s.step
	q.entry = len(plan.Seqs)
	plan.Seqs = append(plan.Seqs, e)
}
