package runner

import (
	"fmt"
	"slices"
	"time"

	"github.com/trigon-llm/trigon/backend"
)

// Verify steps as decode rows.
//
// A verify step (every sequence feeds the same 1+k = q tokens and wants
// every row's logits) runs from a graph in one of two forms:
//
//   - native: B sequences of q query rows, through the prefill attention
//     kernels, from the graph of (bucket(B), width, q);
//   - flat: B*q decode rows, row j of sequence s a one-token sequence at
//     position start+j whose context is the first start+j+1 tokens of s
//     (s's block table, repeated), through the decode kernels, from a
//     graph of (bucket(B*q), width, 1) of its own: the step says
//     StepKeys q, since a row's context ends with rows the same step
//     writes (up to q of them), which a decode kernel that reads older
//     positions while the KV writes before it still run must read after
//     them.
//
// Both write the same KV to the same slots and compute the same logits
// rows in the same order. The flat form reads each sequence's KV q times
// instead of once, but runs the decode path, whose fixed costs are far
// below the prefill kernels' where a step is short (a small model, short
// contexts). Which is faster depends on the model, the device and the
// contexts, so the runner measures it per (bucket, q, width): the shape's
// first steps capture both graphs, the next replays each a few times,
// timed to the device's completion, and the faster form runs that shape
// from then on.

// Uneven verify steps (drafts of different lengths, or sequences without
// a draft beside ones with) take the same graphs: padVerifyRows pads each
// sequence to the longest's 1+k rows with rows that write no KV (slot -1)
// at the positions after its own. Causal attention keeps a sequence's
// own rows from seeing them. The step's logits rows stay first, in order,
// the padding rows' after them (a verify graph gathers its logits rows by
// index, Runner.gather), so the Output is the step's rows as without
// padding, and the padding rows' logits, computed over positions no step
// wrote, are never read or sampled.

// padVerifyRows pads the packed rows of a verify step to q rows a
// sequence; it reports false, changing nothing, where a padded sequence
// would pass the context or its table width, or the step would not fit
// the step buffers (such a step runs eagerly, unpadded).
func (r *Runner) padVerifyRows(q int) bool {
	ns, bs := len(r.hSeqLens), r.opts.BlockSize
	if ns*q > r.opts.MaxTokens || r.win != nil {
		return false
	}
	for s := range ns {
		end := int(r.hSeqLens[s]) + q - int(r.hQueryStart[s+1]-r.hQueryStart[s])
		if end > r.opts.MaxSeqLen || (end+bs-1)/bs > r.width {
			return false
		}
	}
	// Where each old row lands.
	moved := make([]int32, len(r.hTokens))
	toks, pos, slots := r.hTokens, r.hPositions, r.hSlots
	qs := append([]int32(nil), r.hQueryStart...)
	lens := append([]int32(nil), r.hSeqLens...)
	r.hTokens, r.hPositions, r.hSlots = make([]int32, 0, ns*q), make([]int32, 0, ns*q), make([]int32, 0, ns*q)
	r.hQueryStart, r.hSeqLens = r.hQueryStart[:1], r.hSeqLens[:0]
	var pads []int32
	for s := range ns {
		n := int(qs[s+1] - qs[s])
		for j := range q {
			if j < n {
				i := int(qs[s]) + j
				moved[i] = int32(len(r.hTokens))
				r.hTokens, r.hPositions, r.hSlots = append(r.hTokens, toks[i]), append(r.hPositions, pos[i]), append(r.hSlots, slots[i])
				continue
			}
			pads = append(pads, int32(len(r.hTokens)))
			r.hTokens = append(r.hTokens, 0)
			r.hPositions = append(r.hPositions, pos[int(qs[s])+n-1]+int32(j-n+1))
			r.hSlots = append(r.hSlots, -1)
		}
		r.hQueryStart = append(r.hQueryStart, int32(len(r.hTokens)))
		r.hSeqLens = append(r.hSeqLens, lens[s]+int32(q-n))
	}
	for i, row := range r.hLogitsRows {
		r.hLogitsRows[i] = moved[row]
	}
	r.hLogitsRows = append(r.hLogitsRows, pads...)
	return true
}

// verifyKey is a native verify graph's shape.
type verifyKey struct{ bucket, q, width int }

// verifyChoice is what the runner knows of a verify shape's two forms.
type verifyChoice struct {
	trials  int  // steps run while undecided
	decided bool // flat is the measured choice
	flat    bool
	// native and flatTime are the forms' mean timed replays (zero: not
	// timed).
	native, flatTime time.Duration
}

