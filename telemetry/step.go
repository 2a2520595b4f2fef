package telemetry

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Names of the engine-step series, for readers of /metrics (bench serve).
const (
	StepHostMetric   = "trigon_step_host_seconds"
	StepPhaseMetric  = "trigon_step_host_phase_seconds"
	StepPhaseLabel   = "phase"
	StepDeviceMetric = "trigon_step_device_seconds"
	StepGapMetric    = "trigon_step_gap_seconds"
	StepTokensMetric = "trigon_iteration_tokens_total"
	StepKindLabel    = "kind"
	StepModeLabel    = "mode"
	StepModeGraph    = "graph"
	StepModeEager    = "eager"
	// The prefix cache's counters: prompt tokens looked up, and of them
	// those found cached.
	PrefixQueriesMetric = "trigon_prefix_cache_queries_total"
	PrefixHitsMetric    = "trigon_prefix_cache_hits_total"
)

// StepBuckets bound the engine-step histograms, in seconds: host work and
// idle gaps of tens of microseconds, decode steps of a few milliseconds on
// a GPU, prefill steps and CPU steps of up to seconds. The milliseconds
// where GPU decode steps sit are finely divided, so percentiles read back
// from the buckets (bench serve) are close to the true ones.
var StepBuckets = []float64{1e-5, 2.5e-5, 5e-5, 1e-4, 2e-4, 3e-4, 5e-4, 7.5e-4,
	0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.006, 0.007, 0.008, 0.009, 0.01,
	0.0125, 0.015, 0.0175, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2,
	0.3, 0.5, 0.75, 1, 2.5, 5, 10, 30}

// IterationTokenBuckets are vLLM's buckets of vllm:iteration_tokens_total.
var IterationTokenBuckets = []float64{1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384}

// StepKind is what an engine step computes, by shape: in a decode step
// every sequence computes one token, in a prefill step every sequence
// computes more than one (prompt chunks, or the recomputation of a
// preempted sequence), and a mixed step has both. A verify step is one in
// which some sequence verifies draft tokens (speculative decoding),
// whatever else it carries.
type StepKind uint8

// Step kinds, the values of the "kind" label.
const (
	StepDecode StepKind = iota
	StepPrefill
	StepMixed
	StepVerify
	numStepKinds
)

func (k StepKind) String() string {
	switch k {
	case StepDecode:
		return "decode"
	case StepPrefill:
		return "prefill"
	case StepMixed:
		return "mixed"
	case StepVerify:
		return "verify"
	}
	return "unknown"
}

// StepPhase is a part of a step's host time.
type StepPhase uint8

// Host phases of a step, the values of the "phase" label.
const (
	PhaseSchedule StepPhase = iota // the scheduler's plan (Schedule, ScheduleAhead) and queue-time bookkeeping
	PhaseLaunch                    // packing the step and queueing its device work (zero without a device clock: device time then)
	PhaseSample                    // sampling on the host (penalties, logprobs, JSON masks), and those rows' output
	PhaseOutput                    // device-sampled tokens: detokenizing, stop checks, handing events to the streams
	PhaseUpdate                    // the scheduler's update, finished requests' final events, gauges
	PhaseOther                     // the rest of the loop: admitting and reaping requests, building the step
	NumStepPhases
)

func (p StepPhase) String() string {
	return [...]string{"schedule", "launch", "sample", "output", "update", "other", "unknown"}[min(p, NumStepPhases)]
}

// stepSeries are the engine-step histograms, with the observer of every
// (kind, mode) pair resolved up front so that a step records without a
// label lookup or an allocation.
type stepSeries struct {
	hostVec, devVec *prometheus.HistogramVec
	host, dev       [numStepKinds][2]prometheus.Observer // [kind][graph]
	phaseVec        *prometheus.HistogramVec
	phase           [NumStepPhases]prometheus.Observer
	gap             prometheus.Histogram
	tokens          prometheus.Histogram
}

