package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/cpu"
	"github.com/trigon-llm/trigon/engine"
	"github.com/trigon-llm/trigon/sample"
)

const fixture = "../testdata/models/llama3"

// start loads the fixture model and runs the engine until the test ends.
func start(t *testing.T, b backend.Backend, opts engine.LoadOptions) *engine.Loaded {
	t.Helper()
	if b == nil {
		b = cpu.New(cpu.Options{Threads: 2})
	}
	opts.Model, opts.Backend = fixture, b
	l, err := engine.Load(opts)
	if err != nil {
		t.Fatal(err)
	}
	return runLoaded(t, l)
}

// runLoaded runs l's step loop until the test ends, then closes l.
func runLoaded(t *testing.T, l *engine.Loaded) *engine.Loaded {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.Engine.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; l.Close() })
	return l
}

func greedy(maxTokens int) sample.Params {
	return sample.Params{Temperature: 0, TopP: 1, RepetitionPenalty: 1, MaxTokens: maxTokens, IgnoreEOS: true}
}

type result struct {
	text   string
	tokens []int32
	final  engine.Event
}

// collect drains one request's events per choice.
func collect(t *testing.T, ch <-chan engine.Event, n int) []result {
	t.Helper()
	res := make([]result, n)
	finals := 0
	for ev := range ch {
		r := &res[ev.Choice]
		if r.final.FinishReason != "" {
			t.Errorf("choice %d: event after its final event", ev.Choice)
		}
		r.text += ev.Text
		r.tokens = append(r.tokens, ev.TokenIDs...)
		if ev.FinishReason != "" {
			r.final = ev
			finals++
		}
	}
	if finals != n {
		t.Errorf("%d final events for %d choices", finals, n)
	}
	return res
}

func submit(t *testing.T, l *engine.Loaded, ctx context.Context, prompt []int32, n int, p sample.Params) []result {
	t.Helper()
	ch, err := l.Engine.Submit(ctx, &engine.Request{ID: "t", Prompt: prompt, N: n, Params: p})
	if err != nil {
		t.Fatal(err)
	}
	return collect(t, ch, n)
}

func randomPrompt(rng *rand.Rand, n int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32(2 + rng.IntN(500))
	}
	return p
}

// TestConcurrentMatchesAlone runs many requests at once, a fifth of them
// cancelled mid-stream, and checks that every completed greedy output
// equals the same request run alone and that every KV block comes back.
func TestConcurrentMatchesAlone(t *testing.T) {
	l := start(t, nil, engine.LoadOptions{MaxSeqs: 16, MaxBatchedTokens: 256, ChunkSize: 64})
	freeBefore := l.Engine.Stats().FreeBlocks
	rng := rand.New(rand.NewPCG(1, 2))
	const n = 40
	prompts := make([][]int32, n)
	maxTok := make([]int, n)
	for i := range prompts {
		prompts[i] = randomPrompt(rng, 1+rng.IntN(150))
		maxTok[i] = 1 + rng.IntN(24)
	}
	// Reference: each request alone.
	want := make([]result, n)
	for i := range prompts {
		want[i] = submit(t, l, context.Background(), prompts[i], 1, greedy(maxTok[i]))[0]
		if len(want[i].tokens) != maxTok[i] || want[i].final.FinishReason != engine.FinishLength {
			t.Fatalf("request %d alone: %d tokens, finish %q; want %d, length", i, len(want[i].tokens), want[i].final.FinishReason, maxTok[i])
		}
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 12)
	for i := range prompts {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			cancelAfter := -1
			if i%5 == 0 {
				cancelAfter = maxTok[i] / 2
			}
			ch, err := l.Engine.Submit(ctx, &engine.Request{Prompt: prompts[i], N: 1, Params: greedy(maxTok[i])})
			if err != nil {
				t.Error(err)
				return
			}
			var got []int32
			var final engine.Event
			for ev := range ch {
				got = append(got, ev.TokenIDs...)
				if len(got) > cancelAfter && cancelAfter >= 0 {
					cancel()
				}
				if ev.FinishReason != "" {
					final = ev
				}
			}
			if cancelAfter >= 0 {
				return // cancelled: anything it got is a prefix, checked below
			}
			if fmt.Sprint(got) != fmt.Sprint(want[i].tokens) || final.FinishReason != engine.FinishLength {
				t.Errorf("request %d concurrent: %v (%s); alone: %v", i, got, final.FinishReason, want[i].tokens)
			}
		}()
	}
	wg.Wait()
	waitIdle(t, l)
	if got := l.Engine.Stats().FreeBlocks; got != freeBefore {
		t.Errorf("free KV blocks: %d after, %d before", got, freeBefore)
	}
}

