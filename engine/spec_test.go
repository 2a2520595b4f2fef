package engine_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/cpu"
	"github.com/trigon-llm/trigon/engine"
	"github.com/trigon-llm/trigon/format/gguf"
	"github.com/trigon-llm/trigon/sample"
	"github.com/trigon-llm/trigon/specdec"
)

// The default model: its embedded Q8_0 file, and the bf16 checkpoint it
// was made from. The tests' target is the bf16 one: on the CPU its rows
// agree whatever the batch to within rounding far below any argmax gap
// the tests meet (a verify step's rows go through the GEMM, a decode's
// through the dot products), where the Q8_0 products quantize
// activations differently by row count and so let batching, and
// speculation with it, flip near-tied argmaxes.
const (
	defaultModel   = "../models/default/trigon-go.q8_0.gguf"
	defaultModelHF = "../models/default/hf"
	// trainedDraft is the draft trained for the default model (2 layers,
	// its vocabulary; docs/speculative.md, "The default model's draft").
	trainedDraft = "../models/default/draft/trigon-go-draft.q8_0.gguf"
)

// startDefault loads the default model (bf16) on the CPU with spec (zero:
// off) and runs its engine until the test ends.
func startDefault(t *testing.T, spec specdec.Config, kvBlocks ...int) *engine.Loaded {
	t.Helper()
	opts := engine.LoadOptions{Backend: cpu.New(cpu.Options{Threads: 2}), Speculative: spec}
	if len(kvBlocks) > 0 {
		opts.KVBlocks = kvBlocks[0]
	}
	return startDefaultWith(t, opts)
}

// startDefaultWith is startDefault with opts (Backend set).
func startDefaultWith(t *testing.T, opts engine.LoadOptions) *engine.Loaded {
	t.Helper()
	l, start := loadDefaultWith(t, opts)
	start()
	return l
}

// loadDefaultWith loads the default model as startDefaultWith does and
// returns start, which runs its step loop (once): requests submitted
// before it are all queued when the first step is planned.
func loadDefaultWith(t *testing.T, opts engine.LoadOptions) (*engine.Loaded, func()) {
	t.Helper()
	opts.Model, opts.MaxSeqs, opts.MaxBatchedTokens, opts.ChunkSize = defaultModelHF, 16, 256, 128
	l, err := engine.Load(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var once sync.Once
	start := func() { once.Do(func() { go func() { defer close(done); l.Engine.Run(ctx) }() }) }
	t.Cleanup(func() { cancel(); start(); <-done; l.Close() })
	return l, start
}

// heldoutIDs reads the default model's held-out text as token ids.
func heldoutIDs(t *testing.T) []int32 {
	t.Helper()
	raw, err := os.ReadFile("../models/default/heldout.ids.txt")
	if err != nil {
		t.Fatal(err)
	}
	var ids []int32
	for _, f := range strings.Fields(string(raw)) {
		v, err := strconv.Atoi(f)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, int32(v))
	}
	return ids
}

// heldoutPrompts cuts n prompts of 24 to 71 tokens from the default
// model's held-out Go text (code repeats itself, so prompt lookup finds
// matches in it).
func heldoutPrompts(t *testing.T, n int) [][]int32 {
	t.Helper()
	ids := heldoutIDs(t)
	prompts := make([][]int32, n)
	for i := range prompts {
		at := (i * 397) % (len(ids) - 100)
		prompts[i] = ids[at : at+24+(i*13)%48]
	}
	return prompts
}

// truncatedDraft writes a copy of the default model with only its first
// layers: a draft with the target's vocabulary whose guesses often differ,
// so that verify steps reject.
func truncatedDraft(t *testing.T, layers int) string {
	t.Helper()
	f, err := gguf.Open(defaultModel)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := gguf.NewWriter()
	for _, kv := range f.KVs {
		if strings.HasSuffix(kv.Key, ".block_count") {
			w.AddKV(kv.Key, gguf.Uint32Value(uint32(layers)))
			continue
		}
		w.AddKV(kv.Key, kv.Value)
	}
	for _, ti := range f.Tensors {
		var blk int
		if _, err := fmt.Sscanf(ti.Name, "blk.%d.", &blk); err == nil && blk >= layers {
			continue
		}
		if err := w.AddTensor(ti.Name, ti.Type, ti.Dims, ti.Data); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), "draft.gguf")
	out, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteTo(out); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// parseSpec is specdec.ParseConfig, failing the test on an error.
