package telemetry

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// restoreGlobals puts back the global tracer provider and propagator that
// Tracing replaces, so tests do not leak into each other.
func restoreGlobals(t *testing.T) {
	tp, prop := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	t.Cleanup(func() {
		otel.SetTracerProvider(tp)
		otel.SetTextMapPropagator(prop)
	})
}

func TestTracingOffByDefault(t *testing.T) {
	restoreGlobals(t)
	before := otel.GetTracerProvider()
	shutdown, err := Tracing(context.Background(), TracingOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if otel.GetTracerProvider() != before {
		t.Error("Tracing with no endpoint replaced the global provider")
	}
	_, span := otel.Tracer("x").Start(context.Background(), "s")
	if span.SpanContext().IsSampled() {
		t.Error("span sampled with tracing off")
	}
	span.End()
	if err := shutdown(context.Background()); err != nil {
		t.Errorf("shutdown: %v", err)
	}
}

func TestTracingBadEndpoint(t *testing.T) {
	cases := []string{"ftp://host:4318", "localhost:4318", "http://", "http://h/x?q=1", "http://u:p@h", "::"}
	for _, ep := range cases {
		t.Run(ep, func(t *testing.T) {
			restoreGlobals(t)
			if _, err := Tracing(context.Background(), TracingOptions{Endpoint: ep}); err == nil {
				t.Errorf("endpoint %q accepted", ep)
			}
		})
	}
}

// TestTracingExportsOTLP runs a fake collector and checks that a span made
// through the global tracer arrives as an OTLP/HTTP protobuf export with
// the service name, on the default path or a configured one.
func TestTracingExportsOTLP(t *testing.T) {
	cases := []struct{ suffix, wantPath string }{
		{"", "/v1/traces"},
		{"/", "/v1/traces"},
		{"/custom/traces", "/custom/traces"},
	}
	for _, tc := range cases {
		t.Run(tc.wantPath+tc.suffix, func(t *testing.T) {
			restoreGlobals(t)
			var mu sync.Mutex
			var paths []string
			var reqs []*coltracepb.ExportTraceServiceRequest
			col := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				var req coltracepb.ExportTraceServiceRequest
				if err := proto.Unmarshal(body, &req); err != nil {
					t.Errorf("collector: bad protobuf: %v", err)
				}
				mu.Lock()
				paths = append(paths, r.URL.Path)
				reqs = append(reqs, &req)
				mu.Unlock()
				w.Header().Set("Content-Type", "application/x-protobuf")
			}))
			defer col.Close()

			shutdown, err := Tracing(context.Background(), TracingOptions{Endpoint: col.URL + tc.suffix, ServiceName: "trigon-test"})
			if err != nil {
				t.Fatal(err)
			}
			_, span := otel.Tracer("test").Start(context.Background(), "request-"+tc.wantPath)
			span.End()
			if err := shutdown(context.Background()); err != nil {
				t.Fatalf("shutdown: %v", err)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(reqs) == 0 {
				t.Fatal("collector received nothing")
			}
			var found bool
			for i, req := range reqs {
				if paths[i] != tc.wantPath {
					t.Errorf("export posted to %q, want %q", paths[i], tc.wantPath)
				}
				for _, rs := range req.GetResourceSpans() {
					var svc string
					for _, kv := range rs.GetResource().GetAttributes() {
						if kv.GetKey() == "service.name" {
							svc = kv.GetValue().GetStringValue()
						}
					}
					for _, ss := range rs.GetScopeSpans() {
						for _, sp := range ss.GetSpans() {
							if sp.GetName() == "request-"+tc.wantPath {
								found = true
								if svc != "trigon-test" {
									t.Errorf("service.name = %q", svc)
								}
							}
						}
					}
				}
			}
			if !found {
				t.Error("span not in any export")
			}
			// The W3C propagator must be installed for incoming traceparent.
			if !strings.Contains(strings.Join(otel.GetTextMapPropagator().Fields(), ","), "traceparent") {
				t.Error("traceparent propagator not installed")
			}
		})
	}
}

// TestNewTracerProviderParentBased checks the sampler follows a remote
// parent: a sampled traceparent continues the caller's trace id.
func TestNewTracerProviderParentBased(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := NewTracerProvider(exp, "", false)
	defer tp.Shutdown(context.Background())
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	carrier := propagation.MapCarrier{"traceparent": "00-" + traceID + "-00f067aa0ba902b7-01"}
	ctx := propagation.TraceContext{}.Extract(context.Background(), carrier)
	_, span := tp.Tracer("t").Start(ctx, "child", trace.WithSpanKind(trace.SpanKindServer))
	span.End()
	spans := exp.GetSpans()
	if len(spans) != 1 {
		t.Fatalf("%d spans, want 1", len(spans))
	}
	if got := spans[0].SpanContext.TraceID().String(); got != traceID {
		t.Errorf("trace id %s, want %s", got, traceID)
	}
	if got := spans[0].Parent.SpanID().String(); got != "00f067aa0ba902b7" {
		t.Errorf("parent span %s", got)
	}
	var svc string
	for _, kv := range spans[0].Resource.Attributes() {
		if kv.Key == "service.name" {
			svc = kv.Value.AsString()
		}
	}
	if svc != DefaultServiceName {
		t.Errorf("service.name %q, want %q", svc, DefaultServiceName)
	}
}
