// Package telemetry holds trigon's observability: Prometheus metrics in a
// registry of their own and OpenTelemetry tracing.
//
// Metrics live in a dedicated registry (not prometheus.DefaultRegisterer) so
// that tests and embedders can build several servers in one process without
// duplicate-registration panics, and so /metrics shows exactly what trigon
// owns plus the Go and process collectors.
//
// Who records what: the HTTP layer (package api) sees every token as it is
// streamed to the client, so it records the per-request series:
// time to first token, inter-token latency, end-to-end latency, prompt and
// generation token counters and finished requests by reason. The engine sees
// the scheduler, so it records the rest: queue time, running and waiting
// gauges, KV-cache usage, prefix-cache queries and hits, preemptions,
// steps queued ahead, and per engine step its host time, device time, the
// device's idle gap before it and its token count (step.go).
// Recording one series from both places would double count it.
//
// Tracing is off by default: without a configured endpoint the global
// tracer provider stays OpenTelemetry's no-op one and spans cost nothing.
package telemetry
