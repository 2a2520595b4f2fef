package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/trigon-llm/trigon/api"
	"github.com/trigon-llm/trigon/backend/cpu"
	"github.com/trigon-llm/trigon/engine"
	"github.com/trigon-llm/trigon/telemetry"
)

const fixtureModel = "../../testdata/models/llama3"

// startServer serves the fixture model over HTTP on loopback.
func startServer(t *testing.T, opts engine.LoadOptions) (*httptest.Server, *engine.Loaded) {
	t.Helper()
	opts.Model = fixtureModel
	opts.Backend = cpu.New(cpu.Options{Threads: 2})
	l, err := engine.Load(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.Engine.Run(ctx) }()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	eng := &apiEngine{}
	eng.l.Store(l)
	srv, err := api.New(api.Options{Engine: eng, Tokenizer: apiTokenizer{l.Tokenizer},
		Model: api.ModelInfo{ID: "fixture", MaxContext: l.Context}, Metrics: telemetry.NewMetrics(), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() { hs.Close(); cancel(); <-done; l.Close() })
	return hs, l
}

type completion struct {
	text   string
	finish string
}

// complete posts a greedy completion; with stream it reads SSE, fails on
// an error event and, when cancelAfter >= 0, drops the connection after
// that many chunks. started, when not nil, is closed once the first chunk
// has arrived (or the request has failed).
func complete(ctx context.Context, url string, prompt []int32, maxTokens int, stream bool, cancelAfter int, started chan<- struct{}) (completion, error) {
	notify := func() {}
	if started != nil {
		notify = sync.OnceFunc(func() { close(started) })
	}
	defer notify()
	body, _ := json.Marshal(map[string]any{
		"prompt": prompt, "max_tokens": maxTokens, "temperature": 0, "ignore_eos": true, "stream": stream,
	})
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return completion{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		return completion{}, fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	if !stream {
		var r struct {
			Choices []struct {
				Text         string `json:"text"`
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
			return completion{}, err
		}
		return completion{r.Choices[0].Text, r.Choices[0].FinishReason}, nil
	}
	var c completion
	sc := bufio.NewScanner(resp.Body)
	chunks := 0
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			return c, fmt.Errorf("bad SSE line %q", line)
		}
		if data == "[DONE]" {
			return c, nil
		}
		var ch struct {
			Error   json.RawMessage `json:"error"`
			Choices []struct {
				Text         string  `json:"text"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			return c, fmt.Errorf("bad chunk %q: %w", data, err)
		}
		if ch.Error != nil {
			return c, fmt.Errorf("stream error: %s", ch.Error)
		}
		for _, x := range ch.Choices {
			c.text += x.Text
			if x.FinishReason != nil {
				c.finish = *x.FinishReason
			}
		}
		notify()
		chunks++
		if cancelAfter >= 0 && chunks > cancelAfter {
			return c, context.Canceled
		}
	}
	return c, fmt.Errorf("stream ended without [DONE]: %v", sc.Err())
}

// TestLoopbackLoad: 200 requests, 32 concurrent streams of mixed lengths, a
// random 20% cancelled mid-stream. Every other greedy output equals the
// same request run alone, and afterwards every KV block is free again.
func TestLoopbackLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("load test")
	}
	hs, l := startServer(t, engine.LoadOptions{MaxSeqs: 32, MaxBatchedTokens: 512, ChunkSize: 128})
	freeBefore := freeBlocks(t, l)
	rng := rand.New(rand.NewPCG(11, 12))
	const n = 200
	type job struct {
		prompt []int32
		max    int
		cancel int
		want   completion
	}
	jobs := make([]job, n)
	for i := range jobs {
		jobs[i].prompt = make([]int32, 1+rng.IntN(200))
		for j := range jobs[i].prompt {
			jobs[i].prompt[j] = int32(2 + rng.IntN(500))
		}
		jobs[i].max = 1 + rng.IntN(32)
		jobs[i].cancel = -1
		if rng.Float64() < 0.2 {
			jobs[i].cancel = rng.IntN(jobs[i].max)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for i := range jobs {
		if jobs[i].cancel >= 0 {
			continue
		}
		c, err := complete(ctx, hs.URL, jobs[i].prompt, jobs[i].max, false, -1, nil)
		if err != nil {
			t.Fatalf("job %d alone: %v", i, err)
		}
		jobs[i].want = c
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for i := range jobs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			j := jobs[i]
			got, err := complete(ctx, hs.URL, j.prompt, j.max, true, j.cancel, nil)
			if j.cancel >= 0 {
				if err != context.Canceled && err != nil {
					t.Errorf("job %d (cancelled after %d chunks): %v", i, j.cancel, err)
				}
				return
			}
			if err != nil {
				t.Errorf("job %d: %v", i, err)
				return
			}
			if got != j.want {
				t.Errorf("job %d streamed under load: %+v; alone: %+v", i, got, j.want)
			}
		}()
	}
	wg.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for l.Engine.Busy() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := freeBlocks(t, l); got != freeBefore {
		t.Errorf("free KV blocks after the load: %d, before: %d", got, freeBefore)
	}
}

func freeBlocks(t *testing.T, l *engine.Loaded) int {
	t.Helper()
	return l.Engine.Stats().FreeBlocks
}

// TestServeLifecycle: /health answers 503 while the model loads and 200
// after; requests are served; cancelling the context drains and returns.
func TestServeLifecycle(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	release := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- serve(ctx, ln, serveOptions{
			name: "fixture", shutdown: 5 * time.Second, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
			modelPath: func() (string, error) { return fixtureModel, nil },
			load: func(m *telemetry.Metrics) (*engine.Loaded, func(), error) {
				<-release // the model is "loading" until the test says so
				l, err := engine.Load(engine.LoadOptions{Model: fixtureModel, Backend: cpu.New(cpu.Options{Threads: 2}), Metrics: m})
				if err != nil {
					return nil, nil, err
				}
				rctx, stop := context.WithCancel(context.Background())
				ran := make(chan struct{})
				go func() { defer close(ran); l.Engine.Run(rctx) }()
				return l, func() { stop(); <-ran; l.Close() }, nil
			},
		})
	}()
	health := func() int {
		for range 100 {
			resp, err := http.Get(url + "/health")
			if err == nil {
				resp.Body.Close()
				return resp.StatusCode
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatal("server never answered")
		return 0
	}
	if code := health(); code != http.StatusServiceUnavailable {
		t.Fatalf("/health while loading: %d, want 503", code)
	}
	close(release)
	deadline := time.Now().Add(10 * time.Second)
	for health() != http.StatusOK {
		if time.Now().After(deadline) {
			t.Fatal("/health never became 200")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := complete(context.Background(), url, []int32{5, 6, 7}, 4, false, -1, nil); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not return after cancel")
	}
}

// TestExtremeSamplingValues: sampling values at the edges of what the API
// accepts are served (200), not failed inside the engine (500), and values
// the API refuses are refused with a 400 naming the field. The engine
// computes in float32, so float64 values that are valid JSON and in range
// may lie outside float32's.
func TestExtremeSamplingValues(t *testing.T) {
	hs, _ := startServer(t, engine.LoadOptions{})
	// A prompt of repeated tokens, so the repetition penalty has tokens
	// to act on; sampling, so the penalised logits are read.
	prompt := make([]int32, 24)
	for i := range prompt {
		prompt[i] = int32(10 + i%6)
	}
	for _, tc := range []struct {
		name   string
		params map[string]any
		status int
		param  string // the field a 400 names
	}{
		{"repetition_penalty below float32", map[string]any{"repetition_penalty": 1e-50}, 200, ""},
		{"repetition_penalty subnormal", map[string]any{"repetition_penalty": 1e-40}, 200, ""},
		{"repetition_penalty tiny", map[string]any{"repetition_penalty": 1e-38}, 200, ""},
		{"repetition_penalty tiny, low temperature", map[string]any{"repetition_penalty": 1e-38, "temperature": 1e-4}, 200, ""},
		{"repetition_penalty tiny, greedy", map[string]any{"repetition_penalty": 1e-38, "temperature": 0}, 200, ""},
		{"repetition_penalty at the cap", map[string]any{"repetition_penalty": 10}, 200, ""},
		{"top_p below float32", map[string]any{"top_p": 1e-50}, 200, ""},
		{"top_p subnormal", map[string]any{"top_p": 1e-40}, 200, ""},
		{"min_p below float32", map[string]any{"min_p": 1e-50}, 200, ""},
		{"temperature below float32", map[string]any{"temperature": 1e-50}, 200, ""},
		{"top_p zero", map[string]any{"top_p": 0}, 400, "top_p"},
		{"repetition_penalty zero", map[string]any{"repetition_penalty": 0}, 400, "repetition_penalty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := map[string]any{"prompt": prompt, "max_tokens": 4, "temperature": 1, "seed": 1}
			for k, v := range tc.params {
				body[k] = v
			}
			b, _ := json.Marshal(body)
			resp, err := http.Post(hs.URL+"/v1/completions", "application/json", bytes.NewReader(b))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status {
				t.Fatalf("%s: status %d, want %d: %s", b, resp.StatusCode, tc.status, raw)
			}
			if tc.status != 200 {
				var e struct {
					Error struct {
						Param *string `json:"param"`
					} `json:"error"`
				}
				if err := json.Unmarshal(raw, &e); err != nil || e.Error.Param == nil || *e.Error.Param != tc.param {
					t.Errorf("%s: error %s does not name param %q", b, raw, tc.param)
				}
			}
		})
	}
}

// TestUnsamplableRequestFailsAlone: a request whose constraints leave no
// token to sample (JSON mode allows only EOS once the object is complete,
// min_tokens forbids EOS, stop_token_ids forbid the whitespace JSON allows
// before the object) is refused as the client's (400), and the requests
// that share its steps go on untouched.
func TestUnsamplableRequestFailsAlone(t *testing.T) {
	hs, _ := startServer(t, engine.LoadOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	prompt := []int32{10, 11, 12, 13}
	want, err := complete(ctx, hs.URL, prompt, 300, false, -1, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The fixture tokenizer's whitespace-only tokens.
	whitespace := []int32{201, 202, 205, 224, 494}
	refused := 0
	for seed := range 4 {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			victim := make(chan error, 1)
			started := make(chan struct{})
			go func() {
				got, err := complete(ctx, hs.URL, prompt, 300, true, -1, started)
				if err == nil && got != want {
					err = fmt.Errorf("streamed %+v; alone %+v", got, want)
				}
				victim <- err
			}()
			<-started
			body, _ := json.Marshal(map[string]any{
				"prompt": []int32{20, 21, 22}, "max_tokens": 200, "min_tokens": 190, "seed": seed,
				"response_format": map[string]string{"type": "json_object"}, "stop_token_ids": whitespace,
			})
			resp, err := http.Post(hs.URL+"/v1/completions", "application/json", bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			switch resp.StatusCode {
			case 200: // the object never closed before max_tokens
			case 400:
				refused++
			default:
				t.Errorf("constrained request: status %d, want 200 or 400: %s", resp.StatusCode, raw)
			}
			if err := <-victim; err != nil {
				t.Errorf("the request beside it: %v", err)
			}
		})
	}
	if refused == 0 {
		t.Error("no seed closed the object before min_tokens: nothing was checked")
	}
}
