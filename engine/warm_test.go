package engine_test

import (
	"context"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/cpu"
	"github.com/trigon-llm/trigon/engine"
	"github.com/trigon-llm/trigon/runner"
	"github.com/trigon-llm/trigon/specdec"
)

// recording records the row counts of the products (x rows) a backend's
// steps run.
type recording struct {
	backend.Backend
	mu   sync.Mutex
	rows map[int]bool
}

func (p *recording) MatMul(out, x, w, bias backend.Tensor) error {
	p.mu.Lock()
	p.rows[x.Shape()[0]] = true
	p.mu.Unlock()
	return p.Backend.MatMul(out, x, w, bias)
}

func (p *recording) seen() map[int]bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.rows)
}

// preparing is recording for a backend that builds kernels at run time
// and tunes its products: it counts PrepareKernels and EndTuning calls
// too, and keeps the row counts seen when tuning ended.
type preparing struct {
	recording
	prepared, ended int
	rowsAtEnd       map[int]bool
}

func (p *preparing) EndTuning() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ended++
	p.rowsAtEnd = maps.Clone(p.rows)
	return len(p.rows)
}

func (p *preparing) PrepareKernels(context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.prepared++
	return nil
}

func (p *preparing) counts() (prepared int, rows map[int]bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.prepared, maps.Clone(p.rows)
}

// preparingGraphs is preparing with graph capture (replayer's).
type preparingGraphs struct{ *preparing }

func (p preparingGraphs) CaptureGraph(fn func() error) (backend.Graph, error) { return replay{fn}, nil }

// TestLoadWarm: with Warm, Load prepares the kernels of a backend that
// builds them at run time once and runs a decode step at every decode
// batch bucket before serving (with graphs on, the padded buckets; off,
// the default buckets), and the warmed engine's greedy outputs equal an
// unwarmed one's: the KV the warm steps wrote into free blocks never
// reaches a request. A backend without kernels to build is not warmed.
func TestLoadWarm(t *testing.T) {
	const maxSeqs = 12
	plain := start(t, nil, engine.LoadOptions{MaxSeqs: maxSeqs, MaxBatchedTokens: 256})
	rng := rand.New(rand.NewPCG(3, 4))
	prompts := make([][]int32, 9)
	want := make([][]int32, len(prompts))
	for i := range prompts {
		prompts[i] = randomPrompt(rng, 1+rng.IntN(40))
		want[i] = submit(t, plain, context.Background(), prompts[i], 1, greedy(10))[0].tokens
	}
	rec := &recording{Backend: cpu.New(cpu.Options{Threads: 2}), rows: map[int]bool{}}
	start(t, rec, engine.LoadOptions{MaxSeqs: maxSeqs, MaxBatchedTokens: 256, Warm: true})
	if rows := rec.seen(); len(rows) != 0 {
		t.Errorf("a backend with no kernels to build ran products of %v rows at a warm load", slices.Sorted(maps.Keys(rows)))
	}
	// With speculation, a verify step of 1+k rows a sequence at every
	// bucket too: 16, 32 and 48 rows are no decode bucket's.
	ps := &preparing{recording: recording{Backend: cpu.New(cpu.Options{Threads: 2}), rows: map[int]bool{}}}
	start(t, preparingGraphs{ps}, engine.LoadOptions{MaxSeqs: maxSeqs, MaxBatchedTokens: 256, Graphs: true, Warm: true,
		Speculative: specdec.Config{Method: specdec.MethodNGram, NumSpeculativeTokens: 3, PromptLookupMin: 1, PromptLookupMax: 3}})
	if _, rows := ps.counts(); !rows[16] || !rows[32] || !rows[48] {
		t.Errorf("speculative warm load ran products of %v rows, want the verify steps' 16, 32 and 48 among them", slices.Sorted(maps.Keys(rows)))
	}
	for _, graphs := range []bool{false, true} {
		t.Run(fmt.Sprintf("graphs=%v", graphs), func(t *testing.T) {
			p := &preparing{recording: recording{Backend: cpu.New(cpu.Options{Threads: 2}), rows: map[int]bool{}}}
			var b backend.Backend = p
			if graphs {
				b = preparingGraphs{p}
			}
			l := start(t, b, engine.LoadOptions{MaxSeqs: maxSeqs, MaxBatchedTokens: 256, Graphs: graphs, Warm: true})
			prepared, rows := p.counts()
			if prepared != 1 {
				t.Errorf("PrepareKernels called %d times, want 1", prepared)
			}
			p.mu.Lock()
			ended, atEnd := p.ended, p.rowsAtEnd
			p.mu.Unlock()
			if ended != 1 {
				t.Errorf("EndTuning called %d times at load, want 1", ended)
			}
			for _, n := range runner.DefaultBuckets(maxSeqs) {
				if !rows[n] {
					t.Errorf("no product of %d rows ran at load (rows seen %v)", n, slices.Sorted(maps.Keys(rows)))
				}
				if !atEnd[n] {
					t.Errorf("tuning ended before a product of %d rows ran (rows seen then %v)", n, slices.Sorted(maps.Keys(atEnd)))
				}
			}
			if st := l.Engine.Stats().Graphs; graphs && st.EagerDecodes < uint64(len(runner.DefaultBuckets(maxSeqs))) {
				t.Errorf("graph stats after a warm load %+v: want an eager decode per bucket", st)
			}
			var wg sync.WaitGroup
			for i, pr := range prompts {
				wg.Add(1)
				go func() {
					defer wg.Done()
					got := submit(t, l, context.Background(), pr, 1, greedy(10))[0].tokens
					if fmt.Sprint(got) != fmt.Sprint(want[i]) {
						t.Errorf("prompt %d warmed: %v, unwarmed %v", i, got, want[i])
					}
				}()
			}
			wg.Wait()
		})
	}
}

