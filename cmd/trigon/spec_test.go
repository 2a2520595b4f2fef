package main

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/trigon-llm/trigon/engine"
	"github.com/trigon-llm/trigon/specdec"
	"github.com/trigon-llm/trigon/telemetry"
)

// TestSpeculativeConfigFlag: a bad --speculative-config stops serve, run
// and bench latency before they load anything, naming the problem; a good
// one runs, and run reports the drafts' acceptance.
func TestSpeculativeConfigFlag(t *testing.T) {
	for _, args := range [][]string{
		{"serve", "--port", "0"},
		{"run", "x"},
		{"bench", "latency", "--arch", "tiny"},
	} {
		for bad, want := range map[string]string{
			`{"method":"ngram"`: "unexpected EOF",
			`{"method":"ngram","num_speculative_tokens":4,"draft_tensor_parallel_size":1}`: `unknown field "draft_tensor_parallel_size"`,
			`{"method":"eagle","num_speculative_tokens":4}`:                                `method "eagle"`,
		} {
			_, _, err := execute(t, "", append(args, "--model", "/nonexistent", "--speculative-config", bad)...)
			if err == nil || !strings.Contains(err.Error(), "--speculative-config") || !strings.Contains(err.Error(), want) {
				t.Errorf("%v with %s: %v, want an error about the flag containing %q", args, bad, err, want)
			}
		}
	}
	// The default model on Go code it can copy from its prompt, greedily:
	// sampled with the model's own temperature and a random seed, an
	// output can wander off the prompt so that no step has a draft.
	prompt := strings.Repeat("func (c *Client) Get(url string) (*Response, error) {\n\treturn c.Do(NewRequest(\"GET\", url))\n}\n\n", 4)
	_, errOut, err := execute(t, "", "run", "--model", "../../models/default/trigon-go.q8_0.gguf", "--device", "cpu", "-n", "32", "--temperature", "0",
		"--speculative-config", `{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_min":1,"prompt_lookup_max":3}`, prompt)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	if !strings.Contains(errOut, "generated in") || !strings.Contains(errOut, "[speculative: ") {
		t.Errorf("run printed no timing or no speculative line:\n%s", errOut)
	}
}

// scrapeMetrics reads url's /metrics in the text exposition format, once
// l's engine is idle: a step's host time is counted after its tokens are
// streamed, and every step's is counted before Busy reports false.
func scrapeMetrics(t *testing.T, url string, l *engine.Loaded) map[string]*dto.MetricFamily {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); l.Engine.Busy(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("engine still busy after 10s")
		}
	}
	req, err := http.NewRequest("GET", url+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "text/plain")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: status %d", resp.StatusCode)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// seriesSum adds up the series of family name whose labels include
