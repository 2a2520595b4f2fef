package engine

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/trigon-llm/trigon/sample"
	"github.com/trigon-llm/trigon/sched"
	"github.com/trigon-llm/trigon/tokenizer"
)

// request is one submitted Request and its stream to the caller. Events are
// queued without bound by the step loop (which must never block on a slow
// client) and delivered by a pump goroutine.
type request struct {
	ctx       context.Context
	req       *Request
	out       chan Event
	submitted time.Time

	mu     sync.Mutex
	queue  []Event
	notify chan struct{}
	closed bool

	// Owned by the step loop.
	choices   []*choice
	remaining int
	scheduled bool // counted out of the waiting queue (Engine.dequeue)
}

func newRequest(ctx context.Context, req *Request) *request {
	r := &request{
		ctx: ctx, req: req, submitted: time.Now(),
		out:       make(chan Event, 16),
		notify:    make(chan struct{}, 1),
		choices:   make([]*choice, req.N),
		remaining: req.N,
	}
	go r.pump()
	return r
}

func (r *request) send(ev Event, last bool) {
	r.mu.Lock()
	r.queue = append(r.queue, ev)
	if last {
		r.closed = true
	}
	r.mu.Unlock()
	select {
	case r.notify <- struct{}{}:
	default:
	}
}

// pump delivers queued events in order and closes out after the last one.
// Once the caller's context ends, events are dropped, but out is still
// closed when the engine finishes the request. What the caller receives
// is always a prefix of the events: once one is dropped, every later one
// is too (a send and the context's end that are both ready are chosen at
// random, so without that the stream could lose an event in its middle
// and deliver the ones after it).
func (r *request) pump() {
	gone := false
	for {
		<-r.notify
		r.mu.Lock()
		batch, closed := r.queue, r.closed
		r.queue = nil
		r.mu.Unlock()
		for _, ev := range batch {
			if gone {
				break
			}
			select {
			case r.out <- ev:
			case <-r.ctx.Done():
				gone = true
			}
		}
		if closed {
			close(r.out)
			return
		}
	}
}

// finishAll ends a request none of whose choices started.
func (r *request) finishAll(reason string, err error) {
	for i := 0; i < r.req.N; i++ {
		r.remaining--
		r.send(Event{Choice: i, FinishReason: reason, Err: err, PromptTokens: len(r.req.Prompt)}, r.remaining == 0)
	}
}

// choice is one sampled continuation of a request: one scheduler sequence.
type choice struct {
	e       *Engine
	req     *request
	index   int
	seq     sched.SeqID
	sampler *sample.Sampler
	dec     *tokenizer.Decoder
	stop    *sample.StopChecker

	generated []int32
	reason    string // finish reason decided by the engine (stop conditions)
	err       error  // why, when reason is FinishError
	done      bool
	stopped   bool                   // a stop string or EOS ended it: nothing held back is shown
	json      *sample.JSONConstraint // nil unless the request is in JSON mode
	cached    int
}

func newChoice(e *Engine, r *request, index int, id sched.SeqID) (*choice, error) {
	smp, err := sample.NewSampler(r.req.Params, index)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	c := &choice{
		e: e, req: r, index: index, seq: id,
		sampler: smp,
		dec:     tokenizer.NewDecoder(e.tok, r.req.SkipSpecialTokens),
		stop:    sample.NewStopChecker(r.req.Params, e.opts.EOS),
	}
	if r.req.JSONObject {
		c.json = sample.NewJSONConstraint(e.vocabTexts(), e.opts.EOS)
	}
	return c, nil
}

// needsHostLogits reports whether sampling needs the logits row on the host
// (JSON mode, logprobs, penalties, EOS masking until min_tokens); otherwise
// the device samples. A step whose sequence forks (n > 1) reads its rows on
// the host too, as each fork samples the same row.
func (c *choice) needsHostLogits() bool {
	p := &c.req.req.Params
	return c.json != nil || c.req.req.Logprobs || p.RepetitionPenalty != 1 && p.RepetitionPenalty != 0 ||
		p.PresencePenalty != 0 || p.FrequencyPenalty != 0 || len(c.generated) < p.MinTokens
}

