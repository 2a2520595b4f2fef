package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/trigon-llm/trigon/kvcache"
	"github.com/trigon-llm/trigon/runner"
	"github.com/trigon-llm/trigon/sample"
	"github.com/trigon-llm/trigon/sched"
	"github.com/trigon-llm/trigon/specdec"
	"github.com/trigon-llm/trigon/telemetry"
	"github.com/trigon-llm/trigon/tokenizer"
)

// Errors returned by Submit; the HTTP layer maps them to statuses.
var (
	ErrQueueFull  = errors.New("engine: waiting queue is full")
	ErrClosed     = errors.New("engine: shutting down")
	ErrBadRequest = errors.New("engine: bad request")
)

// Request is one generation request, already tokenized.
type Request struct {
	ID     string
	Prompt []int32 // [numPromptTokens]
	// N choices sample independently from the same prompt; with a seed,
	// choice i draws from the PCG stream of (Seed, i) (sample.NewSampler),
	// so choices differ but the request reproduces, and choice 0 is an n=1
	// request's. It is not vLLM's Seed+i: choice i is not choice 0 of a
	// request seeded Seed+i.
	N      int
	Params sample.Params
	// Logprobs asks for the sampled tokens' log-probabilities and
	// TopLogprobs (0..20) alternatives at each position.
	Logprobs    bool
	TopLogprobs int
	// SkipSpecialTokens leaves special tokens out of the text.
	SkipSpecialTokens bool
	// JSONObject constrains the output to one JSON object.
	JSONObject bool
}

// Finish reasons of Event.FinishReason.
const (
	FinishStop   = "stop"
	FinishLength = "length"
	FinishAbort  = "abort"
	FinishError  = "error"
)

// Event is the progress of one choice. Its slices belong to the receiver.
type Event struct {
	Choice       int
	Text         string         // new text, stop strings removed, never half a character
	TokenIDs     []int32        // tokens sampled since the last event (a final EOS included)
	Logprobs     []TokenLogprob // one per TokenIDs entry when asked
	FinishReason string         // "" while running
	Err          error          // why, for FinishError
	// Set on the final event of a choice.
	PromptTokens, CompletionTokens, CachedPromptTokens int
}

// Options configure an Engine.
type Options struct {
	Sched sched.Config
	// MaxQueue bounds requests waiting to start; Submit returns
	// ErrQueueFull beyond it. 0: 4 x Sched.MaxNumSeqs.
	MaxQueue int
	// MaxContext is the model's context length: prompt plus output.
	MaxContext int
	// EOS are the ids that end a choice (unless IgnoreEOS).
	EOS     []int32
	Metrics *telemetry.Metrics // nil: none
	Logger  *slog.Logger       // nil: slog.Default()
	// QueueAhead queues each decode step on the device behind the one
	// before it, fed that step's sampled tokens on the device, before the
	// host reads them (backends that implement backend.DeviceSampler; steps
	// that sample every running sequence: sched.ScheduleAhead), so the host's
	// work for a step overlaps the device's. A sequence that stops (EOS, a
	// stop string) has its ahead token dropped. trigon serve and run turn
	// it on by default: the host's per-step work then hides behind the
	// device's step instead of adding to it. With speculative decoding a
	// step queued ahead carries no draft (proposing needs the tokens on the
	// host), so it stays on only where the proposer can tell when a draft
	// is unlikely (specdec.Predictor: prompt lookup), and the engine queues
	// ahead only while none is likely; otherwise speculation turns it off.
	QueueAhead bool
	// Spec turns on speculative decoding.
	Spec SpecOptions
}

