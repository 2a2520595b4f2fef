package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// testRand returns a generator with a fresh seed, logged so a failure can be
// replayed.
func testRand(t *testing.T) *rand.Rand {
	seed := uint64(time.Now().UnixNano())
	t.Logf("random seed %d", seed)
	return rand.New(rand.NewPCG(seed, 7))
}

// TestGreedyMatchesReference compares whole replies, streamed and not, with
// a greedy generation computed independently on random prompts.
func TestGreedyMatchesReference(t *testing.T) {
	rng := testRand(t)
	e := newEnv(t, nil)
	for i := range 12 {
		path := "/v1/completions"
		if i%2 == 1 {
			path = "/v1/chat/completions"
		}
		stream := i%4 >= 2
		text := words(1+rng.IntN(12), rng.IntN(1000))
		var prompt []int32
		body := map[string]any{"temperature": 0, "stream": stream}
		if path == "/v1/completions" {
			body["prompt"] = text
			prompt = promptIDs(e.tok, text)
		} else {
			body["messages"] = userMsg(text)
			prompt = chatIDs(e.tok, []ChatMessage{{Role: "user", Content: text}})
		}
		maxTok := 1 + rng.IntN(20)
		body["max_tokens"] = maxTok
		var stops []string
		if i%3 == 0 {
			// A stop string spanning a token boundary, cut from the
			// reference output itself so that it really occurs.
			full, _, _ := greedyRef(e.tok, prompt, maxTok, nil)
			r := []rune(full)
			if len(r) > 6 {
				p := 1 + rng.IntN(len(r)-4)
				stops = []string{string(r[p : p+3])}
				body["stop"] = stops
			}
		}
		if stream {
			body["stream_options"] = map[string]any{"include_usage": true}
		}
		t.Run(fmt.Sprintf("%d%s/stream=%v/stops=%q", i, path, stream, stops), func(t *testing.T) {
			want, wantTok, wantFinish := greedyRef(e.tok, prompt, maxTok, stops)
			res := e.generate(t, path, body)
			if res.text[0] != want {
				t.Errorf("text %q, want %q", res.text[0], want)
			}
			if res.finish[0] != wantFinish {
				t.Errorf("finish %q, want %q", res.finish[0], wantFinish)
			}
			u := res.usage
			if u.PromptTokens != len(prompt) || u.CompletionTokens != wantTok || u.TotalTokens != len(prompt)+wantTok {
				t.Errorf("usage %+v, want prompt %d completion %d", *u, len(prompt), wantTok)
			}
			if u.PromptTokensDetails != nil {
				t.Errorf("prompt_tokens_details without cached tokens")
			}
		})
	}
}

// TestStreamEqualsNonStream checks that the same seeded request gives the
// same choices, texts, finish reasons, usage and logprobs either way, for
// one or several choices and with several tokens per engine event.
func TestStreamEqualsNonStream(t *testing.T) {
	rng := testRand(t)
	for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
		for _, n := range []int{1, 3} {
			for _, perEvent := range []int{1, 3} {
				for _, lp := range []bool{false, true} {
					name := fmt.Sprintf("%s/n=%d/perEvent=%d/logprobs=%v", path, n, perEvent, lp)
					t.Run(name, func(t *testing.T) {
						e := newEnv(t, nil)
						e.eng.perEvent = perEvent
						text := words(2+rng.IntN(8), rng.IntN(1000))
						body := map[string]any{"n": n, "seed": rng.Int64(), "temperature": 0.9, "top_p": 0.95,
							"max_tokens": 4 + rng.IntN(16), "stop": []string{" the", " sea r"}}
						if path == "/v1/completions" {
							body["prompt"] = text
							if lp {
								body["logprobs"] = 2
							}
						} else {
							body["messages"] = userMsg(text)
							if lp {
								body["logprobs"] = true
								body["top_logprobs"] = 2
							}
						}
						plain := e.generate(t, path, body)
						body["stream"] = true
						body["stream_options"] = map[string]any{"include_usage": true}
						streamed := e.generate(t, path, body)
						if !reflect.DeepEqual(plain.text, streamed.text) {
							t.Errorf("texts differ:\n plain    %q\n streamed %q", plain.text, streamed.text)
						}
						if !reflect.DeepEqual(plain.finish, streamed.finish) {
							t.Errorf("finish differs: %q vs %q", plain.finish, streamed.finish)
						}
						if !reflect.DeepEqual(plain.usage, streamed.usage) {
							t.Errorf("usage differs: %+v vs %+v", *plain.usage, *streamed.usage)
						}
						if !reflect.DeepEqual(plain.legacy, streamed.legacy) {
							t.Errorf("completions logprobs differ")
						}
						if !reflect.DeepEqual(plain.chatLP, streamed.chatLP) {
							t.Errorf("chat logprobs differ")
						}
						for i := range n {
							if lp && plain.legacy[i] == nil && plain.chatLP[i] == nil {
								t.Errorf("choice %d has no logprobs", i)
							}
							if !lp && (plain.legacy[i] != nil || plain.chatLP[i] != nil) {
								t.Errorf("choice %d has logprobs nobody asked for", i)
							}
						}
					})
				}
			}
		}
	}
}