// waitIdle waits until the engine holds no sequences.
func waitIdle(t *testing.T, l *engine.Loaded) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for l.Engine.Busy() {
		if time.Now().After(deadline) {
			t.Fatal("engine still busy after 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestPreemptionKeepsOutputs gives the engine a KV pool too small for its
// batch, so sequences are preempted and recomputed, and checks the outputs.
func TestPreemptionKeepsOutputs(t *testing.T) {
	ref := start(t, nil, engine.LoadOptions{MaxSeqs: 8})
	tiny := start(t, nil, engine.LoadOptions{MaxSeqs: 8, KVBlocks: 14, ChunkSize: 32, MaxBatchedTokens: 64})
	rng := rand.New(rand.NewPCG(3, 4))
	type job struct {
		prompt []int32
		want   []int32
	}
	jobs := make([]job, 8)
	for i := range jobs {
		jobs[i].prompt = randomPrompt(rng, 20+rng.IntN(40))
		jobs[i].want = submit(t, ref, context.Background(), jobs[i].prompt, 1, greedy(40))[0].tokens
	}
	var wg sync.WaitGroup
	for i := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got := submit(t, tiny, context.Background(), jobs[i].prompt, 1, greedy(40))[0]
			if fmt.Sprint(got.tokens) != fmt.Sprint(jobs[i].want) {
				t.Errorf("job %d under preemption: %v (%s %v), want %v", i, got.tokens, got.final.FinishReason, got.final.Err, jobs[i].want)
			}
		}()
	}
	wg.Wait()
	if tiny.Engine.Stats().Preemptions == 0 {
		t.Error("no preemption happened: the pool is not small enough to test it")
	}
}

// TestSeedsAndChoices: same seed, same output; n>1 choices sample
// independently from one prompt.
func TestSeedsAndChoices(t *testing.T) {
	l := start(t, nil, engine.LoadOptions{})
	seed := uint64(42)
	p := sample.Params{Temperature: 1, TopP: 0.95, RepetitionPenalty: 1, MaxTokens: 20, IgnoreEOS: true, Seed: &seed}
	prompt := randomPrompt(rand.New(rand.NewPCG(5, 6)), 30)
	a := submit(t, l, context.Background(), prompt, 3, p)
	b := submit(t, l, context.Background(), prompt, 3, p)
	for i := range a {
		if fmt.Sprint(a[i].tokens) != fmt.Sprint(b[i].tokens) {
			t.Errorf("choice %d differs between runs with one seed: %v vs %v", i, a[i].tokens, b[i].tokens)
		}
		if len(a[i].tokens) != 20 {
			t.Errorf("choice %d: %d tokens, want 20", i, len(a[i].tokens))
		}
	}
	if fmt.Sprint(a[0].tokens) == fmt.Sprint(a[1].tokens) && fmt.Sprint(a[1].tokens) == fmt.Sprint(a[2].tokens) {
		t.Error("three sampled choices are identical: choices do not sample independently")
	}
	// The first choice of an n=3 request equals an n=1 request with the same seed.
	one := submit(t, l, context.Background(), prompt, 1, p)
	if fmt.Sprint(one[0].tokens) != fmt.Sprint(a[0].tokens) {
		t.Errorf("n=1 %v, first of n=3 %v", one[0].tokens, a[0].tokens)
	}
}

// TestStopAndLogprobs: a stop string ends the choice and is not shown;
// logprobs come one per token with the asked alternatives.
func TestStopAndLogprobs(t *testing.T) {
	l := start(t, nil, engine.LoadOptions{})
	prompt := randomPrompt(rand.New(rand.NewPCG(7, 8)), 12)
	full := submit(t, l, context.Background(), prompt, 1, greedy(30))[0]
	if len(full.text) < 6 {
		t.Skipf("greedy text too short to cut: %q", full.text)
	}
	stop := full.text[3:6]
	cut := strings.Index(full.text, stop)
	p := greedy(30)
	p.Stop = []string{stop}
	got := submit(t, l, context.Background(), prompt, 1, p)[0]
	if got.text != full.text[:cut] || got.final.FinishReason != engine.FinishStop {
		t.Errorf("stop %q: got %q (%s), want %q (stop)", stop, got.text, got.final.FinishReason, full.text[:cut])
	}

	ch, err := l.Engine.Submit(context.Background(), &engine.Request{Prompt: prompt, N: 1, Params: greedy(5), Logprobs: true, TopLogprobs: 3})
	if err != nil {
		t.Fatal(err)
	}
	for ev := range ch {
		if len(ev.Logprobs) != len(ev.TokenIDs) {
			t.Fatalf("%d logprobs for %d tokens", len(ev.Logprobs), len(ev.TokenIDs))
		}
		for i, lp := range ev.Logprobs {
			if lp.ID != ev.TokenIDs[i] || lp.Logprob > 0 || len(lp.Top) != 3 {
				t.Errorf("logprob %+v for token %d", lp, ev.TokenIDs[i])
			}
			// Greedy picks the most likely token.
			if lp.Top[0].ID != lp.ID {
				t.Errorf("greedy token %d is not the top alternative %d", lp.ID, lp.Top[0].ID)
			}
		}
	}
}

// TestBadRequests are refused with ErrBadRequest and the engine keeps serving.
func TestBadRequests(t *testing.T) {
	// 6 blocks of 16 (and the null block) hold 96 tokens of one sequence,
	// fewer than the 128-token context.
	l := start(t, nil, engine.LoadOptions{MaxContext: 128, KVBlocks: 7, MaxSeqs: 2})
	for name, req := range map[string]*engine.Request{
		"empty prompt":   {Prompt: nil, N: 1, Params: greedy(4)},
		"past context":   {Prompt: make([]int32, 200), N: 1, Params: greedy(4)},
		"prompt+max":     {Prompt: make([]int32, 100), N: 1, Params: greedy(40)},
		"prompt fills":   {Prompt: make([]int32, 128), N: 1, Params: greedy(0)},
		"negative max":   {Prompt: []int32{5}, N: 1, Params: greedy(-1)},
		"min over max":   {Prompt: []int32{5}, N: 1, Params: sample.Params{TopP: 1, RepetitionPenalty: 1, MaxTokens: 3, MinTokens: 4}},
		"token id range": {Prompt: []int32{5, 1 << 20}, N: 1, Params: greedy(4)},
		"bad top_p":      {Prompt: []int32{5}, N: 1, Params: sample.Params{TopP: 2, MaxTokens: 3}},
		"n over seqs":    {Prompt: []int32{5}, N: 3, Params: greedy(4)},
		// Fits the context, not the KV cache: refused by Submit, not by
		// the scheduler after the request was accepted.
		"past the KV cache": {Prompt: make([]int32, 90), N: 1, Params: greedy(8)},
	} {
		if _, err := l.Engine.Submit(context.Background(), req); !errors.Is(err, engine.ErrBadRequest) {
			t.Errorf("%s: err %v, want ErrBadRequest", name, err)
		}
	}
	if got := submit(t, l, context.Background(), []int32{5, 6, 7}, 1, greedy(3))[0]; len(got.tokens) != 3 {
		t.Errorf("after bad requests: %d tokens", len(got.tokens))
	}
}

// TestMaxTokensResolved checks the engine applies sample.LengthRule: a
// request without max_tokens runs to the end of the context, one that asks
// for exactly the context left gets it.
func TestMaxTokensResolved(t *testing.T) {
	l := start(t, nil, engine.LoadOptions{MaxContext: 32})
	prompt := make([]int32, 27)
	for i := range prompt {
		prompt[i] = int32(5 + i)
	}
	for _, c := range []struct {
		name      string
		maxTokens int
	}{{"absent", 0}, {"exactly the context left", 5}} {
		got := submit(t, l, context.Background(), prompt, 1, greedy(c.maxTokens))[0]
		if len(got.tokens) != 5 || got.final.FinishReason != engine.FinishLength {
			t.Errorf("%s: %d tokens, finish %q; want 5, length", c.name, len(got.tokens), got.final.FinishReason)
		}
	}
}

// failing wraps a backend and fails MatMul while armed.
type failing struct {
	backend.Backend
	mu    sync.Mutex
	armed bool
}

func (f *failing) MatMul(out, x, w, bias backend.Tensor) error {
	f.mu.Lock()
	armed := f.armed
	f.mu.Unlock()
	if armed {
		return errors.New("injected device fault")
	}
	return f.Backend.MatMul(out, x, w, bias)
}

// TestBackendErrorReachesClient: a failing step ends its requests with an
// error event (no hang), and the engine serves the next request.
func TestBackendErrorReachesClient(t *testing.T) {
	f := &failing{Backend: cpu.New(cpu.Options{Threads: 2})}
	l := start(t, f, engine.LoadOptions{})
	f.mu.Lock()
	f.armed = true
	f.mu.Unlock()
	got := submit(t, l, context.Background(), []int32{5, 6, 7}, 2, greedy(5))
	for i, r := range got {
		if r.final.FinishReason != engine.FinishError || r.final.Err == nil || !strings.Contains(r.final.Err.Error(), "injected") {
			t.Errorf("choice %d: finish %q err %v, want error carrying the fault", i, r.final.FinishReason, r.final.Err)
		}
	}
	f.mu.Lock()
	f.armed = false
	f.mu.Unlock()
	if r := submit(t, l, context.Background(), []int32{5, 6, 7}, 1, greedy(5))[0]; len(r.tokens) != 5 {
		t.Errorf("after the fault: %d tokens (%s %v)", len(r.tokens), r.final.FinishReason, r.final.Err)
	}
}

// TestQueueFull: past MaxQueue waiting requests, Submit refuses with
// ErrQueueFull; requests that end (here: cancelled before they start) free
// their places.
func TestQueueFull(t *testing.T) {
	l, err := engine.Load(engine.LoadOptions{Model: fixture, Backend: cpu.New(cpu.Options{Threads: 1}), MaxQueue: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	var chans []<-chan engine.Event
	for range 2 {
		ch, err := l.Engine.Submit(ctx, &engine.Request{Prompt: []int32{5, 6}, N: 1, Params: greedy(2)})
		if err != nil {
			t.Fatal(err)
		}
		chans = append(chans, ch)
	}
	if _, err := l.Engine.Submit(context.Background(), &engine.Request{Prompt: []int32{5}, N: 1, Params: greedy(2)}); !errors.Is(err, engine.ErrQueueFull) {
		t.Fatalf("third request: %v, want ErrQueueFull", err)
	}
	// Start the loop with the two queued requests cancelled: they end with
	// "abort" and leave the queue, so new requests are admitted again.
	cancel()
	rctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.Engine.Run(rctx) }()
	defer func() { stop(); <-done }()
	for _, ch := range chans {
		for ev := range ch {
			if ev.FinishReason != "" && ev.FinishReason != engine.FinishAbort {
				t.Errorf("cancelled request finished %q", ev.FinishReason)
			}
		}
	}
	if got := submit(t, l, context.Background(), []int32{5, 6, 7}, 1, greedy(3))[0]; len(got.tokens) != 3 {
		t.Errorf("after the queue drained: %d tokens", len(got.tokens))
	}
}

// replayer stands in for a graph-capturing backend on the CPU: a "graph"
// re-runs the captured function, so replays compute what the captured ops
// would, on whatever the static input buffers hold at launch.
type replayer struct {
	backend.Backend
	captures int
}

type replay struct{ fn func() error }

func (g replay) Launch() error { return g.fn() }
func (g replay) Close()        {}

func (r *replayer) CaptureGraph(fn func() error) (backend.Graph, error) {
	r.captures++
	return replay{fn}, nil
}

// TestGraphDecodeMatchesEager: with graphs on, decode steps are padded to
// buckets and replayed, and every greedy output equals the eager engine's.
func TestGraphDecodeMatchesEager(t *testing.T) {
	eager := start(t, nil, engine.LoadOptions{MaxSeqs: 8})
	rb := &replayer{Backend: cpu.New(cpu.Options{Threads: 2})}
	graphs := start(t, rb, engine.LoadOptions{MaxSeqs: 8, Graphs: true})
	rng := rand.New(rand.NewPCG(9, 10))
	prompts := make([][]int32, 11)
	for i := range prompts {
		prompts[i] = randomPrompt(rng, 1+rng.IntN(60))
	}
	want := make([][]int32, len(prompts))
	for i, p := range prompts {
		want[i] = submit(t, eager, context.Background(), p, 1, greedy(12+3*i))[0].tokens
	}
	// Twice, so buckets seen once eagerly are captured and replayed.
	for range 2 {
		var wg sync.WaitGroup
		for i, p := range prompts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got := submit(t, graphs, context.Background(), p, 1, greedy(12+3*i))[0]
				if fmt.Sprint(got.tokens) != fmt.Sprint(want[i]) {
					t.Errorf("prompt %d with graphs: %v, eager %v", i, got.tokens, want[i])
				}
			}()
		}
		wg.Wait()
	}
	waitIdle(t, graphs)
	st := graphs.Engine.Stats().Graphs
	if st.Captures == 0 || st.Replays == 0 || rb.captures == 0 {
		t.Errorf("graph path unused: %+v", st)
	}
	t.Logf("graph stats %+v", st)
}

