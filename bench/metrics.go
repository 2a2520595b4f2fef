package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/trigon-llm/trigon/telemetry"
)

// maxMetricsBody bounds one /metrics scrape.
const maxMetricsBody = 16 << 20

// histogram is one scraped Prometheus histogram: cumulative counts at
// ascending upper bounds, the last +Inf.
type histogram struct {
	bounds []float64
	cum    []uint64
	count  uint64
	sum    float64
}

// sub returns h minus an earlier scrape of the same series, or h itself
// when the counts went down (the server restarted in between) or the
// buckets differ.
func (h histogram) sub(before histogram) histogram {
	if len(before.cum) != len(h.cum) || before.count > h.count {
		return h
	}
	d := histogram{bounds: h.bounds, cum: make([]uint64, len(h.cum)), count: h.count - before.count, sum: h.sum - before.sum}
	for i := range h.cum {
		if before.cum[i] > h.cum[i] || before.bounds[i] != h.bounds[i] {
			return h
		}
		d.cum[i] = h.cum[i] - before.cum[i]
	}
	return d
}

// add sums two series of one histogram that differ only in a label
// labelKey leaves out (an empty h is the first); a series with other
// buckets is left out of the sum.
func (h histogram) add(o histogram) histogram {
	if h.bounds == nil {
		return o
	}
	if !slices.Equal(h.bounds, o.bounds) {
		return h
	}
	s := histogram{bounds: h.bounds, cum: make([]uint64, len(h.cum)), count: h.count + o.count, sum: h.sum + o.sum}
	for i := range h.cum {
		s.cum[i] = h.cum[i] + o.cum[i]
	}
	return s
}

// quantile estimates the q-quantile (0..1) as Prometheus's
// histogram_quantile does: linear within the bucket that holds the rank,
// the first bucket starting at 0, and the highest finite bound for a rank
// in the +Inf bucket. NaN without observations.
func (h histogram) quantile(q float64) float64 {
	if h.count == 0 || len(h.cum) == 0 {
		return math.NaN()
	}
	rank := q * float64(h.count)
	for i, c := range h.cum {
		if float64(c) < rank {
			continue
		}
		if math.IsInf(h.bounds[i], 1) {
			if i == 0 {
				return math.NaN()
			}
			return h.bounds[i-1]
		}
		lo, below := 0.0, uint64(0)
		if i > 0 {
			lo, below = h.bounds[i-1], h.cum[i-1]
		}
		if c == below {
			return h.bounds[i]
		}
		return lo + (h.bounds[i]-lo)*(rank-float64(below))/float64(c-below)
	}
	return h.bounds[len(h.bounds)-1]
}

// HistSummary describes a histogram read from a server's /metrics:
// the count and mean are exact, the percentiles estimated from the
// buckets (linear within a bucket, as Prometheus's histogram_quantile).
type HistSummary struct {
	Count uint64  `json:"count"`
	Mean  float64 `json:"mean"`
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
	P99   float64 `json:"p99"`
}

func summarizeHist(h histogram, scale float64) HistSummary {
	if h.count == 0 {
		return HistSummary{}
	}
	return HistSummary{Count: h.count, Mean: h.sum / float64(h.count) * scale,
		P50: h.quantile(0.5) * scale, P90: h.quantile(0.9) * scale, P99: h.quantile(0.99) * scale}
}

// StepGroup is the engine steps of one kind (decode, prefill, mixed) and
// mode (graph, eager) during the run, in milliseconds.
type StepGroup struct {
	Kind     string      `json:"kind"`
	Mode     string      `json:"mode"`
	HostMS   HistSummary `json:"host_ms"`
	DeviceMS HistSummary `json:"device_ms"`
}

// PhaseStat is one phase of the steps' host time, in milliseconds a step.
type PhaseStat struct {
	Phase string      `json:"phase"`
	MS    HistSummary `json:"ms"`
}

// StepStats are the server's engine-step histograms over the run (the
// difference of /metrics scrapes before and after it): a trigon server's
// trigon_step_host_seconds, trigon_step_device_seconds,
// trigon_step_gap_seconds and trigon_iteration_tokens_total.
type StepStats struct {
	Groups []StepGroup `json:"groups"` // those with steps, decode first
	// HostPhases split the steps' host time (trigon_step_host_phase_seconds).
	HostPhases    []PhaseStat `json:"host_phases,omitempty"`
	GapMS         HistSummary `json:"gap_ms"`
	TokensPerStep HistSummary `json:"tokens_per_step"`
	// PrefixCache is the prompt tokens the server looked up in its prefix
	// cache during the run, and found there (nil: it exports no such
	// counters). Prompts found cached skip their prefill: a run whose
	// prompts an earlier run sent measures less work than a cold one.
	PrefixCache *PrefixCacheStats `json:"prefix_cache,omitempty"`
}