func newStepSeries() *stepSeries {
	labels := []string{StepKindLabel, StepModeLabel}
	s := &stepSeries{
		hostVec: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: StepHostMetric,
			Help: "Engine step time spent by the step loop on the host (scheduling, packing and launching, " +
				"host-side sampling, detokenizing, stop checks, handing events to the streams), between two steps' " +
				"results, less the time it waited for the device. By step kind (decode, prefill, mixed, verify: " +
				"speculative decoding's target step) and mode " +
				"(graph: the step replayed a captured graph; eager).",
			Buckets: StepBuckets}, labels),
		devVec: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: StepDeviceMetric,
			Help: "Engine step time on the device: on backends with a device clock (CUDA) the time between " +
				"timestamps queued on the stream before the step's first work and after its last (sampling " +
				"included; where the host's launches cannot keep the stream busy, the stream's waits inside the " +
				"step count too, and a step not queued ahead is closed once the host has its sampled ids, so " +
				"the read-back counts); on backends without one (CPU) the time the step loop waited on the backend's " +
				"calls for the step. By step kind and mode as " + StepHostMetric + ".",
			Buckets: StepBuckets}, labels),
		phaseVec: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: StepPhaseMetric,
			Help: StepHostMetric + " of each step split by phase: schedule, launch (packing the step and queueing " +
				"its device work; zero on backends without a device clock, where that is device time), sample " +
				"(host-side sampling), output (detokenizing, stop checks, events), update (scheduler update, " +
				"final events), other.",
			Buckets: StepBuckets}, []string{StepPhaseLabel}),
		gap: prometheus.NewHistogram(prometheus.HistogramOpts{Name: StepGapMetric,
			Help: "Time the device sat idle between the end of one engine step and the start of the next, " +
				"while the engine had work (device-clocked where the backend has a clock, else the host time " +
				"between the backend calls of two steps). Idle periods without requests are not counted.",
			Buckets: StepBuckets}),
		tokens: prometheus.NewHistogram(prometheus.HistogramOpts{Name: StepTokensMetric,
			Help:    "Tokens computed per engine step (vLLM's vllm:iteration_tokens_total).",
			Buckets: IterationTokenBuckets}),
	}
	for p := range NumStepPhases {
		s.phase[p] = s.phaseVec.WithLabelValues(p.String())
	}
	for k := range numStepKinds {
		for g, mode := range []string{StepModeEager, StepModeGraph} {
			s.host[k][g] = s.hostVec.WithLabelValues(k.String(), mode)
			s.dev[k][g] = s.devVec.WithLabelValues(k.String(), mode)
		}
	}
	return s
}

func (s *stepSeries) collectors() []prometheus.Collector {
	return []prometheus.Collector{s.hostVec, s.devVec, s.phaseVec, s.gap, s.tokens}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// ObserveStepHost records the host part of one engine step of kind k;
// graph says whether the step replayed a captured graph.
func (m *Metrics) ObserveStepHost(k StepKind, graph bool, d time.Duration) {
	if m != nil && k < numStepKinds {
		m.step.host[k][b2i(graph)].Observe(seconds(d))
	}
}

// ObserveStepHostPhase records the part of one step's host time spent in
// phase p.
func (m *Metrics) ObserveStepHostPhase(p StepPhase, d time.Duration) {
	if m != nil && p < NumStepPhases {
		m.step.phase[p].Observe(seconds(d))
	}
}

// ObserveStepDevice records the device part of one engine step.
func (m *Metrics) ObserveStepDevice(k StepKind, graph bool, d time.Duration) {
	if m != nil && k < numStepKinds {
		m.step.dev[k][b2i(graph)].Observe(seconds(d))
	}
}

// ObserveStepGap records the device's idle time between two engine steps.
func (m *Metrics) ObserveStepGap(d time.Duration) {
	if m != nil {
		m.step.gap.Observe(seconds(d))
	}
}

// ObserveIterationTokens records the tokens one engine step computed.
func (m *Metrics) ObserveIterationTokens(n int) {
	if m != nil && n >= 0 {
		m.step.tokens.Observe(float64(n))
	}
}
