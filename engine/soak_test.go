package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/cpu"
	"github.com/trigon-llm/trigon/engine"
	"github.com/trigon-llm/trigon/model"
	"github.com/trigon-llm/trigon/sample"
	"github.com/trigon-llm/trigon/specdec"
	"github.com/trigon-llm/trigon/tokenizer"
)

// Longer local runs of TestSoak: go test ./engine -run Soak -soak.seeds 20
// (seeds 1..20) or -soak.seed 1234 (that one), -soak.requests 200.
var (
	soakSeed     = flag.Uint64("soak.seed", 0, "TestSoak: run this seed only (0: the CI seeds, or -soak.seeds)")
	soakSeeds    = flag.Int("soak.seeds", 0, "TestSoak: run seeds 1..N (0: the CI seeds)")
	soakRequests = flag.Int("soak.requests", 0, "TestSoak: requests per seed (0: the CI count)")
)

// soakCI are the seeds and the request count `go test ./...` runs: small
// enough for a 2-core CI machine with -tags invariants.
var soakCI = struct {
	seeds    []uint64
	requests int
}{[]uint64{1}, 48}

// cancelMode is when a soak request's context is cancelled.
type cancelMode int

const (
	cancelNever       cancelMode = iota
	cancelBefore                 // before Submit
	cancelAtSubmit               // right after Submit returns
	cancelAfterTokens            // once cancelAfter tokens arrived
	cancelAfterDelay             // cancelDelay after Submit
)

func (m cancelMode) String() string {
	return [...]string{"never", "before submit", "at submit", "after tokens", "after delay"}[m]
}

// soakJob is one random request of the soak and what the test does to it.
type soakJob struct {
	id          int
	req         engine.Request // as submitted (Submit resolves Params.MaxTokens in it: copy first)
	bad         string         // invalid on purpose: why ("" for a valid request)
	cancel      cancelMode
	cancelAfter int
	cancelDelay time.Duration
	startDelay  time.Duration
}

// deterministic reports whether the job's output is fixed by the request:
// greedy, or sampled with a seed. Its tokens must be those of the request
// run alone.
func (j *soakJob) deterministic() bool {
	p := &j.req.Params
	return p.Temperature == 0 || p.Seed != nil
}

func (j *soakJob) String() string {
	p := j.req.Params
	var b strings.Builder
	fmt.Fprintf(&b, "job %d: prompt %d tokens, n=%d, max_tokens %d, temp %g top_p %g top_k %d min_p %g", j.id, len(j.req.Prompt), j.req.N,
		p.MaxTokens, p.Temperature, p.TopP, p.TopK, p.MinP)
	if p.Seed != nil {
		fmt.Fprintf(&b, ", seed %d", *p.Seed)
	}
	if p.RepetitionPenalty != 1 || p.PresencePenalty != 0 || p.FrequencyPenalty != 0 {
		fmt.Fprintf(&b, ", penalties rep %g pres %g freq %g", p.RepetitionPenalty, p.PresencePenalty, p.FrequencyPenalty)
	}
	if p.MinTokens > 0 {
		fmt.Fprintf(&b, ", min_tokens %d", p.MinTokens)
	}
	if len(p.Stop) > 0 {
		fmt.Fprintf(&b, ", stop %q", p.Stop)
	}
	if len(p.StopTokenIDs) > 0 {
		fmt.Fprintf(&b, ", stop ids %v", p.StopTokenIDs)
	}
	if p.IgnoreEOS {
		b.WriteString(", ignore_eos")
	}
	if j.req.Logprobs {
		fmt.Fprintf(&b, ", logprobs (top %d)", j.req.TopLogprobs)
	}
	if j.req.JSONObject {
		b.WriteString(", json")
	}
	if j.req.SkipSpecialTokens {
		b.WriteString(", skip special")
	}
	if j.cancel != cancelNever {
		fmt.Fprintf(&b, ", cancel %s", j.cancel)
	}
	return b.String()
}