// PrefixCacheStats are trigon_prefix_cache_queries_total and
// trigon_prefix_cache_hits_total over a run.
type PrefixCacheStats struct {
	QueryTokens uint64 `json:"query_tokens"`
	HitTokens   uint64 `json:"hit_tokens"`
}

// scrape is one parsed /metrics: histograms by family name, then by their
// labels ("k=v,k=v" in name order), and counters by family name, summed
// over their series.
type scrape struct {
	hists    map[string]map[string]histogram
	counters map[string]float64
}

// fetchMetrics reads base/metrics. Only histograms and counters are kept.
func fetchMetrics(ctx context.Context, client *http.Client, base *url.URL, apiKey string) (scrape, error) {
	var none scrape
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base.JoinPath("metrics").String(), nil)
	if err != nil {
		return none, err
	}
	req.Header.Set("Accept", "text/plain")
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	resp, err := client.Do(req)
	if err != nil {
		return none, fmt.Errorf("scrape /metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return none, fmt.Errorf("scrape /metrics: status %d", resp.StatusCode)
	}
	return parseMetrics(io.LimitReader(resp.Body, maxMetricsBody))
}

// parseMetrics reads the Prometheus text exposition.
func parseMetrics(r io.Reader) (scrape, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return scrape{}, fmt.Errorf("parse /metrics: %w", err)
	}
	out := scrape{hists: map[string]map[string]histogram{}, counters: map[string]float64{}}
	for name, f := range fams {
		if f.GetType() == dto.MetricType_COUNTER {
			for _, m := range f.GetMetric() {
				out.counters[name] += m.GetCounter().GetValue()
			}
			continue
		}
		if f.GetType() != dto.MetricType_HISTOGRAM {
			continue
		}
		series := map[string]histogram{}
		for _, m := range f.GetMetric() {
			h := m.GetHistogram()
			var hist histogram
			for _, b := range h.GetBucket() {
				hist.bounds = append(hist.bounds, b.GetUpperBound())
				hist.cum = append(hist.cum, b.GetCumulativeCount())
			}
			// The text format's +Inf bucket is implied by _count.
			if n := len(hist.bounds); n == 0 || !math.IsInf(hist.bounds[n-1], 1) {
				hist.bounds = append(hist.bounds, math.Inf(1))
				hist.cum = append(hist.cum, h.GetSampleCount())
			}
			hist.count, hist.sum = h.GetSampleCount(), h.GetSampleSum()
			key := labelKey(m.GetLabel())
			series[key] = series[key].add(hist)
		}
		out.hists[name] = series
	}
	return out, nil
}

