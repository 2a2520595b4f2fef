package specdec

import (
	"errors"
	"fmt"
	"slices"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/kvcache"
	"github.com/trigon-llm/trigon/runner"
)

// Draft proposes with a draft model (vLLM's "draft_model" method): a model
// with the target's vocabulary, run through a runner and KV cache of its
// own on the same backend, decoding greedily. Its KV cache follows each
// sequence: Propose first feeds the draft what it has not seen of the
// sequence's tokens (the whole prompt the first time, chunked; afterwards
// the tokens the target accepted and added since), then decodes K-1 more
// tokens, batching every sequence in each step; where the backend can,
// each step's guesses feed the next on the device and the host reads them
// once at the end (runner.Step.FedTokens). Its guesses are point
// masses (greedy), so the engine accepts each with the target's probability
// of it.
//
// Rollback needs no call: the draft remembers the tokens whose KV it
// holds, and a later Propose keeps only their common prefix with the
// sequence's tokens (the rest, rejected guesses, is overwritten as the
// draft goes on) and truncates the table to what it needs.
type Draft struct {
	r    *runner.Runner
	pool *kvcache.Pool
	seqs map[int64]*draftSeq
	// maxTokens and maxSeqs bound one draft step (the runner's sizes).
	maxTokens, maxSeqs, maxSeqLen int
	owned                         func() // frees what NewDraft was handed (Close)
}

type draftSeq struct {
	table *kvcache.BlockTable
	fed   []int32 // tokens whose KV the draft's cache holds, positions 0..
}

// NewDraft returns the proposer over r, the draft model's runner, and
// pool, the block manager of r's KV pools (no prefix cache: nothing else
// may allocate from it). close, when set, is called by Close, after the
// proposer's blocks are freed: it frees r, the draft model and its weights.
func NewDraft(r *runner.Runner, pool *kvcache.Pool, close func()) (*Draft, error) {
	o := r.Options()
	if pool.NumBlocks() != o.NumBlocks || pool.BlockSize() != o.BlockSize {
		return nil, fmt.Errorf("specdec: draft pool of %d blocks of %d for a runner of %d of %d", pool.NumBlocks(), pool.BlockSize(), o.NumBlocks, o.BlockSize)
	}
	if pool.PrefixCacheEnabled() {
		return nil, errors.New("specdec: the draft's pool caches no prefixes (its tables are truncated at will)")
	}
	return &Draft{r: r, pool: pool, seqs: map[int64]*draftSeq{}, maxTokens: o.MaxTokens, maxSeqs: o.MaxSeqs, maxSeqLen: o.MaxSeqLen, owned: close}, nil
}

// Runner is the draft model's runner, for warming its shapes at load
// (engine.LoadOptions.Warm) before any proposal: no sequence holds its
// blocks then.
func (d *Draft) Runner() *runner.Runner { return d.r }

// Propose implements Proposer. A sequence the draft has no room for (its
// pool or context is short) gets no draft.
func (d *Draft) Propose(seqs []Seq) ([][]int32, error) {
	out := make([][]int32, len(seqs))
	var ws []*draftWork
	for i, s := range seqs {
		if len(s.Tokens) == 0 || s.K < 1 {
			continue
		}
		st := d.seqs[s.ID]
		if st == nil {
			st = &draftSeq{table: kvcache.NewBlockTable("")}
			d.seqs[s.ID] = st
		}
		valid := 0
		for valid < len(st.fed) && valid < len(s.Tokens)-1 && st.fed[valid] == s.Tokens[valid] {
			valid++
		}
		st.fed = st.fed[:valid]
		// Positions fed: the sequence's tokens, then K-1 guesses (the
		// last guess is never fed).
		k := min(s.K, d.maxSeqLen-len(s.Tokens)+1)
		if k < 1 || len(ws) == d.maxSeqs {
			continue
		}
		need := len(s.Tokens) + k - 1
		if err := d.pool.Truncate(st.table, need); err != nil {
			return nil, fmt.Errorf("specdec: draft: %w", err)
		}
		if err := d.pool.Allocate(st.table, need); err != nil {
			if !errors.Is(err, kvcache.ErrNoBlocks) {
				return nil, fmt.Errorf("specdec: draft: %w", err)
			}
			continue // no room this step: no draft
		}
		ws = append(ws, &draftWork{i: i, st: st, feed: s.Tokens[valid:], k: k})
	}
	if err := d.draft(ws); err != nil {
		d.reset(ws)
		return nil, err
	}
	for _, w := range ws {
		out[w.i] = w.draft
		if len(w.draft) > 0 {
			// The decode steps fed every guess but the last.
			w.st.fed = append(w.st.fed, w.draft[:len(w.draft)-1]...)
		}
	}
	return out, nil
}

