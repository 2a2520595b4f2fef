package llama_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/trigon-llm/trigon/backend/cuda"
	"github.com/trigon-llm/trigon/engine"
	"github.com/trigon-llm/trigon/sample"
	"github.com/trigon-llm/trigon/specdec"
)

// The default model's files in the repository (see cuda_test.go), and
// the draft trained for it (2 layers, its vocabulary).
const (
	specModelFile   = "../../models/default/trigon-go.q8_0.gguf"
	specHeldoutFile = "../../models/default/heldout.ids.txt"
	specDraftFile   = "../../models/default/draft/trigon-go-draft.q8_0.gguf"
)

// specOutput is one request's tokens, text and finish.
type specOutput struct {
	tokens []int32
	text   string
	reason string
	// completion is the final event's CompletionTokens.
	completion int
	err        error
	// top is, per token, the most likely tokens and their logprobs (when
	// the run asked for them).
	top [][]sample.TokenLogprob
}

// specTopLogprobs is how many alternatives the plain run records per
// token, for judging where a speculative run departs from it.
const specTopLogprobs = 4

// specNearTie is the largest logprob gap, under plain decoding, between
// its token and the token a speculative run chose instead, that counts as
// a near tie. Verify rows go through the prefill kernels and plain decode
// rows through the decode kernels; each holds the logits within 5% of the
// largest magnitude of the f32 reference's (TestDefaultModelCUDAMatchesCPU),
// and the default model's logits reach 10-17, so two GPU paths can
// disagree by this much at a token.
const specNearTie = 0.5

// specRun loads the default model on g with cfg (and graphs on or off),
// runs every prompt at once, prompt i with ps[i], and returns the outputs
// and the engine's counters once idle; the engine is closed after. With
// top set every request asks for its tokens' logprobs and
// specTopLogprobs alternatives (such requests take no drafts).
func specRun(t *testing.T, g *cuda.Backend, cfg specdec.Config, graphs bool, prompts [][]int32, ps []sample.Params, top bool) ([]specOutput, engine.Stats) {
	t.Helper()
	l, err := engine.Load(engine.LoadOptions{Model: specModelFile, Backend: g, MaxSeqs: 32, MaxBatchedTokens: 512,
		ChunkSize: 256, KVBlocks: 4096, Graphs: graphs, Speculative: cfg})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.Engine.Run(ctx) }()
	defer func() { cancel(); <-done }()
	free := l.Engine.Stats().FreeBlocks
	out := make([]specOutput, len(prompts))
	var wg sync.WaitGroup
	for i, prompt := range prompts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := &engine.Request{Prompt: prompt, N: 1, Params: ps[i]}
			if top {
				req.Logprobs, req.TopLogprobs = true, specTopLogprobs
			}
			ch, err := l.Engine.Submit(context.Background(), req)
			if err != nil {
				out[i].err = err
				return
			}
			for ev := range ch {
				out[i].tokens = append(out[i].tokens, ev.TokenIDs...)
				out[i].text += ev.Text
				for _, lp := range ev.Logprobs {
					out[i].top = append(out[i].top, lp.Top)
				}
				if ev.FinishReason != "" {
					out[i].reason, out[i].err, out[i].completion = ev.FinishReason, ev.Err, ev.CompletionTokens
				}
			}
		}()
	}
	wg.Wait()
	for deadline := time.Now().Add(30 * time.Second); l.Engine.Busy(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("engine still busy after 30s")
		}
	}
	st := l.Engine.Stats()
	if st.FreeBlocks != free {
		t.Errorf("%s: free KV blocks %d after, %d before", cfg, st.FreeBlocks, free)
	}
	return out, st
}

// specAll is p for each of n prompts.
func specAll(p sample.Params, n int) []sample.Params {
	ps := make([]sample.Params, n)
	for i := range ps {
		ps[i] = p
	}
	return ps
}