// Engine runs the step loop. Create with New, start with Run.
type Engine struct {
	run  *runner.Runner
	sch  *sched.Scheduler
	pool *kvcache.Pool
	tok  *tokenizer.Tokenizer
	opts Options
	log  *slog.Logger
	// kvTokens is how many tokens of KV one sequence can hold at most:
	// every block of the pool but the null block. Read by Submit, so
	// copied out of the pool, which only the step loop may touch.
	kvTokens int

	mu      sync.Mutex
	pending []*request // submitted, not yet handed to the scheduler
	wake    chan struct{}
	queued  atomic.Int64 // requests submitted and not yet scheduled
	// closing is set (under mu, so that no Submit slips past it) by Drain
	// and when Run returns; Submit fails from then on.
	closing atomic.Bool
	ready   atomic.Bool
	// abort, closed by Shutdown at its deadline, makes Run abort every
	// request and return after the step in progress. stopped is closed
	// when Run has returned; started guards against a second Run.
	abort     chan struct{}
	abortOnce sync.Once
	stopped   chan struct{}
	started   atomic.Bool
	// busy is set while the scheduler holds sequences; stats is what the
	// loop published last. Both are safe to read from any goroutine.
	busy    atomic.Bool
	statsMu sync.Mutex
	stats   Stats

	// Owned by the step loop.
	active  map[*request]struct{}
	choices map[sched.SeqID]*choice
	nextID  sched.SeqID
	// flight is the step whose sampled ids are still on the device
	// (QueueAhead): the next step lands it. aheadSteps counts the steps
	// queued ahead.
	flight     *flight
	aheadSteps uint64
	timer      *stepTimer // nil without metrics
	spec       SpecStats  // speculative decoding's counters
	// graphsSeen are the graph counters the metrics have counted.
	graphsSeen runner.GraphStats
	// predict is the proposer's guess of which sequences will have drafts
	// (nil: none, or no queueing ahead with speculation).
	predict specdec.Predictor
	// tokenTexts[id] is the bytes token id adds to the output ("" for
	// special tokens), built on the first JSON-mode request.
	tokenTexts []string
}

