package engine

import (
	"fmt"
	"time"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/samplerule"
	"github.com/trigon-llm/trigon/runner"
	"github.com/trigon-llm/trigon/sched"
	"github.com/trigon-llm/trigon/specdec"
	"github.com/trigon-llm/trigon/telemetry"
)

// SpecOptions turn on speculative decoding (--speculative-config).
type SpecOptions struct {
	// Proposer guesses each decoding sequence's next tokens; nil: off.
	// The engine owns it from New on (Close is the caller's, after Run).
	Proposer specdec.Proposer
	// Tokens is K, the most tokens proposed per sequence and step.
	Tokens int
}

// SpecStats count speculative decoding's work (Stats.Spec).
type SpecStats struct {
	Drafts      uint64 // drafts verified
	DraftTokens uint64 // tokens proposed and verified
	Accepted    uint64 // of which accepted
	// AcceptedAt[i] counts the drafts whose token i was accepted.
	AcceptedAt []uint64
}

// propose asks the proposer for drafts for every sequence that decodes in
// the next step and may draft (choice.mayDraft), and hands them to the
// scheduler. A proposer's failure costs the drafts of one step, nothing
// else: the output never depends on them.
func (e *Engine) propose() {
	cands := e.sch.DraftCandidates()
	if len(cands) == 0 {
		return
	}
	t0 := time.Now()
	seqs := make([]specdec.Seq, 0, len(cands))
	for _, c := range cands {
		ch := e.choices[c.ID]
		if ch == nil || !ch.mayDraft() {
			continue
		}
		seqs = append(seqs, specdec.Seq{ID: int64(c.ID), Tokens: c.Tokens, K: min(e.opts.Spec.Tokens, c.MaxDraft)})
	}
	if len(seqs) == 0 {
		return
	}
	drafts, err := e.opts.Spec.Proposer.Propose(seqs)
	e.opts.Metrics.ObserveSpecDraftTime(time.Since(t0))
	if err == nil && len(drafts) != len(seqs) {
		err = fmt.Errorf("%d drafts for %d sequences", len(drafts), len(seqs))
	}
	if err != nil {
		e.log.Warn("speculative proposer failed; this step decodes without drafts", "err", err)
		return
	}
	for i, d := range drafts {
		if len(d) == 0 {
			continue
		}
		if err := e.sch.SetDraft(sched.SeqID(seqs[i].ID), d[:min(len(d), seqs[i].K)]); err != nil {
			e.log.Warn("speculative draft refused", "err", err)
		}
	}
}

// draftLikely reports whether some choice of fl may draft and, by the
// proposer's guess (specdec.Predictor), will have a draft once fl's token
// is known: the step after fl is then planned on the host, with drafts,
// rather than queued ahead without them.
func (e *Engine) draftLikely(fl *flight) bool {
	if e.predict == nil {
		return false
	}
	for _, c := range fl.picks {
		if c.mayDraft() && e.predict.LikelyDraft(e.sch.Tokens(c.seq)) {
			return true
		}
	}
	return false
}

// forget drops the proposer's state of a sequence that ended.
func (e *Engine) forget(id sched.SeqID) {
	if e.opts.Spec.Proposer != nil {
		e.opts.Spec.Proposer.Forget(int64(id))
	}
}

// hasDraft reports whether some entry of plan verifies a draft.
func hasDraft(plan *sched.Plan) bool {
	for i := range plan.Seqs {
		if plan.Seqs[i].NumDraft > 0 {
			return true
		}
	}
	return false
}