// soakJobs draws n random requests from seed: prompts cut from held-out
// Go text (many behind one of four shared prefixes of one to three KV
// blocks, some repeated whole, a few random ids), every sampling option
// the engine takes, and a few requests invalid on purpose.
func soakJobs(ids []int32, seed uint64, n int, vocab int) []*soakJob {
	rng := rand.New(rand.NewPCG(seed, 0x50a6))
	cut := func(length int) []int32 {
		at := rng.IntN(len(ids) - length)
		return slices.Clone(ids[at : at+length])
	}
	prefixes := [][]int32{cut(16), cut(32), cut(40), cut(48)}
	stops := []string{"\n", "}", ")", " :=", "return", "err", "func", "\t", "//", ", "}
	var prompts [][]int32
	var jobs []*soakJob
	for i := range n {
		var prompt []int32
		switch r := rng.IntN(10); {
		case r < 5:
			prompt = append(slices.Clone(prefixes[rng.IntN(len(prefixes))]), cut(rng.IntN(41))...)
		case r < 8:
			prompt = cut(1 + rng.IntN(80))
		case r < 9 && len(prompts) > 0:
			prompt = slices.Clone(prompts[rng.IntN(len(prompts))])
		default:
			prompt = randomPrompt(rng, 1+rng.IntN(60))
		}
		prompts = append(prompts, prompt)
		// Every other run of 12 requests samples on the device only (no
		// logprobs, penalties, min_tokens or JSON mode), so that steps are
		// queued ahead between the host-sampled ones.
		device := (i/12)%2 == 1
		p := sample.Params{TopP: 1, RepetitionPenalty: 1, MaxTokens: 1 + rng.IntN(64)}
		switch r := rng.IntN(10); {
		case r < 4: // greedy, other filters set or not (they do not matter)
		case r < 7:
			seed := rng.Uint64N(1000)
			p.Seed = &seed
			p.Temperature = 0.3 + 1.2*rng.Float32()
		default:
			p.Temperature = 0.3 + 1.2*rng.Float32()
		}
		if rng.IntN(3) == 0 {
			p.TopP = 0.5 + 0.5*rng.Float32()
		}
		if rng.IntN(3) == 0 {
			p.TopK = 1 + rng.IntN(50)
		}
		if rng.IntN(4) == 0 {
			p.MinP = 0.2 * rng.Float32()
		}
		if rng.IntN(6) == 0 && !device {
			p.RepetitionPenalty = 0.8 + 0.7*rng.Float32()
		}
		if rng.IntN(8) == 0 && !device {
			p.PresencePenalty = 2*rng.Float32() - 1
		}
		if rng.IntN(8) == 0 && !device {
			p.FrequencyPenalty = 2*rng.Float32() - 1
		}
		if rng.IntN(4) == 0 {
			for range 1 + rng.IntN(2) {
				p.Stop = append(p.Stop, stops[rng.IntN(len(stops))])
			}
		}
		if rng.IntN(6) == 0 {
			// Tokens of the prompt: the model often repeats them.
			for range 1 + rng.IntN(3) {
				p.StopTokenIDs = append(p.StopTokenIDs, prompt[rng.IntN(len(prompt))])
			}
		}
		if rng.IntN(5) == 0 && !device {
			p.MinTokens = 1 + rng.IntN(p.MaxTokens)
		}
		p.IgnoreEOS = rng.IntN(3) == 0
		req := engine.Request{ID: fmt.Sprintf("soak-%d-%d", seed, i), Prompt: prompt, N: 1, Params: p, SkipSpecialTokens: rng.IntN(2) == 0}
		if r := rng.IntN(10); r == 0 {
			req.N = 3
		} else if r < 3 {
			req.N = 2
		}
		if rng.IntN(7) == 0 && !device {
			req.Logprobs = true
			req.TopLogprobs = rng.IntN(6)
		}
		if rng.IntN(12) == 0 && !device {
			req.JSONObject = true
		}
		j := &soakJob{id: i, req: req, startDelay: time.Duration(rng.IntN(20)) * time.Millisecond}
		switch r := rng.IntN(20); {
		case r == 0:
			j.cancel = cancelBefore
		case r == 1:
			j.cancel = cancelAtSubmit
		case r < 4:
			j.cancel, j.cancelAfter = cancelAfterTokens, rng.IntN(p.MaxTokens*req.N)
		case r < 5:
			j.cancel, j.cancelDelay = cancelAfterDelay, time.Duration(rng.IntN(40))*time.Millisecond
		}
		if rng.IntN(25) == 0 {
			switch rng.IntN(6) {
			case 0:
				j.req.Prompt, j.bad = nil, "empty prompt"
			case 1:
				j.req.Prompt, j.bad = append(slices.Clone(prompt), int32(vocab+rng.IntN(100))), "token id past the vocabulary"
			case 2:
				j.req.Params.TopP, j.bad = 1.5, "top_p 1.5"
			case 3:
				j.req.Params.MinTokens, j.bad = j.req.Params.MaxTokens+1, "min_tokens over max_tokens"
			case 4:
				j.req.N, j.bad = 17, "n over MaxSeqs"
			case 5:
				j.req.Params.MaxTokens, j.bad = -1, "negative max_tokens"
			}
		}
		jobs = append(jobs, j)
	}
	return jobs
}