// New builds an engine over a runner whose KV pools have pool's block
// count. The engine owns sch from now on.
func New(r *runner.Runner, pool *kvcache.Pool, tok *tokenizer.Tokenizer, opts Options) (*Engine, error) {
	sch, err := sched.New(opts.Sched, pool)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	if opts.MaxQueue <= 0 {
		opts.MaxQueue = 4 * opts.Sched.MaxNumSeqs
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Spec.Proposer != nil {
		if opts.Spec.Tokens < 1 || opts.Spec.Tokens > specdec.MaxSpeculativeTokens {
			return nil, fmt.Errorf("engine: %d speculative tokens: want 1 to %d", opts.Spec.Tokens, specdec.MaxSpeculativeTokens)
		}
	}
	predict, _ := opts.Spec.Proposer.(specdec.Predictor)
	if opts.Spec.Proposer != nil && predict == nil {
		opts.QueueAhead = false
	}
	e := &Engine{
		run: r, sch: sch, pool: pool, tok: tok, opts: opts, log: opts.Logger, predict: predict,
		kvTokens: (pool.NumBlocks() - 1) * pool.BlockSize(),
		wake:     make(chan struct{}, 1),
		abort:    make(chan struct{}),
		stopped:  make(chan struct{}),
		active:   map[*request]struct{}{},
		choices:  map[sched.SeqID]*choice{},
		nextID:   1,
		timer:    newStepTimer(opts.Metrics, r.Backend(), opts.Logger),
	}
	e.publish()
	e.ready.Store(true)
	return e, nil
}

// Ready reports whether the engine accepts requests.
func (e *Engine) Ready() bool { return e.ready.Load() && !e.closing.Load() }

// Submit queues a request. Events arrive on the returned channel, which is
// closed after every choice's final event. Cancelling ctx aborts the
// request within one step and frees its KV blocks.
func (e *Engine) Submit(ctx context.Context, req *Request) (<-chan Event, error) {
	if e.closing.Load() {
		return nil, ErrClosed
	}
	if err := e.validate(req); err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	// Checked again under mu: Drain sets closing under mu, and Run's last
	// look at pending is after that, so a request queued here is never
	// left behind by a loop that has stopped.
	if e.closing.Load() {
		return nil, ErrClosed
	}
	if e.queued.Add(1) > int64(e.opts.MaxQueue) {
		e.queued.Add(-1)
		return nil, ErrQueueFull
	}
	r := newRequest(ctx, req)
	e.pending = append(e.pending, r)
	e.signal()
	return r.out, nil
}

func (e *Engine) validate(req *Request) error {
	if len(req.Prompt) == 0 {
		return fmt.Errorf("%w: empty prompt", ErrBadRequest)
	}
	if req.N < 1 {
		req.N = 1
	}
	if req.N > e.opts.Sched.MaxNumSeqs {
		return fmt.Errorf("%w: n=%d exceeds the %d sequences the engine runs at once", ErrBadRequest, req.N, e.opts.Sched.MaxNumSeqs)
	}
	if err := req.Params.Validate(); err != nil {
		return fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	// The output bound: sample.LengthRule, with Params.MaxTokens 0 as not
	// given. Every later stage (the scheduler) takes the resolved value.
	var asked *int
	if req.Params.MaxTokens != 0 {
		asked = &req.Params.MaxTokens
	}
	mt, err := sample.LengthRule{Context: e.opts.MaxContext}.MaxTokens(asked, len(req.Prompt), req.Params.MinTokens)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	req.Params.MaxTokens = mt
	// The scheduler would refuse it too, but only once the reply has
	// begun; the last token's KV is never computed.
	if n := len(req.Prompt) + req.Params.MaxTokens - 1; n > e.kvTokens {
		return fmt.Errorf("%w: the request needs up to %d tokens of KV cache (%d in the prompt, %d in the completion), more than the %d the server's KV cache holds for one sequence; reduce the prompt or max_tokens",
			ErrBadRequest, n+1, len(req.Prompt), req.Params.MaxTokens, e.kvTokens)
	}
	for _, id := range req.Prompt {
		if id < 0 || int(id) >= e.tok.VocabSize() {
			return fmt.Errorf("%w: prompt token id %d is outside the vocabulary [0, %d)", ErrBadRequest, id, e.tok.VocabSize())
		}
	}
	return nil
}

func (e *Engine) signal() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// Run is the step loop. It returns when ctx is cancelled or Shutdown's
// deadline passes (after the step in progress, aborting every request:
// each choice gets its final event, FinishAbort) or after Drain finished
// the last request. Submit fails with ErrClosed once Run has returned. Run
// may be called once.
func (e *Engine) Run(ctx context.Context) error {
	if !e.started.CompareAndSwap(false, true) {
		return errors.New("engine: Run called twice")
	}
	// Deferred in reverse: land the step in flight, refuse new requests,
	// abort the rest, then tell Shutdown.
	defer close(e.stopped)
	defer e.abortAll(FinishAbort, ErrClosed)
	defer func() {
		e.mu.Lock()
		e.closing.Store(true)
		e.mu.Unlock()
	}()
	defer func() {
		// A step in flight finishes on the device before the engine stops
		// (its requests are aborted after).
		if e.flight != nil {
			_, _ = e.flight.wait()
			e.flight = nil
		}
	}()
	for {
		if ctx.Err() != nil || e.aborting() {
			return nil
		}
		e.timer.beginIter()
		e.admit()
		e.reap()
		if e.flight == nil && e.sch.NumWaiting()+e.sch.NumRunning() == 0 {
			e.timer.idle() // before Busy reports false: the step metrics are complete then
			e.publish()
			e.busy.Store(false)
			if e.closing.Load() && e.numPending() == 0 {
				return nil
			}
			e.recordGauges()
			// Idle: capture the decode graphs recent traffic uses.
			if err := e.run.Precapture(); err != nil {
				e.log.Warn("graph precapture failed", "err", err)
			}
			e.publish()
			select {
			case <-ctx.Done():
				return nil
			case <-e.abort:
				return nil
			case <-e.wake:
			}
			continue
		}
		e.busy.Store(true)
		if err := e.step(); err != nil {
			e.log.Error("engine step failed", "err", err)
		}
		e.timer.endIter(e.flight != nil)
	}
}

// Drain stops admitting new requests (Submit returns ErrClosed, Ready
// false); Run returns once the running and queued ones have finished.
func (e *Engine) Drain() {
	e.mu.Lock()
	e.closing.Store(true)
	e.mu.Unlock()
	e.signal()
}

// Shutdown drains the engine (Drain) and waits for the requests running
// or queued to finish, until ctx ends; then it aborts the rest, each
// choice ending with a final FinishAbort event after at most the step in
// progress. It returns once Run has returned: nil when every request
// finished on its own, ctx's error when some were aborted. Run must have
// been started (Shutdown waits for it).
func (e *Engine) Shutdown(ctx context.Context) error {
	e.Drain()
	select {
	case <-e.stopped:
		return nil
	case <-ctx.Done():
	}
	e.abortOnce.Do(func() { close(e.abort) })
	<-e.stopped
	return ctx.Err()
}

// aborting reports whether Shutdown's deadline has passed.
func (e *Engine) aborting() bool {
	select {
	case <-e.abort:
		return true
	default:
		return false
	}
}

func (e *Engine) numPending() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.pending)
}

// admit moves submitted requests into the scheduler.
func (e *Engine) admit() {
	e.mu.Lock()
	batch := e.pending
	e.pending = nil
	e.mu.Unlock()
	for _, r := range batch {
		e.start(r)
	}
}