func parseSpec(t *testing.T, text string) specdec.Config {
	t.Helper()
	c, err := specdec.ParseConfig(text)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// generate runs every prompt at once and returns each one's tokens.
func generate(t *testing.T, l *engine.Loaded, prompts [][]int32, p sample.Params) []result {
	t.Helper()
	out := make([]result, len(prompts))
	var wg sync.WaitGroup
	for i, prompt := range prompts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ch, err := l.Engine.Submit(context.Background(), &engine.Request{Prompt: prompt, N: 1, Params: p})
			if err != nil {
				t.Error(err)
				return
			}
			out[i] = collect(t, ch, 1)[0]
		}()
	}
	wg.Wait()
	return out
}

// TestSpeculativeGreedyMatches: with either proposer, greedy output is
// token for token what plain decoding gives, on 50 prompts run together;
// drafts are proposed and accepted: every one with the model as its own
// draft (its KV cache follows each sequence through rollbacks exactly),
// most with its Q8_0 file; a truncated draft and the draft trained for
// the default model (a smaller model of its own) are also rejected; every
// KV block comes back.
func TestSpeculativeGreedyMatches(t *testing.T) {
	prompts := heldoutPrompts(t, 50)
	params := greedy(20)
	want := generate(t, startDefault(t, specdec.Config{}), prompts, params)
	ngram := specdec.Config{Method: specdec.MethodNGram, NumSpeculativeTokens: 4, PromptLookupMin: 1, PromptLookupMax: 3}
	for _, tc := range []struct {
		name string
		cfg  specdec.Config
		// minRate bounds the acceptance rate from below, maxRate from
		// above (1: may accept every token).
		minRate, maxRate float64
		// ahead turns QueueAhead on (how many steps go ahead depends on
		// how the 50 requests interleave: TestSpeculativeQueueAhead
		// counts them on a schedule the test controls).
		ahead bool
	}{
		{"ngram", ngram, 0.05, 1, false},
		{"ngram, queue ahead", ngram, 0.05, 1, true},
		{"self draft", specdec.Config{Method: specdec.MethodDraftModel, NumSpeculativeTokens: 3, Model: defaultModelHF}, 1, 1, false},
		{"q8_0 draft", specdec.Config{Method: specdec.MethodDraftModel, NumSpeculativeTokens: 5, Model: defaultModel}, 0.9, 1, false},
		{"truncated draft", specdec.Config{Method: specdec.MethodDraftModel, NumSpeculativeTokens: 3, Model: truncatedDraft(t, 3)}, 0.05, 0.95, false},
		// As --speculative-config gives it.
		{"trained draft", parseSpec(t, `{"method": "draft_model", "model": "`+trainedDraft+`", "num_speculative_tokens": 4}`), 0.2, 0.95, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := startDefaultWith(t, engine.LoadOptions{Backend: cpu.New(cpu.Options{Threads: 2}), Speculative: tc.cfg, QueueAhead: tc.ahead})
			free := l.Engine.Stats().FreeBlocks
			got := generate(t, l, prompts, params)
			for i := range prompts {
				if fmt.Sprint(got[i].tokens) != fmt.Sprint(want[i].tokens) || got[i].text != want[i].text || got[i].final.FinishReason != want[i].final.FinishReason {
					t.Errorf("prompt %d: %v %q (%s), plain decoding gives %v %q (%s)", i, got[i].tokens, got[i].text, got[i].final.FinishReason,
						want[i].tokens, want[i].text, want[i].final.FinishReason)
				}
			}
			waitIdle(t, l)
			st := l.Engine.Stats()
			rate := float64(st.Spec.Accepted) / float64(max(st.Spec.DraftTokens, 1))
			t.Logf("%d drafts, %d tokens proposed, %d accepted (%.2f), by position %v", st.Spec.Drafts, st.Spec.DraftTokens, st.Spec.Accepted, rate, st.Spec.AcceptedAt)
			if st.Spec.Drafts == 0 || rate < tc.minRate || rate > tc.maxRate {
				t.Errorf("acceptance %.2f over %d drafts, want %.2f to %.2f", rate, st.Spec.Drafts, tc.minRate, tc.maxRate)
			}
			for i := 1; i < len(st.Spec.AcceptedAt); i++ {
				if st.Spec.AcceptedAt[i] > st.Spec.AcceptedAt[i-1] {
					t.Errorf("accepted by position %v: a later position more often than an earlier one", st.Spec.AcceptedAt)
				}
			}
			if !tc.ahead && st.AheadSteps != 0 {
				t.Errorf("%d steps queued ahead with queue-ahead off", st.AheadSteps)
			}
			t.Logf("%d steps queued ahead", st.AheadSteps)
			if st.FreeBlocks != free {
				t.Errorf("free KV blocks: %d after, %d before", st.FreeBlocks, free)
			}
		})
	}
}

