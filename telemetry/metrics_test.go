package telemetry

import (
	"math"
	"math/rand/v2"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape serves m's handler once and parses the text exposition.
func scrape(t *testing.T, m *Metrics) map[string]*dto.MetricFamily {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/metrics", nil)
	req.Header.Set("Accept", "text/plain")
	m.Handler().ServeHTTP(rec, req)
	if rec.Code != 200 {
		t.Fatalf("scrape status %d", rec.Code)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatalf("parse exposition: %v", err)
	}
	return fams
}

func scalar(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		t.Fatalf("metric %s missing", name)
	}
next:
	for _, m := range f.GetMetric() {
		for _, lp := range m.GetLabel() {
			if labels[lp.GetName()] != lp.GetValue() {
				continue next
			}
		}
		if len(m.GetLabel()) != len(labels) {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue()
		case m.Gauge != nil:
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("metric %s%v not found", name, labels)
	return 0
}

// checkHistogram compares a scraped histogram against observations counted
// here independently: count, sum and every cumulative bucket.
func checkHistogram(t *testing.T, fams map[string]*dto.MetricFamily, name string, bounds []float64, obs []float64) {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		t.Fatalf("histogram %s missing", name)
	}
	h := f.GetMetric()[0].GetHistogram()
	if got := h.GetSampleCount(); got != uint64(len(obs)) {
		t.Errorf("%s count = %d, want %d", name, got, len(obs))
	}
	var sum float64
	for _, o := range obs {
		sum += o
	}
	if got := h.GetSampleSum(); math.Abs(got-sum) > 1e-9*math.Max(1, sum) {
		t.Errorf("%s sum = %g, want %g", name, got, sum)
	}
	bounds = append(slices.Clip(bounds), math.Inf(1)) // the exposition adds le="+Inf"
	if len(h.GetBucket()) != len(bounds) {
		t.Fatalf("%s has %d buckets, want %d", name, len(h.GetBucket()), len(bounds))
	}
	for i, b := range h.GetBucket() {
		if b.GetUpperBound() != bounds[i] {
			t.Fatalf("%s bucket %d bound %g, want %g", name, i, b.GetUpperBound(), bounds[i])
		}
		var want uint64
		for _, o := range obs {
			if o <= bounds[i] {
				want++
			}
		}
		if b.GetCumulativeCount() != want {
			t.Errorf("%s le=%g count %d, want %d", name, bounds[i], b.GetCumulativeCount(), want)
		}
	}
}

func TestHistograms(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	cases := []struct {
		name    string
		bounds  []float64
		observe func(*Metrics, time.Duration)
	}{
		{"trigon_time_to_first_token_seconds", TTFTBuckets, (*Metrics).ObserveTTFT},
		{"trigon_inter_token_latency_seconds", InterTokenBuckets, (*Metrics).ObserveInterTokenLatency},
		{"trigon_e2e_request_latency_seconds", E2EBuckets, (*Metrics).ObserveE2ELatency},
		{"trigon_request_queue_time_seconds", QueueBuckets, (*Metrics).ObserveQueueTime},
		{"trigon_stream_write_seconds", StreamWriteBuckets, (*Metrics).ObserveStreamWrite},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for i := 1; i < len(tc.bounds); i++ {
				if tc.bounds[i] <= tc.bounds[i-1] {
					t.Fatalf("bounds not increasing at %d", i)
				}
			}
			m := NewMetrics()
			var obs []float64
			for range 200 {
				// Log-uniform over the bucket range and a bit beyond.
				lo, hi := math.Log(tc.bounds[0]/2), math.Log(tc.bounds[len(tc.bounds)-1]*2)
				s := math.Exp(lo + rng.Float64()*(hi-lo))
				d := time.Duration(s * float64(time.Second))
				obs = append(obs, d.Seconds())
				tc.observe(m, d)
			}
			// A negative duration (clock step) is recorded as zero.
			tc.observe(m, -time.Second)
			obs = append(obs, 0)
			checkHistogram(t, scrape(t, m), tc.name, tc.bounds, obs)
		})
	}
}

func TestGaugesAndCounters(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	m := NewMetrics()
	var queried, hits, preempt, ahead, prompt, gen int
	for range 50 {
		q := rng.IntN(1000)
		h := rng.IntN(q + 1)
		m.AddPrefixCacheLookup(q, h)
		queried += q
		hits += h
		p := rng.IntN(3)
		m.AddPreemptions(p)
		preempt += p
		a := rng.IntN(50)
		m.AddAheadSteps(a)
		ahead += a
		n := rng.IntN(500)
		m.AddPromptTokens(n)
		prompt += n
		g := rng.IntN(500)
		m.AddGenerationTokens(g)
		gen += g
	}
	// Negative values cannot lower a counter and are ignored.
	m.AddPrefixCacheLookup(-5, 1)
	m.AddPreemptions(-1)
	m.AddAheadSteps(-2)
	m.AddPromptTokens(-3)
	m.AddGenerationTokens(-3)
	finished := map[string]int{}
	for _, r := range []string{"stop", "stop", "length", "abort", "error", "stop", "bogus", ""} {
		m.RequestFinished(r)
		switch r {
		case "stop", "length", "abort", "error":
			finished[r]++
		default:
			finished["other"]++
		}
	}
	running, waiting := 1+rng.IntN(100), rng.IntN(100)
	m.SetRequestsRunning(running)
	m.SetRequestsWaiting(waiting)
	usage := rng.Float64()
	m.SetKVCacheUsage(usage)
	m.SetKVCacheUsage(math.NaN()) // ignored

	fams := scrape(t, m)
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"trigon_prefix_cache_queries_total", nil, float64(queried)},
		{"trigon_prefix_cache_hits_total", nil, float64(hits)},
		{"trigon_num_preemptions_total", nil, float64(preempt)},
		{"trigon_ahead_steps_total", nil, float64(ahead)},
		{"trigon_prompt_tokens_total", nil, float64(prompt)},
		{"trigon_generation_tokens_total", nil, float64(gen)},
		{"trigon_num_requests_running", nil, float64(running)},
		{"trigon_num_requests_waiting", nil, float64(waiting)},
		{"trigon_kv_cache_usage_perc", nil, usage},
	}
	for r, n := range finished {
		checks = append(checks, struct {
			name   string
			labels map[string]string
			want   float64
		}{"trigon_request_success_total", map[string]string{"finished_reason": r}, float64(n)})
	}
	for _, c := range checks {
		t.Run(c.name+labelString(c.labels), func(t *testing.T) {
			if got := scalar(t, fams, c.name, c.labels); got != c.want {
				t.Errorf("got %g, want %g", got, c.want)
			}
		})
	}
	if _, ok := fams["go_goroutines"]; !ok {
		t.Error("go_goroutines missing: Go collector not registered")
	}
	if _, ok := fams["process_start_time_seconds"]; !ok && runtime.GOOS == "linux" {
		t.Error("process_start_time_seconds missing: process collector not registered")
	}
}

