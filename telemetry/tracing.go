package telemetry

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// DefaultServiceName names the service in exported spans when
// TracingOptions.ServiceName is empty.
const DefaultServiceName = "trigon"

// TracingOptions configures OpenTelemetry tracing.
type TracingOptions struct {
	// Endpoint is the OTLP/HTTP collector URL, such as
	// "http://localhost:4318" (the path defaults to /v1/traces) or
	// "https://collector:4318/custom/path". Empty turns tracing off.
	Endpoint string
	// ServiceName is the service.name resource attribute.
	ServiceName string
}

// Tracing installs a global tracer provider that batches spans to an OTLP/HTTP
// collector, and the W3C trace-context propagator, so incoming traceparent
// headers continue the caller's trace. With an empty Endpoint it changes
// nothing (the global provider stays the no-op one) and returns a no-op
// shutdown. The returned shutdown flushes pending spans; call it on exit.
func Tracing(ctx context.Context, opts TracingOptions) (shutdown func(context.Context) error, err error) {
	if opts.Endpoint == "" {
		return func(context.Context) error { return nil }, nil
	}
	u, err := parseEndpoint(opts.Endpoint)
	if err != nil {
		return nil, err
	}
	httpOpts := []otlptracehttp.Option{
		otlptracehttp.WithEndpoint(u.Host),
		otlptracehttp.WithURLPath(u.Path),
	}
	if u.Scheme == "http" {
		httpOpts = append(httpOpts, otlptracehttp.WithInsecure())
	}
	exp, err := otlptracehttp.New(ctx, httpOpts...)
	if err != nil {
		return nil, fmt.Errorf("tracing: otlp exporter for %s: %w", opts.Endpoint, err)
	}
	tp := NewTracerProvider(exp, opts.ServiceName, true)
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(
		propagation.TraceContext{}, propagation.Baggage{}))
	return tp.Shutdown, nil
}

// NewTracerProvider builds an SDK tracer provider around exp, with a
// service.name resource. Batching suits a network exporter; tests pass
// batch=false so spans reach an in-memory exporter as soon as they end.
// Sampling follows the parent's decision and samples every root span.
func NewTracerProvider(exp sdktrace.SpanExporter, serviceName string, batch bool) *sdktrace.TracerProvider {
	if serviceName == "" {
		serviceName = DefaultServiceName
	}
	res := resource.NewSchemaless(attribute.String("service.name", serviceName))
	proc := sdktrace.NewSimpleSpanProcessor(exp)
	if batch {
		proc = sdktrace.NewBatchSpanProcessor(exp)
	}
	return sdktrace.NewTracerProvider(
		sdktrace.WithResource(res),
		sdktrace.WithSpanProcessor(proc),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())),
	)
}

// parseEndpoint checks an OTLP/HTTP URL and fills in the default path. The
// exporter's own URL option would post to "/" for a URL without a path,
// which no collector serves, so the path is set here.
func parseEndpoint(endpoint string) (*url.URL, error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return nil, fmt.Errorf("tracing: endpoint %q: %w", endpoint, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("tracing: endpoint %q: scheme must be http or https", endpoint)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("tracing: endpoint %q: missing host", endpoint)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return nil, fmt.Errorf("tracing: endpoint %q: query, fragment and user info are not supported", endpoint)
	}
	if strings.Trim(u.Path, "/") == "" {
		u.Path = "/v1/traces"
	}
	return u, nil
}