// TestJSONObjectMode: with JSONObject the output is always a prefix of a
// JSON object, and a choice that ends with "stop" is a complete, valid one.
func TestJSONObjectMode(t *testing.T) {
	l := start(t, nil, engine.LoadOptions{})
	prompt := randomPrompt(rand.New(rand.NewPCG(13, 14)), 10)
	stops := 0
	for seed := range uint64(8) {
		p := sample.Params{Temperature: 1, TopP: 1, RepetitionPenalty: 1, MaxTokens: 120, Seed: &seed}
		ch, err := l.Engine.Submit(context.Background(), &engine.Request{Prompt: prompt, N: 1, Params: p, JSONObject: true, SkipSpecialTokens: true})
		if err != nil {
			t.Fatal(err)
		}
		var text strings.Builder
		var final engine.Event
		for ev := range ch {
			text.WriteString(ev.Text)
			if ev.FinishReason != "" {
				final = ev
			}
		}
		out := text.String()
		st := sample.JSONState{TopObject: true}
		if !st.Feed(out) {
			t.Errorf("seed %d: %q is not a JSON object prefix", seed, out)
		}
		switch final.FinishReason {
		case engine.FinishStop:
			stops++
			if !json.Valid([]byte(out)) || !strings.HasPrefix(strings.TrimSpace(out), "{") {
				t.Errorf("seed %d: finished %q, not a JSON object", seed, out)
			}
		case engine.FinishLength:
		default:
			t.Errorf("seed %d: finish %q (%v)", seed, final.FinishReason, final.Err)
		}
	}
	t.Logf("%d of 8 sampled outputs closed their object within 120 tokens", stops)
	if stops == 0 {
		t.Error("no output closed its object: EOS is never allowed after a complete object")
	}
}