func labelString(l map[string]string) string {
	s := ""
	for k, v := range l {
		s += "{" + k + "=" + v + "}"
	}
	return s
}

func TestKVUsageClamped(t *testing.T) {
	cases := []struct{ in, want float64 }{{-0.5, 0}, {0.25, 0.25}, {1.5, 1}, {math.Inf(1), 1}}
	for _, c := range cases {
		t.Run("", func(t *testing.T) {
			m := NewMetrics()
			m.SetKVCacheUsage(c.in)
			if got := scalar(t, scrape(t, m), "trigon_kv_cache_usage_perc", nil); got != c.want {
				t.Errorf("SetKVCacheUsage(%g) -> %g, want %g", c.in, got, c.want)
			}
		})
	}
}

func TestNilMetricsIsNoop(t *testing.T) {
	var m *Metrics
	m.ObserveTTFT(time.Second)
	m.ObserveInterTokenLatency(time.Second)
	m.ObserveE2ELatency(time.Second)
	m.ObserveQueueTime(time.Second)
	m.SetRequestsRunning(1)
	m.SetRequestsWaiting(1)
	m.SetKVCacheUsage(0.5)
	m.AddPrefixCacheLookup(1, 1)
	m.AddPreemptions(1)
	m.AddPromptTokens(1)
	m.AddGenerationTokens(1)
	m.RequestFinished("stop")
	if m.Registry() != nil {
		t.Error("nil Metrics has a registry")
	}
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 404 {
		t.Errorf("nil Metrics handler status %d, want 404", rec.Code)
	}
}

// Two Metrics in one process must not collide (no global registry).
func TestIndependentRegistries(t *testing.T) {
	a, b := NewMetrics(), NewMetrics()
	a.AddPromptTokens(7)
	if got := scalar(t, scrape(t, b), "trigon_prompt_tokens_total", nil); got != 0 {
		t.Errorf("b sees a's tokens: %g", got)
	}
	if got := scalar(t, scrape(t, a), "trigon_prompt_tokens_total", nil); got != 7 {
		t.Errorf("a = %g, want 7", got)
	}
}

// TestModelNameLabel: NewMetricsFor labels every trigon_ series with the
// served model's name, vLLM's model_name; the Go and process series and
// NewMetrics' series carry none.
func TestModelNameLabel(t *testing.T) {
	for _, tc := range []struct {
		name, model string
	}{{"NewMetricsFor", "llama-3.1-8b/instruct"}, {"NewMetrics", ""}} {
		t.Run(tc.name, func(t *testing.T) {
			var m *Metrics
			if tc.model != "" {
				m = NewMetricsFor(tc.model)
			} else {
				m = NewMetrics()
			}
			// Touch the labelled families, which show only once used.
			m.ObserveStepHost(StepDecode, true, time.Millisecond)
			m.ObserveStepDevice(StepDecode, true, time.Millisecond)
			m.ObserveStepHostPhase(PhaseOutput, time.Millisecond)
			m.SetKVCache("bf16", 1024)
			m.ObserveSpecDraft(2, 1)
			own := 0
			for name, f := range scrape(t, m) {
				trigon := strings.HasPrefix(name, "trigon_")
				if trigon {
					own++
				}
				for _, s := range f.GetMetric() {
					got, has := "", false
					for _, lp := range s.GetLabel() {
						if lp.GetName() == ModelNameLabel {
							got, has = lp.GetValue(), true
						}
					}
					if want := trigon && tc.model != ""; has != want || has && got != tc.model {
						t.Errorf("%s%v: model_name %q (set %v), want it set %v to %q", name, s.GetLabel(), got, has, want, tc.model)
					}
				}
			}
			if own < 20 {
				t.Errorf("%d trigon_ families scraped, want the whole set", own)
			}
		})
	}
	fams := scrape(t, NewMetricsFor("m"))
	for _, name := range []string{KVCacheUsageMetric, RequestSuccessMetric} {
		if _, ok := fams[name]; !ok {
			t.Errorf("%s missing", name)
		}
	}
	if got := scalar(t, fams, RequestSuccessMetric, map[string]string{FinishedReasonLabel: "abort", ModelNameLabel: "m"}); got != 0 {
		t.Errorf("%s{finished_reason=abort} = %g before any request", RequestSuccessMetric, got)
	}
}
