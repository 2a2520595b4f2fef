package bench

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Limits of a serving benchmark, so a typo cannot start an unbounded run.
const (
	MaxPrompts    = 1_000_000
	maxErrorsKept = 10
	maxSSELine    = 4 << 20 // one SSE line (a chunk) may not exceed this
	maxErrorBody  = 512
)

// ServeOptions configure RunServe.
type ServeOptions struct {
	// URL is the server's base URL (http or https), e.g.
	// http://127.0.0.1:8000; requests go to URL/v1/completions.
	URL    string
	Model  string // "model" field of each request; empty: omitted
	APIKey string // sent as a Bearer token when set
	// Rate is the mean request rate (requests/s) of Poisson arrivals;
	// +Inf sends every request at once.
	Rate       float64
	NumPrompts int
	InputLen   LengthDist // random prompts' lengths (unused with Prompts)
	OutputLen  LengthDist
	Seed       uint64
	// Prompts, when set, are sent as text instead of random token ids,
	// request i taking Prompts[i mod len(Prompts)] (a custom dataset:
	// LoadCustomDataset); Dataset names them in the report.
	Prompts []string
	Dataset string
	// HonorEOS sends ignore_eos false, so that a request may end at the
	// model's end of text before max_tokens. By default every request runs
	// to max_tokens, so two runs of the same prompts produce the same
	// number of tokens whatever the server does.
	HonorEOS bool
	// MaxConcurrency caps requests in flight (0: no cap).
	MaxConcurrency int
	// Timeout bounds the whole run; requests still running or not yet sent
	// then count as failed. 0: 30 minutes.
	Timeout time.Duration
	// TokenIDs are the ids prompts are drawn from. Empty: ask the server's
	// /tokenize for the ids of a fixed English text (trigon and vLLM
	// serve it), so every id is valid in its vocabulary.
	TokenIDs []int32
	// Client is the HTTP client (nil: one sized for NumPrompts
	// connections, without a client-side timeout: streams are long).
	Client *http.Client
	// OnDone, when set, is called after each request finishes (progress).
	OnDone func()
	// Goodput, when set, counts the completed requests that meet every
	// objective and reports them per second (ServeResult.RequestGoodput).
	Goodput SLOs
}

// Rate is a request rate that prints +Inf as "inf" in JSON.
type Rate float64

// MarshalJSON implements json.Marshaler.
func (r Rate) MarshalJSON() ([]byte, error) {
	if math.IsInf(float64(r), 1) {
		return []byte(`"inf"`), nil
	}
	return json.Marshal(float64(r))
}

// ParseRate reads a request rate: a positive number or "inf".
func ParseRate(s string) (float64, error) {
	if strings.EqualFold(strings.TrimSpace(s), "inf") {
		return math.Inf(1), nil
	}
	r, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || !(r > 0) || math.IsInf(r, 0) {
		return 0, fmt.Errorf("request rate %q: want a positive number of requests per second or inf", s)
	}
	return r, nil
}

