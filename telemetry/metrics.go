package telemetry

import (
	"math"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Bucket boundaries, in seconds. Decode steps on a modern GPU take a few
// milliseconds while a long prefill behind a deep queue can take minutes, so
// each histogram spans three to five orders of magnitude with finer steps
// where latency targets (SLOs) usually sit.
var (
	// TTFTBuckets: interactive targets sit between 50 ms and 2 s.
	TTFTBuckets = []float64{0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5,
		0.75, 1, 1.5, 2, 3, 5, 7.5, 10, 20, 40, 80, 160, 320}
	// InterTokenBuckets: one decode step, milliseconds on a GPU, up to a
	// few seconds on a CPU or under heavy preemption.
	InterTokenBuckets = []float64{0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025,
		0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5, 5}
	// E2EBuckets: whole requests, from a short reply to a long generation.
	E2EBuckets = []float64{0.1, 0.25, 0.5, 1, 1.5, 2, 3, 5, 7.5, 10, 15, 20, 30, 45, 60, 90,
		120, 180, 300, 600, 1200, 2400}
	// StreamWriteBuckets: one event written and flushed to a client's
	// socket, microseconds when the kernel's buffer has room, as long as
	// the client takes to read when it is full.
	StreamWriteBuckets = []float64{1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 0.001, 0.0025, 0.005, 0.01,
		0.025, 0.05, 0.1, 0.25, 0.5, 1}
	// QueueBuckets: zero when the server keeps up, minutes when it does not.
	QueueBuckets = []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
		20, 40, 80, 160, 320, 640}
)

// Metrics is trigon's set of Prometheus series, held in a registry of their
// own. All methods are safe for concurrent use, and all are no-ops on a nil
// *Metrics, so callers that were given no metrics need no checks.
type Metrics struct {
	reg *prometheus.Registry

	ttft       prometheus.Histogram
	itl        prometheus.Histogram
	e2e        prometheus.Histogram
	queue      prometheus.Histogram
	write      prometheus.Histogram
	running    prometheus.Gauge
	waiting    prometheus.Gauge
	kvUsage    prometheus.Gauge
	kvCapacity *prometheus.GaugeVec
	pcHits     prometheus.Counter
	pcQuery    prometheus.Counter
	preempt    prometheus.Counter
	ahead      prometheus.Counter
	graphs     *prometheus.CounterVec
	prompt     prometheus.Counter
	gen        prometheus.Counter
	finished   *prometheus.CounterVec
	step       *stepSeries
	spec       *specSeries
}

// Names of series and labels that readers of /metrics look up, as vLLM's
// (V1) with trigon_ for vllm:.
const (
	// ModelNameLabel is the label every trigon_ series carries when the
	// metrics were made for a served model (NewMetricsFor).
	ModelNameLabel = "model_name"
	// KVCacheUsageMetric is the share of KV-cache blocks in use, 0 to 1.
	KVCacheUsageMetric = "trigon_kv_cache_usage_perc"
	// RequestSuccessMetric counts finished choices by FinishedReasonLabel.
	RequestSuccessMetric = "trigon_request_success_total"
	FinishedReasonLabel  = "finished_reason"
)

// NewMetrics builds the series, without a model_name label, and a
// registry holding them together with the Go runtime and process
// collectors.
func NewMetrics() *Metrics { return NewMetricsFor("") }

