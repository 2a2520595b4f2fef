package telemetry

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Speculative decoding's series, vLLM's spec_decode counters under the
// trigon_ prefix: acceptance rate = accepted / draft tokens, mean accepted
// length = 1 + accepted / drafts. The target's verify steps are timed by
// the step histograms (kind "verify"); the proposer's time has its own.
type specSeries struct {
	drafts, draftTokens, accepted prometheus.Counter
	perPos                        *prometheus.CounterVec
	draftTime                     prometheus.Histogram
}

// SpecPositionLabel is the label of the per-position accepted counter: the
// draft position, 0 first.
const SpecPositionLabel = "position"

func newSpecSeries() *specSeries {
	return &specSeries{
		drafts: prometheus.NewCounter(prometheus.CounterOpts{Name: "trigon_spec_decode_num_drafts_total",
			Help: "Drafts verified: sequences that brought proposed tokens to a verify step (vLLM's vllm:spec_decode_num_drafts)."}),
		draftTokens: prometheus.NewCounter(prometheus.CounterOpts{Name: "trigon_spec_decode_num_draft_tokens_total",
			Help: "Proposed tokens verified (vLLM's vllm:spec_decode_num_draft_tokens)."}),
		accepted: prometheus.NewCounter(prometheus.CounterOpts{Name: "trigon_spec_decode_num_accepted_tokens_total",
			Help: "Proposed tokens accepted by the target (vLLM's vllm:spec_decode_num_accepted_tokens)."}),
		perPos: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "trigon_spec_decode_num_accepted_tokens_per_pos_total",
			Help: "Proposed tokens accepted, by draft position, 0 first (vLLM's vllm:spec_decode_num_accepted_tokens_per_pos)."},
			[]string{SpecPositionLabel}),
		draftTime: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "trigon_spec_decode_draft_seconds",
			Help:    "Time an engine step spent proposing drafts (prompt lookup, or the draft model's steps), before the verify step.",
			Buckets: StepBuckets}),
	}
}

func (s *specSeries) collectors() []prometheus.Collector {
	return []prometheus.Collector{s.drafts, s.draftTokens, s.accepted, s.perPos, s.draftTime}
}

// ObserveSpecDraft records one verified draft of draftTokens proposed
// tokens of which the first accepted were accepted.
func (m *Metrics) ObserveSpecDraft(draftTokens, accepted int) {
	if m == nil || draftTokens <= 0 || accepted < 0 || accepted > draftTokens {
		return
	}
	m.spec.drafts.Inc()
	m.spec.draftTokens.Add(float64(draftTokens))
	m.spec.accepted.Add(float64(accepted))
	for i := range accepted {
		m.spec.perPos.WithLabelValues(strconv.Itoa(i)).Inc()
	}
}

// ObserveSpecDraftTime records the time one step spent proposing.
func (m *Metrics) ObserveSpecDraftTime(d time.Duration) {
	if m != nil {
		m.spec.draftTime.Observe(seconds(d))
	}
}
