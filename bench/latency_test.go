package bench

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/cpu"
	"github.com/trigon-llm/trigon/model"
	"github.com/trigon-llm/trigon/model/llama"
	"github.com/trigon-llm/trigon/runner"
)

// replayBackend stands in for a graph-capturing backend on the CPU: a
// "graph" re-runs the captured function, so a replay computes what the
// captured ops would on whatever the static inputs hold at launch. That
// checks the runner's side of graphs: padded static inputs refreshed
// before each launch, the captured logits read after it.
type replayBackend struct {
	backend.Backend
	graphs []*replayGraph
}

type replayGraph struct {
	fn       func() error
	launches int
	closed   bool
}

func (g *replayGraph) Launch() error { g.launches++; return g.fn() }
func (g *replayGraph) Close()        { g.closed = true }

// SampleTo and ReadAsync pass through, so the benchmark feeds sampled ids
// to the next step on the replayed path too.
func (r *replayBackend) SampleTo(ids backend.Tensor, a backend.SampleArgs) error {
	return r.Backend.(backend.DeviceSampler).SampleTo(ids, a)
}

func (r *replayBackend) ReadAsync(t backend.Tensor, dst []byte) (func() error, error) {
	return r.Backend.(backend.DeviceSampler).ReadAsync(t, dst)
}

func (r *replayBackend) CaptureGraph(fn func() error) (backend.Graph, error) {
	g := &replayGraph{fn: fn}
	r.graphs = append(r.graphs, g)
	return g, nil
}

// referenceGreedy generates outputLen tokens for one prompt the slow way:
// every step recomputes the whole sequence from position 0 in a fresh
// cache and takes the host argmax (lowest id on ties) of the last logits.
// It shares only the model code with the benchmark, not its KV handling,
// block tables, batching or device sampling.
func referenceGreedy(t *testing.T, cfg model.Config, w model.Weights, prompt []int32, outputLen int) []int32 {
	t.Helper()
	b := cpu.New(cpu.Options{Threads: 2})
	total := len(prompt) + outputLen
	m, err := llama.New(b, cfg, w, model.Options{MaxTokens: total})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	blocks := (total + 15) / 16
	r, err := runner.New(b, m, runner.Options{NumBlocks: blocks + 1, BlockSize: 16, MaxTokens: total, MaxSeqs: 1, MaxSeqLen: total,
		NumLayers: cfg.NumLayers, NumKVHeads: cfg.NumKVHeads, HeadDim: cfg.HeadDim})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	table := make([]int32, blocks)
	for i := range table {
		table[i] = int32(i + 1)
	}
	seq := slices.Clone(prompt)
	var out []int32
	for range outputLen {
		o, err := r.Execute(&runner.Step{Seqs: []runner.Seq{{Tokens: seq, BlockTable: table, WantLogits: true}}})
		if err != nil {
			t.Fatal(err)
		}
		logits, err := o.Logits(0)
		if err != nil {
			t.Fatal(err)
		}
		best := 0
		for i, v := range logits {
			if v > logits[best] {
				best = i
			}
		}
		out = append(out, int32(best))
		seq = append(seq, int32(best))
	}
	return out
}

// prompts regenerates the benchmark's prompts (same seed and stream).
func prompts(seed uint64, batch, inputLen, vocab int) [][]int32 {
	rng := rand.New(rand.NewPCG(seed, 0x6c61_7465_6e63_79))
	var ps [][]int32
	for range batch {
		p := make([]int32, inputLen)
		for i := range p {
			p[i] = int32(rng.IntN(vocab))
		}
		ps = append(ps, p)
	}
	return ps
}