// soakChoice is what one choice streamed.
type soakChoice struct {
	tokens   []int32
	text     string
	logprobs []engine.TokenLogprob
	final    *engine.Event
}

// soakResult is what one request of the soak got.
type soakResult struct {
	submitErr error
	choices   []soakChoice
	cancelled bool     // its context was cancelled before the stream closed
	problems  []string // broken stream invariants, seen as events arrived
}

// runSoakJob submits j (a copy of its request) and reads its stream to
// the end, cancelling as j says.
func runSoakJob(l *engine.Loaded, j *soakJob, cancelOK bool) soakResult {
	req := j.req
	req.Params.Stop = slices.Clone(req.Params.Stop)
	var res soakResult
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mode := j.cancel
	if !cancelOK {
		mode = cancelNever
	}
	if mode == cancelBefore {
		cancel()
	}
	var ch <-chan engine.Event
	for {
		var err error
		if ch, err = l.Engine.Submit(ctx, &req); errors.Is(err, engine.ErrQueueFull) {
			time.Sleep(2 * time.Millisecond)
			continue
		} else if err != nil {
			res.submitErr = err
			return res
		}
		break
	}
	var once sync.Once
	var mu sync.Mutex
	stop := func() {
		once.Do(func() {
			mu.Lock()
			res.cancelled = true
			mu.Unlock()
			cancel()
		})
	}
	if mode == cancelBefore {
		once.Do(func() { res.cancelled = true })
	}
	switch mode {
	case cancelAtSubmit:
		stop()
	case cancelAfterDelay:
		timer := time.AfterFunc(j.cancelDelay, stop)
		defer timer.Stop()
	}
	res.choices = make([]soakChoice, req.N)
	bad := func(format string, args ...any) { res.problems = append(res.problems, fmt.Sprintf(format, args...)) }
	got := 0
	deadline := time.NewTimer(2 * time.Minute)
	defer deadline.Stop()
	for {
		var ev engine.Event
		var ok bool
		select {
		case ev, ok = <-ch:
		case <-deadline.C:
			bad("the event channel did not close within 2 minutes")
			return res
		}
		if !ok {
			break
		}
		if ev.Choice < 0 || ev.Choice >= req.N {
			bad("event for choice %d of %d", ev.Choice, req.N)
			continue
		}
		c := &res.choices[ev.Choice]
		if c.final != nil {
			bad("choice %d: event %+v after its final event (%s)", ev.Choice, ev, c.final.FinishReason)
		}
		if ev.FinishReason == "" && ev.Err != nil {
			bad("choice %d: an event without a finish reason carries error %v", ev.Choice, ev.Err)
		}
		if req.Logprobs && len(ev.Logprobs) != len(ev.TokenIDs) {
			bad("choice %d: %d logprobs for %d tokens", ev.Choice, len(ev.Logprobs), len(ev.TokenIDs))
		}
		if !req.Logprobs && len(ev.Logprobs) != 0 {
			bad("choice %d: %d logprobs, none asked", ev.Choice, len(ev.Logprobs))
		}
		c.tokens = append(c.tokens, ev.TokenIDs...)
		c.text += ev.Text
		c.logprobs = append(c.logprobs, ev.Logprobs...)
		if ev.FinishReason != "" {
			c.final = &ev
		}
		got += len(ev.TokenIDs)
		if mode == cancelAfterTokens && got > j.cancelAfter {
			stop()
		}
	}
	mu.Lock()
	defer mu.Unlock()
	return res
}

