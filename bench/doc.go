// Package bench measures trigon: `trigon bench latency` times one batch
// through the model and runner directly (prefill time, decode-step
// latency, achieved memory bandwidth against a floor), and `trigon bench
// serve` drives a running OpenAI-compatible server with Poisson arrivals
// and reports TTFT, inter-token latency and throughput, goodput against
// request-level objectives (goodput.go, vLLM's definitions), and from a
// trigon server's /metrics its engine steps' host and device times
// (metrics.go); RunSweep runs it at several rates and WritePlot draws the
// throughput-latency curve (sweep.go, plot.go). `trigon bench
// overlap` answers a scheduling question: while a batch decodes and a
// prompt arrives, compare mixed steps (decode rows plus a prefill chunk),
// serial steps and prefill on a second stream (see overlap.go).
//
// Latency runs need no checkpoint: Arch names a published architecture
// (or reads a config.json) and SyntheticWeights generates deterministic
// random weights of that shape, so the numbers depend only on shapes and
// dtypes, as a benchmark's should. SyntheticTokenizer and PadTokenizer
// give such weights a tokenizer that covers their vocabulary, for serving
// them (trigon serve --load-format dummy). bench/peers holds the Python
// scripts that time the same shapes in Hugging Face transformers and a
// gpt-fast-style PyTorch model, and compare.py, which prints the ratios.
//
// Timing regions start after backend.Sync (the GPU is asynchronous) and end
// when the sampled token ids are back on the host, so each region covers
// the device work it launched.
//
//	cfg, err := bench.Arch("llama-3-8b")
//	if err != nil { ... }
//	w, err := bench.SyntheticWeights(cfg, backend.BF16, 0)
//	if err != nil { ... }
//	defer w.Close()
//	res, err := bench.RunLatency(ctx, bench.LatencyOptions{
//		Backend: b, Config: cfg, Weights: w, Batch: 4, InputLen: 2048, OutputLen: 128,
//	})
//	res.WriteText(os.Stdout)
package bench