// TestRunLatencyGreedyTokens runs the benchmark on the CPU in several
// shapes (chunked prefill with several sequences per step, graphs
// replayed) and checks its greedy tokens against referenceGreedy.
func TestRunLatencyGreedyTokens(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		cfg                   model.Config
		dt                    backend.DType
		batch, in, out, chunk int
		warmup, iters         int
		graphs                bool
	}{
		{"one sequence", tinyConfig(false, false), backend.BF16, 1, 20, 6, 0, 0, 1, false},
		{"chunked batch", tinyConfig(false, false), backend.BF16, 3, 20, 6, 7, 1, 2, false},
		{"chunked batch graphs", tinyConfig(false, false), backend.BF16, 3, 20, 6, 7, 1, 2, true},
		{"qwen2 tied q8 graphs", func() model.Config { c := tinyConfig(true, true); return c }(), backend.Q8_0, 2, 33, 5, 16, 1, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := mustSynthetic(t, tc.cfg, tc.dt, 42)
			rb := &replayBackend{Backend: cpu.New(cpu.Options{Threads: 2})}
			opts := LatencyOptions{
				Backend: cpu.New(cpu.Options{Threads: 2}), Config: tc.cfg, Weights: w, Arch: "tiny",
				Batch: tc.batch, InputLen: tc.in, OutputLen: tc.out, PrefillChunk: tc.chunk,
				Warmup: tc.warmup, Iters: tc.iters, Seed: 3, CUDAGraphs: tc.graphs,
			}
			if tc.graphs {
				opts.Backend = rb
			}
			res, err := RunLatency(context.Background(), opts)
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Tokens) != tc.batch {
				t.Fatalf("%d token rows, want %d", len(res.Tokens), tc.batch)
			}
			for s, p := range prompts(3, tc.batch, tc.in, tc.cfg.VocabSize) {
				want := referenceGreedy(t, tc.cfg, w, p, tc.out)
				if !slices.Equal(res.Tokens[s], want) {
					t.Errorf("sequence %d: tokens %v, reference %v", s, res.Tokens[s], want)
				}
			}
			if res.PrefillMS.Count != tc.iters || res.E2EMS.Count != tc.iters || res.ITLMS.Count != tc.iters*(tc.out-1) {
				t.Errorf("counts: prefill %d, e2e %d, itl %d; want %d, %d, %d",
					res.PrefillMS.Count, res.E2EMS.Count, res.ITLMS.Count, tc.iters, tc.iters, tc.iters*(tc.out-1))
			}
			if res.QueuedStepMS == nil || !(*res.QueuedStepMS > 0) {
				t.Errorf("queued step time %v, want a positive time", res.QueuedStepMS)
			}
			if !(res.E2EMS.Min >= res.PrefillMS.Min) || !(res.ITLMS.Min > 0) {
				t.Errorf("e2e %v shorter than prefill %v, or a zero step %v", res.E2EMS, res.PrefillMS, res.ITLMS)
			}
			if tc.graphs {
				if res.CUDAGraphs != "on" || len(rb.graphs) != 1 {
					t.Fatalf("cuda_graphs %q with %d graphs captured, want on and 1", res.CUDAGraphs, len(rb.graphs))
				}
				// Every decode step but the first (eager, loading kernels)
				// replays the graph, as do the queued steps; the run closes it.
				g := rb.graphs[0]
				if want := (tc.warmup+tc.iters)*(tc.out-1) - 1 + queuedSteps; g.launches != want || !g.closed {
					t.Errorf("graph launched %d times (closed %v), want %d and closed", g.launches, g.closed, want)
				}
			} else if res.CUDAGraphs != "off" {
				t.Errorf("cuda_graphs %q, want off", res.CUDAGraphs)
			}
		})
	}
}

// fakeProber is a CPU backend that reports a fixed copy bandwidth.
type fakeProber struct {
	*cpu.Backend
	bw float64
}

func (f fakeProber) MeasureCopyBandwidth(int) (float64, error) { return f.bw, nil }

// TestLatencyAccounting checks bytes, FLOPs, rates and floors against
// formulas written from the architecture.
// noProber hides a backend's copy-bandwidth probe.
type noProber struct{ backend.Backend }