// draftWork is one sequence's share of a Propose.
type draftWork struct {
	i     int // index in seqs
	st    *draftSeq
	feed  []int32 // tokens still to feed before the first guess
	k     int
	n     int     // guesses made, those still on the device included
	draft []int32 // guesses on the host
}

// pendingIDs are a step's sampled ids on their way to the host
// (Output.SampleNext): one per row, for rows[i] in order.
type pendingIDs struct {
	rows []*draftWork
	wait func() ([]int32, error)
}

// draft runs the draft model's steps for ws: first the catch-up (each
// sequence's unseen tokens, chunked to the step's token bound; the chunk
// that ends them gives the first guess), then one decode step per further
// guess, every sequence still short of its k in each. Where the backend
// can (runner.CanFeed), a step's guesses stay on the device and feed the
// next step directly (Step.FedTokens) when that step decodes exactly the
// same sequences, so the host waits for the ids once at the end rather
// than once a step; at most backend.MaxAsyncReads reads are pending.
func (d *Draft) draft(ws []*draftWork) error {
	var pend []pendingIDs
	// prev are the rows of the step just run when its ids were left on
	// the device (nil otherwise): the only step a fed step may follow.
	var prev []*draftWork
	if n := d.evenCatchUp(ws); n > 0 {
		if err := d.runCatchUp(ws, n); err != nil {
			return err
		}
	}
	for {
		var step runner.Step
		var rows []*draftWork
		budget := d.maxTokens
		for _, w := range ws {
			if len(w.feed) == 0 || budget == 0 {
				continue
			}
			n := min(len(w.feed), budget)
			last := n == len(w.feed)
			step.Seqs = append(step.Seqs, runner.Seq{Tokens: w.feed[:n], Start: len(w.st.fed), BlockTable: ids(w.st.table), WantLogits: last})
			w.st.fed = append(w.st.fed, w.feed[:n]...)
			w.feed = w.feed[n:]
			budget -= n
			if last {
				rows = append(rows, w)
			}
		}
		if len(step.Seqs) == 0 {
			break
		}
		var err error
		if prev, err = d.run(&step, rows, &pend); err != nil {
			return err
		}
	}
	for {
		var rows []*draftWork
		for _, w := range ws {
			if w.n > 0 && w.n < w.k {
				rows = append(rows, w)
			}
		}
		if len(rows) == 0 {
			break
		}
		fed := prev != nil && slices.Equal(rows, prev)
		if !fed {
			if err := resolve(&pend, len(pend)); err != nil {
				return err
			}
		}
		step := runner.Step{Seqs: make([]runner.Seq, len(rows)), FedTokens: fed}
		for i, w := range rows {
			tok := []int32{0} // fed: the device has it
			if !fed {
				tok = w.draft[len(w.draft)-1:]
			}
			// Position: the catch-up's tokens, then one guess a step.
			step.Seqs[i] = runner.Seq{Tokens: tok, Start: len(w.st.fed) + w.n - 1, BlockTable: ids(w.st.table), WantLogits: true}
		}
		var err error
		if prev, err = d.run(&step, rows, &pend); err != nil {
			return err
		}
	}
	return resolve(&pend, len(pend))
}

// evenCatchUp is the catch-up length n every sequence of ws has left to
// feed where one step of them all, every row's logits wanted, is the
// verify-shaped step the draft's runner replays from a graph (1 < n <=
// 1 + its GraphOptions.VerifyTokens, within its token bound); else 0.
// After the first proposal a sequence's catch-up is the 1..k+1 tokens
// the target added, the same count for every sequence at batch 1 and
// often beyond; a step of uneven or longer catch-ups runs eagerly.
func (d *Draft) evenCatchUp(ws []*draftWork) int {
	o := d.r.Options().Graphs
	if !o.Enabled || len(ws) == 0 {
		return 0
	}
	n := len(ws[0].feed)
	for _, w := range ws {
		if len(w.feed) != n {
			return 0
		}
	}
	if n < 2 || n > 1+o.VerifyTokens || n*len(ws) > d.maxTokens {
		return 0
	}
	return n
}