// ServeResult is what `trigon bench serve` reports. Latencies are in
// milliseconds; TTFT runs from sending the request to the first chunk
// with text, ITL between successive chunks with text (a chunk usually
// carries one token), TPOT is a request's (E2E - TTFT) / (output tokens -
// 1), E2E runs to the end of the stream.
type ServeResult struct {
	Benchmark      string     `json:"benchmark"` // "serve"
	URL            string     `json:"url"`
	Model          string     `json:"model"`
	RequestRate    Rate       `json:"request_rate"`
	NumPrompts     int        `json:"num_prompts"`
	Dataset        string     `json:"dataset"` // "random" or the custom dataset's path
	IgnoreEOS      bool       `json:"ignore_eos"`
	InputLen       LengthDist `json:"input_len"`
	OutputLen      LengthDist `json:"output_len"`
	MaxConcurrency int        `json:"max_concurrency"` // 0: no cap
	Seed           uint64     `json:"seed"`

	Completed    int      `json:"completed"`
	Failed       int      `json:"failed"`
	Errors       []string `json:"errors"` // the first few distinct failures
	DurationS    float64  `json:"duration_s"`
	PeakInFlight int      `json:"peak_in_flight"`
	InputTokens  int64    `json:"input_tokens"`  // of completed requests
	OutputTokens int64    `json:"output_tokens"` // of completed requests
	RequestsPerS float64  `json:"request_throughput"`
	// With ServeOptions.Goodput: the objectives, the completed requests
	// that met them all, and those per second.
	GoodputSLOMS     SLOs     `json:"goodput_slo_ms,omitempty"`
	GoodRequests     *int     `json:"good_requests,omitempty"`
	RequestGoodput   *float64 `json:"request_goodput,omitempty"`
	OutputTokensPerS float64  `json:"output_token_throughput"`
	TotalTokensPerS  float64  `json:"total_token_throughput"`

	TTFTMS Summary `json:"ttft_ms"`
	ITLMS  Summary `json:"itl_ms"`
	TPOTMS Summary `json:"tpot_ms"`
	E2EMS  Summary `json:"e2e_ms"`

	// Steps are the server's engine-step times over the run, from its
	// /metrics before and after (nil where it exports none).
	Steps *StepStats `json:"steps,omitempty"`
}

// serveRequest is one planned request and, afterwards, what happened.
type serveRequest struct {
	at        time.Duration // send time after the start
	prompt    []int32
	text      string // a dataset's prompt, sent instead of prompt when set
	maxTokens int

	promptTokens int // len(prompt), or for a text prompt the server's usage count

	err       error
	ttft, e2e time.Duration
	itl       []time.Duration
	outTokens int
}

// RunServe sends NumPrompts streaming completions to a running server on
// a Poisson schedule and measures them. A failed request is counted, not
// fatal; RunServe errors only on bad options or when no request could be
// planned.
func RunServe(ctx context.Context, o ServeOptions) (*ServeResult, error) {
	base, err := checkServeOptions(&o)
	if err != nil {
		return nil, err
	}
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	client := o.Client
	if client == nil {
		client = &http.Client{Transport: &http.Transport{
			Proxy: nil, MaxIdleConns: o.NumPrompts, MaxIdleConnsPerHost: o.NumPrompts,
			IdleConnTimeout: 90 * time.Second, ResponseHeaderTimeout: 0,
		}}
	}
	pool := o.TokenIDs
	if o.Prompts == nil && len(pool) == 0 {
		if pool, err = tokenPool(ctx, client, base, o); err != nil {
			return nil, err
		}
	}
	rng := rand.New(rand.NewPCG(o.Seed, 0x7365_7276_65))
	reqs := planRequests(o, pool, rng)
	// A server without /metrics (or without trigon's step series) is
	// measured all the same; its report has no step section.
	before, beforeErr := fetchMetrics(ctx, client, base, o.APIKey)

	res := &ServeResult{
		Benchmark: "serve", URL: o.URL, Model: o.Model, RequestRate: Rate(o.Rate), NumPrompts: o.NumPrompts,
		Dataset: "random", IgnoreEOS: !o.HonorEOS, InputLen: o.InputLen, OutputLen: o.OutputLen,
		MaxConcurrency: o.MaxConcurrency, Seed: o.Seed, Errors: []string{}, GoodputSLOMS: o.Goodput,
	}
	if o.Prompts != nil {
		res.Dataset = cmp.Or(o.Dataset, "custom")
	}
	var sem chan struct{}
	if o.MaxConcurrency > 0 {
		sem = make(chan struct{}, o.MaxConcurrency)
	}
	var mu sync.Mutex
	inFlight := 0
	var wg sync.WaitGroup
	start := time.Now()
	endpoint := base.JoinPath("v1", "completions").String()
	for _, rq := range reqs {
		if d := time.Until(start.Add(rq.at)); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
			}
		}
		if sem != nil {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
			}
		}
		if err := ctx.Err(); err != nil {
			// Past the deadline nothing more is sent (a semaphore slot
			// taken just now no longer matters).
			rq.err = fmt.Errorf("not sent: %w", err)
			if o.OnDone != nil {
				o.OnDone()
			}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			mu.Lock()
			inFlight++
			res.PeakInFlight = max(res.PeakInFlight, inFlight)
			mu.Unlock()
			sendCompletion(ctx, client, endpoint, o, rq)
			mu.Lock()
			inFlight--
			mu.Unlock()
			if sem != nil {
				<-sem
			}
			if o.OnDone != nil {
				o.OnDone()
			}
		}()
	}
	wg.Wait()
	res.DurationS = time.Since(start).Seconds()
	summarizeServe(res, reqs)
	if beforeErr == nil {
		if after, err := settledMetrics(parent, client, base, o.APIKey); err == nil {
			res.Steps = stepStats(before, after)
		}
	}
	return res, nil
}