func TestLatencyAccounting(t *testing.T) {
	const batch, in, out = 2, 24, 5
	for _, tc := range []struct {
		name     string
		tied     bool
		b        backend.Backend
		peak     float64
		source   string
		ceiling  float64
		hasFloor bool
		sustain  time.Duration
	}{
		{"untied, measured ceiling", false, fakeProber{cpu.New(cpu.Options{Threads: 2}), 5e9}, 0, "measured", 5e9, true, 0},
		{"tied, nominal ceiling, sustained probe", true, cpu.New(cpu.Options{Threads: 2}), 3e9, "nominal", 3e9, true, 60 * time.Millisecond},
		{"no ceiling", false, noProber{cpu.New(cpu.Options{Threads: 2})}, 0, "", 0, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tinyConfig(tc.tied, false)
			w := mustSynthetic(t, c, backend.BF16, 1)
			res, err := RunLatency(context.Background(), LatencyOptions{
				Backend: tc.b, Config: c, Weights: w, Batch: batch, InputLen: in, OutputLen: out, Iters: 1, PeakBandwidth: tc.peak,
				SustainedProbe: tc.sustain,
			})
			if err != nil {
				t.Fatal(err)
			}
			H, I, V, L := c.Hidden, c.Intermediate, c.VocabSize, c.NumLayers
			q, kv := c.NumHeads*c.HeadDim, c.NumKVHeads*c.HeadDim
			layerMatrix := H*(q+2*kv) + q*H + 3*H*I
			// BF16 matrices, F32 norms, the LM head (the table itself when
			// tied) and one embedding row per sequence.
			wantWeights := int64(L*(2*layerMatrix+4*2*H) + 4*H + 2*V*H + batch*2*H)
			if res.DecodeWeightBytes != wantWeights {
				t.Errorf("decode weight bytes %d, want %d", res.DecodeWeightBytes, wantWeights)
			}
			// Decode steps k = 1..out-1 read a context of in+k tokens: in +
			// out/2 on average; F32 K and V on the CPU.
			wantKV := float64(batch) * (in + out/2.0) * float64(L*2*kv*4)
			if math.Abs(*res.DecodeKVBytes-wantKV) > 1e-6*wantKV {
				t.Errorf("decode KV bytes %g, want %g", *res.DecodeKVBytes, wantKV)
			}
			perStep := float64(wantWeights) + wantKV
			if got := *res.AchievedBytesPerS; math.Abs(got-perStep/(res.ITLMS.Mean/1e3)) > 1e-6*got {
				t.Errorf("achieved %g B/s, want bytes per step / mean step = %g", got, perStep/(res.ITLMS.Mean/1e3))
			}
			wantFLOPs := 2*float64(L*layerMatrix)*batch*in + 2*float64(V*H)*batch
			if math.Abs(res.PrefillFLOPs-wantFLOPs) > 1e-9*wantFLOPs {
				t.Errorf("prefill FLOPs %g, want %g", res.PrefillFLOPs, wantFLOPs)
			}
			if res.MatMulFLOPsPerS == nil || !(*res.MatMulFLOPsPerS > 0) ||
				math.Abs(*res.PrefillGEMMFloorMS - wantFLOPs / *res.MatMulFLOPsPerS * 1e3) > 1e-6**res.PrefillGEMMFloorMS {
				t.Errorf("GEMM floor %v at %v FLOP/s, want FLOPs / rate", res.PrefillGEMMFloorMS, res.MatMulFLOPsPerS)
			}
			// A decode step: every matrix and the LM head for each row.
			wantDecodeFLOPs := 2 * float64(L*layerMatrix+V*H) * batch
			if math.Abs(res.DecodeFLOPs-wantDecodeFLOPs) > 1e-9*wantDecodeFLOPs || res.DecodeGEMMFloorMS == nil ||
				math.Abs(*res.DecodeGEMMFloorMS - wantDecodeFLOPs / *res.MatMulFLOPsPerS * 1e3) > 1e-6**res.DecodeGEMMFloorMS {
				t.Errorf("decode FLOPs %g, GEMM floor %v; want %g at %v FLOP/s", res.DecodeFLOPs, res.DecodeGEMMFloorMS, wantDecodeFLOPs, *res.MatMulFLOPsPerS)
			}
			if tc.sustain == 0 {
				if res.MatMulFLOPsPerSSustained != nil || res.PrefillGEMMFloorSustainedMS != nil {
					t.Errorf("sustained rate %v, floor %v without the probe; want n/a", res.MatMulFLOPsPerSSustained, res.PrefillGEMMFloorSustainedMS)
				}
			} else if res.MatMulFLOPsPerSSustained == nil || !(*res.MatMulFLOPsPerSSustained > 0) ||
				math.Abs(*res.PrefillGEMMFloorSustainedMS - wantFLOPs / *res.MatMulFLOPsPerSSustained * 1e3) > 1e-6**res.PrefillGEMMFloorSustainedMS {
				t.Errorf("sustained GEMM floor %v at %v FLOP/s, want FLOPs / rate", res.PrefillGEMMFloorSustainedMS, res.MatMulFLOPsPerSSustained)
			}
			if wantParams := paramCount(c); res.Params != wantParams {
				t.Errorf("params %d, want %d", res.Params, wantParams)
			}
			if *res.DecodeTokensPerS != batch/(res.ITLMS.Mean/1e3) {
				t.Errorf("decode tok/s %g, want batch / mean step", *res.DecodeTokensPerS)
			}
			if res.CeilingSource != tc.source {
				t.Errorf("ceiling source %q, want %q", res.CeilingSource, tc.source)
			}
			if !tc.hasFloor {
				if res.CopyCeiling != nil || res.CeilingShare != nil || res.DecodeFloorMS != nil || res.DecodeFloorAllWeightsMS != nil {
					t.Errorf("ceiling %v, share %v, floors %v %v; want all n/a", res.CopyCeiling, res.CeilingShare, res.DecodeFloorMS, res.DecodeFloorAllWeightsMS)
				}
				return
			}
			if *res.CopyCeiling != tc.ceiling {
				t.Errorf("ceiling %g, want %g", *res.CopyCeiling, tc.ceiling)
			}
			if math.Abs(*res.DecodeFloorMS-perStep/tc.ceiling*1e3) > 1e-9 {
				t.Errorf("floor %g ms, want %g", *res.DecodeFloorMS, perStep/tc.ceiling*1e3)
			}
			// Every weight byte: the whole embedding table (and the LM head
			// when untied) instead of the batch's rows.
			allWeights := int64(L*(2*layerMatrix+4*2*H) + 4*H + 2*V*H)
			if !tc.tied {
				allWeights += int64(2 * V * H)
			}
			if res.WeightBytes != allWeights {
				t.Errorf("weight bytes %d, want %d", res.WeightBytes, allWeights)
			}
			if want := (float64(allWeights) + wantKV) / tc.ceiling * 1e3; math.Abs(*res.DecodeFloorAllWeightsMS-want) > 1e-9 {
				t.Errorf("all-weights floor %g ms, want %g", *res.DecodeFloorAllWeightsMS, want)
			}
			if math.Abs(*res.CeilingShare-*res.AchievedBytesPerS/tc.ceiling) > 1e-12 {
				t.Errorf("share %g, want achieved / ceiling", *res.CeilingShare)
			}
		})
	}
}