// TestSpeculativeQueueAhead: prompt lookup with QueueAhead, one request
// at a time (so that a lone sequence's guesses alone decide): steps without
// drafts are queued ahead between the verify steps, both kinds run many
// times, and every output is plain decoding's, token for token, where
// every other request also ends at a stop string from the middle of its
// plain text; every KV block comes back.
func TestSpeculativeQueueAhead(t *testing.T) {
	prompts := heldoutPrompts(t, 12)
	plain := startDefault(t, specdec.Config{})
	l := startDefaultWith(t, engine.LoadOptions{Backend: cpu.New(cpu.Options{Threads: 2}), QueueAhead: true,
		Speculative: specdec.Config{Method: specdec.MethodNGram, NumSpeculativeTokens: 4, PromptLookupMin: 2, PromptLookupMax: 3}})
	free := l.Engine.Stats().FreeBlocks
	for i, prompt := range prompts {
		params := greedy(48)
		if i%2 == 1 {
			text := generate(t, plain, [][]int32{prompt}, params)[0].text
			if len(text) < 40 {
				t.Fatalf("prompt %d: plain text %q too short for a stop string", i, text)
			}
			params.Stop = []string{text[30:33]}
		}
		want := generate(t, plain, [][]int32{prompt}, params)[0]
		got := generate(t, l, [][]int32{prompt}, params)[0]
		if fmt.Sprint(got.tokens) != fmt.Sprint(want.tokens) || got.text != want.text || got.final.FinishReason != want.final.FinishReason {
			t.Errorf("prompt %d: %v %q (%s), plain decoding gives %v %q (%s)", i, got.tokens, got.text, got.final.FinishReason,
				want.tokens, want.text, want.final.FinishReason)
		}
	}
	waitIdle(t, l)
	st := l.Engine.Stats()
	t.Logf("%d drafts, %d of %d tokens accepted; %d steps queued ahead", st.Spec.Drafts, st.Spec.Accepted, st.Spec.DraftTokens, st.AheadSteps)
	if st.Spec.Drafts < 10 || st.Spec.Accepted == 0 || st.AheadSteps < 10 {
		t.Errorf("%d drafts (%d tokens accepted) and %d steps queued ahead: want at least 10 of each kind of step", st.Spec.Drafts, st.Spec.Accepted, st.AheadSteps)
	}
	if st.FreeBlocks != free {
		t.Errorf("free KV blocks: %d after, %d before", st.FreeBlocks, free)
	}
}

// preparingReplayer is a replayer that prepares kernels
// (engine.KernelPreparer), as a GPU backend does, so that Load warms the
// model.
type preparingReplayer struct{ *replayer }

func (p preparingReplayer) PrepareKernels(context.Context) error { return nil }