// NewMetricsFor is NewMetrics for a server of the model clients call
// modelName: every trigon_ series carries the constant label
// model_name=modelName, as each of vLLM's vllm: series carries its served
// model's name, so that queries and dashboards written for vLLM select
// the same way. The Go and process series do not (vLLM's process series
// have no such label either). An empty modelName sets no label.
func NewMetricsFor(modelName string) *Metrics {
	hist := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets})
	}
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		ttft: hist("trigon_time_to_first_token_seconds",
			"Time from request arrival to the first generated token of a choice.", TTFTBuckets),
		itl: hist("trigon_inter_token_latency_seconds",
			"Time between consecutive token deliveries of one choice.", InterTokenBuckets),
		e2e: hist("trigon_e2e_request_latency_seconds",
			"Time from request arrival to the last token of a choice.", E2EBuckets),
		queue: hist("trigon_request_queue_time_seconds",
			"Time a request waited in the scheduler queue before its first step.", QueueBuckets),
		// trigon's own (vLLM has none): the API's side of a token's way
		// out, which runs beside the engine's step loop, not in it.
		write: hist("trigon_stream_write_seconds",
			"Time to write and flush one server-sent event of a streamed response to its client.", StreamWriteBuckets),
		running: prometheus.NewGauge(prometheus.GaugeOpts{Name: "trigon_num_requests_running",
			Help: "Sequences scheduled in the running batch."}),
		waiting: prometheus.NewGauge(prometheus.GaugeOpts{Name: "trigon_num_requests_waiting",
			Help: "Sequences waiting in the scheduler queue."}),
		// vLLM's name (V1's vllm:kv_cache_usage_perc), and as there a
		// fraction despite the name.
		kvUsage: prometheus.NewGauge(prometheus.GaugeOpts{Name: KVCacheUsageMetric,
			Help: "Fraction of KV-cache blocks in use, 0 to 1 (1 means 100 percent, as vLLM's)."}),
		kvCapacity: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "trigon_kv_cache_capacity_tokens",
			Help: "Tokens the KV cache holds, labelled by its dtype (--kv-cache-dtype)."}, []string{"dtype"}),
		pcHits: prometheus.NewCounter(prometheus.CounterOpts{Name: PrefixHitsMetric,
			Help: "Prompt tokens found in the prefix cache."}),
		pcQuery: prometheus.NewCounter(prometheus.CounterOpts{Name: PrefixQueriesMetric,
			Help: "Prompt tokens looked up in the prefix cache."}),
		preempt: prometheus.NewCounter(prometheus.CounterOpts{Name: "trigon_num_preemptions_total",
			Help: "Sequences preempted (KV blocks freed, to be recomputed)."}),
		ahead: prometheus.NewCounter(prometheus.CounterOpts{Name: "trigon_ahead_steps_total",
			Help: "Engine steps queued on the device before the previous step's tokens reached the host (--queue-ahead)."}),
		graphs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "trigon_graph_events_total",
			Help: "The runner's CUDA graph cache: graphs captured, replayed, and evicted (the least recently used, beyond the cache's bound)."}, []string{"event"}),
		prompt: prometheus.NewCounter(prometheus.CounterOpts{Name: "trigon_prompt_tokens_total",
			Help: "Prompt tokens of accepted requests."}),
		gen: prometheus.NewCounter(prometheus.CounterOpts{Name: "trigon_generation_tokens_total",
			Help: "Generated tokens, summed over choices."}),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{Name: RequestSuccessMetric,
			Help: "Finished choices by finish reason (stop, length, abort, error)."}, []string{FinishedReasonLabel}),
		step: newStepSeries(),
		spec: newSpecSeries(),
	}
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	var own prometheus.Registerer = m.reg
	if modelName != "" {
		own = prometheus.WrapRegistererWith(prometheus.Labels{ModelNameLabel: modelName}, m.reg)
	}
	own.MustRegister(
		m.ttft, m.itl, m.e2e, m.queue, m.write, m.running, m.waiting, m.kvUsage, m.kvCapacity,
		m.pcHits, m.pcQuery, m.preempt, m.ahead, m.graphs, m.prompt, m.gen, m.finished,
	)
	own.MustRegister(m.step.collectors()...)
	own.MustRegister(m.spec.collectors()...)
	// Pre-create the usual reasons so dashboards see zeros, not gaps.
	for _, r := range []string{"stop", "length", "abort", "error"} {
		m.finished.WithLabelValues(r)
	}
	for _, e := range []string{"capture", "replay", "eviction"} {
		m.graphs.WithLabelValues(e)
	}
	return m
}

// Registry returns the registry, for embedders that add their own series.
func (m *Metrics) Registry() *prometheus.Registry {
	if m == nil {
		return nil
	}
	return m.reg
}