func TestLatencyOptionErrors(t *testing.T) {
	c := tinyConfig(false, false)
	w := mustSynthetic(t, c, backend.BF16, 1)
	b := cpu.New(cpu.Options{Threads: 1})
	ok := LatencyOptions{Backend: b, Config: c, Weights: w, Batch: 1, InputLen: 4, OutputLen: 2, Iters: 1}
	for _, tc := range []struct {
		name   string
		change func(*LatencyOptions)
		want   string
	}{
		{"no backend", func(o *LatencyOptions) { o.Backend = nil }, "backend"},
		{"zero batch", func(o *LatencyOptions) { o.Batch = 0 }, "batch"},
		{"zero output", func(o *LatencyOptions) { o.OutputLen = 0 }, "output length"},
		{"past context", func(o *LatencyOptions) { o.InputLen = 500; o.OutputLen = 13 }, "context"},
		{"no iters", func(o *LatencyOptions) { o.Iters = 0 }, "iters"},
		{"negative chunk", func(o *LatencyOptions) { o.PrefillChunk = -1 }, "chunk"},
		{"NaN peak", func(o *LatencyOptions) { o.PeakBandwidth = math.NaN() }, "peak"},
		{"graphs on cpu", func(o *LatencyOptions) { o.CUDAGraphs = true; o.Warmup = 1 }, "cannot capture"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := ok
			tc.change(&o)
			_, err := RunLatency(context.Background(), o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one mentioning %q", err, tc.want)
			}
		})
	}
	t.Run("cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := RunLatency(ctx, ok); err == nil {
			t.Error("a cancelled run succeeded")
		}
	})
}