func (e *Engine) start(r *request) {
	if r.ctx.Err() != nil {
		e.dequeue(r)
		r.finishAll(FinishAbort, r.ctx.Err())
		return
	}
	ids := make([]sched.SeqID, r.req.N)
	for i := range ids {
		ids[i] = e.nextID + sched.SeqID(i)
		c, err := newChoice(e, r, i, ids[i])
		if err != nil {
			e.dequeue(r)
			r.finishAll(FinishError, err)
			return
		}
		r.choices[i] = c
	}
	sreq := sched.Request{ID: ids[0], Prompt: r.req.Prompt, MaxTokens: r.req.Params.MaxTokens, Forks: ids[1:]}
	if err := e.sch.Add(sreq); err != nil {
		e.dequeue(r)
		r.finishAll(FinishError, fmt.Errorf("%w: %v", ErrBadRequest, err))
		return
	}
	e.nextID += sched.SeqID(len(ids))
	for i, id := range ids {
		e.choices[id] = r.choices[i]
	}
	e.active[r] = struct{}{}
}

// dequeue counts r out of the waiting queue (once): when its first step is
// scheduled, or when it ends before that.
func (e *Engine) dequeue(r *request) {
	if !r.scheduled {
		r.scheduled = true
		e.queued.Add(-1)
	}
}

// reap aborts requests whose context ended (client gone, timeout).
func (e *Engine) reap() {
	for r := range e.active {
		if err := r.ctx.Err(); err != nil {
			e.abortRequest(r, FinishAbort, err)
		}
	}
}

func (e *Engine) abortRequest(r *request, reason string, err error) {
	e.dequeue(r)
	for _, c := range r.choices {
		if c == nil || c.done {
			continue
		}
		e.sch.Abort(c.seq)
		e.forget(c.seq)
		delete(e.choices, c.seq)
		c.finish(reason, err)
	}
	delete(e.active, r)
}

func (e *Engine) abortAll(reason string, err error) {
	for r := range e.active {
		e.abortRequest(r, reason, err)
	}
	e.mu.Lock()
	batch := e.pending
	e.pending = nil
	e.mu.Unlock()
	for _, r := range batch {
		e.dequeue(r)
		r.finishAll(reason, err)
	}
}

func (e *Engine) recordGauges() {
	m := e.opts.Metrics
	if m == nil {
		return
	}
	st := e.sch.Stats()
	m.SetRequestsRunning(st.NumRunning)
	m.SetRequestsWaiting(st.NumWaiting + e.numPending())
	m.SetKVCacheUsage(st.KVUsage)
}

// Stats are the engine's counters as of its last step.
type Stats struct {
	Running, Waiting int
	FreeBlocks       int     // KV blocks not held by a sequence (cached prefixes included)
	KVUsage          float64 // fraction of KV blocks held
	Preemptions      uint64
	PrefixQueries    uint64 // prompt tokens looked up in the prefix cache
	PrefixHits       uint64 // of which served from it
	// AheadSteps counts decode steps queued on the device before the
	// previous step's tokens reached the host (Options.QueueAhead).
	AheadSteps uint64
	Graphs     runner.GraphStats
	Spec       SpecStats // speculative decoding (Options.Spec)
}

// Stats returns the counters the step loop published last.
func (e *Engine) Stats() Stats {
	e.statsMu.Lock()
	defer e.statsMu.Unlock()
	return e.stats
}

// Busy reports whether any request is queued or running.
func (e *Engine) Busy() bool {
	return e.busy.Load() || e.queued.Load() > 0 || e.numPending() > 0
}

// publish copies the loop-owned counters for Stats.
func (e *Engine) publish() {
	st := e.sch.Stats()
	e.statsMu.Lock()
	e.stats = Stats{
		Running: st.NumRunning, Waiting: st.NumWaiting, FreeBlocks: e.pool.NumFree(), KVUsage: st.KVUsage,
		Preemptions: st.Preemptions, PrefixQueries: st.PrefixQueryTokens, PrefixHits: st.PrefixHitTokens,
		AheadSteps: e.aheadSteps, Graphs: e.run.GraphStats(),
		Spec: e.spec,
	}
	e.stats.Spec.AcceptedAt = append([]uint64(nil), e.spec.AcceptedAt...)
	e.statsMu.Unlock()
}

// vocabTexts returns the output bytes of every token, for constraints.
func (e *Engine) vocabTexts() []string {
	if e.tokenTexts == nil {
		n := e.tok.VocabSize()
		e.tokenTexts = make([]string, n)
		for id := range n {
			if e.tok.IsSpecial(int32(id)) {
				continue
			}
			if b, ok := e.tok.TokenBytes(int32(id)); ok {
				e.tokenTexts[id] = string(b)
			}
		}
	}
	return e.tokenTexts
}