// TestLoadWarmDraft: a warm load with a draft model warms the draft's
// runner too (its own pools, before any proposal), and the engine's
// greedy outputs stay those of plain decoding.
func TestLoadWarmDraft(t *testing.T) {
	prompts := heldoutPrompts(t, 3)
	want := generate(t, startDefault(t, specdec.Config{}), prompts, greedy(12))
	p := &preparing{recording: recording{Backend: cpu.New(cpu.Options{Threads: 2}), rows: map[int]bool{}}}
	l := startDefaultWith(t, engine.LoadOptions{Backend: preparingGraphs{p}, Graphs: true, Warm: true,
		Speculative: specdec.Config{Method: specdec.MethodDraftModel, NumSpeculativeTokens: 3, Model: defaultModelHF}})
	// The target's verify steps of 4 rows: bucket 16 gives 64 rows, no
	// decode bucket's of 16 sequences.
	if _, rows := p.counts(); !rows[64] {
		t.Errorf("warm load ran products of %v rows, want the verify steps' among them", slices.Sorted(maps.Keys(rows)))
	}
	got := generate(t, l, prompts, greedy(12))
	for i := range prompts {
		if fmt.Sprint(got[i].tokens) != fmt.Sprint(want[i].tokens) {
			t.Errorf("prompt %d after a warm load with a draft: %v, plain decoding %v", i, got[i].tokens, want[i].tokens)
		}
	}
}

// TestLoadMixedCap: a load that asks for a mixed-step ratio caps the
// prefill beside decodes (at least one token, growing with the decodes,
// one entry per decode count up to MaxSeqs), with its budget measured or
// given, warmed or not, and its greedy outputs of prompts arriving
// together equal those of a plain engine; without a ratio the budget is
// alone; a ratio of 1 or less, or not finite, is refused.
func TestLoadMixedCap(t *testing.T) {
	const maxSeqs = 6
	rng := rand.New(rand.NewPCG(7, 8))
	prompts := make([][]int32, 8)
	want := make([][]int32, len(prompts))
	plain := start(t, nil, engine.LoadOptions{MaxSeqs: maxSeqs, MaxBatchedTokens: 256})
	for i := range prompts {
		prompts[i] = randomPrompt(rng, 20+rng.IntN(100))
		want[i] = submit(t, plain, context.Background(), prompts[i], 1, greedy(8))[0].tokens
	}
	newWarm := func() backend.Backend {
		return &preparing{recording: recording{Backend: cpu.New(cpu.Options{Threads: 2}), rows: map[int]bool{}}}
	}
	l := start(t, newWarm(), engine.LoadOptions{MaxSeqs: maxSeqs, Warm: true, MixedStepRatio: 2})
	caps := l.MixedCap
	if len(caps) != min(maxSeqs, l.MaxBatchedTokens)+1 {
		t.Fatalf("measured warm load: caps %v for budget %d, want one per decode count 0..%d", caps, l.MaxBatchedTokens, maxSeqs)
	}
	for d := 1; d < len(caps); d++ {
		if caps[d] < 1 || caps[d] < caps[d-1] {
			t.Fatalf("caps %v: want at least 1 and non-decreasing", caps)
		}
	}
	t.Logf("budget %d, caps %v", l.MaxBatchedTokens, caps)
	var wg sync.WaitGroup
	for i, pr := range prompts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if got := submit(t, l, context.Background(), pr, 1, greedy(8))[0].tokens; fmt.Sprint(got) != fmt.Sprint(want[i]) {
				t.Errorf("prompt %d with caps %v: %v, plain %v", i, caps, got, want[i])
			}
		}()
	}
	wg.Wait()
	// A given budget and an unwarmed backend are capped too; no ratio, not.
	for _, tc := range []struct {
		opts engine.LoadOptions
		caps bool
	}{
		{engine.LoadOptions{MaxSeqs: maxSeqs, Warm: true, MaxBatchedTokens: 256, MixedStepRatio: 2}, true},
		{engine.LoadOptions{MaxSeqs: maxSeqs, MixedStepRatio: 2}, true},
		{engine.LoadOptions{MaxSeqs: maxSeqs, Warm: true}, false},
	} {
		l := start(t, newWarm(), tc.opts)
		if (l.MixedCap != nil) != tc.caps || tc.caps && len(l.MixedCap) != min(maxSeqs, l.MaxBatchedTokens)+1 {
			t.Errorf("load %+v: caps %v (budget %d), want caps: %v", tc.opts, l.MixedCap, l.MaxBatchedTokens, tc.caps)
		}
	}
	for _, r := range []float64{1, 0.5, -1, math.NaN(), math.Inf(1)} {
		_, err := engine.Load(engine.LoadOptions{Model: fixture, Backend: newWarm(), MaxSeqs: maxSeqs, Warm: true, MixedStepRatio: r})
		if err == nil || !strings.Contains(err.Error(), "mixed-step ratio") {
			t.Errorf("ratio %v: %v, want a refusal naming the mixed-step ratio", r, err)
		}
	}
}