// failingReads is a CPU backend whose asynchronous reads of sampled ids
// fail, as a device error would surface there.
type failingReads struct{ *cpu.Backend }

func (f failingReads) ReadAsync(t backend.Tensor, dst []byte) (func() error, error) {
	return func() error { return errors.New("injected read failure") }, nil
}

// TestRunLatencyReportsQueuedReadErrors checks that an error surfacing
// when the host waits for queued-ahead ids ends the run with that error.
func TestRunLatencyReportsQueuedReadErrors(t *testing.T) {
	cfg := tinyConfig(false, false)
	w := mustSynthetic(t, cfg, backend.BF16, 42)
	_, err := RunLatency(context.Background(), LatencyOptions{
		Backend: failingReads{cpu.New(cpu.Options{Threads: 2})}, Config: cfg, Weights: w, Arch: "tiny",
		Batch: 2, InputLen: 8, OutputLen: 4, Iters: 1, Seed: 3,
	})
	if err == nil || !strings.Contains(err.Error(), "injected read failure") {
		t.Fatalf("RunLatency: %v, want the injected read failure", err)
	}
}

// TestRunLatencyQueueAheadSameTokens checks that queuing decode steps on
// the device's ids changes no token: the same run with and without it.
// Prefill chunks of 7 tokens leave the last prefill step sampling only the
// last sequence, so the first decode step is fed one row on the device and
// two from the host (and the decode rows are in another order than the
// sequences); the default chunk prefills all three in one step.
func TestRunLatencyQueueAheadSameTokens(t *testing.T) {
	cfg := tinyConfig(false, false)
	w := mustSynthetic(t, cfg, backend.BF16, 42)
	for _, chunk := range []int{0, 7, 12} {
		run := func(noQueue bool) *LatencyResult {
			res, err := RunLatency(context.Background(), LatencyOptions{
				Backend: cpu.New(cpu.Options{Threads: 2}), Config: cfg, Weights: w, Arch: "tiny",
				Batch: 3, InputLen: 12, OutputLen: 7, Iters: 1, Seed: 5, NoQueueAhead: noQueue, PrefillChunk: chunk,
			})
			if err != nil {
				t.Fatal(err)
			}
			return res
		}
		ahead, serial := run(false), run(true)
		if !ahead.QueueAhead || serial.QueueAhead {
			t.Fatalf("queue_ahead %v and %v, want true and false", ahead.QueueAhead, serial.QueueAhead)
		}
		for s := range ahead.Tokens {
			if len(ahead.Tokens[s]) != 7 || !slices.Equal(ahead.Tokens[s], serial.Tokens[s]) {
				t.Fatalf("chunk %d, sequence %d: %v queued ahead, %v one step at a time", chunk, s, ahead.Tokens[s], serial.Tokens[s])
			}
		}
	}
}

// markingBackend is the CPU backend with a StepClock whose marks are
// counted; each interval it reports is the mark's index, so a test can
// tell which marks the benchmark kept.
type markingBackend struct {
	*cpu.Backend
	marks, calls int
}

func (m *markingBackend) MarkStep() error { m.marks++; return nil }