const (
	// verifyTimingRounds is how many replays of each form a timing takes,
	// one of each in turn; verifyTimingReps the back-to-back launches of
	// one replay's timing.
	verifyTimingRounds = 3
	verifyTimingReps   = 2
	// maxVerifyTrials bounds the undecided steps of a shape (whose graphs
	// an LRU eviction or a failed capture can keep from coexisting): past
	// it the shape stays native.
	maxVerifyTrials = 8
)

// flatBucket is the decode bucket a verify step of n sequences of q rows
// would run in flat, or 0 where it cannot: the rows exceed the sequence
// cap or the buckets, a KIVI window maps sequences (its blocks are the
// sequences'), or the runner leads or is a rank of a group (every rank
// must run the same form, and each would measure its own).
func (r *Runner) flatBucket(n, q int) int {
	c := r.graphs
	if c == nil || r.win != nil || r.peers != nil || r.grouped || n*q > r.opts.MaxSeqs {
		return 0
	}
	if b := c.bucket(n * q); b <= r.opts.MaxTokens {
		return b
	}
	return 0
}

// flatten turns the packed native rows of a verify step (no padding yet)
// into one-token decode sequences: the tokens, positions, slots and
// logits rows stay; each row gets its own query range, its causal
// context length and its sequence's block table.
func (r *Runner) flatten() {
	w := r.width
	ns := len(r.hSeqLens)
	qs := append([]int32(nil), r.hQueryStart...)
	lens := append([]int32(nil), r.hSeqLens...)
	tables := append([]int32(nil), r.hTables[:ns*w]...)
	r.hQueryStart, r.hSeqLens, r.hTables = r.hQueryStart[:1], r.hSeqLens[:0], r.hTables[:0]
	for s := range ns {
		n := qs[s+1] - qs[s]
		for j := range n {
			r.hQueryStart = append(r.hQueryStart, qs[s]+j+1)
			r.hSeqLens = append(r.hSeqLens, lens[s]-n+j+1)
			r.hTables = append(r.hTables, tables[s*w:(s+1)*w]...)
		}
	}
}

// forwardVerify runs a packed verify step of bucket (padded from
// len(step.Seqs)) sequences of q rows each in the form its shape's choice
// names, measuring the choice where both graphs exist. The host rows are
// the native packing, unpadded.
func (r *Runner) forwardVerify(step *Step, bucket, q, flat int) (backend.Tensor, error) {
	c := r.graphs
	c.clock++
	key := verifyKey{bucket, q, r.width}
	ch := c.verifyChoice[key]
	if ch.decided || ch.trials >= maxVerifyTrials {
		return r.runVerify(bucket, q, flat, ch.decided && ch.flat)
	}
	ch.trials++
	c.verifyChoice[key] = ch
	native := c.graphs[c.keyFor(bucket, r.width, q, 0)]
	flatG := c.graphs[c.keyFor(flat, r.width, 1, q)]
	switch {
	case c.uncapturable[graphShape{bucket, r.width, q, 0}] || c.uncapturable[graphShape{flat, r.width, 1, q}]:
		// One form runs eagerly: the other, from its graph, is faster.
		ch.decided, ch.flat = true, !c.uncapturable[graphShape{flat, r.width, 1, q}]
		c.verifyChoice[key] = ch
		return r.runVerify(bucket, q, flat, ch.flat)
	case native == nil:
		return r.runVerify(bucket, q, flat, false)
	case flatG == nil:
		return r.runVerify(bucket, q, flat, true)
	}
	// Both graphs exist: time them on this step's inputs (replays write
	// the same KV and logits each time), alternating so that a drift of
	// the device's clocks falls on both.
	r.padDecode(bucket, q)
	nativeRows := r.saveHost()
	r.truncatePadding(len(step.Seqs))
	r.flatten()
	r.padDecode(flat, 1)
	flatRows := r.saveHost()
	var tn, tf time.Duration
	for range verifyTimingRounds {
		r.restoreHost(nativeRows)
		d, err := r.timeGraph(native)
		if err != nil {
			return nil, err
		}
		tn += d
		r.restoreHost(flatRows)
		if d, err = r.timeGraph(flatG); err != nil {
			return nil, err
		}
		tf += d
	}
	ch.decided, ch.flat = true, tf < tn
	ch.native, ch.flatTime = tn/verifyTimingRounds, tf/verifyTimingRounds
	c.verifyChoice[key] = ch
	c.stats.VerifyTimings++
	if ch.flat {
		c.stats.FlatVerifies++
	}
	c.stats.Replays++
	// The last replay was the flat form's, from the flat rows: its logits
	// rows are the step's, in the same order as the native form's.
	return flatG.logits, nil
}