// soakConfig is one engine configuration the soak runs.
type soakConfig struct {
	name string
	opts engine.LoadOptions // Backend unset: the CPU; Model: the default model's bf16 checkpoint
	// budget and chunk, when set, replace loadDefaultWith's step budget
	// (256 tokens) and chunk (128), maxSeqs its 16 sequences.
	budget, chunk, maxSeqs int
	graphs                 bool // the replaying stand-in backend, graphs on
	preempt                bool // the pool is small enough that the storm must preempt
	drafts                 bool // speculation must verify drafts
}

// feedingReplayer is a replayer that samples on the device
// (backend.DeviceSampler) as the CPU backend does, so that steps are
// queued ahead with graphs on.
type feedingReplayer struct {
	*replayer
	backend.DeviceSampler
}

func soakConfigs() []soakConfig {
	ngram := specdec.Config{Method: specdec.MethodNGram, NumSpeculativeTokens: 4, PromptLookupMin: 1, PromptLookupMax: 3}
	self := specdec.Config{Method: specdec.MethodDraftModel, NumSpeculativeTokens: 3, Model: defaultModelHF}
	return []soakConfig{
		{name: "plain"},
		{name: "queue ahead, graphs", opts: engine.LoadOptions{QueueAhead: true}, graphs: true},
		{name: "ngram, small budget", opts: engine.LoadOptions{Speculative: ngram}, budget: 40, chunk: 16, maxSeqs: 12, drafts: true},
		{name: "ngram, queue ahead", opts: engine.LoadOptions{Speculative: ngram, QueueAhead: true}, drafts: true},
		{name: "self draft, small pool", opts: engine.LoadOptions{Speculative: self, KVBlocks: 24}, preempt: true, drafts: true},
		{name: "small pool, queue ahead", opts: engine.LoadOptions{KVBlocks: 24, QueueAhead: true}, preempt: true},
		{name: "ngram, queue ahead, graphs, small pool", opts: engine.LoadOptions{Speculative: ngram, QueueAhead: true, KVBlocks: 24}, graphs: true, preempt: true, drafts: true},
	}
}

func (c soakConfig) load(t *testing.T) *engine.Loaded {
	t.Helper()
	opts := c.opts
	b := cpu.New(cpu.Options{Threads: 2})
	opts.Backend = b
	if c.graphs {
		opts.Backend, opts.Graphs = feedingReplayer{&replayer{Backend: b}, b}, true
	}
	if c.budget == 0 {
		return startDefaultWith(t, opts)
	}
	opts.Model, opts.MaxBatchedTokens, opts.ChunkSize, opts.MaxSeqs = defaultModelHF, c.budget, c.chunk, c.maxSeqs
	l, err := engine.Load(opts)
	if err != nil {
		t.Fatal(err)
	}
	return runLoaded(t, l)
}

