package sched

import (
	"fmt"
	"slices"

	"github.com/trigon-llm/trigon/kvcache"
)

// verify checks the scheduler's invariants and the pool's against the
// running sequences' tables. Builds with the invariants tag run it after
// every call; tests run it directly.
func (s *Scheduler) verify() error {
	if len(s.running)+len(s.waiting) != len(s.seqs) {
		return fmt.Errorf("sched: %d running + %d waiting != %d live sequences", len(s.running), len(s.waiting), len(s.seqs))
	}
	slots := 0
	tables := make([]*kvcache.BlockTable, 0, len(s.running))
	for _, q := range s.running {
		if s.seqs[q.id] != q || !q.running {
			return fmt.Errorf("sched: running sequence %d is not live or not marked running", q.id)
		}
		if q.numComputed >= len(q.tokens) {
			return fmt.Errorf("sched: running sequence %d computed all %d of its tokens: it would never be scheduled again", q.id, len(q.tokens))
		}
		if q.table.Len() < s.pool.BlocksFor(q.numComputed) {
			return fmt.Errorf("sched: sequence %d has %d blocks for %d computed tokens", q.id, q.table.Len(), q.numComputed)
		}
		if err := s.pool.VerifyTokens(q.table, q.tokens[:q.numComputed]); err != nil {
			return fmt.Errorf("sched: sequence %d: %w", q.id, err)
		}
		slots += q.slots()
		tables = append(tables, q.table)
	}
	if slots > s.cfg.MaxNumSeqs {
		return fmt.Errorf("sched: %d sequences running (forks included), cap %d", slots, s.cfg.MaxNumSeqs)
	}
	for i, q := range s.waiting {
		if s.seqs[q.id] != q || q.running || q.numComputed != 0 || q.table.Len() != 0 {
			return fmt.Errorf("sched: waiting sequence %d: live %v, running %v, %d computed, %d blocks", q.id, s.seqs[q.id] == q, q.running, q.numComputed, q.table.Len())
		}
		if i > 0 && s.before(q, s.waiting[i-1]) {
			return fmt.Errorf("sched: waiting queue out of order at %d", i)
		}
	}
	for id := range s.drafts {
		if q := s.seqs[id]; q == nil || !q.running {
			return fmt.Errorf("sched: draft for sequence %d, which is not running", id)
		}
	}
	for id, owner := range s.forkOwner {
		if s.seqs[owner.id] != owner || !slices.Contains(owner.forks, id) || s.seqs[id] != nil {
			return fmt.Errorf("sched: pending fork %d of sequence %d is inconsistent", id, owner.id)
		}
	}
	if p := s.pending; p != nil {
		if p.NumTokens > s.cfg.MaxNumBatchedTokens || len(p.Seqs) > s.cfg.MaxNumSeqs {
			return fmt.Errorf("sched: plan %d has %d tokens for %d sequences, caps %d and %d", p.Step, p.NumTokens, len(p.Seqs), s.cfg.MaxNumBatchedTokens, s.cfg.MaxNumSeqs)
		}
		seen := make(map[SeqID]bool, len(p.Seqs))
		for _, e := range p.Seqs {
			if seen[e.ID] || len(e.Tokens) == 0 || len(e.Tokens) > s.cfg.ChunkSize {
				return fmt.Errorf("sched: plan %d: sequence %d scheduled twice or with %d tokens", p.Step, e.ID, len(e.Tokens))
			}
			seen[e.ID] = true
			if e.NumDraft > 0 {
				q := e.seq
				live := s.seqs[e.ID] == q && q.running && q.numComputed == e.Start
				if len(e.Tokens) != 1+e.NumDraft || !e.Sample || len(e.Forks) > 0 || live && e.Start+1 != len(q.tokens) {
					return fmt.Errorf("sched: plan %d: sequence %d verifies %d draft tokens in %d tokens at %d", p.Step, e.ID, e.NumDraft, len(e.Tokens), e.Start)
				}
			}
			if len(e.Blocks) < s.pool.BlocksFor(e.Start+len(e.Tokens)) {
				return fmt.Errorf("sched: plan %d: sequence %d has %d blocks for %d tokens", p.Step, e.ID, len(e.Blocks), e.Start+len(e.Tokens))
			}
		}
	}
	if a := s.ahead; a != nil {
		if s.pending == nil || len(a.Seqs) != len(s.pending.Seqs) {
			return fmt.Errorf("sched: ahead plan %d without an outstanding plan of as many sequences", a.Step)
		}
		for i, e := range a.Seqs {
			q := e.seq
			if s.seqs[e.ID] != q || !q.running {
				continue // ended since: Update skips it
			}
			o := s.pending.Seqs[i]
			if o.ID != e.ID || e.Start != o.Start+len(o.Tokens) || len(e.Tokens) != 1 || !q.ahead || len(q.tokens) != e.Start+1 {
				return fmt.Errorf("sched: ahead plan %d: sequence %d does not follow the outstanding plan's entry", a.Step, e.ID)
			}
			if len(e.Blocks) < s.pool.BlocksFor(e.Start+1) {
				return fmt.Errorf("sched: ahead plan %d: sequence %d has %d blocks for %d tokens", a.Step, e.ID, len(e.Blocks), e.Start+1)
			}
		}
	}
	return s.pool.Verify(tables)
}