// specJudge compares a speculative run's output with plain decoding's
// (w, run with logprobs) and reports whether the two are identical. Where
// they differ, the first differing token must be a near tie under plain
// decoding (specNearTie), which a run that goes past plain decoding's end
// (a stop string or max_tokens missed) or ends before it never is.
func specJudge(t *testing.T, i int, got, w specOutput) bool {
	t.Helper()
	j := 0
	for j < len(got.tokens) && j < len(w.tokens) && got.tokens[j] == w.tokens[j] {
		j++
	}
	switch {
	case j == len(got.tokens) && j == len(w.tokens):
		if got.text != w.text || got.reason != w.reason || got.completion != w.completion {
			t.Errorf("prompt %d: the tokens of plain decoding, but %q (%s, %d tokens) where plain decoding gives %q (%s, %d tokens)",
				i, got.text, got.reason, got.completion, w.text, w.reason, w.completion)
			return false
		}
		return true
	case j == len(got.tokens):
		t.Errorf("prompt %d ends (%s) after %d tokens, where plain decoding goes on to %d (%s): %q against %q", i, got.reason, j, len(w.tokens), w.reason, got.text, w.text)
		return false
	case j == len(w.tokens):
		t.Errorf("prompt %d goes on after plain decoding's end (%s at %d tokens) to %d tokens (%s): %q against %q", i, w.reason, j, len(got.tokens), got.reason, got.text, w.text)
		return false
	}
	gap := specGap(w, j, got.tokens[j])
	t.Logf("prompt %d differs from plain decoding at token %d: %d, not %d (logprob gap %.3g under plain decoding)", i, j, got.tokens[j], w.tokens[j], gap)
	if !(gap <= specNearTie) {
		t.Errorf("prompt %d departs from plain decoding at token %d where it is no near tie (gap %.3g > %.3g)", i, j, gap, specNearTie)
	}
	return false
}