// hostRows is a copy of the packed host rows of a step.
type hostRows struct{ tokens, positions, slots, queryStart, seqLens, tables, logitsRows []int32 }

func (r *Runner) saveHost() hostRows {
	return hostRows{slices.Clone(r.hTokens), slices.Clone(r.hPositions), slices.Clone(r.hSlots), slices.Clone(r.hQueryStart),
		slices.Clone(r.hSeqLens), slices.Clone(r.hTables), slices.Clone(r.hLogitsRows)}
}

func (r *Runner) restoreHost(h hostRows) {
	r.hTokens, r.hPositions, r.hSlots = append(r.hTokens[:0], h.tokens...), append(r.hPositions[:0], h.positions...), append(r.hSlots[:0], h.slots...)
	r.hQueryStart, r.hSeqLens = append(r.hQueryStart[:0], h.queryStart...), append(r.hSeqLens[:0], h.seqLens...)
	r.hTables, r.hLogitsRows = append(r.hTables[:0], h.tables...), append(r.hLogitsRows[:0], h.logitsRows...)
}

// VerifyForm is the form the runner chose for one verify shape (bucket
// sequences of Query rows, block tables of Width blocks) and the replay
// times it chose by: the mean of each form's timed replays (zero where a
// form could not be captured, and the other was chosen without timing).
type VerifyForm struct {
	Bucket, Query, Width int
	Flat                 bool
	Native, FlatTime     time.Duration
}

// VerifyForms lists the verify shapes whose form is decided, in no
// particular order (none when graphs are off).
func (r *Runner) VerifyForms() []VerifyForm {
	if r.graphs == nil {
		return nil
	}
	var out []VerifyForm
	for k, ch := range r.graphs.verifyChoice {
		if ch.decided {
			out = append(out, VerifyForm{Bucket: k.bucket, Query: k.q, Width: k.width, Flat: ch.flat, Native: ch.native, FlatTime: ch.flatTime})
		}
	}
	return out
}

// runVerify runs the packed verify step natively or flat, through
// forwardGraph (which captures a shape's graph on its second use).
func (r *Runner) runVerify(bucket, q, flat int, asFlat bool) (backend.Tensor, error) {
	stepKeys := 0
	if asFlat {
		r.flatten()
		bucket, q, stepKeys = flat, 1, q
		r.graphs.stats.FlatVerifies++
	}
	r.padDecode(bucket, q)
	in, err := r.upload(0)
	if err != nil {
		return nil, err
	}
	in.MaxSeqLen = r.graphSeqLen()
	in.StepKeys = stepKeys
	return r.forwardGraph(in, bucket, q)
}

// truncatePadding drops the padding sequences padDecode appended after
// the step's n real ones.
func (r *Runner) truncatePadding(n int) {
	end := r.hQueryStart[n]
	r.hTokens, r.hPositions, r.hSlots = r.hTokens[:end], r.hPositions[:end], r.hSlots[:end]
	r.hQueryStart, r.hSeqLens = r.hQueryStart[:n+1], r.hSeqLens[:n]
	r.hTables = r.hTables[:n*r.width]
	for len(r.hLogitsRows) > 0 && r.hLogitsRows[len(r.hLogitsRows)-1] >= end {
		r.hLogitsRows = r.hLogitsRows[:len(r.hLogitsRows)-1]
	}
}

// timeGraph uploads the packed rows and replays e verifyTimingReps times
// back to back, returning the time from the first launch to the device's
// completion of the last, per replay.
func (r *Runner) timeGraph(e *graphEntry) (time.Duration, error) {
	if _, err := r.upload(0); err != nil {
		return 0, err
	}
	e.lastUse = r.graphs.clock
	if err := r.b.Sync(); err != nil {
		return 0, fmt.Errorf("runner: time verify graph: %w", err)
	}
	t0 := time.Now()
	for range verifyTimingReps {
		if err := e.g.Launch(); err != nil {
			return 0, fmt.Errorf("runner: time verify graph: %w", err)
		}
	}
	if err := r.b.Sync(); err != nil {
		return 0, fmt.Errorf("runner: time verify graph: %w", err)
	}
	return time.Since(t0) / verifyTimingReps, nil
}