// TestWarmVerifyGraphs: with graphs, speculation and a backend that
// prepares kernels, Load captures the verify graphs of the buckets up to 4
// sequences for every draft length at every table width and decides their
// forms; the first request's verify steps then replay without a capture,
// and its output is plain decoding's.
func TestWarmVerifyGraphs(t *testing.T) {
	prompt := heldoutPrompts(t, 1)
	want := generate(t, startDefault(t, specdec.Config{}), prompt, greedy(24))[0]
	rb := &replayer{Backend: cpu.New(cpu.Options{Threads: 2})}
	const k = 3
	l := startDefaultWith(t, engine.LoadOptions{Backend: preparingReplayer{rb}, Graphs: true, Warm: true,
		Speculative: specdec.Config{Method: specdec.MethodNGram, NumSpeculativeTokens: k, PromptLookupMin: 1, PromptLookupMax: 3}})
	st := l.Engine.Stats()
	// The default model's 1024-token context: table widths 16, 32 and 64,
	// at buckets 1, 2 and 4 (MaxSeqs 16 holds even 4 x 4 rows as decode
	// rows, so every shape has both forms, and is timed).
	const shapes = 3 * 3 * k
	if st.Graphs.VerifyTimings != shapes {
		t.Errorf("after Load: %d verify shapes timed, want %d (3 buckets x 3 widths x %d draft lengths); graphs %+v", st.Graphs.VerifyTimings, shapes, k, st.Graphs)
	}
	captured := rb.captures
	got := generate(t, l, prompt, greedy(24))[0]
	if fmt.Sprint(got.tokens) != fmt.Sprint(want.tokens) {
		t.Errorf("%v, plain decoding gives %v", got.tokens, want.tokens)
	}
	waitIdle(t, l)
	st = l.Engine.Stats()
	if st.Spec.Drafts == 0 {
		t.Fatal("no draft verified")
	}
	t.Logf("%d captures at load, %d after; graphs %+v", captured, rb.captures-captured, st.Graphs)
	if st.Graphs.VerifyTimings != shapes {
		t.Errorf("verify shapes timed after the request: %d, want still %d", st.Graphs.VerifyTimings, shapes)
	}
}

// sizedReplayer is a preparingReplayer whose graphs hold a device
// megabyte each (as a GPU graph's temporaries do).
type sizedReplayer struct{ preparingReplayer }

type sizedReplay struct{ replay }

func (sizedReplay) Bytes() int64 { return 1 << 20 }

func (s sizedReplayer) CaptureGraph(fn func() error) (backend.Graph, error) {
	s.captures++
	return sizedReplay{replay{fn}}, nil
}

