package sched

import (
	"errors"
	"fmt"
	"slices"

	"github.com/trigon-llm/trigon/kvcache"
)

// Update applies the engine's results of plan, which must be the plan the
// last Schedule returned, or the outstanding one of a ScheduleAhead (call
// it for every plan, empty ones included, in the order they were made). For
// each scheduled sequence it advances the computed tokens, registers newly
// full blocks in the prefix cache, appends the sampled token where the plan
// asked for one, creates the forks of n>1 requests, and finishes sequences
// the engine reported (out.Finish) or that reached MaxTokens.
//
// The returned list holds every sequence that left the scheduler since the
// last Update, in a deterministic order; their blocks are already free. A
// scheduled sequence whose sampled token is missing from out is finished
// with FinishError rather than left waiting for a token that will never
// come. The error is for a plan that is not the outstanding one.
func (s *Scheduler) Update(plan *Plan, out StepOutput) ([]Finished, error) {
	if plan == nil || plan != s.pending {
		return nil, errors.New("sched: Update with a plan that is not the one Schedule returned last")
	}
	s.pending, s.ahead = s.ahead, nil
	fin := s.deferred
	s.deferred = nil
	for i := range plan.Seqs {
		e := &plan.Seqs[i]
		q := e.seq
		if s.seqs[q.id] != q || !q.running || q.numComputed != e.Start {
			continue // aborted since Schedule
		}
		q.copies = nil // done by the runner before this step
		if e.NumDraft > 0 {
			fin = s.updateDraft(plan, e, q, out, fin)
			continue
		}
		q.numComputed += len(e.Tokens)
		if err := s.pool.CommitFull(q.table, q.tokens[:q.numComputed]); err != nil {
			fin = s.finish(q, FinishError, fmt.Errorf("sched: sequence %d: %w", q.id, err), fin)
			continue
		}
		if !e.Sample {
			fin = s.checkFinish(q, out, fin)
			continue
		}
		tok, ok := out.Tokens[q.id]
		if !ok {
			fin = s.finish(q, FinishError, fmt.Errorf("sched: step %d: no sampled token for sequence %d", plan.Step, q.id), fin)
			continue
		}
		if q.ahead {
			// ScheduleAhead left this token's place (numComputed) for it.
			q.tokens[q.numComputed] = tok
			q.ahead = false
		} else {
			q.tokens = append(q.tokens, tok)
		}
		for k, id := range e.Forks {
			if s.forkOwner[id] == q { // not aborted since Schedule
				fin = s.fork(q, id, k, out, fin)
			}
		}
		q.forks = nil
		fin = s.checkFinish(q, out, fin)
	}
	s.checkInvariants()
	return fin, nil
}

// updateDraft applies a verify entry: the fed token and the accepted draft
// tokens have their KV computed now, the output gains them and the token
// after them, and the blocks past the sequence's tokens (the rejected
// tokens' slots) are released. Only the computed tokens are committed to
// the prefix cache, so no block holding a rejected token's KV is ever
// registered: its slots are written again by the token that really sits
// there before the block fills.
func (s *Scheduler) updateDraft(plan *Plan, e *ScheduledSeq, q *sequence, out StepOutput, fin []Finished) []Finished {
	acc := out.Accepted[q.id]
	if len(acc) > e.NumDraft || !slices.Equal(acc, e.Tokens[1:1+len(acc)]) {
		return s.finish(q, FinishError, fmt.Errorf("sched: step %d: sequence %d: accepted tokens %v are not a prefix of its draft %v", plan.Step, q.id, acc, e.Tokens[1:]), fin)
	}
	tok, ok := out.Tokens[q.id]
	if !ok {
		return s.finish(q, FinishError, fmt.Errorf("sched: step %d: no sampled token for sequence %d", plan.Step, q.id), fin)
	}
	q.tokens = append(q.tokens, acc...)
	q.numComputed += 1 + len(acc)
	if err := s.pool.CommitFull(q.table, q.tokens[:q.numComputed]); err != nil {
		return s.finish(q, FinishError, fmt.Errorf("sched: sequence %d: %w", q.id, err), fin)
	}
	q.tokens = append(q.tokens, tok)
	if err := s.pool.Truncate(q.table, len(q.tokens)); err != nil {
		return s.finish(q, FinishError, fmt.Errorf("sched: sequence %d: %w", q.id, err), fin)
	}
	return s.checkFinish(q, out, fin)
}

// checkFinish finishes q if the engine said so or it reached MaxTokens.
func (s *Scheduler) checkFinish(q *sequence, out StepOutput, fin []Finished) []Finished {
	if r, ok := out.Finish[q.id]; ok {
		var err error
		if r == FinishError {
			err = errors.New("sched: the engine reported an error")
		}
		return s.finish(q, r, err, fin)
	}
	if q.numOutput() >= q.maxTokens {
		return s.finish(q, FinishLength, nil, fin)
	}
	return fin
}

// fork creates fork number k of q, id, right after q's prefill: it shares
// q's full prompt blocks and gets a copy of the partial last one. If the
// pool has no block for that copy, the fork waits and is recomputed (its
// prompt blocks are then found in the prefix cache when it is enabled).
func (s *Scheduler) fork(q *sequence, id SeqID, k int, out StepOutput, fin []Finished) []Finished {
	delete(s.forkOwner, id)
	tok, ok := out.Tokens[id]
	if !ok {
		return append(fin, Finished{ID: id, Reason: FinishError, Err: fmt.Errorf("sched: no sampled token for fork %d of sequence %d", id, q.id)})
	}
	tokens := make([]int32, q.numPrompt+1)
	copy(tokens, q.tokens[:q.numPrompt])
	tokens[q.numPrompt] = tok
	c := &sequence{
		id:        id,
		tokens:    tokens,
		numPrompt: q.numPrompt,
		maxTokens: q.maxTokens,
		priority:  q.priority,
		arrival:   q.arrival,
		forkIndex: k + 1,
	}
	s.seqs[id] = c
	table, copies, err := s.pool.Fork(q.table, q.numComputed)
	switch {
	case err == nil:
		c.table, c.copies, c.numComputed = table, copies, q.numComputed
		c.running = true
		s.running = append(s.running, c)
	case errors.Is(err, kvcache.ErrNoBlocks):
		c.table = kvcache.NewBlockTable(q.table.Salt())
		s.insertWaiting(c)
	default:
		c.table = kvcache.NewBlockTable(q.table.Salt())
		return s.finish(c, FinishError, fmt.Errorf("sched: fork %d of sequence %d: %w", id, q.id, err), fin)
	}
	return s.checkFinish(c, out, fin)
}
