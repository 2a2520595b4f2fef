package llama_test

import (
	"context"
	"runtime"
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/cuda"
	"github.com/trigon-llm/trigon/bench"
)

// BenchmarkDecodeStepHostCUDA measures what the host allocates per decode
// step of bench latency's loop on the GPU (Llama-3.2-1B shape, synthetic
// BF16 weights made on the device, batch 4, CUDA graphs on, steps queued
// ahead): after a warm-up run, two runs that differ only in their decode
// steps, so setup cancels. Reports objects and bytes per step and the GC cycles per 100
// steps. Run with -test.memprofile (and -test.memprofilerate=1) to see
// where the allocations come from.
func BenchmarkDecodeStepHostCUDA(b *testing.B) {
	if err := cuda.Available(); err != nil {
		b.Skipf("no CUDA GPU: %v", err)
	}
	g, err := cuda.New(cuda.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	cfg, err := bench.Arch("llama-3.2-1b")
	if err != nil {
		b.Fatal(err)
	}
	w, err := bench.SyntheticWeights(cfg, backend.BF16, 0)
	if err != nil {
		b.Fatal(err)
	}
	run := func(out int) (mallocs, bytes, gcs uint64) {
		var m0, m1 runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m0)
		if _, err := bench.RunLatency(context.Background(), bench.LatencyOptions{
			Backend: g, Config: cfg, Weights: w, Arch: "llama-3.2-1b", Batch: 4, InputLen: 128, OutputLen: out,
			Warmup: 0, Iters: 1, CUDAGraphs: true,
		}); err != nil {
			b.Fatal(err)
		}
		runtime.ReadMemStats(&m1)
		return m1.Mallocs - m0.Mallocs, m1.TotalAlloc - m0.TotalAlloc, uint64(m1.NumGC - m0.NumGC)
	}
	const short, long = 16, 16 + 256
	run(short) // kernels, plans and the graph's capture: one-time costs the measured runs must not see
	for range b.N {
		m0, b0, g0 := run(short)
		m1, b1, g1 := run(long)
		steps := float64(long - short)
		b.ReportMetric(float64(int64(m1)-int64(m0))/steps, "objects/step")
		b.ReportMetric(float64(int64(b1)-int64(b0))/steps, "bytes/step")
		b.ReportMetric(float64(int64(g1)-int64(g0))*100/steps, "gc/100steps")
	}
}