// TestWarmVerifyStopsAtTheCacheBound: warming stops before the shape
// whose graphs would pass the graph cache's memory bound (within the
// one-sequence shapes, or within the two-sequence ones), so it never
// captures graphs only to throw them away, and the output is plain
// decoding's. Where all one-sequence shapes fit, a request at one
// sequence times no new shape, and the same request again captures
// nothing and replays as many steps as the first.
func TestWarmVerifyStopsAtTheCacheBound(t *testing.T) {
	prompt := heldoutPrompts(t, 1)
	want := generate(t, startDefault(t, specdec.Config{}), prompt, greedy(24))[0]
	const k = 3
	for _, tc := range []struct {
		name   string
		budget int64
		some   bool // one-sequence shapes only in part
	}{
		{"within one sequence", 12 << 20, true},
		{"within two sequences", 40 << 20, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rb := &replayer{Backend: cpu.New(cpu.Options{Threads: 2})}
			l := startDefaultWith(t, engine.LoadOptions{Backend: sizedReplayer{preparingReplayer{rb}}, Graphs: true, Warm: true, GraphMemory: tc.budget,
				Speculative: specdec.Config{Method: specdec.MethodNGram, NumSpeculativeTokens: k, PromptLookupMin: 1, PromptLookupMax: 3}})
			st := l.Engine.Stats().Graphs
			t.Logf("after Load: graphs %+v", st)
			if st.Evictions != 0 || st.Bytes > tc.budget || st.VerifyTimings == 0 || st.VerifyTimings >= 3*3*k {
				t.Fatalf("after Load: %d evictions, %d bytes, %d verify shapes timed; want none, within %d, some shapes and not all %d", st.Evictions, st.Bytes, st.VerifyTimings, tc.budget, 3*3*k)
			}
			if some := st.VerifyTimings < 3*k; some != tc.some {
				t.Fatalf("%d verify shapes timed against one sequence's %d: want fewer %v", st.VerifyTimings, 3*k, tc.some)
			}
			if got := generate(t, l, prompt, greedy(24))[0]; fmt.Sprint(got.tokens) != fmt.Sprint(want.tokens) {
				t.Errorf("%v, plain decoding gives %v", got.tokens, want.tokens)
			}
			waitIdle(t, l)
			first := l.Engine.Stats().Graphs
			t.Logf("after a request: graphs %+v", first)
			if tc.some {
				return
			}
			// The request's own captures (a graph the warm-up does not
			// prepare) each evict the least recently used graph: a larger
			// bucket's, so the same request again finds all it needs.
			if got := generate(t, l, prompt, greedy(24))[0]; fmt.Sprint(got.tokens) != fmt.Sprint(want.tokens) {
				t.Errorf("again: %v, plain decoding gives %v", got.tokens, want.tokens)
			}
			waitIdle(t, l)
			again := l.Engine.Stats().Graphs
			t.Logf("after it again: graphs %+v", again)
			if r1, r2 := first.Replays-st.Replays, again.Replays-first.Replays; first.VerifyTimings != st.VerifyTimings || again.Captures != first.Captures || r2 != r1 {
				t.Errorf("the requests timed %d new verify shapes, the second captured %d graphs and replayed %d steps against the first's %d; want the one-sequence shapes warmed and kept",
					again.VerifyTimings-st.VerifyTimings, again.Captures-first.Captures, r2, r1)
			}
		})
	}
}

