package engine

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/runner"
	"github.com/trigon-llm/trigon/sched"
)

// step runs one plan: schedule, execute, sample, update, stream.
func (e *Engine) step() error {
	before := e.sch.Stats()
	plan := e.sch.Schedule()
	out := sched.StepOutput{Tokens: map[sched.SeqID]int32{}, Finish: map[sched.SeqID]sched.FinishReason{}}
	var stepErr error
	if len(plan.Seqs) > 0 {
		e.markScheduled(plan)
		stepErr = e.execute(plan, &out)
		if stepErr != nil {
			// The backend failed: every request in the step gets the error;
			// the engine keeps serving the others.
			for _, s := range plan.Seqs {
				if c := e.choices[s.ID]; c != nil {
					e.abortRequest(c.req, FinishError, stepErr)
				}
			}
		}
	} else {
		// Nothing could run (waiting for blocks): do not spin.
		time.Sleep(time.Millisecond)
	}
	fin, err := e.sch.Update(plan, out)
	if err != nil {
		return fmt.Errorf("engine: update: %w", err)
	}
	for _, f := range fin {
		c := e.choices[f.ID]
		if c == nil {
			continue
		}
		delete(e.choices, f.ID)
		e.dequeue(c.req) // finished without ever being scheduled
		reason := c.reason
		switch {
		case reason != "":
		case f.Reason == sched.FinishStop:
			reason = FinishStop
		case f.Reason == sched.FinishLength:
			reason = FinishLength
		default:
			reason = FinishError
		}
		c.finish(reason, f.Err)
		if c.req.remaining == 0 {
			delete(e.active, c.req)
		}
	}
	e.recordStep(before, e.sch.Stats())
	return stepErr
}

func (e *Engine) markScheduled(plan *sched.Plan) {
	now := time.Now()
	for _, s := range plan.Seqs {
		c := e.choices[s.ID]
		if c == nil || c.req.scheduled {
			continue
		}
		e.dequeue(c.req)
		if m := e.opts.Metrics; m != nil {
			m.ObserveQueueTime(now.Sub(c.req.submitted))
		}
		for _, o := range c.req.choices {
			o.cached = s.NumCachedTokens
		}
	}
}

// execute runs the plan on the runner and samples every row that asks.
func (e *Engine) execute(plan *sched.Plan, out *sched.StepOutput) error {
	if err := e.copyBlocks(plan); err != nil {
		return err
	}
	st := runner.Step{Seqs: make([]runner.Seq, len(plan.Seqs))}
	for i, s := range plan.Seqs {
		table := make([]int32, len(s.Blocks))
		for j, b := range s.Blocks {
			table[j] = int32(b)
		}
		st.Seqs[i] = runner.Seq{Tokens: s.Tokens, Start: s.Start, BlockTable: table, WantLogits: s.Sample}
	}
	res, err := e.run.Execute(&st)
	if err != nil {
		return err
	}
	if res.Rows == 0 {
		return nil
	}
	// Each logits row is sampled by its sequence and by each of its forks.
	type pick struct {
		c   *choice
		row int
	}
	var picks []pick
	host := false
	for row, si := range res.Seq {
		s := plan.Seqs[si]
		for _, id := range append([]sched.SeqID{s.ID}, s.Forks...) {
			c := e.choices[id]
			if c == nil {
				continue
			}
			picks = append(picks, pick{c, row})
			host = host || c.needsHostLogits()
		}
		host = host || len(s.Forks) > 0
	}
	if host {
		for _, p := range picks {
			logits, err := res.Logits(p.row)
			if err != nil {
				return err
			}
			tok, lp, err := p.c.pickHost(logits)
			if err != nil {
				return err
			}
			e.accept(p.c, tok, lp, out)
		}
		return nil
	}
	rows := make([]backend.SampleRow, len(picks))
	for i, p := range picks {
		rows[i] = p.c.sampler.Row()
	}
	toks, err := res.Sample(rows)
	if err != nil {
		return err
	}
	for i, p := range picks {
		e.accept(p.c, toks[i], nil, out)
	}
	return nil
}

// accept records a sampled token and decides whether the choice ends.
func (e *Engine) accept(c *choice, tok int32, lp *TokenLogprob, out *sched.StepOutput) {
	out.Tokens[c.seq] = tok
	if reason := c.onToken(tok, lp); reason != "" {
		c.reason = reason
		out.Finish[c.seq] = sched.FinishStop
	}
}

// copyBlocks performs the plan's block copies (forks of partially filled
// blocks) in every layer's K and V pool before any KV write of the step.
// A copy is two gathers (Embed) through a one-block scratch, with each
// pool viewed as [numBlocks, blockElems].
func (e *Engine) copyBlocks(plan *sched.Plan) error {
	if len(plan.Copies) == 0 {
		return nil
	}
	b := e.run.Backend()
	if e.copyIDs == nil {
		kv := e.run.KV()[0].K
		sh := kv.Shape()
		ids, err := b.Alloc(backend.I32, 2)
		if err != nil {
			return fmt.Errorf("engine: block copy: %w", err)
		}
		scratch, err := b.Alloc(kv.DType(), 1, sh[1]*sh[2]*sh[3])
		if err != nil {
			b.Free(ids)
			return fmt.Errorf("engine: block copy: %w", err)
		}
		e.copyIDs, e.copyScratch = ids, scratch
	}
	srcID, err := b.View(e.copyIDs, 0, 1)
	if err != nil {
		return err
	}
	zeroID, err := b.View(e.copyIDs, 1, 1)
	if err != nil {
		return err
	}
	var ids [8]byte
	for _, cp := range plan.Copies {
		binary.LittleEndian.PutUint32(ids[:], uint32(cp.Src))
		binary.LittleEndian.PutUint32(ids[4:], 0)
		if err := b.Write(e.copyIDs, ids[:]); err != nil {
			return fmt.Errorf("engine: block copy: %w", err)
		}
		for _, kv := range e.run.KV() {
			for _, pool := range []backend.Tensor{kv.K, kv.V} {
				sh := pool.Shape()
				flat, err := b.Reshape(pool, sh[0], sh[1]*sh[2]*sh[3])
				if err != nil {
					return err
				}
				dst, err := b.View(flat, int(cp.Dst), 1)
				if err != nil {
					return err
				}
				if err := b.Embed(e.copyScratch, flat, srcID); err != nil {
					return fmt.Errorf("engine: copy block %d to %d: %w", cp.Src, cp.Dst, err)
				}
				if err := b.Embed(dst, e.copyScratch, zeroID); err != nil {
					return fmt.Errorf("engine: copy block %d to %d: %w", cp.Src, cp.Dst, err)
				}
			}
		}
	}
	return nil
}

func (e *Engine) recordStep(before, after sched.Stats) {
	e.publish()
	m := e.opts.Metrics
	if m == nil {
		return
	}
	if d := after.Preemptions - before.Preemptions; d > 0 {
		m.AddPreemptions(int(d))
	}
	if q := after.PrefixQueryTokens - before.PrefixQueryTokens; q > 0 {
		m.AddPrefixCacheLookup(int(q), int(after.PrefixHitTokens-before.PrefixHitTokens))
	}
	m.SetRequestsRunning(after.NumRunning)
	m.SetRequestsWaiting(after.NumWaiting + e.numPending())
	m.SetKVCacheUsage(after.KVUsage)
}