// memBackend reports a fixed amount of device memory.
type memBackend struct {
	backend.Backend
	free, total int64
}

func (m memBackend) MemoryInfo() (int64, int64, error) { return m.free, m.total, nil }

// TestKVSizedFromDeviceMemory: on a backend that reports its memory, the
// KV cache takes what the utilization share leaves after the weights; too
// little for one sequence is a clear error.
func TestKVSizedFromDeviceMemory(t *testing.T) {
	c := cpu.New(cpu.Options{Threads: 1})
	// llama3 fixture: 2 layers x K,V x 2 KV heads x 16 tokens x 16 dims x 4 bytes = 8 KiB a block.
	const perBlock = 2 * 2 * 2 * 16 * 16 * 4
	l, err := engine.Load(engine.LoadOptions{Model: fixture, Backend: memBackend{c, 100 * perBlock * 9 / 8 * 10, 10 << 30}, MemoryUtilization: 1})
	if err != nil {
		t.Fatal(err)
	}
	if l.KVBlocks != 1000 {
		t.Errorf("KV blocks %d, want 1000 (all free memory at utilization 1, 9/8 per block)", l.KVBlocks)
	}
	l.Close()
	_, err = engine.Load(engine.LoadOptions{Model: fixture, Backend: memBackend{c, 10 * perBlock, 10 << 30}, MemoryUtilization: 1})
	if err == nil || !strings.Contains(err.Error(), "KV cache") {
		t.Errorf("too little memory: %v, want an error about the KV cache", err)
	}
}