func checkServeOptions(o *ServeOptions) (*url.URL, error) {
	u, err := url.Parse(o.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("bench serve: URL %q: want http(s)://host:port", o.URL)
	}
	switch {
	case o.NumPrompts < 1 || o.NumPrompts > MaxPrompts:
		return nil, fmt.Errorf("bench serve: %d prompts outside 1..%d", o.NumPrompts, MaxPrompts)
	case !(o.Rate > 0):
		return nil, fmt.Errorf("bench serve: request rate %g must be positive (or +Inf)", o.Rate)
	case (o.Prompts == nil && o.InputLen.kind == "") || o.OutputLen.kind == "":
		return nil, errors.New("bench serve: input and output length distributions are required")
	case o.Prompts != nil && len(o.Prompts) == 0:
		return nil, errors.New("bench serve: the dataset has no prompts")
	case o.MaxConcurrency < 0:
		return nil, fmt.Errorf("bench serve: max concurrency %d is negative", o.MaxConcurrency)
	case o.Timeout < 0:
		return nil, fmt.Errorf("bench serve: timeout %v is negative", o.Timeout)
	}
	if o.Timeout == 0 {
		o.Timeout = 30 * time.Minute
	}
	for _, id := range o.TokenIDs {
		if id < 0 {
			return nil, fmt.Errorf("bench serve: negative token id %d", id)
		}
	}
	return u, nil
}

// planRequests draws every request's lengths, prompt and send time up
// front, so the same seed gives the same workload whatever the server does.
func planRequests(o ServeOptions, pool []int32, rng *rand.Rand) []*serveRequest {
	reqs := make([]*serveRequest, o.NumPrompts)
	at := arrivals(o.NumPrompts, o.Rate, rng)
	for i := range reqs {
		if o.Prompts != nil {
			reqs[i] = &serveRequest{at: at[i], text: o.Prompts[i%len(o.Prompts)], maxTokens: o.OutputLen.Sample(rng)}
			continue
		}
		n := o.InputLen.Sample(rng)
		p := make([]int32, n)
		for j := range p {
			p[j] = pool[rng.IntN(len(pool))]
		}
		reqs[i] = &serveRequest{at: at[i], prompt: p, promptTokens: n, maxTokens: o.OutputLen.Sample(rng)}
	}
	return reqs
}

// arrivals returns n send times of a Poisson process of the given rate
// (exponential gaps of mean 1/rate, the first at 0); all 0 when rate is
// +Inf.
func arrivals(n int, rate float64, rng *rand.Rand) []time.Duration {
	at := make([]time.Duration, n)
	if math.IsInf(rate, 1) {
		return at
	}
	t := 0.0
	for i := 1; i < n; i++ {
		t += rng.ExpFloat64() / rate
		at[i] = time.Duration(t * float64(time.Second))
	}
	return at
}

// tokenSourceText is tokenized by the server to find valid prompt ids.
var tokenSourceText = strings.Join(strings.Fields(`
	the of and to in is was for on that with as by at from his her are this be or an
	which had not but were have they one all their there been has when who would more
	will into time year new first may some these two other people after many about
	over such most made only state city through world where between during while under
	number part system family water house music river school since early light game
	film known well used later both around three century against group before country
	small large began name second long found great without high place several called
	season being following series including government university national south north`), " ")

