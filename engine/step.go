package engine

import (
	"errors"
	"fmt"
	"time"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/kvcache"
	"github.com/trigon-llm/trigon/runner"
	"github.com/trigon-llm/trigon/sched"
	"github.com/trigon-llm/trigon/telemetry"
)

// flight is a step whose sampled ids are still on the device
// (Options.QueueAhead): its plan, the choice that samples each logits row,
// the wait for the ids, and the scheduler's counters before the step.
type flight struct {
	plan   *sched.Plan
	picks  []*choice
	wait   func() ([]int32, error)
	before sched.Stats
	label  stepLabel // for the step metrics
}

func newOutput() sched.StepOutput {
	return sched.StepOutput{Tokens: map[sched.SeqID]int32{}, Finish: map[sched.SeqID]sched.FinishReason{}}
}

// step runs one plan: schedule, execute, sample, update, stream. With a
// step in flight it lands that one instead (land).
func (e *Engine) step() error {
	if e.flight != nil {
		return e.land()
	}
	before := e.sch.Stats()
	t0 := e.timer.now()
	if e.opts.Spec.Proposer != nil {
		e.propose()
	}
	plan := e.sch.Schedule()
	out := newOutput()
	var stepErr error
	if len(plan.Seqs) > 0 {
		e.markScheduled(plan)
		e.timer.phaseSince(telemetry.PhaseSchedule, t0)
		var fl *flight
		fl, stepErr = e.execute(plan, &out)
		if stepErr == nil && fl != nil {
			fl.before = before
			e.flight = fl // its ids are read by the next step
			return nil
		}
		if stepErr != nil {
			e.abortPlan(plan, stepErr)
		}
		e.timer.deliveredCurrent()
	} else {
		// Nothing could run (waiting for blocks): do not spin.
		t0 := e.timer.now()
		time.Sleep(time.Millisecond)
		e.timer.stalled(t0)
	}
	return e.update(plan, out, before, stepErr)
}

// abortPlan ends, with err, every request with a sequence in plan: the
// backend failed; the engine keeps serving the others.
func (e *Engine) abortPlan(plan *sched.Plan, err error) {
	for _, s := range plan.Seqs {
		if c := e.choices[s.ID]; c != nil {
			e.abortRequest(c.req, FinishError, err)
		}
	}
}

// land finishes the step in flight. First, where the scheduler and the
// choices allow, it queues the next decode step behind it on the device,
// fed the flight's sampled ids there (sched.ScheduleAhead); then it waits
// for the flight's ids, accepts them and updates the scheduler. The queued
// step becomes the flight the next step lands.
func (e *Engine) land() error {
	cur := e.flight
	e.flight = nil
	var next *flight
	var aheadPlan *sched.Plan
	var aheadErr error
	if e.canFollow(cur) {
		t0 := e.timer.now()
		p, ok := e.sch.ScheduleAhead()
		e.timer.phaseSince(telemetry.PhaseSchedule, t0)
		if ok {
			aheadPlan = p
			next, aheadErr = e.launchAhead(p)
		}
	}
	out := newOutput()
	t0 := e.timer.now()
	ids, err := cur.wait()
	e.timer.waitedDevice(t0)
	e.timer.delivered(cur.label)
	if err == nil && len(ids) != len(cur.picks) {
		err = fmt.Errorf("engine: %d sampled ids for %d rows", len(ids), len(cur.picks))
	}
	if err == nil {
		t0 = e.timer.now()
		for i, c := range cur.picks {
			if !c.done && e.choices[c.seq] == c { // not aborted meanwhile
				e.accept(c, ids[i], nil, &out)
			}
		}
		e.timer.phaseSince(telemetry.PhaseOutput, t0)
	} else {
		e.abortPlan(cur.plan, err)
	}
	err = e.update(cur.plan, out, cur.before, err)
	if aheadPlan != nil && next == nil {
		// Planned but never launched: it is the outstanding plan now.
		e.abortPlan(aheadPlan, aheadErr)
		if uerr := e.update(aheadPlan, newOutput(), e.sch.Stats(), aheadErr); err == nil {
			err = uerr
		}
	}
	e.flight = next
	return err
}