// labelKey is the series' labels as "k=v,k=v" in name order, without
// model_name: a server labels every series with the model it serves (as
// vLLM's do), and the readers here look series up by their own labels.
func labelKey(labels []*dto.LabelPair) string {
	parts := make([]string, 0, len(labels))
	for _, l := range labels {
		if l.GetName() != telemetry.ModelNameLabel {
			parts = append(parts, l.GetName()+"="+l.GetValue())
		}
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// total is the observations of every series of family name.
func (s scrape) total(name string) uint64 {
	var n uint64
	for _, h := range s.hists[name] {
		n += h.count
	}
	return n
}

// stepStats is the run's engine-step statistics from scrapes before and
// after it; nil when the server exports no step series (not trigon, or
// an older one).
func stepStats(before, after scrape) *StepStats {
	if _, ok := after.hists[telemetry.StepTokensMetric]; !ok {
		return nil
	}
	delta := func(name, key string) histogram {
		return after.hists[name][key].sub(before.hists[name][key])
	}
	st := &StepStats{
		GapMS:         summarizeHist(delta(telemetry.StepGapMetric, ""), 1e3),
		TokensPerStep: summarizeHist(delta(telemetry.StepTokensMetric, ""), 1),
	}
	if q, ok := after.counters[telemetry.PrefixQueriesMetric]; ok {
		// A counter lower than before: the server restarted in between,
		// and the later scrape alone is the run's (as histogram.sub).
		h := after.counters[telemetry.PrefixHitsMetric]
		if bq := before.counters[telemetry.PrefixQueriesMetric]; bq <= q && before.counters[telemetry.PrefixHitsMetric] <= h {
			q, h = q-bq, h-before.counters[telemetry.PrefixHitsMetric]
		}
		st.PrefixCache = &PrefixCacheStats{QueryTokens: uint64(q), HitTokens: uint64(h)}
	}
	for p := range telemetry.NumStepPhases {
		key := labelKey([]*dto.LabelPair{{Name: ptr(telemetry.StepPhaseLabel), Value: ptr(p.String())}})
		if h := delta(telemetry.StepPhaseMetric, key); h.count > 0 {
			st.HostPhases = append(st.HostPhases, PhaseStat{Phase: p.String(), MS: summarizeHist(h, 1e3)})
		}
	}
	for _, kind := range []string{telemetry.StepDecode.String(), telemetry.StepPrefill.String(), telemetry.StepMixed.String(), telemetry.StepVerify.String()} {
		for _, mode := range []string{telemetry.StepModeGraph, telemetry.StepModeEager} {
			key := labelKey([]*dto.LabelPair{{Name: ptr(telemetry.StepKindLabel), Value: ptr(kind)}, {Name: ptr(telemetry.StepModeLabel), Value: ptr(mode)}})
			g := StepGroup{Kind: kind, Mode: mode,
				HostMS:   summarizeHist(delta(telemetry.StepHostMetric, key), 1e3),
				DeviceMS: summarizeHist(delta(telemetry.StepDeviceMetric, key), 1e3)}
			if g.HostMS.Count > 0 || g.DeviceMS.Count > 0 {
				st.Groups = append(st.Groups, g)
			}
		}
	}
	return st
}

// settledMetrics scrapes after the run until the server has recorded the
// device and host times of every step it counted, or about a second has
// passed: a device-clocked server reads its step times in batches, the
// last when its engine goes idle, just after the last response, and every
// server records a step's host time at the end of the loop iteration that
// delivered it, after that step's responses went out.
func settledMetrics(ctx context.Context, client *http.Client, base *url.URL, apiKey string) (scrape, error) {
	var s scrape
	var err error
	for range 50 {
		if s, err = fetchMetrics(ctx, client, base, apiKey); err != nil {
			return scrape{}, err
		}
		if n := s.total(telemetry.StepTokensMetric); s.total(telemetry.StepDeviceMetric) >= n && s.total(telemetry.StepHostMetric) >= n {
			return s, nil
		}
		select {
		case <-ctx.Done():
			return s, nil
		case <-time.After(20 * time.Millisecond):
		}
	}
	return s, nil
}

// writeText prints the step section of bench serve's report.
func (st *StepStats) writeText(b *strings.Builder) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format+"\n", args...) }
	p("")
	if st == nil {
		p("engine steps: n/a (the server's /metrics has no trigon step series)")
		return
	}
	p("engine steps (server /metrics; ms, percentiles estimated from the histogram buckets)")
	p("%-8s %-6s %8s %10s %10s %10s %10s", "kind", "mode", "steps", "host p50", "host p99", "device p50", "device p99")
	for _, g := range st.Groups {
		p("%-8s %-6s %8d %10.3f %10.3f %10.3f %10.3f", g.Kind, g.Mode, max(g.HostMS.Count, g.DeviceMS.Count),
			g.HostMS.P50, g.HostMS.P99, g.DeviceMS.P50, g.DeviceMS.P99)
	}
	var host, dev float64
	for _, g := range st.Groups {
		host += g.HostMS.Mean * float64(g.HostMS.Count)
		dev += g.DeviceMS.Mean * float64(g.DeviceMS.Count)
	}
	// With steps queued ahead the host's and the device's times overlap:
	// they need not add up to the run's duration.
	p("%-28s device %.3f s, host %.3f s, device idle between steps %.3f s", "summed over the run", dev/1e3, host/1e3, st.GapMS.Mean*float64(st.GapMS.Count)/1e3)
	if g := st.GapMS; g.Count > 0 {
		p("%-28s p50 %.3f  p99 %.3f  mean %.3f ms (%d gaps)", "device idle between steps", g.P50, g.P99, g.Mean, g.Count)
	}
	if len(st.HostPhases) > 0 {
		parts := make([]string, len(st.HostPhases))
		for i, ph := range st.HostPhases {
			parts[i] = fmt.Sprintf("%s %.3f", ph.Phase, ph.MS.Mean)
		}
		p("%-28s %s", "host ms a step, by phase", strings.Join(parts, ", "))
	}
	if tk := st.TokensPerStep; tk.Count > 0 {
		p("%-28s p50 %.0f  p99 %.0f  mean %.1f (%d steps)", "tokens per step", tk.P50, tk.P99, tk.Mean, tk.Count)
	}
	if pc := st.PrefixCache; pc != nil {
		p("%-28s %d of %d prompt tokens looked up (%.1f%%)", "prefix cache hits", pc.HitTokens, pc.QueryTokens, 100*float64(pc.HitTokens)/float64(max(pc.QueryTokens, 1)))
	}
}