// TestQueueAheadMatches runs one workload on an engine that queues decode
// steps ahead (Options.QueueAhead: the next step fed the previous step's
// ids on the backend before the host reads them) and on one that does not:
// greedy requests of many lengths, some ending at EOS or a stop string,
// seeded sampling, n=2 choices, a logprobs request (sampled on the host,
// so no step is queued ahead while it runs), and cancellations. Every
// output must be the same, steps must have been queued ahead, and every KV
// block must come back.
func TestQueueAheadMatches(t *testing.T) {
	opts := engine.LoadOptions{MaxSeqs: 8, MaxBatchedTokens: 128, ChunkSize: 32}
	plain := start(t, nil, opts)
	opts.QueueAhead = true
	ahead := start(t, nil, opts)
	freeBefore := ahead.Engine.Stats().FreeBlocks
	rng := rand.New(rand.NewPCG(9, 10))
	type job struct {
		prompt      []int32
		n           int
		p           sample.Params
		logprobs    bool
		cancelAfter int // tokens; -1: never
	}
	var jobs []job
	for i := range 24 {
		seed := uint64(100 + i)
		j := job{prompt: randomPrompt(rng, 1+rng.IntN(60)), n: 1, p: greedy(1 + rng.IntN(30)), cancelAfter: -1}
		switch i % 6 {
		case 1:
			j.p.IgnoreEOS = false // may end at EOS
		case 2:
			j.p.Temperature, j.p.TopP, j.p.Seed = 0.8, 0.95, &seed
		case 3:
			j.n = 2
			j.p.Temperature, j.p.Seed = 1, &seed
		case 4:
			j.logprobs = i == 4
			j.p.Stop = []string{"e"}
		case 5:
			if i == 11 || i == 23 {
				j.cancelAfter = 3
			}
		}
		jobs = append(jobs, j)
	}
	run := func(l *engine.Loaded) [][]result {
		out := make([][]result, len(jobs))
		var wg sync.WaitGroup
		for i, j := range jobs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				ch, err := l.Engine.Submit(ctx, &engine.Request{Prompt: j.prompt, N: j.n, Params: j.p, Logprobs: j.logprobs})
				if err != nil {
					t.Error(err)
					return
				}
				res := make([]result, j.n)
				got := 0
				for ev := range ch {
					res[ev.Choice].tokens = append(res[ev.Choice].tokens, ev.TokenIDs...)
					res[ev.Choice].text += ev.Text
					got += len(ev.TokenIDs)
					if j.cancelAfter >= 0 && got > j.cancelAfter {
						cancel()
					}
					if ev.FinishReason != "" {
						res[ev.Choice].final = ev
					}
				}
				out[i] = res
			}()
		}
		wg.Wait()
		return out
	}
	want, got := run(plain), run(ahead)
	for i, j := range jobs {
		if j.cancelAfter >= 0 {
			continue // cancelled at a time the test does not control
		}
		for c := range j.n {
			w, g := want[i][c], got[i][c]
			if fmt.Sprint(g.tokens) != fmt.Sprint(w.tokens) || g.text != w.text || g.final.FinishReason != w.final.FinishReason {
				t.Errorf("job %d choice %d: queued ahead %v %q (%s), not %v %q (%s)", i, c, g.tokens, g.text, g.final.FinishReason,
					w.tokens, w.text, w.final.FinishReason)
			}
		}
	}
	// One request at a time: after its prefill, every decode step but the
	// last can be queued ahead.
	waitIdle(t, ahead)
	before := ahead.Engine.Stats().AheadSteps
	for i := range 3 {
		prompt := randomPrompt(rng, 10+10*i)
		w := submit(t, plain, context.Background(), prompt, 1, greedy(40))[0]
		g := submit(t, ahead, context.Background(), prompt, 1, greedy(40))[0]
		if fmt.Sprint(g.tokens) != fmt.Sprint(w.tokens) || g.final.FinishReason != w.final.FinishReason {
			t.Errorf("alone %d: queued ahead %v (%s), not %v (%s)", i, g.tokens, g.final.FinishReason, w.tokens, w.final.FinishReason)
		}
	}
	waitIdle(t, ahead)
	st := ahead.Engine.Stats()
	if n := st.AheadSteps - before; n < 3*30 {
		t.Errorf("%d of the 3 x 39 decode steps of lone requests were queued ahead", n)
	}
	if n := plain.Engine.Stats().AheadSteps; n != 0 {
		t.Errorf("%d steps queued ahead with QueueAhead off", n)
	}
	if st.FreeBlocks != freeBefore {
		t.Errorf("free KV blocks: %d after, %d before", st.FreeBlocks, freeBefore)
	}
	t.Logf("%d steps queued ahead", st.AheadSteps)
}