// TestSoak submits a few hundred random requests at once to engines of
// several configurations (plain; graphs and queue-ahead; prompt lookup
// with a small step budget and chunk, and with queue-ahead; the model as
// its own draft over a pool that must preempt; a small pool with
// queue-ahead, and with prompt lookup and graphs too) mixing n > 1, greedy
// and sampled (seeded and not) requests, every filter and penalty,
// logprobs, stop strings and ids, min_tokens, ignore_eos, JSON mode,
// shared prompt prefixes, cancellations before and during the stream and
// a few invalid requests, and checks what must hold whatever the mix:
// each stream closes after one final event per choice; greedy and seeded
// output is that of the request alone; stop conditions and max_tokens
// end each choice exactly; every KV block comes back and the engine
// serves on.
func TestSoak(t *testing.T) {
	seeds, n := soakCI.seeds, soakCI.requests
	if *soakSeeds > 0 {
		seeds = nil
		for s := range *soakSeeds {
			seeds = append(seeds, uint64(s+1))
		}
	}
	if *soakSeed != 0 {
		seeds = []uint64{*soakSeed}
	}
	if *soakRequests > 0 {
		n = *soakRequests
	}
	ids := heldoutIDs(t)
	configs := soakConfigs()
	// One engine per configuration for all seeds: later seeds meet the
	// prefix cache and graphs the earlier ones left.
	engines := make([]*engine.Loaded, len(configs))
	for i, c := range configs {
		engines[i] = c.load(t)
	}
	ref := startDefault(t, specdec.Config{})
	eos := model.StopTokenIDs(ref.Config, ref.Gen)
	for _, seed := range seeds {
		jobs := soakJobs(ids, seed, n, ref.Tokenizer.VocabSize())
		// References: every valid deterministic request alone, on a
		// plain engine. On the CPU the bf16 model's rows are the same
		// whatever the batch, and neither speculation nor queueing ahead
		// nor preemption may change a token.
		want := map[int]soakResult{}
		t0 := time.Now()
		for _, j := range jobs {
			if j.bad == "" && j.deterministic() {
				r := runSoakJob(ref, j, false)
				for _, p := range r.problems {
					t.Errorf("seed %d, reference %s: %s", seed, j, p)
				}
				checkSoak(t, fmt.Sprintf("seed %d, reference", seed), ref, eos, j, r, nil)
				want[j.id] = r
			}
		}
		t.Logf("seed %d: %d requests, %d references alone in %v", seed, len(jobs), len(want), time.Since(t0).Round(time.Millisecond))
		for i, c := range configs {
			l := engines[i]
			t.Run(fmt.Sprintf("seed=%d/%s", seed, c.name), func(t *testing.T) {
				runSoak(t, c, l, eos, jobs, want)
			})
		}
	}
}

// runSoak runs the storm of jobs on l and checks it.
func runSoak(t *testing.T, c soakConfig, l *engine.Loaded, eos []int32, jobs []*soakJob, want map[int]soakResult) {
	waitIdle(t, l)
	before := l.Engine.Stats()
	t0 := time.Now()
	results := make([]soakResult, len(jobs))
	var wg sync.WaitGroup
	// At most 24 requests submitted and not finished: the queue's bound
	// (MaxQueue, 4 x MaxSeqs) stays out of the way.
	sem := make(chan struct{}, 24)
	for i, j := range jobs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			time.Sleep(j.startDelay)
			results[i] = runSoakJob(l, j, true)
		}()
	}
	wg.Wait()
	elapsed := time.Since(t0)
	for i, j := range jobs {
		r := results[i]
		for _, p := range r.problems {
			t.Errorf("%s: %s", j, p)
		}
		var ref *soakResult
		if w, ok := want[j.id]; ok {
			ref = &w
		}
		checkSoak(t, c.name, l, eos, j, r, ref)
	}
	waitIdle(t, l)
	st := l.Engine.Stats()
	t.Logf("%d requests in %v: %d preemptions, %d drafts (%d of %d tokens accepted), %d steps queued ahead, prefix cache %d of %d tokens",
		len(jobs), elapsed.Round(time.Millisecond), st.Preemptions-before.Preemptions, st.Spec.Drafts-before.Spec.Drafts,
		st.Spec.Accepted-before.Spec.Accepted, st.Spec.DraftTokens-before.Spec.DraftTokens, st.AheadSteps-before.AheadSteps,
		st.PrefixHits-before.PrefixHits, st.PrefixQueries-before.PrefixQueries)
	if st.FreeBlocks != before.FreeBlocks || st.Running != 0 || st.Waiting != 0 {
		t.Errorf("after the storm, idle: %d free KV blocks (%d before), %d sequences running, %d waiting; want every block back and none",
			st.FreeBlocks, before.FreeBlocks, st.Running, st.Waiting)
	}
	if c.preempt && st.Preemptions == before.Preemptions {
		t.Error("the small pool preempted nothing: it no longer tests preemption")
	}
	if c.drafts && st.Spec.Drafts == before.Spec.Drafts {
		t.Error("no draft verified: speculation is not exercised")
	}
	if st.PrefixHits == before.PrefixHits {
		t.Error("no prompt token came from the prefix cache: shared prefixes are not exercised")
	}
	// The engine serves on.
	after := submit(t, l, context.Background(), []int32{262, 981, 221, 1730}, 1, greedy(8))[0]
	if len(after.tokens) != 8 || after.final.FinishReason != engine.FinishLength {
		t.Errorf("a plain request after the storm: %d tokens, finish %q (%v); want 8, length", len(after.tokens), after.final.FinishReason, after.final.Err)
	}
}

