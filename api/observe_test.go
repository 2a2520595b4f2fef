package api

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/trigon-llm/trigon/telemetry"
)

func scrapeMetrics(t *testing.T, e *env) map[string]*dto.MetricFamily {
	t.Helper()
	rec := e.do(t, "GET", "/metrics", "", "Accept", "text/plain")
	if rec.Code != 200 {
		t.Fatalf("/metrics status %d", rec.Code)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// metricValue returns a counter or gauge value, or a histogram's count.
func metricValue(t *testing.T, fams map[string]*dto.MetricFamily, name string, label ...string) float64 {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		t.Fatalf("metric %s missing from /metrics", name)
	}
	for _, m := range f.GetMetric() {
		if len(label) == 2 {
			match := false
			for _, lp := range m.GetLabel() {
				match = match || (lp.GetName() == label[0] && lp.GetValue() == label[1])
			}
			if !match {
				continue
			}
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue()
		case m.Gauge != nil:
			return m.GetGauge().GetValue()
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	t.Fatalf("metric %s%v not found", name, label)
	return 0
}

// TestOwnMetricsCarryModelName: metrics the server makes for itself
// label every trigon_ series with the served model's name (vLLM's
// model_name), the reasons of finished requests with finished_reason.
func TestOwnMetricsCarryModelName(t *testing.T) {
	e := newEnv(t, nil)
	e.generate(t, "/v1/completions", map[string]any{"prompt": "the cat sat", "max_tokens": 2, "ignore_eos": true})
	fams := scrapeMetrics(t, e)
	for _, name := range []string{"trigon_prompt_tokens_total", "trigon_request_success_total", "trigon_time_to_first_token_seconds"} {
		f, ok := fams[name]
		if !ok {
			t.Fatalf("%s missing", name)
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			if labels["model_name"] != testModel {
				t.Errorf("%s%v: model_name %q, want %q", name, labels, labels["model_name"], testModel)
			}
			if _, ok := labels["finished_reason"]; name == "trigon_request_success_total" && !ok {
				t.Errorf("%s%v: no finished_reason", name, labels)
			}
		}
	}
	if got := metricValue(t, fams, "trigon_request_success_total", "finished_reason", "length"); got != 1 {
		t.Errorf("finished_reason=length: %g, want 1", got)
	}
}

func TestMetricsAfterRequests(t *testing.T) {
	m := telemetry.NewMetrics()
	e := newEnv(t, func(o *Options) { o.Metrics = m })
	if e.srv.Metrics() != m {
		t.Fatal("server does not use the given metrics")
	}
	p1 := promptIDs(e.tok, "the cat sat")
	p2 := chatIDs(e.tok, []ChatMessage{{Role: "user", Content: "dog ran"}})
	p3 := promptIDs(e.tok, "red fox")

	// 2 choices x 5 tokens, non-streamed.
	e.generate(t, "/v1/completions", map[string]any{"prompt": "the cat sat", "n": 2, "max_tokens": 5, "ignore_eos": true})
	// 1 choice x 3 tokens, streamed.
	e.generate(t, "/v1/chat/completions", map[string]any{"messages": userMsg("dog ran"), "max_tokens": 3,
		"ignore_eos": true, "stream": true})
	// A choice that fails after 3 tokens.
	e.eng.failAfter, e.eng.failErr = 3, errors.New("boom")
	if rec := e.do(t, "POST", "/v1/completions", `{"prompt":"red fox","max_tokens":8,"ignore_eos":true}`); rec.Code != 500 {
		t.Fatalf("status %d", rec.Code)
	}
	// A rejected request counts nothing.
	e.do(t, "POST", "/v1/completions", `{"prompt":"red","temperature":9}`)

	fams := scrapeMetrics(t, e)
	checks := []struct {
		name  string
		label []string
		want  float64
	}{
		{"trigon_prompt_tokens_total", nil, float64(len(p1) + len(p2) + len(p3))},
		{"trigon_generation_tokens_total", nil, 10 + 3 + 3},
		{"trigon_request_success_total", []string{"finished_reason", "length"}, 3},
		{"trigon_request_success_total", []string{"finished_reason", "error"}, 1},
		{"trigon_request_success_total", []string{"finished_reason", "stop"}, 0},
		{"trigon_time_to_first_token_seconds", nil, 4},             // one per choice with a token
		{"trigon_inter_token_latency_seconds", nil, 4 + 4 + 2 + 2}, // tokens-1 per choice
		{"trigon_e2e_request_latency_seconds", nil, 4},             // one per finished choice
		// Engine-side series exist (the engine records them) and are zero here.
		{"trigon_request_queue_time_seconds", nil, 0},
		{"trigon_num_requests_running", nil, 0},
		{"trigon_num_requests_waiting", nil, 0},
		{"trigon_kv_cache_usage_perc", nil, 0},
		{"trigon_prefix_cache_hits_total", nil, 0},
		{"trigon_prefix_cache_queries_total", nil, 0},
		{"trigon_num_preemptions_total", nil, 0},
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			if got := metricValue(t, fams, c.name, c.label...); got != c.want {
				t.Errorf("%s%v = %g, want %g", c.name, c.label, got, c.want)
			}
		})
	}
	// The engine records into the same registry.
	m.SetRequestsRunning(3)
	m.AddPreemptions(2)
	fams = scrapeMetrics(t, e)
	if got := metricValue(t, fams, "trigon_num_requests_running"); got != 3 {
		t.Errorf("running %g", got)
	}
	if got := metricValue(t, fams, "trigon_num_preemptions_total"); got != 2 {
		t.Errorf("preemptions %g", got)
	}
}

// TestStreamWriteMetric: every server-sent event of a streamed reply,
// [DONE] included, is one observation of trigon_stream_write_seconds,
// and a reply that is not streamed is none.
func TestStreamWriteMetric(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.Metrics = telemetry.NewMetrics() })
	e.generate(t, "/v1/completions", map[string]any{"prompt": "the cat sat", "max_tokens": 4, "ignore_eos": true})
	if got := metricValue(t, scrapeMetrics(t, e), "trigon_stream_write_seconds"); got != 0 {
		t.Fatalf("a reply not streamed: %g stream writes, want 0", got)
	}
	events := 0
	for _, req := range []string{
		`{"messages":[{"role":"user","content":"dog ran"}],"max_tokens":3,"ignore_eos":true,"stream":true}`,
		`{"prompt":"red fox","max_tokens":5,"n":2,"ignore_eos":true,"stream":true}`,
	} {
		path := "/v1/completions"
		if strings.Contains(req, "messages") {
			path = "/v1/chat/completions"
		}
		rec := e.do(t, "POST", path, req)
		if rec.Code != 200 {
			t.Fatalf("%s: status %d", path, rec.Code)
		}
		n := strings.Count(rec.Body.String(), "data: ")
		if n < 4 || !strings.HasSuffix(rec.Body.String(), "data: [DONE]\n\n") {
			t.Fatalf("%s: %d events, body %q", path, n, rec.Body)
		}
		events += n
	}
	if got := metricValue(t, scrapeMetrics(t, e), "trigon_stream_write_seconds"); got != float64(events) {
		t.Errorf("trigon_stream_write_seconds count %g, want one per event (%d)", got, events)
	}
}