func TestSeedReproducible(t *testing.T) {
	rng := testRand(t)
	for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
		t.Run(path, func(t *testing.T) {
			e := newEnv(t, nil)
			text := words(3, rng.IntN(1000))
			body := map[string]any{"n": 3, "temperature": 1.0, "max_tokens": 16}
			if path == "/v1/completions" {
				body["prompt"] = text
			} else {
				body["messages"] = userMsg(text)
			}
			seed := rng.Int64()
			body["seed"] = seed
			a := e.generate(t, path, body)
			b := e.generate(t, path, body)
			if !reflect.DeepEqual(a.text, b.text) {
				t.Errorf("same seed, different output:\n%q\n%q", a.text, b.text)
			}
			if a.text[0] == a.text[1] && a.text[1] == a.text[2] {
				t.Errorf("n=3 choices are identical: %q", a.text)
			}
			body["seed"] = seed + 1000
			c := e.generate(t, path, body)
			if reflect.DeepEqual(a.text, c.text) {
				t.Errorf("different seeds gave the same output %q", a.text)
			}
			if got := *e.eng.lastRequest().Sampling.Seed; got != uint64(seed+1000) {
				t.Errorf("engine seed %d, want %d", got, seed+1000)
			}
		})
	}
}

// generatedIDs maps token strings of logprobs back to ids (every fake
// token string is unique).
func generatedIDs(t *testing.T, tok *fakeTokenizer, toks []string) []int32 {
	t.Helper()
	var ids []int32
	for _, s := range toks {
		found := false
		for id := range int32(len(fakeWords)) {
			if ts, _ := tok.TokenString(id); ts == s {
				ids = append(ids, id)
				found = true
				break
			}
		}
		if !found {
			t.Fatalf("token %q not in vocab", s)
		}
	}
	return ids
}

// expectTop computes, independently of the server, the top k tokens and
// log-probabilities after seq.
func expectTop(tok *fakeTokenizer, seq []int32, k int) ([]string, []float64, []float64) {
	lp := logSoftmax(fakeLogits(seq))
	idx := make([]int, len(lp))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		switch {
		case lp[a] > lp[b]:
			return -1
		case lp[a] < lp[b]:
			return 1
		}
		return 0
	})
	var names []string
	var vals []float64
	for _, i := range idx[:k] {
		s, _ := tok.TokenString(int32(i))
		names = append(names, s)
		vals = append(vals, lp[i])
	}
	return names, vals, lp
}

const lpTol = 1e-5