func (m *markingBackend) StepIntervals() ([]float64, error) {
	m.calls++
	var out []float64
	for i := 1; i < m.marks; i++ {
		out = append(out, float64(i))
	}
	m.marks = 0
	return out, nil
}

// TestRunLatencyStepTrace checks --step-trace: every timed iteration's
// ITLs in order (summing to what the summary counts), one device mark per
// decode step, and the device intervals summarised over the timed
// iterations only; without it, nothing is marked or traced.
func TestRunLatencyStepTrace(t *testing.T) {
	cfg := tinyConfig(false, false)
	w := mustSynthetic(t, cfg, backend.BF16, 42)
	const outputLen, iters = 6, 2
	for _, trace := range []bool{false, true} {
		for _, noQueue := range []bool{false, true} {
			b := &markingBackend{Backend: cpu.New(cpu.Options{Threads: 2})}
			res, err := RunLatency(context.Background(), LatencyOptions{
				Backend: b, Config: cfg, Weights: w, Arch: "tiny",
				Batch: 2, InputLen: 9, OutputLen: outputLen, Warmup: 1, Iters: iters, Seed: 3,
				NoQueueAhead: noQueue, StepTrace: trace,
			})
			if err != nil {
				t.Fatal(err)
			}
			if !trace {
				if b.calls != 0 || res.ITLTraceMS != nil || res.DeviceStepMS != nil || res.DeviceStepTraceMS != nil {
					t.Fatalf("no trace asked: %d interval calls, traces %v %v", b.calls, res.ITLTraceMS, res.DeviceStepTraceMS)
				}
				continue
			}
			if b.calls != 1+iters {
				t.Fatalf("queue ahead %v: StepIntervals called %d times, want once per iteration (%d)", !noQueue, b.calls, 1+iters)
			}
			if len(res.ITLTraceMS) != iters || len(res.DeviceStepTraceMS) != iters {
				t.Fatalf("%d ITL traces and %d device traces, want %d each", len(res.ITLTraceMS), len(res.DeviceStepTraceMS), iters)
			}
			var sum float64
			for i := range iters {
				itl, dev := res.ITLTraceMS[i], res.DeviceStepTraceMS[i]
				if len(itl) != outputLen-1 {
					t.Fatalf("iteration %d: %d ITLs, want %d", i, len(itl), outputLen-1)
				}
				// One mark per decode step: outputLen-1 marks, outputLen-2 intervals 1, 2, ...
				if want := []float64{1, 2, 3, 4}; !slices.Equal(dev, want) {
					t.Fatalf("iteration %d: device intervals %v, want %v", i, dev, want)
				}
				for _, v := range itl {
					if v <= 0 {
						t.Fatalf("iteration %d: ITL %v", i, itl)
					}
					sum += v
				}
			}
			if got, want := res.ITLMS.Mean*float64(res.ITLMS.Count), sum; math.Abs(got-want) > 1e-9*want {
				t.Fatalf("traced ITLs sum to %v ms, the summary to %v", want, got)
			}
			if d := res.DeviceStepMS; d == nil || d.Count != iters*(outputLen-2) || d.Max != 4 || d.Min != 1 {
				t.Fatalf("device step summary %+v, want %d intervals from 1 to 4", d, iters*(outputLen-2))
			}
		}
	}
}