// TestSpeculativeStopsExact: with several tokens arriving per step (the
// model as its own draft accepts every guess), stop strings, stop token
// ids, EOS and max_tokens end each request exactly where plain decoding
// does, with the same text; requests sampled on the host (logprobs,
// penalties) share the verify steps; a pool too small for the batch
// preempts and recomputes; cancelled requests give every block back.
func TestSpeculativeStopsExact(t *testing.T) {
	prompts := heldoutPrompts(t, 24)
	base := generate(t, startDefault(t, specdec.Config{}), prompts, greedy(24))
	type job struct {
		p        sample.Params
		logprobs bool
	}
	jobs := make([]job, len(prompts))
	for i := range prompts {
		p := greedy(1 + (i*7)%24)
		switch i % 6 {
		case 0, 3:
			// A stop string from the middle of the plain output.
			if text := base[i].text; len(text) > 12 {
				p.Stop = []string{text[6+i%5 : 9+i%5]}
			}
		case 1:
			p.StopTokenIDs = []int32{base[i].tokens[min(5, len(base[i].tokens)-1)]}
		case 2:
			p.IgnoreEOS = false
			p.MaxTokens = 24
		case 4:
			p.RepetitionPenalty = 1.3
		case 5:
			jobs[i].logprobs = true
		}
		jobs[i].p = p
	}
	// run submits every job, then calls start (nil: the engine runs
	// already) and reads the results. Submitted before the step loop
	// starts, the requests are all queued at its first step, however slow
	// the machine: a small pool must then preempt.
	run := func(l *engine.Loaded, start func()) []result {
		chans := make([]<-chan engine.Event, len(prompts))
		for i, j := range jobs {
			ch, err := l.Engine.Submit(context.Background(), &engine.Request{Prompt: prompts[i], N: 1, Params: j.p, Logprobs: j.logprobs})
			if err != nil {
				t.Fatal(err)
			}
			chans[i] = ch
		}
		if start != nil {
			start()
		}
		out := make([]result, len(prompts))
		var wg sync.WaitGroup
		for i, ch := range chans {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out[i] = collect(t, ch, 1)[0]
			}()
		}
		wg.Wait()
		return out
	}
	self := specdec.Config{Method: specdec.MethodDraftModel, NumSpeculativeTokens: 4, Model: defaultModelHF}
	want := run(startDefault(t, specdec.Config{}), nil)
	small, startSmall := loadDefaultWith(t, engine.LoadOptions{Backend: cpu.New(cpu.Options{Threads: 2}), Speculative: self, KVBlocks: 24})
	for _, tc := range []struct {
		name     string
		l        *engine.Loaded
		start    func()
		preempts bool
	}{
		{"self draft", startDefault(t, self), nil, false},
		{"ngram", startDefault(t, specdec.Config{Method: specdec.MethodNGram, NumSpeculativeTokens: 4, PromptLookupMin: 1, PromptLookupMax: 2}), nil, false},
		{"self draft, small pool", small, startSmall, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			free := tc.l.Engine.Stats().FreeBlocks
			got := run(tc.l, tc.start)
			for i := range prompts {
				w, g := want[i], got[i]
				if fmt.Sprint(g.tokens) != fmt.Sprint(w.tokens) || g.text != w.text || g.final.FinishReason != w.final.FinishReason ||
					g.final.CompletionTokens != w.final.CompletionTokens {
					t.Errorf("job %d (%+v): %v %q (%s, %d tokens), plain decoding gives %v %q (%s, %d tokens)", i, jobs[i].p,
						g.tokens, g.text, g.final.FinishReason, g.final.CompletionTokens, w.tokens, w.text, w.final.FinishReason, w.final.CompletionTokens)
				}
			}
			waitIdle(t, tc.l)
			st := tc.l.Engine.Stats()
			if st.Spec.Accepted == 0 {
				t.Error("no draft token accepted")
			}
			t.Logf("%d drafts, %d steps queued ahead", st.Spec.Drafts, st.AheadSteps)
			if tc.preempts && st.Preemptions == 0 {
				t.Error("the small pool preempted nothing")
			}
			// Cancelled mid-stream: every block comes back.
			var wg sync.WaitGroup
			for _, prompt := range prompts[:8] {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ctx, cancel := context.WithCancel(context.Background())
					defer cancel()
					ch, err := tc.l.Engine.Submit(ctx, &engine.Request{Prompt: prompt, N: 1, Params: greedy(40)})
					if err != nil {
						t.Error(err)
						return
					}
					n := 0
					for ev := range ch {
						if n += len(ev.TokenIDs); n >= 6 {
							cancel()
						}
					}
				}()
			}
			wg.Wait()
			waitIdle(t, tc.l)
			if st := tc.l.Engine.Stats(); st.FreeBlocks != free {
				t.Errorf("free KV blocks: %d after, %d before", st.FreeBlocks, free)
			}
		})
	}
}

// TestSpeculativeSampling: sampled requests with drafts (judged on the
// host by the acceptance rule) run to their length and accept some draft
// tokens; seeded ones take no drafts and give plain decoding's text.
func TestSpeculativeSampling(t *testing.T) {
	l := startDefault(t, specdec.Config{Method: specdec.MethodDraftModel, NumSpeculativeTokens: 3, Model: defaultModel})
	prompts := heldoutPrompts(t, 8)
	// Unseeded sampled requests take drafts: some are accepted, some not.
	p := sample.Params{Temperature: 0.8, TopP: 0.95, TopK: 40, RepetitionPenalty: 1, MaxTokens: 16, IgnoreEOS: true}
	for i, r := range generate(t, l, prompts, p) {
		if len(r.tokens) != 16 || r.final.FinishReason != engine.FinishLength {
			t.Errorf("prompt %d: %d tokens (%s %v), want 16", i, len(r.tokens), r.final.FinishReason, r.final.Err)
		}
	}
	waitIdle(t, l)
	st := l.Engine.Stats()
	if st.Spec.Accepted == 0 || st.Spec.Accepted == st.Spec.DraftTokens {
		t.Errorf("sampled: %d of %d draft tokens accepted, want some but not all", st.Spec.Accepted, st.Spec.DraftTokens)
	}
	// Seeded ones take none, so their text is what plain decoding gives,
	// however they are batched.
	seed := uint64(42)
	p.Seed = &seed
	plain := generate(t, startDefault(t, specdec.Config{}), prompts, p)
	a := generate(t, l, prompts, p)
	waitIdle(t, l)
	b := generate(t, l, prompts, p)
	for i := range prompts {
		if fmt.Sprint(a[i].tokens) != fmt.Sprint(plain[i].tokens) {
			t.Errorf("prompt %d: seed %d gave %v with speculation on, %v without", i, seed, a[i].tokens, plain[i].tokens)
		}
		if fmt.Sprint(a[i].tokens) != fmt.Sprint(b[i].tokens) {
			t.Errorf("prompt %d: seed %d gave %v, then %v", i, seed, a[i].tokens, b[i].tokens)
		}
	}
	if after := l.Engine.Stats(); after.Spec.DraftTokens != st.Spec.DraftTokens {
		t.Errorf("seeded requests took %d draft tokens, want none", after.Spec.DraftTokens-st.Spec.DraftTokens)
	}
}