// checkSoak checks one request's result against what its parameters
// allow and, for deterministic requests, against ref (the request alone;
// nil: none).
func checkSoak(t *testing.T, where string, l *engine.Loaded, eos []int32, j *soakJob, r soakResult, ref *soakResult) {
	t.Helper()
	fail := func(format string, args ...any) {
		t.Helper()
		t.Errorf("%s: %s: %s", where, j, fmt.Sprintf(format, args...))
	}
	if j.bad != "" {
		if !errors.Is(r.submitErr, engine.ErrBadRequest) {
			fail("invalid on purpose (%s): Submit returned %v, want ErrBadRequest", j.bad, r.submitErr)
		}
		return
	}
	if r.submitErr != nil {
		fail("Submit: %v", r.submitErr)
		return
	}
	p := j.req.Params
	if p.MaxTokens <= 0 {
		fail("max_tokens %d was not resolved", p.MaxTokens)
		return
	}
	for ci, c := range r.choices {
		fc := func(format string, args ...any) {
			t.Helper()
			fail("choice %d: %s", ci, fmt.Sprintf(format, args...))
		}
		if c.final == nil {
			if !r.cancelled {
				fc("no final event (%d tokens streamed)", len(c.tokens))
			}
			// A cancelled request's events may be dropped once its
			// context ends: nothing more to check.
			continue
		}
		f := c.final
		switch f.FinishReason {
		case engine.FinishStop, engine.FinishLength:
		case engine.FinishAbort:
			if !r.cancelled {
				fc("finished %q (%v) without being cancelled", f.FinishReason, f.Err)
			}
		case engine.FinishError:
			if !conflicting(j) || !errors.Is(f.Err, engine.ErrBadRequest) {
				fc("finished %q (%v)", f.FinishReason, f.Err)
			}
		default:
			fc("finished %q (%v)", f.FinishReason, f.Err)
		}
		if f.FinishReason != engine.FinishError && f.FinishReason != engine.FinishAbort && f.Err != nil {
			fc("finished %q with error %v", f.FinishReason, f.Err)
		}
		if f.PromptTokens != len(j.req.Prompt) {
			fc("prompt tokens %d, the prompt has %d", f.PromptTokens, len(j.req.Prompt))
		}
		if f.CachedPromptTokens < 0 || f.CachedPromptTokens > len(j.req.Prompt) {
			fc("cached prompt tokens %d of a %d-token prompt", f.CachedPromptTokens, len(j.req.Prompt))
		}
		if len(c.tokens) > p.MaxTokens {
			fc("%d tokens, past max_tokens %d", len(c.tokens), p.MaxTokens)
		}
		if r.cancelled && f.FinishReason == engine.FinishAbort {
			// Events before the final may have been dropped.
			if f.CompletionTokens < len(c.tokens) {
				fc("aborted with %d completion tokens, %d streamed", f.CompletionTokens, len(c.tokens))
			}
		} else {
			if f.CompletionTokens != len(c.tokens) {
				fc("%d completion tokens, %d streamed", f.CompletionTokens, len(c.tokens))
			}
			if f.FinishReason != engine.FinishError {
				checkStops(t, fc, l.Tokenizer, eos, j, c)
			}
		}
		checkLogprobs(fc, j, c)
		// With ignore_eos a complete object is followed by EOS tokens,
		// whose text is shown unless special tokens are skipped.
		if j.req.JSONObject && !(p.IgnoreEOS && !j.req.SkipSpecialTokens) {
			st := sample.JSONState{TopObject: true}
			if !st.Feed(c.text) {
				fc("JSON mode: %q is not a prefix of a JSON object", c.text)
			}
		}
		if ref == nil || ci >= len(ref.choices) {
			continue
		}
		w := ref.choices[ci]
		if r.cancelled && f.FinishReason == engine.FinishAbort {
			if len(c.tokens) > len(w.tokens) || !slices.Equal(c.tokens, w.tokens[:len(c.tokens)]) {
				fc("cancelled: streamed %v, not a prefix of the request alone's %v", c.tokens, w.tokens)
			}
			continue
		}
		if w.final == nil {
			continue
		}
		if f.FinishReason == engine.FinishError || w.final.FinishReason == engine.FinishError {
			// A choice whose constraints conflict fails its whole
			// request, its other choices wherever they are.
			if k := min(len(c.tokens), len(w.tokens)); !slices.Equal(c.tokens[:k], w.tokens[:k]) {
				fc("%v (%s); the request alone gives %v (%s)%s", c.tokens, f.FinishReason, w.tokens, w.final.FinishReason, firstDiff(c.tokens, w.tokens))
			}
			continue
		}
		if !slices.Equal(c.tokens, w.tokens) || c.text != w.text || f.FinishReason != w.final.FinishReason {
			fc("%v %q (%s); the request alone gives %v %q (%s)%s", c.tokens, c.text, f.FinishReason, w.tokens, w.text, w.final.FinishReason, firstDiff(c.tokens, w.tokens))
		}
		if j.req.Logprobs && len(c.logprobs) == len(w.logprobs) {
			for k := range c.logprobs {
				if a, b := c.logprobs[k], w.logprobs[k]; a.ID != b.ID || !soakClose(a.Logprob, b.Logprob) || len(a.Top) != len(b.Top) {
					fc("token %d: logprob %+v; the request alone has %+v", k, a, b)
					break
				}
			}
		}
	}
}