// every pair of match: counters' values, histograms' sample counts. A
// family not exposed sums to 0.
func seriesSum(fams map[string]*dto.MetricFamily, name string, match map[string]string) float64 {
	var sum float64
next:
	for _, m := range fams[name].GetMetric() {
		for k, v := range match {
			if !slices.ContainsFunc(m.GetLabel(), func(lp *dto.LabelPair) bool { return lp.GetName() == k && lp.GetValue() == v }) {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Histogram != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum
}

// TestSpeculativeMetricsLoopback: a server with prompt lookup, the
// default model and one telemetry.Metrics for the API and the engine (as
// trigon serve has), answers greedy requests on prompts that repeat a
// function, so that drafts come and are accepted; what its /metrics
// exposition then says of speculation is consistent with itself and with
// the tokens served: drafts, proposed and accepted tokens counted,
// accepted at most proposed and at most k a draft; the per-position
// counts fall by position and add up to the accepted ones; one verify
// step and one proposal timed per draft (one request at a time); and
// every token emitted comes from the prompt's step, a decode step, or a
// verify step (one plus its accepted tokens).
func TestSpeculativeMetricsLoopback(t *testing.T) {
	const k, maxTokens = 4, 32
	const defaultModel = "../../models/default/trigon-go.q8_0.gguf"
	tok, err := engine.LoadTokenizer(defaultModel)
	if err != nil {
		t.Fatal(err)
	}
	hs, l := startMetricsServer(t, engine.LoadOptions{Model: defaultModel, MaxSeqs: 4, MaxBatchedTokens: 256, ChunkSize: 128,
		Speculative: specdec.Config{Method: specdec.MethodNGram, NumSpeculativeTokens: k, PromptLookupMin: 1, PromptLookupMax: 3}})
	prompts := []string{
		strings.Repeat("func (c *Client) Get(url string) (*Response, error) {\n\treturn c.Do(NewRequest(\"GET\", url))\n}\n\n", 3),
		strings.Repeat("type Point struct {\n\tX, Y int\n}\n\nfunc (p Point) Add(q Point) Point {\n\treturn Point{p.X + q.X, p.Y + q.Y}\n}\n\n", 2),
	}
	before := scrapeMetrics(t, hs.URL, l)
	for _, p := range prompts {
		ids, err := tok.Encode(p, true)
		if err != nil {
			t.Fatal(err)
		}
		c, err := complete(context.Background(), hs.URL, ids, maxTokens, false, -1, nil)
		if err != nil {
			t.Fatal(err)
		}
		if c.finish != "length" {
			t.Fatalf("finish %q, want length (ignore_eos, no stop)", c.finish)
		}
	}
	after := scrapeMetrics(t, hs.URL, l)
	delta := func(name string, match map[string]string) float64 {
		return seriesSum(after, name, match) - seriesSum(before, name, match)
	}
	var (
		drafts    = delta("trigon_spec_decode_num_drafts_total", nil)
		proposed  = delta("trigon_spec_decode_num_draft_tokens_total", nil)
		accepted  = delta("trigon_spec_decode_num_accepted_tokens_total", nil)
		emitted   = delta("trigon_generation_tokens_total", nil)
		verifies  = delta(telemetry.StepHostMetric, map[string]string{telemetry.StepKindLabel: "verify"})
		decodes   = delta(telemetry.StepHostMetric, map[string]string{telemetry.StepKindLabel: "decode"})
		proposals = delta("trigon_spec_decode_draft_seconds", nil)
	)
	var perPos []float64
	for _, m := range after["trigon_spec_decode_num_accepted_tokens_per_pos_total"].GetMetric() {
		pos := -1
		for _, lp := range m.GetLabel() {
			if lp.GetName() == telemetry.SpecPositionLabel {
				pos, _ = strconv.Atoi(lp.GetValue())
			}
		}
		if pos < 0 || pos >= k {
			t.Fatalf("accepted-per-position series with labels %v: want a position 0 to %d", m.GetLabel(), k-1)
		}
		for len(perPos) <= pos {
			perPos = append(perPos, 0)
		}
		perPos[pos] = m.GetCounter().GetValue() - seriesSum(before, "trigon_spec_decode_num_accepted_tokens_per_pos_total", map[string]string{telemetry.SpecPositionLabel: strconv.Itoa(pos)})
	}
	t.Logf("%v drafts, %v of %v tokens accepted, by position %v; %v tokens emitted; %v verify and %v decode steps, %v proposals timed",
		drafts, accepted, proposed, perPos, emitted, verifies, decodes, proposals)
	if drafts <= 0 || proposed <= 0 || accepted <= 0 {
		t.Fatalf("drafts %v, proposed tokens %v, accepted %v: want each > 0", drafts, proposed, accepted)
	}
	if accepted > proposed || proposed > k*drafts || proposed < drafts {
		t.Errorf("%v of %v proposed tokens accepted over %v drafts: want accepted <= proposed, and 1 to %d tokens a draft", accepted, proposed, drafts, k)
	}
	var sum float64
	for i, n := range perPos {
		sum += n
		if i > 0 && n > perPos[i-1] {
			t.Errorf("accepted by position %v: position %d more often than %d", perPos, i, i-1)
		}
	}
	if sum != accepted || len(perPos) == 0 || perPos[0] > drafts {
		t.Errorf("accepted by position %v (sum %v): want the sum %v and position 0 at most the %v drafts", perPos, sum, accepted, drafts)
	}
	if verifies != drafts || proposals < drafts {
		t.Errorf("%v verify steps and %v proposals timed for %v drafts of one sequence at a time: want one verify step a draft, a proposal before each", verifies, proposals, drafts)
	}
	if want := float64(len(prompts) * maxTokens); emitted != want {
		t.Errorf("%v generation tokens counted, want %v", emitted, want)
	}
	if got := float64(len(prompts)) + decodes + verifies + accepted; got != emitted {
		t.Errorf("%v prompts' tokens + %v decode steps + %v verify steps + %v accepted tokens = %v, want the %v tokens emitted", len(prompts), decodes, verifies, accepted, got, emitted)
	}
}