// TestSpeculativeCUDA runs speculative decoding of the default model on
// the GPU, with prompt lookup, the model as its own draft and the draft
// trained for it, graphs off and on (verify steps replayed per (bucket,
// 1+k)), over 50 held-out prompts run together, and then alone (batch 1,
// where every verify step of the draft model has K draft tokens and
// replays its graph).
//
// Verify rows go through the prefill kernels where plain decoding uses the
// decode kernels, so greedy outputs agree with plain decoding up to near
// ties: where a prompt departs from plain decoding, plain decoding's
// logprob of the token the speculative run chose must be within
// specNearTie of its own choice's, and three prompts in four must be
// identical throughout; with the model as its own draft it requires 90%
// of draft tokens accepted, with the trained draft 20%. Alone, the draft
// model's verify steps (K tokens each but near max_tokens) must replay
// graphs. With prompt lookup, requests that end at a stop string or at a
// max_tokens below the others' while several tokens arrive a step must
// end where plain decoding ends them, with its text. A sampled run
// (judged on the host) must finish every request at its length and
// accept drafts.
func TestSpeculativeCUDA(t *testing.T) {
	if err := cuda.Available(); err != nil {
		t.Skipf("no CUDA GPU: %v", err)
	}
	g, err := cuda.New(cuda.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	raw, err := os.ReadFile(specHeldoutFile)
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
	prompts := make([][]int32, 50)
	for i := range prompts {
		at := (i * 397) % (len(ids) - 200)
		prompts[i] = ids[at : at+32+(i*13)%96]
	}
	greedy := sample.Params{Temperature: 0, TopP: 1, RepetitionPenalty: 1, MaxTokens: 32, IgnoreEOS: true}
	want, _ := specRun(t, g, specdec.Config{}, true, prompts, specAll(greedy, len(prompts)), true)
	ngram := specdec.Config{Method: specdec.MethodNGram, NumSpeculativeTokens: 4, PromptLookupMin: 1, PromptLookupMax: 3}
	self := specdec.Config{Method: specdec.MethodDraftModel, NumSpeculativeTokens: 4, Model: specModelFile}
	trained := specdec.Config{Method: specdec.MethodDraftModel, NumSpeculativeTokens: 4, Model: specDraftFile}
	for _, tc := range []struct {
		name    string
		cfg     specdec.Config
		graphs  bool
		minRate float64
	}{
		{"ngram eager", ngram, false, 0.05},
		{"ngram graphs", ngram, true, 0.05},
		{"self draft eager", self, false, 0.9},
		{"self draft graphs", self, true, 0.9},
		{"trained draft eager", trained, false, 0.2},
		{"trained draft graphs", trained, true, 0.2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, st := specRun(t, g, tc.cfg, tc.graphs, prompts, specAll(greedy, len(prompts)), false)
			same := 0
			for i := range prompts {
				if got[i].err != nil || got[i].reason != engine.FinishLength || len(got[i].tokens) != greedy.MaxTokens {
					t.Errorf("prompt %d: %d tokens, finish %q, %v", i, len(got[i].tokens), got[i].reason, got[i].err)
					continue
				}
				if specJudge(t, i, got[i], want[i]) {
					same++
				}
			}
			rate := float64(st.Spec.Accepted) / float64(max(st.Spec.DraftTokens, 1))
			t.Logf("%d of %d prompts as plain decoding; %d drafts, %d of %d tokens accepted (%.3f), by position %v; graphs %+v",
				same, len(prompts), st.Spec.Drafts, st.Spec.Accepted, st.Spec.DraftTokens, rate, st.Spec.AcceptedAt, st.Graphs)
			if same*4 < len(prompts)*3 {
				t.Errorf("%d of %d prompts as plain decoding, want three in four (the others at near ties)", same, len(prompts))
			}
			if rate < tc.minRate {
				t.Errorf("acceptance %.3f, want at least %.2f", rate, tc.minRate)
			}
		})
	}
	t.Run("self draft alone graphs", func(t *testing.T) {
		var st engine.Stats
		same := 0
		for i, p := range prompts[:8] {
			got, s := specRun(t, g, self, true, [][]int32{p}, specAll(greedy, 1), false)
			st = s
			if fmt.Sprint(got[0].tokens) == fmt.Sprint(want[i].tokens) {
				same++
			}
		}
		t.Logf("%d of 8 lone prompts as plain decoding; last run's graphs %+v", same, st.Graphs)
		if same < 7 {
			t.Errorf("%d of 8 lone prompts as plain decoding, want at least 7", same)
		}
		if st.Graphs.Replays == 0 {
			t.Errorf("no verify step replayed at batch 1: %+v", st.Graphs)
		}
	})
	t.Run("ngram stops", func(t *testing.T) {
		// Even prompts stop at a string from the middle of their plain
		// text, odd ones at a max_tokens of 1 to 31; plain decoding, with
		// the same parameters, says where each ends.
		ps := specAll(greedy, len(prompts))
		for i := range ps {
			if i%2 == 1 {
				ps[i].MaxTokens = 1 + (i*7)%31
				continue
			}
			if text := want[i].text; len(text) > 16 {
				ps[i].Stop = []string{text[8+i%5 : 11+i%5]}
			}
		}
		plain, _ := specRun(t, g, specdec.Config{}, true, prompts, ps, true)
		stops, short := 0, 0
		for i, w := range plain {
			if w.err != nil {
				t.Fatalf("plain decoding, prompt %d: %v", i, w.err)
			}
			switch {
			case w.reason == engine.FinishStop:
				stops++
			case w.reason == engine.FinishLength && ps[i].MaxTokens < greedy.MaxTokens:
				short++
			}
		}
		if stops < len(prompts)/4 || short < len(prompts)/4 {
			t.Fatalf("plain decoding: %d prompts ended at a stop string and %d at a short max_tokens, want at least %d each", stops, short, len(prompts)/4)
		}
		got, st := specRun(t, g, ngram, true, prompts, ps, false)
		same := 0
		for i := range prompts {
			if got[i].err != nil {
				t.Errorf("prompt %d: %v", i, got[i].err)
				continue
			}
			if specJudge(t, i, got[i], plain[i]) {
				same++
			}
		}
		t.Logf("stops: %d of %d prompts as plain decoding (%d plain ends at a stop string, %d at a short max_tokens); %d drafts, %d of %d tokens accepted, by position %v",
			same, len(prompts), stops, short, st.Spec.Drafts, st.Spec.Accepted, st.Spec.DraftTokens, st.Spec.AcceptedAt)
		if same*4 < len(prompts)*3 {
			t.Errorf("%d of %d prompts as plain decoding, want three in four (the others at near ties)", same, len(prompts))
		}
		if st.Spec.Accepted == 0 {
			t.Errorf("no draft token accepted of %d: no step brought several tokens", st.Spec.DraftTokens)
		}
	})
	t.Run("sampled", func(t *testing.T) {
		// Unseeded: seeded requests take no drafts.
		p := sample.Params{Temperature: 0.8, TopP: 0.95, TopK: 50, RepetitionPenalty: 1, MaxTokens: 32, IgnoreEOS: true}
		got, st := specRun(t, g, self, true, prompts, specAll(p, len(prompts)), false)
		for i := range prompts {
			if got[i].err != nil || got[i].reason != engine.FinishLength || len(got[i].tokens) != p.MaxTokens {
				t.Errorf("prompt %d: %d tokens, finish %q, %v", i, len(got[i].tokens), got[i].reason, got[i].err)
			}
		}
		if st.Spec.Accepted == 0 {
			t.Errorf("sampled: no draft token accepted of %d", st.Spec.DraftTokens)
		}
		t.Logf("sampled: %d of %d draft tokens accepted", st.Spec.Accepted, st.Spec.DraftTokens)
	})
}

// specGap is how much less likely tok was than plain decoding's own token
// at position j of run w (logprob units), +Inf where tok is not among the
// recorded alternatives.
func specGap(w specOutput, j int, tok int32) float64 {
	if j >= len(w.top) || len(w.top[j]) == 0 {
		return math.Inf(1)
	}
	for _, a := range w.top[j] {
		if a.ID == tok {
			return float64(w.top[j][0].Logprob - a.Logprob)
		}
	}
	return math.Inf(1)
}