// runCatchUp feeds every sequence of ws its n catch-up tokens in one step
// that wants all their logits and takes each sequence's last row's argmax
// as its first guess (read at once: the rows the device would leave for a
// fed step are not one a sequence).
func (d *Draft) runCatchUp(ws []*draftWork, n int) error {
	step := runner.Step{Seqs: make([]runner.Seq, len(ws))}
	for i, w := range ws {
		step.Seqs[i] = runner.Seq{Tokens: w.feed, Start: len(w.st.fed), BlockTable: ids(w.st.table), AllLogits: true}
		w.st.fed = append(w.st.fed, w.feed...)
		w.feed = nil
	}
	res, err := d.r.Execute(&step)
	if err != nil {
		return fmt.Errorf("specdec: draft catch-up: %w", err)
	}
	if res.Rows != n*len(ws) {
		return fmt.Errorf("specdec: draft catch-up: %d logits rows for %d sequences of %d", res.Rows, len(ws), n)
	}
	toks, err := res.Sample(argmaxRows(res.Rows))
	if err != nil {
		return fmt.Errorf("specdec: draft catch-up: %w", err)
	}
	for i, w := range ws {
		w.draft = append(w.draft, toks[i*n+n-1])
		w.n++
	}
	return nil
}

// run executes one draft step and samples each row's argmax for rows (in
// step order, one per WantLogits seq): left on the device where the
// backend can, else read at once. It returns rows when their ids are on
// the device for the next step.
func (d *Draft) run(step *runner.Step, rows []*draftWork, pend *[]pendingIDs) ([]*draftWork, error) {
	res, err := d.r.Execute(step)
	if err != nil {
		return nil, fmt.Errorf("specdec: draft step: %w", err)
	}
	if res.Rows != len(rows) {
		return nil, fmt.Errorf("specdec: draft step: %d logits rows for %d guesses", res.Rows, len(rows))
	}
	if len(rows) == 0 {
		return nil, nil
	}
	rules := argmaxRows(len(rows))
	for _, w := range rows {
		w.n++
	}
	if d.r.CanFeed() && 4*len(rows) <= backend.MaxAsyncRead {
		if len(*pend) == backend.MaxAsyncReads {
			if err := resolve(pend, 1); err != nil {
				return nil, err
			}
		}
		wait, err := res.SampleNext(rules)
		if err != nil {
			return nil, fmt.Errorf("specdec: draft step: %w", err)
		}
		*pend = append(*pend, pendingIDs{rows: rows, wait: wait})
		return rows, nil
	}
	if err := resolve(pend, len(*pend)); err != nil { // earlier guesses first
		return nil, err
	}
	toks, err := res.Sample(rules)
	if err != nil {
		return nil, fmt.Errorf("specdec: draft step: %w", err)
	}
	for i, w := range rows {
		w.draft = append(w.draft, toks[i])
	}
	return nil, nil
}

// argmaxRows are n greedy sampling rules: each row's argmax, the draft's
// guess.
func argmaxRows(n int) []backend.SampleRow {
	rules := make([]backend.SampleRow, n)
	for i := range rules {
		rules[i] = backend.SampleRow{Temperature: 0, TopP: 1}
	}
	return rules
}

// resolve waits for the oldest n pending reads, in order, and appends
// their ids to their sequences' drafts.
func resolve(pend *[]pendingIDs, n int) error {
	for _, p := range (*pend)[:n] {
		ids, err := p.wait()
		if err != nil {
			return fmt.Errorf("specdec: draft ids: %w", err)
		}
		if len(ids) != len(p.rows) {
			return fmt.Errorf("specdec: draft ids: %d for %d rows", len(ids), len(p.rows))
		}
		for i, w := range p.rows {
			w.draft = append(w.draft, ids[i])
		}
	}
	*pend = (*pend)[n:]
	return nil
}

// reset forgets what the sequences of a failed Propose fed: their KV may
// be incomplete, so the next Propose feeds them again from the start.
func (d *Draft) reset(ws []*draftWork) {
	for _, w := range ws {
		w.st.fed = w.st.fed[:0]
	}
}

func ids(t *kvcache.BlockTable) []int32 {
	b := t.Blocks()
	out := make([]int32, len(b))
	for i, id := range b {
		out[i] = int32(id)
	}
	return out
}

// Forget implements Proposer: the sequence's draft blocks go back.
func (d *Draft) Forget(id int64) {
	if st := d.seqs[id]; st != nil {
		d.pool.Free(st.table)
		delete(d.seqs, id)
	}
}

// Close implements Proposer.
func (d *Draft) Close() {
	for id := range d.seqs {
		d.Forget(id)
	}
	if d.owned != nil {
		d.owned()
		d.owned = nil
	}
}