// conflicting reports whether j's constraints can leave no token to
// sample: JSON mode allows only EOS once its object is complete, and
// min_tokens masks EOS. Such a request fails with an error wrapping
// ErrBadRequest when that happens.
func conflicting(j *soakJob) bool { return j.req.JSONObject && j.req.Params.MinTokens > 0 }

// soakClose reports whether two logprobs of one token agree: the logits
// of one row may differ in the last bits between batches of other sizes
// (the tokens do not, away from exact ties).
func soakClose(a, b float32) bool { return math.Abs(float64(a-b)) <= 1e-4 }

// checkStops replays a finished choice's tokens through the stop rules,
// written out here as the API documents them: EOS (unless ignore_eos) and
// stop token ids end a choice once min_tokens exist, and are masked
// before; a stop string ends it at the token that completes it (once
// min_tokens exist), its text and what follows left out; max_tokens ends
// it otherwise. The choice must end at the first such token, with that
// reason and text.
func checkStops(t *testing.T, fc func(string, ...any), tok *tokenizer.Tokenizer, eos []int32, j *soakJob, c soakChoice) {
	t.Helper()
	p := j.req.Params
	ends := slices.Clone(p.StopTokenIDs)
	if !p.IgnoreEOS {
		ends = append(ends, eos...)
	}
	dec := tokenizer.NewDecoder(tok, j.req.SkipSpecialTokens)
	var acc string
	for i, id := range c.tokens {
		generated := i + 1
		last := i == len(c.tokens)-1
		checking := generated >= p.MinTokens
		if slices.Contains(ends, id) {
			if !checking {
				fc("token %d is %d, an EOS or stop id, before min_tokens %d", i, id, p.MinTokens)
				return
			}
			if !last {
				fc("token %d is %d, an EOS or stop id, but %d tokens follow", i, id, len(c.tokens)-1-i)
			} else if c.final.FinishReason != engine.FinishStop || c.text != acc {
				fc("ends at EOS or stop id %d: finish %q text %q, want stop %q", id, c.final.FinishReason, c.text, acc)
			} else if j.req.JSONObject && !slices.Contains(p.StopTokenIDs, id) && !json.Valid([]byte(acc)) {
				fc("JSON mode: ended at EOS with %q, not a complete object", acc)
			}
			return
		}
		delta, err := dec.Add(id)
		if err != nil {
			fc("token %d (%d) has no text: %v", i, id, err)
			return
		}
		prev := len(acc)
		acc += delta
		if checking {
			best := -1
			for _, s := range p.Stop {
				from := max(0, prev-len(s)+1)
				if k := strings.Index(acc[from:], s); k >= 0 && (best < 0 || from+k < best) {
					best = from + k
				}
			}
			if best >= 0 {
				if !last {
					fc("token %d completes a stop string (text %q), but %d tokens follow", i, acc, len(c.tokens)-1-i)
				} else if c.final.FinishReason != engine.FinishStop || c.text != acc[:best] {
					fc("a stop string ends it: finish %q text %q, want stop %q", c.final.FinishReason, c.text, acc[:best])
				}
				return
			}
		}
	}
	acc += dec.Flush()
	switch {
	case len(c.tokens) != p.MaxTokens:
		fc("finish %q after %d tokens, neither at a stop condition nor at max_tokens %d", c.final.FinishReason, len(c.tokens), p.MaxTokens)
	case c.final.FinishReason != engine.FinishLength:
		fc("finish %q at max_tokens with no stop condition met", c.final.FinishReason)
	case c.text != acc:
		fc("text %q, the tokens decode to %q", c.text, acc)
	}
}

