package bench

import (
	"context"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/trigon-llm/trigon/telemetry"
)

func TestHistogramQuantile(t *testing.T) {
	inf := math.Inf(1)
	// 10 observations in (0, 1], 30 in (1, 2], none in (2, 4], 10 above 4.
	h := histogram{bounds: []float64{1, 2, 4, inf}, cum: []uint64{10, 40, 40, 50}, count: 50, sum: 100}
	for _, tc := range []struct{ q, want float64 }{
		{0, 0},             // rank 0: the start of the first bucket
		{0.1, 0.5},         // rank 5 of the first 10, in (0, 1]
		{0.2, 1},           // rank 10: the first bucket's end
		{0.5, 1.5},         // rank 25: 15 of 30 into (1, 2]
		{0.8, 2},           // rank 40: the end of (1, 2]
		{0.9, 4},           // in the +Inf bucket: the highest finite bound
		{0.99, 4},          //
		{1, 4},             //
		{0.6, 1 + 20.0/30}, // rank 30: 20 of 30 into (1, 2]
	} {
		if got := h.quantile(tc.q); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("q%g = %g, want %g", tc.q, got, tc.want)
		}
	}
	if got := (histogram{}).quantile(0.5); !math.IsNaN(got) {
		t.Errorf("empty histogram q0.5 = %g, want NaN", got)
	}
}

func TestHistogramSub(t *testing.T) {
	inf := math.Inf(1)
	before := histogram{bounds: []float64{1, inf}, cum: []uint64{3, 4}, count: 4, sum: 5}
	after := histogram{bounds: []float64{1, inf}, cum: []uint64{5, 9}, count: 9, sum: 20}
	d := after.sub(before)
	if d.count != 5 || d.sum != 15 || d.cum[0] != 2 || d.cum[1] != 5 {
		t.Errorf("after - before = %+v", d)
	}
	// A restarted server's counts went down: the later scrape alone.
	if r := before.sub(after); r.count != before.count {
		t.Errorf("restart: %+v, want the later scrape %+v", r, before)
	}
	if n := after.sub(histogram{}); n.count != after.count {
		t.Errorf("series new in the second scrape: %+v", n)
	}
}

// TestStepStatsFromExposition scrapes trigon's own /metrics before and
// after observations and checks the difference is what was observed in
// between, by kind and mode, with percentiles inside the right buckets,
// from a server whose series carry a model_name label (trigon serve's, as
// vLLM's) and one whose series do not.
func TestStepStatsFromExposition(t *testing.T) {
	for _, tc := range []struct {
		name string
		m    *telemetry.Metrics
	}{{"model_name", telemetry.NewMetricsFor("llama-3-8b")}, {"no labels", telemetry.NewMetrics()}} {
		t.Run(tc.name, func(t *testing.T) { testStepStats(t, tc.m) })
	}
}