// TestRunLatencyVerifySteps: with VerifyTokens the run times verify
// steps against decode steps timed alike, leaves the greedy tokens as
// they are without it, and refuses a K out of range or past the context.
func TestRunLatencyVerifySteps(t *testing.T) {
	cfg := tinyConfig(false, false)
	w := mustSynthetic(t, cfg, backend.BF16, 42)
	opts := LatencyOptions{Backend: cpu.New(cpu.Options{Threads: 2}), Config: cfg, Weights: w, Arch: "tiny",
		Batch: 3, InputLen: 9, OutputLen: 5, Iters: 1, Seed: 3}
	plain, err := RunLatency(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if plain.VerifyStepMS != nil || plain.VerifyRatio != nil {
		t.Fatalf("verify steps timed without VerifyTokens: %+v", plain.VerifyStepMS)
	}
	opts.VerifyTokens = 4
	res, err := RunLatency(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(res.Tokens, plain.Tokens, func(a, b []int32) bool { return slices.Equal(a, b) }) {
		t.Errorf("tokens %v with verify steps, %v without", res.Tokens, plain.Tokens)
	}
	v, d := res.VerifyStepMS, res.VerifyDecodeStepMS
	if res.VerifyTokens != 4 || v == nil || d == nil || v.Count != verifyRounds || d.Count != verifyRounds ||
		!(v.Min > 0) || !(d.Min > 0) || res.VerifyRatio == nil || !(*res.VerifyRatio > 0) {
		t.Fatalf("verify %+v, decode %+v, ratio %v", v, d, res.VerifyRatio)
	}
	if res.VerifyForm != "native" { // no graphs: no decode-row form
		t.Errorf("verify form %q without graphs, want native", res.VerifyForm)
	}
	var text strings.Builder
	if err := res.WriteText(&text); err != nil || !strings.Contains(text.String(), "verify step (k=4)") {
		t.Errorf("text report without the verify step (%v):\n%s", err, text.String())
	}
	for _, k := range []int{-1, 17, cfg.MaxPositions} {
		opts.VerifyTokens = k
		if _, err := RunLatency(context.Background(), opts); err == nil || !strings.Contains(err.Error(), "verify tokens") {
			t.Errorf("VerifyTokens %d: %v, want an error about them", k, err)
		}
	}
}

// TestDecodeKVBytes checks the KV bytes a decode step reads, worked out by
// hand. An int4 cache (groups of 32, a 128-token window) of 2 layers, 4
// KV heads of 128 dims, at 1000 tokens: the newest 128 are read from the
// bf16 window (the last block's 8 tokens are among them), each 2·4·128·2
// = 2,048 bytes a layer; the other 872 in int4, each per head 64 bytes of
// K codes, 64 of V codes, 4·128/16 = 32 of K's per-channel scale and zero
// point (F16, one pair per channel shared by a block's 16 tokens) and
// 2·(128/32)·2 = 16 of V's per-group pairs: 176, 704 a layer. So
// 2·(128·2,048 + 872·704) = 1,752,064 bytes.
func TestDecodeKVBytes(t *testing.T) {
	const layers, kvh, d = 2, 4, 128
	for _, c := range []struct {
		name   string
		spec   backend.KVSpec
		ctxLen int
		want   int64
	}{
		{"int4, window 128, 1000 tokens", backend.Int4KV(16, 32, 128), 1000, 2 * (128*2048 + 872*704)},
		// Without a window only the partial block's 8 tokens are bf16.
		{"int4, no window, 1000 tokens", backend.Int4KV(16, 32, 0), 1000, 2 * (8*2048 + 992*704)},
		// On a block boundary without a window: every token in int4.
		{"int4, no window, 992 tokens", backend.Int4KV(16, 32, 0), 992, 2 * 992 * 704},
		// A window longer than the sequence: all of it in bf16.
		{"int4, window 128, 100 tokens", backend.Int4KV(16, 32, 128), 100, 2 * 100 * 2048},
		// An odd window: the newest 20 tokens, more than the partial block's 8.
		{"int4, window 20, 1000 tokens", backend.Int4KV(16, 32, 20), 1000, 2 * (20*2048 + 980*704)},
		{"bf16", backend.PlainKV(backend.BF16, 16), 1000, 2 * 1000 * 2048},
		// 128 bytes of codes and 4 groups' F16 scales, for K and for V.
		{"int8, groups of 32", backend.Int8KV(16, 32), 1000, 2 * 1000 * 4 * 2 * (128 + 4*2)},
		// The per-head scales are not per token.
		{"fp8", backend.FP8KV(16), 1000, 2 * 1000 * 4 * 2 * 128},
	} {
		if got := decodeKVBytes(c.spec, layers, kvh, d, c.ctxLen); got != c.want {
			t.Errorf("%s: %d bytes, want %d", c.name, got, c.want)
		}
	}
}