// seededSampling reports a request that samples (temperature above 0)
// with a seed: its output must be the same whatever else runs.
func (c *choice) seededSampling() bool {
	p := &c.req.req.Params
	return p.Seed != nil && p.Temperature > 0
}

// mayDraft reports whether the choice may verify drafts: it samples on
// the device's terms (penalties, logprobs, JSON and min-tokens masks need
// each token's logits adjusted on the host for the tokens before it) and
// without a seed (a seeded request's random draws per token differ between
// verify and plain steps, and whether a step carries a draft depends on
// the batch, so its text would depend on what else runs).
func (c *choice) mayDraft() bool {
	return !c.done && !c.needsHostLogits() && !c.seededSampling()
}

// TokenLogprob is a sampled token's log-probability under the model's raw
// logits, with the Top most likely alternatives.
type TokenLogprob struct {
	ID      int32
	Logprob float32
	Top     []sample.TokenLogprob
}

// pickHost samples from a logits row on the host; logits is shared with
// other choices and is not modified.
func (c *choice) pickHost(logits []float32) (int32, *TokenLogprob, error) {
	work := append([]float32(nil), logits...)
	c.stop.Mask(work)
	if err := c.sampler.ApplyPenalties(work, c.generated, c.req.req.Prompt); err != nil {
		return 0, nil, err
	}
	if c.json != nil {
		c.json.Mask(work)
	}
	tok, err := c.sampler.Pick(work)
	if err != nil {
		if allMasked(work) && !allMasked(logits) {
			// The model gave finite logits and the request's own masks
			// removed every one: the request cannot go on as asked.
			return 0, nil, fmt.Errorf("%w: no token is left to sample: the request's constraints (response_format json_object, min_tokens, stop_token_ids) exclude every token after %d generated tokens",
				ErrBadRequest, len(c.generated))
		}
		return 0, nil, err
	}
	if !c.req.req.Logprobs {
		return tok, nil, nil
	}
	lp, top, err := c.sampler.Logprobs(logits, tok, c.req.req.TopLogprobs)
	if err != nil {
		return 0, nil, err
	}
	return tok, &TokenLogprob{ID: tok, Logprob: lp, Top: top}, nil
}

// allMasked reports whether every logit is -Inf (or the row is empty).
func allMasked(logits []float32) bool {
	for _, l := range logits {
		if l > -math.MaxFloat32 {
			return false
		}
	}
	return true
}

// onToken streams a sampled token and returns a finish reason when a stop
// condition ends the choice.
func (c *choice) onToken(tok int32, lp *TokenLogprob) string {
	c.generated = append(c.generated, tok)
	if c.json != nil {
		c.json.Accept(tok)
	}
	ev := Event{Choice: c.index, TokenIDs: []int32{tok}}
	if lp != nil {
		ev.Logprobs = []TokenLogprob{*lp}
	}
	text, err := c.dec.Add(tok)
	if err != nil {
		// A model whose vocabulary is wider than its tokenizer's can
		// sample an id that has no text.
		c.err = fmt.Errorf("engine: sampled token %d has no text: %w", tok, err)
		c.req.send(ev, false)
		return FinishError
	}
	done, _, emit := c.stop.Add(tok, text)
	ev.Text = emit
	c.req.send(ev, false)
	if !done {
		return ""
	}
	c.stopped = true
	return FinishStop
}

// finish sends the choice's final event.
func (c *choice) finish(reason string, err error) {
	if c.done {
		return
	}
	c.done = true
	ev := Event{Choice: c.index, FinishReason: reason, Err: err,
		PromptTokens: len(c.req.req.Prompt), CompletionTokens: len(c.generated), CachedPromptTokens: c.cached}
	if reason != FinishError && reason != FinishAbort && !c.stopped {
		// Text held back for a possible stop string or an incomplete
		// character is final now.
		ev.Text = c.stop.Flush() + c.dec.Flush()
	}
	c.req.remaining--
	c.req.send(ev, c.req.remaining == 0)
}