// checkLogprobs checks a choice's logprobs: one per token, its id, a
// log-probability, the asked alternatives in order, and for plain greedy
// choices the token itself first.
func checkLogprobs(fc func(string, ...any), j *soakJob, c soakChoice) {
	if !j.req.Logprobs {
		return
	}
	p := j.req.Params
	plainGreedy := p.Temperature == 0 && p.RepetitionPenalty == 1 && p.PresencePenalty == 0 && p.FrequencyPenalty == 0 && !j.req.JSONObject
	for k, lp := range c.logprobs {
		if k >= len(c.tokens) {
			break
		}
		if lp.ID != c.tokens[k] || lp.Logprob > 0 || math.IsNaN(float64(lp.Logprob)) || len(lp.Top) != j.req.TopLogprobs {
			fc("token %d (%d): logprob %+v, want its id, a log-probability and %d alternatives", k, c.tokens[k], lp, j.req.TopLogprobs)
			return
		}
		for a := 1; a < len(lp.Top); a++ {
			if lp.Top[a].Logprob > lp.Top[a-1].Logprob {
				fc("token %d: alternatives %+v out of order", k, lp.Top)
				return
			}
		}
		if plainGreedy && len(lp.Top) > 0 && k >= p.MinTokens && lp.Top[0].ID != lp.ID && lp.Top[0].Logprob > lp.Logprob {
			fc("token %d: greedy picked %d (%g), the top alternative is %d (%g)", k, lp.ID, lp.Logprob, lp.Top[0].ID, lp.Top[0].Logprob)
			return
		}
	}
}