// TestSpeculativeGraphs: with graphs on (the CPU replayer standing in for
// CUDA graphs), verify steps whose sequences carry drafts of one length
// replay a graph per (bucket, 1+k), the draft model's decode steps replay
// theirs, and greedy output stays that of plain eager decoding.
func TestSpeculativeGraphs(t *testing.T) {
	prompts := heldoutPrompts(t, 6)
	want := generate(t, startDefault(t, specdec.Config{}), prompts, greedy(16))
	rb := &replayer{Backend: cpu.New(cpu.Options{Threads: 2})}
	l := startDefaultWith(t, engine.LoadOptions{Backend: rb, Graphs: true,
		Speculative: specdec.Config{Method: specdec.MethodDraftModel, NumSpeculativeTokens: 3, Model: defaultModelHF}})
	// One at a time (batch 1: every verify step carries 3 draft tokens,
	// but near max_tokens), then all together.
	for i, p := range prompts {
		got := generate(t, l, [][]int32{p}, greedy(16))[0]
		if fmt.Sprint(got.tokens) != fmt.Sprint(want[i].tokens) {
			t.Errorf("prompt %d alone: %v, plain eager decoding gives %v", i, got.tokens, want[i].tokens)
		}
	}
	waitIdle(t, l)
	if st := l.Engine.Stats().Graphs; st.Replays == 0 {
		t.Errorf("no verify step replayed at batch 1: %+v", st)
	}
	got := generate(t, l, prompts, greedy(16))
	for i := range prompts {
		if fmt.Sprint(got[i].tokens) != fmt.Sprint(want[i].tokens) {
			t.Errorf("prompt %d together: %v, plain eager decoding gives %v", i, got[i].tokens, want[i].tokens)
		}
	}
	t.Logf("target graphs %+v, %d captures in all", l.Engine.Stats().Graphs, rb.captures)

	// Prompt lookup, all together: drafts of different lengths and
	// sequences without one share steps, which replay padded to the
	// longest draft's shape.
	prompts = heldoutPrompts(t, 12)
	want = generate(t, startDefault(t, specdec.Config{}), prompts, greedy(24))
	rb2 := &replayer{Backend: cpu.New(cpu.Options{Threads: 2})}
	ng := startDefaultWith(t, engine.LoadOptions{Backend: rb2, Graphs: true,
		Speculative: specdec.Config{Method: specdec.MethodNGram, NumSpeculativeTokens: 4, PromptLookupMin: 1, PromptLookupMax: 3}})
	got = generate(t, ng, prompts, greedy(24))
	for i := range prompts {
		if fmt.Sprint(got[i].tokens) != fmt.Sprint(want[i].tokens) {
			t.Errorf("prompt lookup, prompt %d together: %v, plain eager decoding gives %v", i, got[i].tokens, want[i].tokens)
		}
	}
	waitIdle(t, ng)
	st := ng.Engine.Stats().Graphs
	t.Logf("prompt lookup: graphs %+v", st)
	if st.PaddedVerifies == 0 {
		t.Errorf("no uneven verify step replayed padded: %+v", st)
	}
}