func TestTracingSpans(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := telemetry.NewTracerProvider(exp, "trigon-test", false)
	defer tp.Shutdown(context.Background())
	e := newEnv(t, func(o *Options) { o.TracerProvider = tp })

	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	body := mustJSON(t, map[string]any{"messages": userMsg("the cat"), "max_tokens": 4, "ignore_eos": true, "stream": true})
	rec := e.do(t, "POST", "/v1/chat/completions", body, "traceparent", "00-"+traceID+"-"+parentID+"-01")
	if rec.Code != 200 {
		t.Fatalf("status %d", rec.Code)
	}
	// A rejected request also gets a span, marked as an error.
	e.do(t, "POST", "/v1/completions", `{"prompt":"the","top_p":7}`)

	spans := exp.GetSpans()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want 2", len(spans))
	}
	s := spans[0]
	if s.Name != "POST /v1/chat/completions" || s.SpanKind != trace.SpanKindServer {
		t.Errorf("span %q kind %v", s.Name, s.SpanKind)
	}
	if s.SpanContext.TraceID().String() != traceID || s.Parent.SpanID().String() != parentID {
		t.Errorf("trace %s parent %s: traceparent not continued", s.SpanContext.TraceID(), s.Parent.SpanID())
	}
	attrs := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes {
		attrs[kv.Key] = kv.Value
	}
	prompt := chatIDs(e.tok, []ChatMessage{{Role: "user", Content: "the cat"}})
	wantInt := map[attribute.Key]int64{
		"gen_ai.usage.input_tokens":   int64(len(prompt)),
		"gen_ai.usage.output_tokens":  4,
		"gen_ai.request.max_tokens":   4,
		"gen_ai.request.choice.count": 1,
		"http.response.status_code":   200,
	}
	for k, v := range wantInt {
		if got := attrs[k].AsInt64(); got != v {
			t.Errorf("%s = %d, want %d", k, got, v)
		}
	}
	if got := attrs["gen_ai.response.finish_reasons"].AsStringSlice(); !reflect.DeepEqual(got, []string{"length"}) {
		t.Errorf("finish_reasons %v", got)
	}
	if got := attrs["trigon.request_id"].AsString(); got != rec.Header().Get("X-Request-Id") || got == "" {
		t.Errorf("request id %q", got)
	}
	if len(s.Events) != 1 || s.Events[0].Name != "first_token" {
		t.Errorf("events %v, want first_token", s.Events)
	}
	if s.Status.Code == codes.Error {
		t.Errorf("successful request marked as error")
	}
	bad := spans[1]
	if bad.Status.Code != codes.Error || bad.SpanContext.TraceID().String() == traceID {
		t.Errorf("rejected request span: status %v", bad.Status)
	}
}
