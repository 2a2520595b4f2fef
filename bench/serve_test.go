package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/trigon-llm/trigon/telemetry"
)

// fakeServer is a minimal streaming /v1/completions server. It checks
// each request's body, streams max_tokens one-token chunks (with the
// given gap), a usage chunk and [DONE], and serves /tokenize. fail decides,
// per request number, to misbehave in one of several ways.
type fakeServer struct {
	t        *testing.T
	gap      time.Duration
	vocab    []int32
	fail     func(n int) string // "", "status", "no-done", "error-event", "hang"
	apiKey   string
	n        atomic.Int64
	inFlight atomic.Int64
	peak     atomic.Int64
	mu       sync.Mutex
	prompts  [][]int32
	texts    []string // text prompts, in arrival order
	maxToks  []int
	// honorEOS is the ignore_eos the requests must carry, negated; a
	// request without ignore_eos ends at its eosAt-th token (0: never).
	honorEOS bool
	eosAt    int
	// metrics, when set, is served on /metrics; each token streamed
	// records one decode step of 1 ms on the host and 10 ms on the device.
	metrics *telemetry.Metrics
}

func (f *fakeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if f.apiKey != "" && r.Header.Get("Authorization") != "Bearer "+f.apiKey {
		http.Error(w, `{"error":{"message":"bad key"}}`, http.StatusUnauthorized)
		return
	}
	switch r.URL.Path {
	case "/metrics":
		f.metrics.Handler().ServeHTTP(w, r) // a nil *Metrics serves 404
		return
	case "/tokenize":
		var req struct {
			Prompt string `json:"prompt"`
		}
		json.NewDecoder(r.Body).Decode(&req)
		if req.Prompt == "" {
			http.Error(w, "no prompt", http.StatusBadRequest)
			return
		}
		json.NewEncoder(w).Encode(map[string]any{"tokens": append(f.vocab, f.vocab...)}) // duplicates on purpose
		return
	case "/v1/completions":
	default:
		http.NotFound(w, r)
		return
	}
	cur := f.inFlight.Add(1)
	defer f.inFlight.Add(-1)
	for {
		p := f.peak.Load()
		if cur <= p || f.peak.CompareAndSwap(p, cur) {
			break
		}
	}
	var req struct {
		Prompt        json.RawMessage `json:"prompt"`
		MaxTokens     int             `json:"max_tokens"`
		Stream        bool            `json:"stream"`
		IgnoreEOS     bool            `json:"ignore_eos"`
		Temperature   *float64        `json:"temperature"`
		StreamOptions map[string]bool `json:"stream_options"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		f.t.Errorf("bad request body: %v", err)
		return
	}
	if !req.Stream || req.IgnoreEOS == f.honorEOS || req.Temperature == nil || *req.Temperature != 0 || !req.StreamOptions["include_usage"] || req.MaxTokens < 1 {
		f.t.Errorf("request not a greedy stream with usage and ignore_eos %v: %+v", !f.honorEOS, req)
	}
	// A text prompt counts a token per word, in the usage chunk.
	var ids []int32
	var text string
	promptTokens := 0
	if err := json.Unmarshal(req.Prompt, &text); err == nil {
		promptTokens = len(strings.Fields(text))
	} else if err := json.Unmarshal(req.Prompt, &ids); err == nil {
		promptTokens = len(ids)
	} else {
		f.t.Errorf("prompt %s is neither text nor token ids", req.Prompt)
	}
	f.mu.Lock()
	if ids != nil {
		f.prompts = append(f.prompts, ids)
	} else {
		f.texts = append(f.texts, text)
	}
	f.maxToks = append(f.maxToks, req.MaxTokens)
	f.mu.Unlock()
	n := req.MaxTokens
	if !req.IgnoreEOS && f.eosAt > 0 {
		n = min(n, f.eosAt)
	}
	mode := ""
	if f.fail != nil {
		mode = f.fail(int(f.n.Add(1)) - 1)
	}
	if mode == "status" {
		http.Error(w, `{"error":{"message":"overloaded"}}`, http.StatusTooManyRequests)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	send := func(v string) {
		fmt.Fprintf(w, "data: %s\n\n", v)
		fl.Flush()
	}
	// A role-less empty chunk and a comment first: neither is a token.
	send(`{"choices":[{"index":0,"text":""}],"usage":null}`)
	fmt.Fprint(w, ": keep-alive\n\n")
	for i := range n {
		time.Sleep(f.gap)
		if mode == "error-event" && i == 1 {
			send(`{"error":{"message":"engine failed"}}`)
			send("[DONE]")
			return
		}
		if mode == "hang" {
			<-r.Context().Done()
			return
		}
		f.metrics.ObserveStepHost(telemetry.StepDecode, false, time.Millisecond)
		f.metrics.ObserveStepDevice(telemetry.StepDecode, false, 10*time.Millisecond)
		f.metrics.ObserveIterationTokens(1)
		send(fmt.Sprintf(`{"choices":[{"index":0,"text":"t%d","finish_reason":null}],"usage":null}`, i))
	}
	if mode == "no-done" {
		return
	}
	send(fmt.Sprintf(`{"choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d}}`, promptTokens, n))
	send("[DONE]")
}

func TestRunServeFakeServer(t *testing.T) {
	f := &fakeServer{t: t, gap: 2 * time.Millisecond, vocab: []int32{7, 11, 300, 4001}, apiKey: "k1", metrics: telemetry.NewMetrics()}
	// Steps before the run are not the run's.
	for range 7 {
		f.metrics.ObserveStepHost(telemetry.StepDecode, false, time.Second)
		f.metrics.ObserveStepDevice(telemetry.StepPrefill, true, time.Second)
		f.metrics.ObserveIterationTokens(100)
	}
	hs := httptest.NewServer(f)
	defer hs.Close()
	in, _ := ParseLengthDist("uniform:3-9")
	out, _ := ParseLengthDist("uniform:2-6")
	var done atomic.Int64
	res, err := RunServe(context.Background(), ServeOptions{
		URL: hs.URL, APIKey: "k1", Rate: 400, NumPrompts: 30, InputLen: in, OutputLen: out, Seed: 4,
		OnDone: func() { done.Add(1) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Completed != 30 || res.Failed != 0 || done.Load() != 30 {
		t.Fatalf("completed %d, failed %d (%v), progress calls %d", res.Completed, res.Failed, res.Errors, done.Load())
	}
	var wantIn, wantOut int64
	wantITL := 0
	for i, p := range f.prompts {
		wantIn += int64(len(p))
		wantOut += int64(f.maxToks[i])
		wantITL += f.maxToks[i] - 1
		if len(p) < 3 || len(p) > 9 || f.maxToks[i] < 2 || f.maxToks[i] > 6 {
			t.Errorf("request %d: %d prompt tokens, max_tokens %d; outside the distributions", i, len(p), f.maxToks[i])
		}
		for _, id := range p {
			if id != 7 && id != 11 && id != 300 && id != 4001 {
				t.Fatalf("prompt id %d not among the /tokenize ids", id)
			}
		}
	}
	if res.InputTokens != wantIn || res.OutputTokens != wantOut || res.ITLMS.Count != wantITL {
		t.Errorf("input %d, output %d tokens, %d ITLs; want %d, %d, %d", res.InputTokens, res.OutputTokens, res.ITLMS.Count, wantIn, wantOut, wantITL)
	}
	for _, s := range []Summary{res.TTFTMS, res.ITLMS, res.TPOTMS, res.E2EMS} {
		if !(s.Min <= s.P50 && s.P50 <= s.P90 && s.P90 <= s.P99 && s.P99 <= s.Max) {
			t.Errorf("summary not ordered: %+v", s)
		}
	}
	// The server sleeps 2 ms before each token, so the first comes after
	// 2 ms and the stream ends after 2 ms per token (ITLs alone can be
	// shorter: a busy client reads queued chunks together).
	if res.TTFTMS.Min < 2 || res.E2EMS.Min < 2*2 {
		t.Errorf("TTFT min %g ms, E2E min %g ms: shorter than the server's 2 ms gaps allow", res.TTFTMS.Min, res.E2EMS.Min)
	}
	if itlSum, span := res.ITLMS.Mean*float64(res.ITLMS.Count), (res.E2EMS.Mean-res.TTFTMS.Mean)*float64(res.Completed); itlSum > span+1e-6 {
		t.Errorf("ITLs add up to %g ms, more than the %g ms between first tokens and stream ends", itlSum, span)
	}
	if got := float64(res.OutputTokens) / res.DurationS; math.Abs(res.OutputTokensPerS-got) > 1e-9*got {
		t.Errorf("output throughput %g, want tokens / duration %g", res.OutputTokensPerS, got)
	}
	raw, err := json.Marshal(res)
	if err != nil || !strings.Contains(string(raw), `"request_rate":400`) {
		t.Errorf("JSON %s: %v", raw, err)
	}
	st := res.Steps
	if st == nil || len(st.Groups) != 1 {
		t.Fatalf("step stats %+v: want the run's decode/eager steps only", st)
	}
	g := st.Groups[0]
	if g.Kind != "decode" || g.Mode != "eager" || g.HostMS.Count != uint64(wantOut) || g.DeviceMS.Count != uint64(wantOut) {
		t.Errorf("step group %+v: want %d decode eager steps", g, wantOut)
	}
	if math.Abs(g.DeviceMS.Mean-10) > 1e-9 || math.Abs(g.HostMS.Mean-1) > 1e-9 {
		t.Errorf("mean device %g ms, host %g ms; want 10 and 1", g.DeviceMS.Mean, g.HostMS.Mean)
	}
	// 10 ms sits in the bucket (9, 10] ms, 1 ms in (0.75, 1].
	if g.DeviceMS.P50 <= 9 || g.DeviceMS.P99 > 10 || g.HostMS.P50 <= 0.75 || g.HostMS.P99 > 1 {
		t.Errorf("percentiles outside the observations' buckets: %+v", g)
	}
	if st.TokensPerStep.Count != uint64(wantOut) || st.TokensPerStep.Mean != 1 {
		t.Errorf("tokens per step %+v: want %d steps of 1", st.TokensPerStep, wantOut)
	}
	var sb strings.Builder
	if err := res.WriteText(&sb); err != nil || !strings.Contains(sb.String(), "TTFT") || !strings.Contains(sb.String(), "decode   eager") {
		t.Errorf("text report %q: %v", sb.String(), err)
	}
}

// TestRunServeDataset: a custom dataset's prompts go out as text, request i
// taking prompt i mod len, each with the fixed max_tokens; input tokens are
// the server's usage counts; with HonorEOS a request may end early.
func TestRunServeDataset(t *testing.T) {
	prompts := []string{"package main", "func f() {\n\treturn\n}", "a b c d"}
	for _, tc := range []struct {
		name     string
		n        int
		honorEOS bool
		wantOut  int64 // output tokens in all
	}{
		{"one each", 3, false, 3 * 5},
		{"cycling", 7, false, 7 * 5},
		{"honor eos", 4, true, 4 * 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeServer{t: t, honorEOS: tc.honorEOS, eosAt: 2}
			hs := httptest.NewServer(f)
			defer hs.Close()
			res, err := RunServe(context.Background(), ServeOptions{
				URL: hs.URL, Rate: math.Inf(1), NumPrompts: tc.n, OutputLen: FixedLength(5), MaxConcurrency: 1,
				Prompts: prompts, Dataset: "edit.jsonl", HonorEOS: tc.honorEOS,
			})
			if err != nil {
				t.Fatal(err)
			}
			if res.Completed != tc.n || res.Failed != 0 {
				t.Fatalf("completed %d, failed %d (%v)", res.Completed, res.Failed, res.Errors)
			}
			if len(f.prompts) != 0 || len(f.texts) != tc.n {
				t.Fatalf("%d id prompts and %d text prompts reached the server, want 0 and %d", len(f.prompts), len(f.texts), tc.n)
			}
			var wantIn int64
			for i, text := range f.texts {
				if text != prompts[i%len(prompts)] || f.maxToks[i] != 5 {
					t.Errorf("request %d: prompt %q, max_tokens %d; want %q, 5", i, text, f.maxToks[i], prompts[i%len(prompts)])
				}
				wantIn += int64(len(strings.Fields(text)))
			}
			if res.InputTokens != wantIn || res.OutputTokens != tc.wantOut {
				t.Errorf("input %d, output %d tokens; want %d, %d", res.InputTokens, res.OutputTokens, wantIn, tc.wantOut)
			}
			if res.Dataset != "edit.jsonl" || res.IgnoreEOS == tc.honorEOS {
				t.Errorf("report says dataset %q, ignore_eos %v", res.Dataset, res.IgnoreEOS)
			}
			var sb strings.Builder
			if err := res.WriteText(&sb); err != nil || !strings.Contains(sb.String(), "prompts from edit.jsonl") {
				t.Errorf("text report %q: %v", sb.String(), err)
			}
		})
	}
}

func TestRunServeFailures(t *testing.T) {
	modes := []string{"", "status", "no-done", "error-event"}
	f := &fakeServer{t: t, vocab: []int32{1, 2, 3}, fail: func(n int) string { return modes[n%len(modes)] }}
	hs := httptest.NewServer(f)
	defer hs.Close()
	res, err := RunServe(context.Background(), ServeOptions{
		URL: hs.URL, Rate: math.Inf(1), NumPrompts: 12, InputLen: FixedLength(4), OutputLen: FixedLength(3),
		TokenIDs: []int32{1, 2}, MaxConcurrency: 1, // one at a time: request i gets mode i%4
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Completed != 3 || res.Failed != 9 {
		t.Errorf("completed %d, failed %d; want 3 and 9", res.Completed, res.Failed)
	}
	joined := strings.Join(res.Errors, "\n")
	for _, want := range []string{"status 429", "without data: [DONE]", "engine failed"} {
		if !strings.Contains(joined, want) {
			t.Errorf("errors %q do not mention %q", joined, want)
		}
	}
	if len(res.Errors) != 3 {
		t.Errorf("%d distinct errors kept, want 3: %q", len(res.Errors), res.Errors)
	}
	// The client counts a request done when it has read the response; the
	// server's handler may still be returning then, so the server can see
	// the next request start before the last one's handler ends: at most 2.
	if res.PeakInFlight != 1 || f.peak.Load() > 2 {
		t.Errorf("peak concurrency %d reported, %d at the server; want 1 (MaxConcurrency), at most 2 at the server", res.PeakInFlight, f.peak.Load())
	}
	for _, p := range f.prompts {
		for _, id := range p {
			if id != 1 && id != 2 {
				t.Fatalf("prompt id %d outside TokenIDs", id)
			}
		}
	}
}

// TestRunServeTimeout: a server that never finishes cannot hold the
// benchmark past its timeout; unfinished and unsent requests fail.
func TestRunServeTimeout(t *testing.T) {
	f := &fakeServer{t: t, vocab: []int32{1}, fail: func(int) string { return "hang" }}
	hs := httptest.NewServer(f)
	defer hs.Close()
	start := time.Now()
	res, err := RunServe(context.Background(), ServeOptions{
		URL: hs.URL, Rate: 20, NumPrompts: 50, InputLen: FixedLength(2), OutputLen: FixedLength(2),
		Timeout: 300 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("took %v with a 300 ms timeout", el)
	}
	if res.Completed != 0 || res.Failed != 50 {
		t.Errorf("completed %d, failed %d; want 0 and 50", res.Completed, res.Failed)
	}
	if !strings.Contains(strings.Join(res.Errors, " "), "not sent") {
		t.Errorf("errors %q: want unsent requests reported", res.Errors)
	}
}

func TestRunServeOptionErrors(t *testing.T) {
	ok := ServeOptions{URL: "http://127.0.0.1:1", Rate: 1, NumPrompts: 1, InputLen: FixedLength(1), OutputLen: FixedLength(1), TokenIDs: []int32{1}}
	for _, tc := range []struct {
		name   string
		change func(*ServeOptions)
		want   string
	}{
		{"ftp url", func(o *ServeOptions) { o.URL = "ftp://x" }, "URL"},
		{"no host", func(o *ServeOptions) { o.URL = "http://" }, "URL"},
		{"zero prompts", func(o *ServeOptions) { o.NumPrompts = 0 }, "prompts"},
		{"too many prompts", func(o *ServeOptions) { o.NumPrompts = MaxPrompts + 1 }, "prompts"},
		{"zero rate", func(o *ServeOptions) { o.Rate = 0 }, "rate"},
		{"NaN rate", func(o *ServeOptions) { o.Rate = math.NaN() }, "rate"},
		{"no lengths", func(o *ServeOptions) { o.InputLen = LengthDist{} }, "length"},
		{"negative concurrency", func(o *ServeOptions) { o.MaxConcurrency = -1 }, "concurrency"},
		{"negative id", func(o *ServeOptions) { o.TokenIDs = []int32{-4} }, "token id"},
		{"empty dataset", func(o *ServeOptions) { o.Prompts = []string{} }, "no prompts"},
		{"dataset without output length", func(o *ServeOptions) { o.Prompts, o.OutputLen = []string{"x"}, LengthDist{} }, "length"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := ok
			tc.change(&o)
			_, err := RunServe(context.Background(), o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one mentioning %q", err, tc.want)
			}
		})
	}
	t.Run("no tokenize endpoint", func(t *testing.T) {
		hs := httptest.NewServer(http.NotFoundHandler())
		defer hs.Close()
		o := ok
		o.URL, o.TokenIDs = hs.URL, nil
		_, err := RunServe(context.Background(), o)
		if err == nil || !strings.Contains(err.Error(), "--token-ids") {
			t.Errorf("error %v, want a hint to pass --token-ids", err)
		}
	})
}

// TestReadStreamOversizedLine: a chunk longer than the line limit fails
// the request instead of growing the buffer without bound.
func TestReadStreamOversizedLine(t *testing.T) {
	body := io.MultiReader(strings.NewReader("data: "), strings.NewReader(strings.Repeat("x", maxSSELine+10)))
	err := readStream(body, time.Now(), &serveRequest{})
	if err == nil {
		t.Fatal("accepted an oversized line")
	}
}

// TestRunSweepFreshPrompts: each point of a sweep sends prompts of its own
// (random ones drawn with seed+i, a dataset's taken from where the last
// point stopped), so a server's prefix cache cannot serve a later point's
// prompts from an earlier one's; point i reports its seed.
func TestRunSweepFreshPrompts(t *testing.T) {
	t.Run("random", func(t *testing.T) {
		vocab := make([]int32, 500)
		for i := range vocab {
			vocab[i] = int32(i + 1)
		}
		f := &fakeServer{t: t, vocab: vocab}
		hs := httptest.NewServer(f)
		defer hs.Close()
		sw, err := RunSweep(context.Background(), ServeOptions{
			URL: hs.URL, Rate: 1, NumPrompts: 5, InputLen: FixedLength(20), OutputLen: FixedLength(2), Seed: 9,
		}, []float64{1000, 2000, 4000}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(f.prompts) != 15 {
			t.Fatalf("%d prompts reached the server, want 15", len(f.prompts))
		}
		seen := map[string]int{}
		for i, p := range f.prompts {
			k := fmt.Sprint(p)
			if j, ok := seen[k]; ok {
				t.Errorf("requests %d and %d sent the same prompt %v", j, i, p)
			}
			seen[k] = i
		}
		for i, p := range sw.Points {
			if p.Seed != 9+uint64(i) || p.Completed != 5 {
				t.Errorf("point %d: seed %d, %d completed; want seed %d, 5", i, p.Seed, p.Completed, 9+i)
			}
		}
	})
	t.Run("dataset", func(t *testing.T) {
		prompts := []string{"a", "b", "c", "d", "e", "f", "g"}
		f := &fakeServer{t: t}
		hs := httptest.NewServer(f)
		defer hs.Close()
		if _, err := RunSweep(context.Background(), ServeOptions{
			URL: hs.URL, Rate: 1, NumPrompts: 3, OutputLen: FixedLength(2), MaxConcurrency: 1, Prompts: prompts,
		}, []float64{1000, 2000, 4000}, nil); err != nil {
			t.Fatal(err)
		}
		// One request in flight at a time: they reach the server in order.
		if got, want := strings.Join(f.texts, ""), "abcdefgab"; got != want {
			t.Errorf("prompts sent %q, want %q", got, want)
		}
	})
}