func TestCompletionLogprobs(t *testing.T) {
	rng := testRand(t)
	e := newEnv(t, nil)
	for _, k := range []int{0, 1, 5, 20} {
		t.Run(fmt.Sprintf("logprobs=%d", k), func(t *testing.T) {
			text := words(3, rng.IntN(1000))
			prompt := promptIDs(e.tok, text)
			body := map[string]any{"prompt": text, "max_tokens": 10, "logprobs": k, "seed": rng.Int64(), "temperature": 1}
			res := e.generate(t, "/v1/completions", body)
			l := res.legacy[0]
			if l == nil {
				t.Fatal("no logprobs")
			}
			nTok := res.usage.CompletionTokens
			if len(l.Tokens) != nTok || len(l.TokenLogprobs) != nTok || len(l.TopLogprobs) != nTok || len(l.TextOffset) != nTok {
				t.Fatalf("logprobs arrays %d/%d/%d/%d, want %d", len(l.Tokens), len(l.TokenLogprobs),
					len(l.TopLogprobs), len(l.TextOffset), nTok)
			}
			ids := generatedIDs(t, e.tok, l.Tokens)
			seq := slices.Clone(prompt)
			off := 0
			for i, id := range ids {
				names, vals, all := expectTop(e.tok, seq, k)
				if d := math.Abs(l.TokenLogprobs[i] - all[id]); d > lpTol {
					t.Errorf("token %d logprob %g, want %g", i, l.TokenLogprobs[i], all[id])
				}
				want := map[string]float64{}
				for j := range names {
					want[names[j]] = vals[j]
				}
				want[l.Tokens[i]] = all[id] // the sampled token is always listed
				if len(l.TopLogprobs[i]) != len(want) {
					t.Errorf("token %d: %d top entries, want %d", i, len(l.TopLogprobs[i]), len(want))
				}
				for name, v := range want {
					if got, ok := l.TopLogprobs[i][name]; !ok || math.Abs(got-v) > lpTol {
						t.Errorf("token %d top %q = %g (present %v), want %g", i, name, got, ok, v)
					}
				}
				if l.TextOffset[i] != off {
					t.Errorf("text_offset[%d] = %d, want %d", i, l.TextOffset[i], off)
				}
				off += utf8.RuneCountInString(l.Tokens[i])
				seq = append(seq, id)
			}
			if res.finish[0] == "length" && strings.Join(l.Tokens, "") != res.text[0] {
				t.Errorf("tokens %q do not spell the text %q", l.Tokens, res.text[0])
			}
		})
	}
}

