package telemetry

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// histogramWith returns the histogram of family name whose labels are
// exactly labels.
func histogramWith(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels map[string]string) *dto.Histogram {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		t.Fatalf("histogram %s missing", name)
	}
next:
	for _, m := range f.GetMetric() {
		if len(m.GetLabel()) != len(labels) {
			continue
		}
		for _, lp := range m.GetLabel() {
			if labels[lp.GetName()] != lp.GetValue() {
				continue next
			}
		}
		return m.GetHistogram()
	}
	t.Fatalf("histogram %s%v not found", name, labels)
	return nil
}

// TestStepSeries records random host and device times under every kind
// and mode and checks each labelled series holds exactly its own
// observations; series nobody observed are present at zero.
func TestStepSeries(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	m := NewMetrics()
	type key struct {
		kind  StepKind
		graph bool
	}
	host, dev := map[key][]float64{}, map[key][]float64{}
	var gaps, tokens []float64
	for range 500 {
		k := key{StepKind(rng.IntN(int(numStepKinds))), rng.IntN(2) == 0}
		if k.kind == StepMixed && k.graph {
			continue // leave one series unobserved
		}
		h := time.Duration(rng.Int64N(int64(50 * time.Millisecond)))
		d := time.Duration(rng.Int64N(int64(2 * time.Second)))
		g := time.Duration(rng.Int64N(int64(time.Millisecond)))
		n := rng.IntN(20000)
		m.ObserveStepHost(k.kind, k.graph, h)
		m.ObserveStepDevice(k.kind, k.graph, d)
		m.ObserveStepGap(g)
		m.ObserveIterationTokens(n)
		host[k] = append(host[k], h.Seconds())
		dev[k] = append(dev[k], d.Seconds())
		gaps = append(gaps, g.Seconds())
		tokens = append(tokens, float64(n))
	}
	// Out-of-range input is dropped or clamped, never a panic.
	m.ObserveStepHost(numStepKinds, false, time.Second)
	m.ObserveStepDevice(StepKind(200), true, time.Second)
	m.ObserveIterationTokens(-1)
	m.ObserveStepGap(-time.Millisecond)
	gaps = append(gaps, 0)

	fams := scrape(t, m)
	checkHistogram(t, fams, StepGapMetric, StepBuckets, gaps)
	checkHistogram(t, fams, StepTokensMetric, IterationTokenBuckets, tokens)
	for kind := range numStepKinds {
		for _, graph := range []bool{false, true} {
			mode := StepModeEager
			if graph {
				mode = StepModeGraph
			}
			labels := map[string]string{StepKindLabel: kind.String(), StepModeLabel: mode}
			for _, series := range []struct {
				name string
				obs  map[key][]float64
			}{{StepHostMetric, host}, {StepDeviceMetric, dev}} {
				h := histogramWith(t, fams, series.name, labels)
				want := series.obs[key{kind, graph}]
				if got := h.GetSampleCount(); got != uint64(len(want)) {
					t.Errorf("%s%v: count %d, want %d", series.name, labels, got, len(want))
				}
				var sum float64
				for _, v := range want {
					sum += v
				}
				if got := h.GetSampleSum(); math.Abs(got-sum) > 1e-9*math.Max(1, sum) {
					t.Errorf("%s%v: sum %g, want %g", series.name, labels, got, sum)
				}
				if len(h.GetBucket()) != len(StepBuckets)+1 { // and le="+Inf"
					t.Errorf("%s%v: %d buckets, want %d", series.name, labels, len(h.GetBucket()), len(StepBuckets)+1)
				}
			}
		}
	}
}

func TestStepKindNames(t *testing.T) {
	for k, want := range map[StepKind]string{StepDecode: "decode", StepPrefill: "prefill", StepMixed: "mixed", numStepKinds: "unknown"} {
		if got := k.String(); got != want {
			t.Errorf("StepKind(%d) = %q, want %q", k, got, want)
		}
	}
}

func TestStepSeriesNilIsNoop(t *testing.T) {
	var m *Metrics
	m.ObserveStepHost(StepDecode, true, time.Millisecond)
	m.ObserveStepDevice(StepDecode, true, time.Millisecond)
	m.ObserveStepGap(time.Millisecond)
	m.ObserveIterationTokens(8)
}

// BenchmarkObserveStep is what the engine adds to every step: a host, a
// device, a gap and a token-count observation. It must not allocate.
func BenchmarkObserveStep(b *testing.B) {
	m := NewMetrics()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		m.ObserveStepHost(StepKind(i%3), i&1 == 0, 300*time.Microsecond)
		m.ObserveStepDevice(StepKind(i%3), i&1 == 0, 9*time.Millisecond)
		m.ObserveStepGap(20 * time.Microsecond)
		m.ObserveIterationTokens(i & 255)
	}
}

func TestStepPhases(t *testing.T) {
	m := NewMetrics()
	want := map[string]float64{}
	for p := range NumStepPhases {
		for i := range int(p) + 1 {
			d := time.Duration(i+1) * time.Millisecond
			m.ObserveStepHostPhase(p, d)
			want[p.String()] += d.Seconds()
		}
	}
	m.ObserveStepHostPhase(NumStepPhases, time.Second) // dropped
	fams := scrape(t, m)
	for p := range NumStepPhases {
		h := histogramWith(t, fams, StepPhaseMetric, map[string]string{StepPhaseLabel: p.String()})
		if h.GetSampleCount() != uint64(p)+1 || math.Abs(h.GetSampleSum()-want[p.String()]) > 1e-9 {
			t.Errorf("phase %s: %d observations summing to %g, want %d and %g", p, h.GetSampleCount(), h.GetSampleSum(), p+1, want[p.String()])
		}
	}
	names := map[string]bool{}
	for p := range NumStepPhases + 1 {
		names[p.String()] = true
	}
	if len(names) != int(NumStepPhases)+1 || !names["unknown"] {
		t.Errorf("phase names %v: want distinct names and unknown", names)
	}
}
