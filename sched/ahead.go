package sched

import "slices"

// ScheduleAhead plans the step after the outstanding one before that step's
// sampled tokens are known, so the engine can queue it on the device behind
// the outstanding step (whose tokens the device feeds it) and read the
// outstanding step's tokens meanwhile. It takes only the steady state of
// decoding, and says false, changing nothing the next Schedule would not
// do anyway, otherwise:
//
//   - the outstanding plan samples every sequence it runs (a decode, or
//     the chunk that ends a prompt), with no forks, block copies or
//     preemptions, and runs every running sequence;
//   - nothing waiting could be admitted: the queue is empty, or its head
//     would not fit MaxNumSeqs (an ahead step admits nothing, so a request
//     that could start would wait a step for it);
//   - no sequence reaches MaxTokens with the outstanding step;
//   - the pool has the blocks (it never preempts for an ahead step).
//
// The ahead plan feeds each sequence one token at the next position. Its
// Tokens hold a placeholder until Update of the outstanding plan writes the
// sampled token there (the one exception to a plan's slices never being
// written again; the runner feeds those tokens from the device). Update
// of the outstanding plan then makes the ahead plan the outstanding one:
// call Update for it next, as for any plan. A sequence that ends with the
// outstanding step (EOS, stop string, Abort) is skipped by that Update;
// its ahead step's token is the engine's to drop.
func (s *Scheduler) ScheduleAhead() (*Plan, bool) {
	p := s.pending
	if p == nil || s.ahead != nil || len(p.Seqs) == 0 || len(p.Seqs) != len(s.running) ||
		len(p.Copies) > 0 || len(p.Preempted) > 0 {
		return nil, false
	}
	if len(s.waiting) > 0 {
		slots := 0
		for _, q := range s.running {
			slots += q.slots()
		}
		if slots+s.waiting[0].slots() <= s.cfg.MaxNumSeqs {
			return nil, false
		}
	}
	for i := range p.Seqs {
		e := &p.Seqs[i]
		q := e.seq
		if q == nil || s.seqs[q.id] != q || !q.running || q.ahead || !e.Sample || len(e.Forks) > 0 ||
			e.Start != q.numComputed || e.Start+len(e.Tokens) != len(q.tokens) || q.numOutput()+1 >= q.maxTokens {
			return nil, false
		}
	}
	for i := range p.Seqs {
		q := p.Seqs[i].seq
		if err := s.pool.Allocate(q.table, len(q.tokens)+1); err != nil {
			// Out of blocks (or worse): the next Schedule deals with it.
			// Blocks given to the sequences before q stay theirs: their
			// next step needs them either way.
			return nil, false
		}
	}
	s.step++
	plan := &Plan{Step: s.step, BlockSize: s.pool.BlockSize(), Seqs: make([]ScheduledSeq, len(p.Seqs))}
	for i := range p.Seqs {
		q := p.Seqs[i].seq
		start := len(q.tokens)
		q.tokens = append(q.tokens, 0) // the outstanding step's token, written by its Update
		q.ahead = true
		plan.Seqs[i] = ScheduledSeq{
			ID:     q.id,
			Tokens: q.tokens[start : start+1 : start+1],
			Start:  start,
			Blocks: slices.Clip(q.table.Blocks()),
			Sample: true,
			seq:    q,
		}
	}
	plan.NumTokens = len(plan.Seqs) // at most MaxNumSeqs, within the budget (New checks)
	s.ahead = plan
	s.checkInvariants()
	return plan, true
}