func testStepStats(t *testing.T, m *telemetry.Metrics) {
	get := func() scrape {
		rec := httptest.NewRecorder()
		m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		s, err := parseMetrics(rec.Body)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	m.ObserveStepHost(telemetry.StepMixed, false, time.Second) // before: not counted
	m.AddPrefixCacheLookup(1000, 900)                          // before: not counted
	before := get()
	m.AddPrefixCacheLookup(2048, 0)
	m.AddPrefixCacheLookup(1024, 1008)
	for i := range 100 {
		m.ObserveStepHost(telemetry.StepDecode, true, 300*time.Microsecond)
		m.ObserveStepDevice(telemetry.StepDecode, true, time.Duration(8+i%2)*time.Millisecond) // 8 and 9 ms
		m.ObserveStepGap(20 * time.Microsecond)
		m.ObserveIterationTokens(64)
		m.ObserveStepHostPhase(telemetry.PhaseOutput, 100*time.Microsecond)
		m.ObserveStepHostPhase(telemetry.PhaseOther, 200*time.Microsecond)
	}
	m.ObserveStepDevice(telemetry.StepPrefill, false, 120*time.Millisecond)
	m.ObserveStepHost(telemetry.StepPrefill, false, 2*time.Millisecond)
	m.ObserveIterationTokens(2048)
	st := stepStats(before, get())
	if st == nil || len(st.Groups) != 2 {
		t.Fatalf("groups %+v, want decode/graph and prefill/eager", st)
	}
	dec, pre := st.Groups[0], st.Groups[1]
	if dec.Kind != "decode" || dec.Mode != "graph" || dec.HostMS.Count != 100 || dec.DeviceMS.Count != 100 {
		t.Errorf("decode group %+v", dec)
	}
	if math.Abs(dec.DeviceMS.Mean-8.5) > 1e-9 || dec.DeviceMS.P50 <= 7 || dec.DeviceMS.P50 > 8 || dec.DeviceMS.P99 <= 8 || dec.DeviceMS.P99 > 9 {
		t.Errorf("decode device %+v: mean 8.5, p50 in (7, 8], p99 in (8, 9]", dec.DeviceMS)
	}
	if pre.Kind != "prefill" || pre.Mode != "eager" || pre.DeviceMS.Count != 1 || pre.HostMS.Count != 1 || math.Abs(pre.DeviceMS.Mean-120) > 1e-9 {
		t.Errorf("prefill group %+v", pre)
	}
	if st.GapMS.Count != 100 || st.GapMS.P50 <= 0.01 || st.GapMS.P50 > 0.025 {
		t.Errorf("gaps %+v: 100 of 0.02 ms", st.GapMS)
	}
	if st.TokensPerStep.Count != 101 || math.Abs(st.TokensPerStep.Mean-(100*64+2048)/101.0) > 1e-9 {
		t.Errorf("tokens per step %+v", st.TokensPerStep)
	}
	if len(st.HostPhases) != 2 || st.HostPhases[0].Phase != "output" || st.HostPhases[1].Phase != "other" ||
		math.Abs(st.HostPhases[0].MS.Mean-0.1) > 1e-9 || st.HostPhases[1].MS.Count != 100 {
		t.Errorf("host phases %+v: want output 0.1 ms and other 0.2 ms, 100 each", st.HostPhases)
	}
	if pc := st.PrefixCache; pc == nil || pc.QueryTokens != 3072 || pc.HitTokens != 1008 {
		t.Errorf("prefix cache %+v, want 1008 of 3072 tokens", pc)
	}
	var b strings.Builder
	st.writeText(&b)
	for _, want := range []string{"decode   graph", "prefill  eager", "device idle between steps", "tokens per step", "output 0.100, other 0.200",
		"prefix cache hits            1008 of 3072 prompt tokens looked up (32.8%)"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("text %q lacks %q", b.String(), want)
		}
	}
	if s := stepStats(scrape{}, scrape{}); s != nil {
		t.Errorf("a server without step series: %+v, want nil", s)
	}
}

// TestSettledMetricsWaitsForHostTimes: a server records a step's tokens
// and device time when the step ends but its host time only at the end of
// the loop iteration that delivered it, after its responses went out; the
// scrape after a run waits for that last host time, so that every step
// counted has both.
func TestSettledMetricsWaitsForHostTimes(t *testing.T) {
	m := telemetry.NewMetrics()
	for range 19 {
		m.ObserveIterationTokens(4)
		m.ObserveStepDevice(telemetry.StepDecode, false, time.Millisecond)
		m.ObserveStepHost(telemetry.StepDecode, false, time.Millisecond)
	}
	// The last step: ended, its host time still to come.
	m.ObserveIterationTokens(4)
	m.ObserveStepDevice(telemetry.StepDecode, false, time.Millisecond)
	var scrapes atomic.Int32
	h := m.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if scrapes.Add(1) == 3 {
			m.ObserveStepHost(telemetry.StepDecode, false, time.Millisecond)
		}
		h.ServeHTTP(w, r)
	}))
	defer srv.Close()
	base, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	s, err := settledMetrics(context.Background(), srv.Client(), base, "")
	if err != nil {
		t.Fatal(err)
	}
	if host, dev := s.total(telemetry.StepHostMetric), s.total(telemetry.StepDeviceMetric); host != 20 || dev != 20 || scrapes.Load() != 3 {
		t.Errorf("settled after %d scrapes with %d host and %d device times; want 20 of each, at the third scrape", scrapes.Load(), host, dev)
	}
}