// canFollow reports whether the step after fl may be queued before fl's
// ids are read: queueing ahead is on, every row's choice is live and
// samples on the device (no logprobs, penalties, JSON or min-tokens mask),
// and, with speculation, no choice is likely to have a draft for that
// step (draftLikely).
func (e *Engine) canFollow(fl *flight) bool {
	if !e.opts.QueueAhead {
		return false
	}
	for _, c := range fl.picks {
		if c.done || e.choices[c.seq] != c || c.needsHostLogits() {
			return false
		}
	}
	return !e.draftLikely(fl)
}

// launchAhead runs an ahead plan, its tokens fed from the step in flight
// on the device, and samples it on the device too.
func (e *Engine) launchAhead(plan *sched.Plan) (*flight, error) {
	before := e.sch.Stats()
	e.timer.beginStep(plan)
	defer e.timer.dropStep() // a step that failed before its end
	picks := make([]*choice, len(plan.Seqs))
	st := runner.Step{Seqs: make([]runner.Seq, len(plan.Seqs)), FedTokens: true}
	for i, s := range plan.Seqs {
		if picks[i] = e.choices[s.ID]; picks[i] == nil {
			return nil, fmt.Errorf("engine: ahead step: sequence %d has no choice", s.ID)
		}
		st.Seqs[i] = runner.Seq{Tokens: s.Tokens, Start: s.Start, BlockTable: blockTable(s.Blocks), WantLogits: true}
	}
	t0 := e.timer.now()
	res, err := e.run.Execute(&st)
	e.timer.ranBackend(t0)
	if err != nil {
		return nil, err
	}
	if res.Rows != len(picks) {
		return nil, fmt.Errorf("engine: ahead step: %d logits rows for %d sequences", res.Rows, len(picks))
	}
	rows := make([]backend.SampleRow, len(picks))
	for row, si := range res.Seq {
		rows[row] = picks[si].sampler.Row()
	}
	ordered := make([]*choice, len(picks))
	for row, si := range res.Seq {
		ordered[row] = picks[si]
	}
	t0 = e.timer.now()
	wait, err := res.SampleNext(rows)
	e.timer.ranBackend(t0)
	if err != nil {
		return nil, err
	}
	e.aheadSteps++
	e.opts.Metrics.AddAheadSteps(1)
	return &flight{plan: plan, picks: ordered, wait: wait, before: before, label: e.timer.endStep(res.Graph)}, nil
}