// Handler serves the registry in the Prometheus exposition formats.
// A nil *Metrics serves 404, so a server without metrics says so plainly.
func (m *Metrics) Handler() http.Handler {
	if m == nil {
		return http.NotFoundHandler()
	}
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

func seconds(d time.Duration) float64 {
	if d < 0 {
		return 0
	}
	return d.Seconds()
}

// ObserveTTFT records the time from request arrival to a choice's first token.
func (m *Metrics) ObserveTTFT(d time.Duration) {
	if m != nil {
		m.ttft.Observe(seconds(d))
	}
}

// ObserveInterTokenLatency records the gap between two consecutive token
// deliveries of one choice.
func (m *Metrics) ObserveInterTokenLatency(d time.Duration) {
	if m != nil {
		m.itl.Observe(seconds(d))
	}
}

// ObserveE2ELatency records the time from request arrival to a choice's end.
func (m *Metrics) ObserveE2ELatency(d time.Duration) {
	if m != nil {
		m.e2e.Observe(seconds(d))
	}
}

// ObserveQueueTime records how long a request waited before its first
// scheduled step.
func (m *Metrics) ObserveQueueTime(d time.Duration) {
	if m != nil {
		m.queue.Observe(seconds(d))
	}
}

// ObserveStreamWrite records the time one server-sent event took to
// write and flush.
func (m *Metrics) ObserveStreamWrite(d time.Duration) {
	if m != nil {
		m.write.Observe(seconds(d))
	}
}

// SetRequestsRunning sets the number of sequences in the running batch.
func (m *Metrics) SetRequestsRunning(n int) {
	if m != nil {
		m.running.Set(float64(max(n, 0)))
	}
}

// SetRequestsWaiting sets the number of sequences waiting to be scheduled.
func (m *Metrics) SetRequestsWaiting(n int) {
	if m != nil {
		m.waiting.Set(float64(max(n, 0)))
	}
}

// SetKVCache states the KV cache's dtype and capacity in tokens.
func (m *Metrics) SetKVCache(dtype string, capacityTokens int) {
	if m == nil {
		return
	}
	m.kvCapacity.Reset()
	m.kvCapacity.WithLabelValues(dtype).Set(float64(capacityTokens))
}

// SetKVCacheUsage sets the fraction of KV blocks in use; values outside
// [0, 1] are clamped and NaN is ignored.
func (m *Metrics) SetKVCacheUsage(ratio float64) {
	if m == nil || math.IsNaN(ratio) {
		return
	}
	m.kvUsage.Set(min(max(ratio, 0), 1))
}

// AddPrefixCacheLookup records one lookup of queried prompt tokens of which
// hit were found cached. The hit rate is hits_total / queries_total.
// Negative counts are ignored (a Prometheus counter cannot go down).
func (m *Metrics) AddPrefixCacheLookup(queried, hit int) {
	if m == nil || queried < 0 || hit < 0 {
		return
	}
	m.pcQuery.Add(float64(queried))
	m.pcHits.Add(float64(hit))
}

// AddPreemptions counts n preempted sequences.
func (m *Metrics) AddPreemptions(n int) {
	if m != nil && n > 0 {
		m.preempt.Add(float64(n))
	}
}

// AddAheadSteps counts n steps queued ahead (engine.Options.QueueAhead).
func (m *Metrics) AddAheadSteps(n int) {
	if m != nil && n > 0 {
		m.ahead.Add(float64(n))
	}
}

// AddGraphEvents counts the graph cache's captures, replays and
// evictions since the last call.
func (m *Metrics) AddGraphEvents(captures, replays, evictions uint64) {
	if m == nil {
		return
	}
	for _, e := range []struct {
		name string
		n    uint64
	}{{"capture", captures}, {"replay", replays}, {"eviction", evictions}} {
		if e.n > 0 {
			m.graphs.WithLabelValues(e.name).Add(float64(e.n))
		}
	}
}

// AddPromptTokens counts the prompt tokens of an accepted request (once per
// request, however many choices it has, as usage.prompt_tokens does).
func (m *Metrics) AddPromptTokens(n int) {
	if m != nil && n > 0 {
		m.prompt.Add(float64(n))
	}
}

// AddGenerationTokens counts n generated tokens.
func (m *Metrics) AddGenerationTokens(n int) {
	if m != nil && n > 0 {
		m.gen.Add(float64(n))
	}
}

// RequestFinished counts one finished choice under its finish reason
// ("stop", "length", "abort", "error"; anything else counts as "other", so a
// caller bug cannot blow up the label cardinality). Each choice of an n>1
// request counts once, because each is a sequence of its own in the engine.
func (m *Metrics) RequestFinished(reason string) {
	if m == nil {
		return
	}
	switch reason {
	case "stop", "length", "abort", "error":
	default:
		reason = "other"
	}
	m.finished.WithLabelValues(reason).Inc()
}