// TestCompletionTopLogprobsOrder checks the {token: logprob} objects are
// written most likely first, not in Go's sorted map order.
func TestCompletionTopLogprobsOrder(t *testing.T) {
	e := newEnv(t, nil)
	rec := e.do(t, "POST", "/v1/completions", `{"prompt":"the cat","max_tokens":3,"logprobs":6,"temperature":0}`)
	var raw struct {
		Choices []struct {
			Logprobs struct {
				TopLogprobs []json.RawMessage `json:"top_logprobs"`
			} `json:"logprobs"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &raw); err != nil {
		t.Fatal(err)
	}
	for i, obj := range raw.Choices[0].Logprobs.TopLogprobs {
		dec := json.NewDecoder(strings.NewReader(string(obj)))
		dec.Token() // {
		prev := math.Inf(1)
		for dec.More() {
			dec.Token() // key
			var v float64
			if err := dec.Decode(&v); err != nil {
				t.Fatal(err)
			}
			if v > prev {
				t.Errorf("position %d: top_logprobs not in descending order: %s", i, obj)
			}
			prev = v
		}
	}
}

func TestChatLogprobs(t *testing.T) {
	rng := testRand(t)
	e := newEnv(t, nil)
	for _, k := range []int{0, 2, 20} {
		t.Run(fmt.Sprintf("top_logprobs=%d", k), func(t *testing.T) {
			text := words(3, rng.IntN(1000))
			prompt := chatIDs(e.tok, []ChatMessage{{Role: "user", Content: text}})
			body := map[string]any{"messages": userMsg(text), "max_tokens": 12, "logprobs": true,
				"top_logprobs": k, "seed": rng.Int64(), "temperature": 1.2}
			res := e.generate(t, "/v1/chat/completions", body)
			lp := res.chatLP[0]
			if lp == nil || len(lp.Content) != res.usage.CompletionTokens {
				t.Fatalf("logprobs content has %v entries, want %d", lp, res.usage.CompletionTokens)
			}
			var toks []string
			for _, c := range lp.Content {
				toks = append(toks, c.Token)
			}
			ids := generatedIDs(t, e.tok, toks)
			seq := slices.Clone(prompt)
			for i, c := range lp.Content {
				names, vals, all := expectTop(e.tok, seq, k)
				if math.Abs(c.Logprob-all[ids[i]]) > lpTol {
					t.Errorf("token %d logprob %g, want %g", i, c.Logprob, all[ids[i]])
				}
				if !reflect.DeepEqual(c.Bytes, bytesOf(c.Token)) {
					t.Errorf("token %d bytes %v, want %v", i, c.Bytes, bytesOf(c.Token))
				}
				if c.TopLogprobs == nil || len(c.TopLogprobs) != k {
					t.Fatalf("token %d has %d top_logprobs, want %d", i, len(c.TopLogprobs), k)
				}
				for j, tl := range c.TopLogprobs {
					if tl.Token != names[j] || math.Abs(tl.Logprob-vals[j]) > lpTol {
						t.Errorf("token %d top %d = %q %g, want %q %g", i, j, tl.Token, tl.Logprob, names[j], vals[j])
					}
					if !reflect.DeepEqual(tl.Bytes, bytesOf(tl.Token)) {
						t.Errorf("top bytes %v for %q", tl.Bytes, tl.Token)
					}
				}
				seq = append(seq, ids[i])
			}
		})
	}
}

func bytesOf(s string) []int {
	out := []int{}
	for _, b := range []byte(s) {
		out = append(out, int(b))
	}
	return out
}

// findPrompt searches prompts until pred holds for the greedy reference.
func findPrompt(t *testing.T, tok *fakeTokenizer, pred func(prompt []int32) bool) string {
	t.Helper()
	for s := range 2000 {
		text := words(2+s%5, s)
		if pred(promptIDs(tok, text)) {
			return text
		}
	}
	t.Fatal("no prompt found")
	return ""
}

func TestStopConditions(t *testing.T) {
	e := newEnv(t, nil)
	// A prompt whose greedy continuation hits EOS after a few tokens.
	eosPrompt := findPrompt(t, e.tok, func(p []int32) bool {
		_, n, f := greedyRef(e.tok, p, 20, nil)
		return f == "stop" && n >= 3
	})
	eosText, eosTokens, _ := greedyRef(e.tok, promptIDs(e.tok, eosPrompt), 20, nil)
	// A prompt that runs 20 tokens without EOS, for stop_token_ids.
	longPrompt := findPrompt(t, e.tok, func(p []int32) bool {
		_, _, f := greedyRef(e.tok, p, 20, nil)
		return f == "length"
	})
	longIDs := promptIDs(e.tok, longPrompt)
	full, _, _ := greedyRef(e.tok, longIDs, 20, nil)
	// The token generated 4th becomes a stop token id: the reply must end
	// right before its first occurrence.
	var gen []int32
	seq := slices.Clone(longIDs)
	for range 4 {
		ref, _, _ := greedyRef(e.tok, seq, 1, nil)
		for id := range int32(len(fakeWords)) {
			if s, _ := e.tok.TokenString(id); s == ref {
				gen = append(gen, id)
				seq = append(seq, id)
				break
			}
		}
	}
	stopID := gen[3]
	cut := slices.Index(gen, stopID)
	wantStopText, _ := e.tok.Decode(gen[:cut], false)

	cases := []struct {
		name       string
		body       map[string]any
		wantText   func(string) bool
		wantFinish string
		wantTokens func(int) bool
	}{
		{"eos stops", map[string]any{"prompt": eosPrompt, "max_tokens": 20},
			func(s string) bool { return s == eosText }, "stop", func(n int) bool { return n == eosTokens }},
		{"ignore_eos runs to max_tokens", map[string]any{"prompt": eosPrompt, "max_tokens": 20, "ignore_eos": true},
			func(s string) bool { return strings.HasPrefix(s, eosText) && len(s) > len(eosText) }, "length",
			func(n int) bool { return n == 20 }},
		{"min_tokens suppresses eos", map[string]any{"prompt": eosPrompt, "max_tokens": 20, "min_tokens": eosTokens + 1},
			func(s string) bool { return strings.HasPrefix(s, eosText) }, "",
			func(n int) bool { return n >= eosTokens+1 }},
		{"max_tokens", map[string]any{"prompt": longPrompt, "max_tokens": 7},
			func(s string) bool { r, _, _ := greedyRef(e.tok, longIDs, 7, nil); return s == r }, "length",
			func(n int) bool { return n == 7 }},
		{"stop token id", map[string]any{"prompt": longPrompt, "max_tokens": 20, "stop_token_ids": []int32{stopID}},
			func(s string) bool { return s == wantStopText }, "stop", func(n int) bool { return n == cut+1 }},
		{"stop string absent", map[string]any{"prompt": longPrompt, "max_tokens": 20, "stop": "zzz"},
			func(s string) bool { return s == full }, "length", func(n int) bool { return n == 20 }},
	}
	for _, tc := range cases {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stream=%v", tc.name, stream), func(t *testing.T) {
				body := maps(tc.body)
				body["temperature"] = 0
				body["stream"] = stream
				if stream {
					body["stream_options"] = map[string]any{"include_usage": true}
				}
				res := e.generate(t, "/v1/completions", body)
				if !tc.wantText(res.text[0]) {
					t.Errorf("unexpected text %q", res.text[0])
				}
				if tc.wantFinish != "" && res.finish[0] != tc.wantFinish {
					t.Errorf("finish %q, want %q", res.finish[0], tc.wantFinish)
				}
				if !tc.wantTokens(res.usage.CompletionTokens) {
					t.Errorf("completion tokens %d", res.usage.CompletionTokens)
				}
			})
		}
	}
}

func maps(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// TestParamsReachEngine checks each request field lands in the engine
// request, with the documented defaults for what is left out.
func TestParamsReachEngine(t *testing.T) {
	seed42 := uint64(42)
	seedNeg := uint64(math.MaxUint64) // -1 keeps its bit pattern
	defaults := SamplingParams{Temperature: 1, TopP: 1, RepetitionPenalty: 1, SkipSpecialTokens: true}
	with := func(f func(*SamplingParams)) SamplingParams {
		p := defaults
		f(&p)
		return p
	}
	chatPrompt := chatIDs(newFakeTokenizer(), []ChatMessage{{Role: "user", Content: "the cat"}})
	long := words(55, 4) // 56 tokens with BOS
	cases := []struct {
		name  string
		path  string
		body  string
		cap   int
		want  SamplingParams
		n     int
		lp    bool
		topLP int
	}{
		{"completion defaults", "/v1/completions", `{"prompt":"the"}`, 0,
			with(func(p *SamplingParams) { p.MaxTokens = 16 }), 1, false, 0},
		{"completion default shrinks to fit", "/v1/completions", `{"prompt":"` + long + `"}`, 0,
			with(func(p *SamplingParams) { p.MaxTokens = testMaxCtx - 56 }), 1, false, 0},
		{"chat default is the rest of the context", "/v1/chat/completions", `{"messages":[{"role":"user","content":"the cat"}]}`, 0,
			with(func(p *SamplingParams) { p.MaxTokens = testMaxCtx - len(chatPrompt) }), 1, false, 0},
		{"chat default capped", "/v1/chat/completions", `{"messages":[{"role":"user","content":"the cat"}]}`, 10,
			with(func(p *SamplingParams) { p.MaxTokens = 10 }), 1, false, 0},
		{"max_completion_tokens wins", "/v1/chat/completions", `{"messages":[{"role":"user","content":"the cat"}],"max_tokens":3,"max_completion_tokens":9}`, 0,
			with(func(p *SamplingParams) { p.MaxTokens = 9 }), 1, false, 0},
		{"everything", "/v1/completions", `{"prompt":"the","temperature":0.5,"top_p":0.75,"top_k":5,"min_p":0.125,
			"presence_penalty":0.5,"frequency_penalty":-0.25,"repetition_penalty":1.5,"seed":42,"max_tokens":7,
			"min_tokens":2,"stop":["x","y"],"stop_token_ids":[5,9],"ignore_eos":true,"skip_special_tokens":false,"n":2,"logprobs":3}`, 0,
			SamplingParams{Temperature: 0.5, TopP: 0.75, TopK: 5, MinP: 0.125, PresencePenalty: 0.5,
				FrequencyPenalty: -0.25, RepetitionPenalty: 1.5, Seed: &seed42, MaxTokens: 7, MinTokens: 2,
				Stop: []string{"x", "y"}, StopTokenIDs: []int32{5, 9}, IgnoreEOS: true}, 2, true, 3},
		{"single stop string, negative seed, top_k 0", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],
			"stop":"end","seed":-1,"top_k":0,"max_tokens":4,"logprobs":true}`, 0,
			with(func(p *SamplingParams) { p.Stop = []string{"end"}; p.Seed = &seedNeg; p.MaxTokens = 4 }), 1, true, 0},
		{"greedy", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"temperature":0,"max_tokens":2,"logprobs":true,"top_logprobs":4}`, 0,
			with(func(p *SamplingParams) { p.Temperature = 0; p.MaxTokens = 2 }), 1, true, 4},
		{"json object", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"},"max_tokens":3}`, 0,
			with(func(p *SamplingParams) { p.JSONObject = true; p.MaxTokens = 3 }), 1, false, 0},
		{"text format", "/v1/completions", `{"prompt":"x","response_format":{"type":"text"},"max_tokens":3}`, 0,
			with(func(p *SamplingParams) { p.MaxTokens = 3 }), 1, false, 0},
		// The engine computes in float32: a positive value below its range
		// reaches it as the smallest positive float32, not as 0 (which the
		// engine refuses as out of range).
		{"positive values below float32", "/v1/completions", `{"prompt":"x","top_p":1e-50,"repetition_penalty":1e-300,"max_tokens":3}`, 0,
			with(func(p *SamplingParams) {
				p.TopP, p.RepetitionPenalty = math.SmallestNonzeroFloat32, math.SmallestNonzeroFloat32
				p.MaxTokens = 3
			}), 1, false, 0},
		{"small values that float32 holds", "/v1/completions", `{"prompt":"x","top_p":1e-40,"repetition_penalty":1e-30,"max_tokens":3}`, 0,
			with(func(p *SamplingParams) { p.TopP, p.RepetitionPenalty = 1e-40, 1e-30; p.MaxTokens = 3 }), 1, false, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, func(o *Options) { o.MaxTokensCap = tc.cap })
			rec := e.do(t, "POST", tc.path, tc.body)
			if rec.Code != 200 {
				t.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
			got := e.eng.lastRequest()
			if !reflect.DeepEqual(got.Sampling, tc.want) {
				t.Errorf("sampling\n got %+v\nwant %+v", got.Sampling, tc.want)
			}
			if got.N != tc.n || got.Logprobs != tc.lp || got.TopLogprobs != tc.topLP {
				t.Errorf("n %d logprobs %v top %d, want %d %v %d", got.N, got.Logprobs, got.TopLogprobs, tc.n, tc.lp, tc.topLP)
			}
			wantPrefix := "cmpl-"
			if strings.Contains(tc.path, "chat") {
				wantPrefix = "chatcmpl-"
			}
			if !strings.HasPrefix(got.RequestID, wantPrefix) || rec.Header().Get("X-Request-Id") != got.RequestID {
				t.Errorf("request id %q, header %q", got.RequestID, rec.Header().Get("X-Request-Id"))
			}
		})
	}
}