// tokenPool asks /tokenize for the distinct ids of tokenSourceText.
func tokenPool(ctx context.Context, client *http.Client, base *url.URL, o ServeOptions) ([]int32, error) {
	body := map[string]any{"prompt": tokenSourceText, "add_special_tokens": false}
	if o.Model != "" {
		body["model"] = o.Model
	}
	data, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base.JoinPath("tokenize").String(), bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("bench serve: tokenize: %w", err)
	}
	setHeaders(req, o.APIKey)
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("bench serve: tokenize (pass --token-ids LO-HI for servers without /tokenize): %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		return nil, fmt.Errorf("bench serve: tokenize: status %d: %s (pass --token-ids LO-HI for servers without /tokenize)", resp.StatusCode, b)
	}
	var tr struct {
		Tokens []int32 `json:"tokens"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&tr); err != nil {
		return nil, fmt.Errorf("bench serve: tokenize: %w", err)
	}
	seen := map[int32]bool{}
	var ids []int32
	for _, id := range tr.Tokens {
		if id >= 0 && !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return nil, errors.New("bench serve: tokenize returned no token ids")
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids, nil
}

func setHeaders(req *http.Request, apiKey string) {
	req.Header.Set("Content-Type", "application/json")
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
}

// sendCompletion runs one streaming completion and records its timings in
// rq (rq.err on failure).
func sendCompletion(ctx context.Context, client *http.Client, endpoint string, o ServeOptions, rq *serveRequest) {
	body := map[string]any{
		"prompt": rq.prompt, "max_tokens": rq.maxTokens, "temperature": 0, "ignore_eos": !o.HonorEOS,
		"stream": true, "stream_options": map[string]bool{"include_usage": true},
	}
	if rq.text != "" {
		body["prompt"] = rq.text
	}
	if o.Model != "" {
		body["model"] = o.Model
	}
	data, err := json.Marshal(body)
	if err != nil {
		rq.err = err
		return
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(data))
	if err != nil {
		rq.err = err
		return
	}
	setHeaders(req, o.APIKey)
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		rq.err = err
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		rq.err = fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(b))
		return
	}
	rq.err = readStream(resp.Body, start, rq)
}

// streamChunk is the part of a completions SSE chunk the benchmark reads.
type streamChunk struct {
	Choices []struct {
		Text string `json:"text"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// readStream reads server-sent events up to "data: [DONE]", timing each
// chunk that carries text.
func readStream(body io.Reader, start time.Time, rq *serveRequest) error {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), maxSSELine)
	var last time.Time
	textChunks, usageTokens := 0, -1
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 || line[0] == ':' {
			continue // event separator or comment
		}
		data, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue // event:, id:, retry: fields
		}
		data = bytes.TrimSpace(data)
		now := time.Now()
		if string(data) == "[DONE]" {
			if textChunks == 0 {
				return errors.New("stream ended without any text")
			}
			rq.e2e = now.Sub(start)
			rq.outTokens = textChunks
			if usageTokens >= 0 {
				rq.outTokens = usageTokens
			}
			return nil
		}
		var ch streamChunk
		if err := json.Unmarshal(data, &ch); err != nil {
			return fmt.Errorf("bad SSE chunk: %w", err)
		}
		if ch.Error != nil {
			return fmt.Errorf("server error in stream: %s", ch.Error.Message)
		}
		if ch.Usage != nil {
			usageTokens = ch.Usage.CompletionTokens
			if rq.text != "" {
				rq.promptTokens = ch.Usage.PromptTokens
			}
		}
		text := false
		for _, c := range ch.Choices {
			text = text || c.Text != ""
		}
		if !text {
			continue
		}
		if textChunks == 0 {
			rq.ttft = now.Sub(start)
		} else {
			rq.itl = append(rq.itl, now.Sub(last))
		}
		last = now
		textChunks++
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read stream: %w", err)
	}
	return errors.New("stream ended without data: [DONE]")
}