// update applies a step's output to the scheduler, ends the choices that
// finished, and records the step.
func (e *Engine) update(plan *sched.Plan, out sched.StepOutput, before sched.Stats, stepErr error) error {
	defer e.timer.phaseSince(telemetry.PhaseUpdate, e.timer.now())
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
		e.forget(f.ID)
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
		err := f.Err
		if err == nil {
			err = c.err // the engine's own reason (FinishError)
		}
		c.finish(reason, err)
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
// With QueueAhead, where the device samples every row, it leaves the ids
// on the device and returns the step as a flight for land to read;
// otherwise it samples at once into out.
func (e *Engine) execute(plan *sched.Plan, out *sched.StepOutput) (*flight, error) {
	if e.opts.Spec.Proposer != nil && hasDraft(plan) {
		return nil, e.executeSpec(plan, out)
	}
	e.timer.beginStep(plan)
	defer e.timer.dropStep() // a step that failed before its end
	t0 := e.timer.now()
	if err := e.copyBlocks(plan); err != nil {
		return nil, err
	}
	st := runner.Step{Seqs: make([]runner.Seq, len(plan.Seqs))}
	for i, s := range plan.Seqs {
		st.Seqs[i] = runner.Seq{Tokens: s.Tokens, Start: s.Start, BlockTable: blockTable(s.Blocks), WantLogits: s.Sample}
	}
	res, err := e.run.Execute(&st)
	e.timer.ranBackend(t0)
	if err != nil {
		return nil, err
	}
	if res.Rows == 0 {
		e.timer.endStep(res.Graph)
		return nil, nil
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
		t0 = e.timer.now()
		if _, err := res.Logits(0); err != nil { // reads every row
			return nil, err
		}
		e.timer.waitedDevice(t0)
		e.timer.endStep(res.Graph)
		t0 = e.timer.now()
		defer e.timer.phaseSince(telemetry.PhaseSample, t0)
		for _, p := range picks {
			if p.c.done {
				continue // its request failed at an earlier pick of this step
			}
			logits, err := res.Logits(p.row)
			if err != nil {
				return nil, err
			}
			tok, lp, err := p.c.pickHost(logits)
			if err != nil {
				e.pickFailed(p.c, err)
				continue
			}
			e.accept(p.c, tok, lp, out)
		}
		return nil, nil
	}
	rows := make([]backend.SampleRow, len(picks))
	for i, p := range picks {
		rows[i] = p.c.sampler.Row()
	}
	oneEach := len(picks) == res.Rows // one pick a row (no forks): the ids can feed an ahead step
	for i, p := range picks {
		oneEach = oneEach && p.row == i
	}
	if e.opts.QueueAhead && oneEach && res.Rows*4 <= backend.MaxAsyncRead && e.run.CanFeed() {
		t0 = e.timer.now()
		wait, err := res.SampleNext(rows)
		e.timer.ranBackend(t0)
		if err != nil {
			return nil, err
		}
		fl := &flight{plan: plan, picks: make([]*choice, len(picks)), wait: wait, label: e.timer.endStep(res.Graph)}
		for i, p := range picks {
			fl.picks[i] = p.c
		}
		return fl, nil
	}
	t0 = e.timer.now()
	toks, err := res.Sample(rows)
	e.timer.waitedDevice(t0)
	if err != nil {
		return nil, err
	}
	e.timer.endStep(res.Graph)
	t0 = e.timer.now()
	for i, p := range picks {
		e.accept(p.c, toks[i], nil, out)
	}
	e.timer.phaseSince(telemetry.PhaseOutput, t0)
	return nil, nil
}

// blockTable is a plan's block table as the runner takes it.
func blockTable(blocks []kvcache.BlockID) []int32 {
	table := make([]int32, len(blocks))
	for j, b := range blocks {
		table[j] = int32(b)
	}
	return table
}

// pickFailed ends the request of a choice whose row could not be sampled
// (its masks left no token, or the row holds a NaN or +Inf): the failure
// is that request's, so the step's other sequences keep their tokens.
// A client's error keeps its text as it is: the client is shown it.
func (e *Engine) pickFailed(c *choice, err error) {
	if !errors.Is(err, ErrBadRequest) {
		err = fmt.Errorf("engine: sampling request %s: %w", c.req.req.ID, err)
	}
	e.abortRequest(c.req, FinishError, err)
}

// accept records a sampled token and decides whether the choice ends.
func (e *Engine) accept(c *choice, tok int32, lp *TokenLogprob, out *sched.StepOutput) {
	out.Tokens[c.seq] = tok
	if reason := c.onToken(tok, lp); reason != "" {
		c.reason = reason
		out.Finish[c.seq] = sched.FinishStop
	}
}

// copyBlocks has the runner copy the plan's blocks (forks of partially
// filled blocks) before any KV write of the step.
func (e *Engine) copyBlocks(plan *sched.Plan) error {
	if len(plan.Copies) == 0 {
		return nil
	}
	copies := make([]runner.BlockCopy, len(plan.Copies))
	for i, c := range plan.Copies {
		copies[i] = runner.BlockCopy{Src: int32(c.Src), Dst: int32(c.Dst)}
	}
	if err := e.run.CopyBlocks(copies); err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	return nil
}

func (e *Engine) recordStep(before, after sched.Stats) {
	e.publish()
	m := e.opts.Metrics
	if m == nil {
		return
	}
	if g := e.stats.Graphs; g != e.graphsSeen {
		m.AddGraphEvents(g.Captures-e.graphsSeen.Captures, g.Replays-e.graphsSeen.Replays, g.Evictions-e.graphsSeen.Evictions)
		e.graphsSeen = g
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