func TestEcho(t *testing.T) {
	e := newEnv(t, nil)
	cases := []struct {
		name   string
		prompt any
		echo   string
		ids    []int32
	}{
		{"text", "the cat sat", "the cat sat", promptIDs(e.tok, "the cat sat")},
		{"ids", []int{7, 8, 9}, " the cat sat", []int32{7, 8, 9}},
	}
	for _, tc := range cases {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stream=%v", tc.name, stream), func(t *testing.T) {
				res := e.generate(t, "/v1/completions", map[string]any{"prompt": tc.prompt, "echo": true,
					"max_tokens": 5, "temperature": 0, "stream": stream})
				gen, _, _ := greedyRef(e.tok, tc.ids, 5, nil)
				if res.text[0] != tc.echo+gen {
					t.Errorf("text %q, want %q", res.text[0], tc.echo+gen)
				}
			})
		}
	}
}

func TestCachedPromptTokens(t *testing.T) {
	e := newEnv(t, nil)
	e.eng.cached = 3
	for _, stream := range []bool{false, true} {
		body := map[string]any{"messages": userMsg("the cat"), "max_tokens": 2, "stream": stream}
		if stream {
			body["stream_options"] = map[string]any{"include_usage": true}
		}
		res := e.generate(t, "/v1/chat/completions", body)
		if d := res.usage.PromptTokensDetails; d == nil || d.CachedTokens != 3 {
			t.Errorf("stream=%v: prompt_tokens_details %+v, want cached 3", stream, d)
		}
	}
}