// executeSpec runs a plan with drafts: the target computes the logits of
// every fed token of a verify entry (its rows are the target's
// distributions after each), and each such sequence yields its accepted
// draft prefix and one more token (specdec.Verify). Where every row is
// greedy, the device picks each row's argmax and only the ids come back
// (specdec.Greedy); otherwise the logits rows are read and judged on the
// host. Rows of the plan's other entries (decodes without a draft, chunks
// that end a prompt, their forks) are sampled as execute samples them.
func (e *Engine) executeSpec(plan *sched.Plan, out *sched.StepOutput) error {
	e.timer.beginStep(plan)
	defer e.timer.dropStep()
	t0 := e.timer.now()
	if err := e.copyBlocks(plan); err != nil {
		return err
	}
	st := runner.Step{Seqs: make([]runner.Seq, len(plan.Seqs))}
	for i, s := range plan.Seqs {
		st.Seqs[i] = runner.Seq{Tokens: s.Tokens, Start: s.Start, BlockTable: blockTable(s.Blocks), WantLogits: s.Sample && s.NumDraft == 0, AllLogits: s.NumDraft > 0}
	}
	res, err := e.run.Execute(&st)
	e.timer.ranBackend(t0)
	if err != nil {
		return err
	}
	// first[i] is the first logits row of plan entry i (-1: none).
	first := make([]int, len(plan.Seqs))
	for i := range first {
		first[i] = -1
	}
	for row, si := range res.Seq {
		if first[si] < 0 {
			first[si] = row
		}
	}
	host := false
	for i, s := range plan.Seqs {
		if first[i] < 0 {
			continue
		}
		host = host || len(s.Forks) > 0
		for _, id := range append([]sched.SeqID{s.ID}, s.Forks...) {
			if c := e.choices[id]; c != nil {
				host = host || c.needsHostLogits() || !c.sampler.Greedy()
			}
		}
	}
	if host {
		return e.verifyHost(plan, res, first, out)
	}
	rows := make([]backend.SampleRow, res.Rows)
	for i := range rows {
		rows[i] = backend.SampleRow{Temperature: 0, TopP: 1} // every choice is greedy: the argmax
	}
	t0 = e.timer.now()
	ids, err := res.Sample(rows)
	e.timer.waitedDevice(t0)
	if err != nil {
		return err
	}
	e.timer.endStep(res.Graph)
	t0 = e.timer.now()
	for i, s := range plan.Seqs {
		c := e.choices[s.ID]
		if first[i] < 0 || c == nil {
			continue
		}
		if s.NumDraft == 0 {
			e.accept(c, ids[first[i]], nil, out)
			continue
		}
		draft := s.Tokens[1:]
		e.acceptDraft(c, draft, specdec.Greedy(ids[first[i]:first[i]+1+len(draft)], draft), out)
	}
	e.timer.phaseSince(telemetry.PhaseOutput, t0)
	return nil
}

// verifyHost is executeSpec's host path: every logits row on the host.
func (e *Engine) verifyHost(plan *sched.Plan, res *runner.Output, first []int, out *sched.StepOutput) error {
	t0 := e.timer.now()
	if _, err := res.Logits(0); err != nil { // reads every row
		return err
	}
	e.timer.waitedDevice(t0)
	e.timer.endStep(res.Graph)
	t0 = e.timer.now()
	defer e.timer.phaseSince(telemetry.PhaseSample, t0)
	var scratch samplerule.Scratch
	for i, s := range plan.Seqs {
		if first[i] < 0 {
			continue
		}
		if s.NumDraft == 0 {
			logits, err := res.Logits(first[i])
			if err != nil {
				return err
			}
			for _, id := range append([]sched.SeqID{s.ID}, s.Forks...) {
				c := e.choices[id]
				if c == nil {
					continue // never started, or its request failed at an earlier pick
				}
				tok, lp, err := c.pickHost(logits)
				if err != nil {
					e.pickFailed(c, err)
					continue
				}
				e.accept(c, tok, lp, out)
			}
			continue
		}
		c := e.choices[s.ID]
		if c == nil {
			continue
		}
		draft := s.Tokens[1:]
		row := first[i]
		toks, err := specdec.Verify(func(j int) ([]float32, error) { return res.Logits(row + j) }, draft, c.sampler.Row, &scratch)
		if err != nil {
			return fmt.Errorf("engine: sequence %d: %w", s.ID, err)
		}
		e.acceptDraft(c, draft, toks, out)
	}
	return nil
}

// acceptDraft streams a verify step's tokens in order, stopping at the
// first that ends the choice (EOS, stop string: the tokens after it are
// dropped), and reports them: the leading ones as accepted draft tokens,
// the last as the sampled one. It counts the draft's acceptance.
func (e *Engine) acceptDraft(c *choice, draft, toks []int32, out *sched.StepOutput) {
	accepted := len(toks) - 1
	e.spec.Drafts++
	e.spec.DraftTokens += uint64(len(draft))
	e.spec.Accepted += uint64(accepted)
	for len(e.spec.AcceptedAt) < len(draft) {
		e.spec.AcceptedAt = append(e.spec.AcceptedAt, 0)
	}
	for i := range accepted {
		e.spec.AcceptedAt[i]++
	}
	e.opts.Metrics.ObserveSpecDraft(len(draft), accepted)
	for i, tok := range toks {
		if reason := c.onToken(tok, nil); reason != "" {
			c.reason = reason
			out.Finish[c.seq] = sched.FinishStop
			toks = toks[:i+1]
			break
		}
	}
	out.Tokens[c.seq] = toks[len(toks)-1]
	if len(toks) > 1 {
		if out.Accepted == nil {
			out.Accepted = map[sched.SeqID][]int32{}
		}
		out.Accepted[c.seq] = toks[:len(toks)-1]
	}
}