// summarizeServe fills the counts, throughputs and latency summaries.
func summarizeServe(res *ServeResult, reqs []*serveRequest) {
	var ttft, itl, tpot, e2e []float64
	good := 0
	seen := map[string]bool{}
	msOf := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	for _, rq := range reqs {
		if rq.err != nil {
			res.Failed++
			msg := rq.err.Error()
			if !seen[msg] && len(res.Errors) < maxErrorsKept {
				seen[msg] = true
				res.Errors = append(res.Errors, msg)
			}
			continue
		}
		res.Completed++
		res.InputTokens += int64(rq.promptTokens)
		res.OutputTokens += int64(rq.outTokens)
		ttft = append(ttft, msOf(rq.ttft))
		e2e = append(e2e, msOf(rq.e2e))
		for _, d := range rq.itl {
			itl = append(itl, msOf(d))
		}
		if rq.outTokens > 1 {
			tpot = append(tpot, msOf(rq.e2e-rq.ttft)/float64(rq.outTokens-1))
		}
		if res.GoodputSLOMS != nil && res.GoodputSLOMS.meets(rq) {
			good++
		}
	}
	res.TTFTMS, res.ITLMS, res.TPOTMS, res.E2EMS = Summarize(ttft), Summarize(itl), Summarize(tpot), Summarize(e2e)
	if res.DurationS > 0 {
		res.RequestsPerS = float64(res.Completed) / res.DurationS
		res.OutputTokensPerS = float64(res.OutputTokens) / res.DurationS
		res.TotalTokensPerS = float64(res.InputTokens+res.OutputTokens) / res.DurationS
	}
	if res.GoodputSLOMS != nil {
		rate := 0.0
		if res.DurationS > 0 {
			rate = float64(good) / res.DurationS
		}
		res.GoodRequests, res.RequestGoodput = &good, &rate
	}
}

// WriteText prints the result for people.
func (r *ServeResult) WriteText(w io.Writer) error {
	rate := "inf"
	if !math.IsInf(float64(r.RequestRate), 1) {
		rate = strconv.FormatFloat(float64(r.RequestRate), 'g', -1, 64) + " req/s"
	}
	conc := "no cap"
	if r.MaxConcurrency > 0 {
		conc = strconv.Itoa(r.MaxConcurrency)
	}
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	p("trigon bench serve: %s", r.URL)
	input := "input " + r.InputLen.String()
	if r.Dataset != "random" && r.Dataset != "" {
		input = "prompts from " + r.Dataset
	}
	eos := ""
	if !r.IgnoreEOS {
		eos = " (or to EOS)"
	}
	p("  %d prompts at rate %s (concurrency %s), %s, output %s%s, seed %d", r.NumPrompts, rate, conc, input, r.OutputLen, eos, r.Seed)
	p("")
	p("%-28s %d", "completed", r.Completed)
	p("%-28s %d", "failed", r.Failed)
	p("%-28s %.2f", "duration (s)", r.DurationS)
	p("%-28s %d", "peak requests in flight", r.PeakInFlight)
	p("%-28s %d", "input tokens", r.InputTokens)
	p("%-28s %d", "output tokens", r.OutputTokens)
	p("%-28s %.2f", "request throughput (req/s)", r.RequestsPerS)
	if r.RequestGoodput != nil {
		p("%-28s %.2f (%d of %d completed met %s)", "request goodput (req/s)", *r.RequestGoodput, *r.GoodRequests, r.Completed, r.GoodputSLOMS)
	}
	p("%-28s %.2f", "output throughput (tok/s)", r.OutputTokensPerS)
	p("%-28s %.2f", "total throughput (tok/s)", r.TotalTokensPerS)
	p("")
	p("%-10s %10s %10s %10s %10s %10s", "ms", "mean", "p50", "p90", "p99", "max")
	for _, row := range []struct {
		name string
		s    Summary
	}{{"TTFT", r.TTFTMS}, {"ITL", r.ITLMS}, {"TPOT", r.TPOTMS}, {"E2E", r.E2EMS}} {
		if row.s.Count == 0 {
			p("%-10s %10s", row.name, "n/a")
			continue
		}
		p("%-10s %10.2f %10.2f %10.2f %10.2f %10.2f", row.name, row.s.Mean, row.s.P50, row.s.P90, row.s.P99, row.s.Max)
	}
	r.Steps.writeText(&b)
	for _, e := range r.Errors {
		p("error: %s", e)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