// TestEngineErrors covers errors from Generate and from events.
func TestEngineErrors(t *testing.T) {
	boom := errors.New("device lost")
	cases := []struct {
		name    string
		setup   func(*fakeEngine)
		stream  bool
		status  int
		errType string
		msg     string
		chunks  int // streamed: content chunks expected before the error event
	}{
		{"queue full", func(f *fakeEngine) { f.genErr = ErrQueueFull }, false, 429, "rate_limit_error", "capacity", 0},
		{"queue full stream", func(f *fakeEngine) { f.genErr = ErrQueueFull }, true, 429, "rate_limit_error", "capacity", 0},
		{"not ready from engine", func(f *fakeEngine) { f.genErr = ErrNotReady }, false, 503, "service_unavailable_error", "not ready", 0},
		{"not ready flag", func(f *fakeEngine) { f.ready.Store(false) }, false, 503, "service_unavailable_error", "not ready", 0},
		{"engine bad request", func(f *fakeEngine) { f.genErr = fmt.Errorf("%w: needs 900 blocks, cache has 800", ErrBadRequest) },
			false, 400, "invalid_request_error", "needs 900 blocks", 0},
		{"engine bad request, streamed", func(f *fakeEngine) { f.genErr = fmt.Errorf("%w: needs 900 blocks, cache has 800", ErrBadRequest) },
			true, 400, "invalid_request_error", "needs 900 blocks", 0},
		{"bad request mid-stream", func(f *fakeEngine) {
			f.failAfter, f.failErr = 3, fmt.Errorf("%w: no token is left to sample", ErrBadRequest)
		}, true, 200, "invalid_request_error", "no token is left to sample", 3},
		{"engine failure", func(f *fakeEngine) { f.genErr = boom }, false, 500, "server_error", "device lost", 0},
		{"mid-generation failure", func(f *fakeEngine) { f.failAfter, f.failErr = 3, boom }, false, 500, "server_error", "device lost", 0},
		{"mid-stream failure", func(f *fakeEngine) { f.failAfter, f.failErr = 3, boom }, true, 200, "server_error", "device lost", 3},
		{"failure before first chunk", func(f *fakeEngine) { f.failAfter, f.failErr, f.perEvent = 2, boom, 10 }, true, 500, "server_error", "device lost", 0},
		{"stream closed early", func(f *fakeEngine) { f.skipFinal = true }, false, 500, "server_error", "internal", 0},
		{"stream closed early, streaming", func(f *fakeEngine) { f.skipFinal = true }, true, 200, "server_error", "internal", 4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nil)
			tc.setup(e.eng)
			body := mustJSON(t, map[string]any{"prompt": "the cat", "max_tokens": 5, "stream": tc.stream, "temperature": 0})
			rec := e.do(t, "POST", "/v1/completions", body)
			if rec.Code != tc.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.status, rec.Body)
			}
			if tc.status != 200 {
				er := decodeError(t, rec)
				if er.Type != tc.errType || !strings.Contains(er.Message, tc.msg) {
					t.Errorf("error %+v, want type %s containing %q", er, tc.errType, tc.msg)
				}
				// The 400 and the type say it is a bad request already.
				if strings.HasPrefix(er.Message, "bad request") {
					t.Errorf("message %q: want it without the \"bad request: \" prefix", er.Message)
				}
				return
			}
			// Streamed: content chunks, then data: {"error": ...}, then [DONE].
			events := parseSSE(t, rec.Body.String())
			if len(events) != tc.chunks+1 {
				t.Fatalf("%d events, want %d content chunks and an error: %s", len(events), tc.chunks, rec.Body)
			}
			var ev struct {
				Error apiErr `json:"error"`
			}
			strict(t, events[len(events)-1], &ev)
			if ev.Error.Type != tc.errType || !strings.Contains(ev.Error.Message, tc.msg) || strings.HasPrefix(ev.Error.Message, "bad request") {
				t.Errorf("error event %+v, want type %s containing %q, without a \"bad request: \" prefix", ev.Error, tc.errType, tc.msg)
			}
		})
	}
}

func TestHealth(t *testing.T) {
	e := newEnv(t, nil)
	for _, ready := range []bool{true, false} {
		e.eng.ready.Store(ready)
		for _, method := range []string{"GET", "HEAD"} {
			rec := e.do(t, method, "/health", "")
			want := 200
			if !ready {
				want = 503
			}
			if rec.Code != want {
				t.Errorf("%s ready=%v: status %d, want %d", method, ready, rec.Code, want)
			}
		}
	}
}
