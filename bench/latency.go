package bench

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/kvcache"
	"github.com/trigon-llm/trigon/model"
	"github.com/trigon-llm/trigon/model/arch"
	"github.com/trigon-llm/trigon/runner"
)

// BandwidthProber is an optional Backend interface: the device's copy
// bandwidth in bytes/s (bytes read plus bytes written, per second),
// measured by copying a buffer of about the given size. The latency
// benchmark uses it as the ceiling that decode steps, which stream every
// weight once, are held against. A nominal --peak-bandwidth replaces it;
// backends without it and no nominal figure get "n/a".
type BandwidthProber interface {
	MeasureCopyBandwidth(bytes int) (float64, error)
}

// Profiler is an optional Backend interface: it brackets the work an
// external profiler records (the CUDA backend: cuProfilerStart/Stop, for
// `ncu --profile-from-start off`).
type Profiler interface {
	ProfilerStart() error
	ProfilerStop() error
}

// StepClock is an optional Backend interface: timestamps taken on the
// device's queue. MarkStep queues one after the work queued so far;
// StepIntervals waits for them and returns the milliseconds between
// successive ones, then forgets them. The latency benchmark marks each
// decode step with it (--step-trace), which separates the device's time
// for a step from what the host adds to the inter-token latency.
type StepClock interface {
	MarkStep() error
	StepIntervals() ([]float64, error)
}

// LatencyOptions configure RunLatency.
type LatencyOptions struct {
	Backend backend.Backend
	Config  model.Config
	Weights model.Weights // stays open for the run (the CPU backend aliases it)
	// Arch and WeightsSource label the report ("llama-3-8b", "synthetic
	// BF16, seed 0" or a model path).
	Arch, WeightsSource string

	Batch     int // sequences decoded together
	InputLen  int // prompt tokens per sequence
	OutputLen int // generated tokens per sequence, the one sampled from the prefill included
	// PrefillChunk is the most tokens one prefill step carries (default
	// 2048, the engine's default step budget).
	PrefillChunk int
	Warmup       int // untimed iterations first
	Iters        int // timed iterations (>= 1)
	Seed         uint64

	// KV is the KV cache's format (zero: the backend's activation dtype).
	KV backend.KVSpec

	// CUDAGraphs replays decode steps from the runner's captured graphs
	// (one bucket: the batch); the backend must implement
	// backend.GraphCapturer.
	CUDAGraphs bool
	// PeakBandwidth, bytes/s, is a nominal ceiling used instead of the
	// backend's own measurement (0: measure, where the backend can).
	PeakBandwidth float64
	// NoQueueAhead turns off queuing each decode step on the previous
	// step's sampled ids before the host reads them (runner.Output.
	// SampleNext; the first decode step on the last prefill step's, the
	// sequences it sampled first in every decode step), for comparing
	// the two.
	NoQueueAhead bool
	// SustainedProbe > 0 also runs the GEMM probe back to back for this
	// long and reports the rate over its second half: the rate the device
	// holds once its power limit bites (a long prefill's GEMMs can drive a
	// GPU to its power limit, where its SM clock drops), where the burst
	// probe measures the boost clock.
	SustainedProbe time.Duration
	// ProfileSteps > 0 brackets, in the last iteration, the prefill and
	// the first ProfileSteps decode steps with the backend's Profiler
	// calls, so that a profiler started with collection off records one
	// prefill and a few decode steps of a long run and nothing else.
	ProfileSteps int
	// StepTrace reports every decode step's ITL in order and, where the
	// backend is a StepClock, the device-timed interval between the ends
	// of successive decode steps (device_step_ms).
	StepTrace bool
	// VerifyTokens > 0 (speculative decoding's K, 1 to 16) also times,
	// after the iterations, the target's verify step: every sequence feeds
	// its last token and K draft tokens and has all 1+K logits rows
	// sampled, against a plain decode step timed the same way (each step
	// sampled and read back before the next is queued).
	VerifyTokens int
	// Ranks, for tensor parallelism, are every rank's backend (Ranks[0]
	// is Backend, which the timings sync) and Comms their communicators
	// (arch.NewSharded); Abort releases ranks waiting for a failed one.
	// Nil: the whole model on Backend.
	Ranks []backend.Backend
	Comms []backend.Communicator
	Abort runner.Aborter
}

// LatencyResult is what `trigon bench latency` reports. Durations are in
// milliseconds, rates per second; pointer fields are null (n/a) when they
// cannot be known on this backend or run.
type LatencyResult struct {
	Benchmark    string `json:"benchmark"` // "latency"
	Engine       string `json:"engine"`    // "trigon"
	Arch         string `json:"arch"`
	Weights      string `json:"weights"`
	WeightDType  string `json:"weight_dtype"`
	KVDType      string `json:"kv_dtype"`
	Backend      string `json:"backend"`
	Device       string `json:"device,omitempty"`
	Batch        int    `json:"batch"`
	InputLen     int    `json:"input_len"`
	OutputLen    int    `json:"output_len"`
	PrefillChunk int    `json:"prefill_chunk"`
	Warmup       int    `json:"warmup"`
	Iters        int    `json:"iters"`
	CUDAGraphs   string `json:"cuda_graphs"` // "on" or "off"
	// TensorParallel is the ranks the model is split over (1: none).
	TensorParallel int      `json:"tensor_parallel_size"`
	Notes          []string `json:"notes"`

	Params      int64 `json:"params"`       // every weight element
	WeightBytes int64 `json:"weight_bytes"` // as stored on the device
	KVPoolBytes int64 `json:"kv_pool_bytes"`

	PrefillMS         Summary `json:"prefill_ms"` // whole batch: TTFT of the batch
	PrefillTokensPerS float64 `json:"prefill_tokens_per_s"`
	ITLMS             Summary `json:"itl_ms"` // one decode step (a token for every sequence)
	// DecodeTokensPerS is batch / mean step time: tokens per second while decoding.
	DecodeTokensPerS *float64 `json:"decode_tokens_per_s"`
	E2EMS            Summary  `json:"e2e_ms"` // prefill plus every decode step
	OutputTokensPerS float64  `json:"output_tokens_per_s"`

	// Bytes one decode step must read: every weight except the embedding
	// table (only its batch rows, unless it is also the LM head), plus the
	// KV cache of every sequence.
	DecodeWeightBytes  int64    `json:"decode_weight_bytes_per_step"`
	DecodeKVBytes      *float64 `json:"decode_kv_bytes_per_step"` // mean over the steps
	DecodeBytesPerStep *float64 `json:"decode_bytes_per_step"`
	AchievedBytesPerS  *float64 `json:"achieved_bytes_per_s"`
	// CopyCeiling is the device's copy bandwidth; CeilingSource says
	// whether the backend measured it ("measured") or --peak-bandwidth
	// gave it ("nominal").
	CopyCeiling   *float64 `json:"copy_ceiling_bytes_per_s"`
	CeilingSource string   `json:"ceiling_source"`
	CeilingShare  *float64 `json:"ceiling_share"`   // achieved / ceiling
	DecodeFloorMS *float64 `json:"decode_floor_ms"` // mean bytes per step / ceiling
	// DecodeFloorAllWeightsMS counts every weight byte as read (the whole
	// embedding table too, which a step reads only the batch's rows of),
	// plus the KV: (WeightBytes + KV bytes) / ceiling, the floor as a
	// plain "weights + KV over bandwidth" count gives it.
	DecodeFloorAllWeightsMS *float64 `json:"decode_floor_all_weights_ms"`

	// PrefillFLOPs counts the projections only (2 x matrix params x tokens,
	// the LM head on the logits rows); attention is left out, so the floor
	// is a lower bound.
	PrefillFLOPs       float64  `json:"prefill_flops"`
	MatMulFLOPsPerS    *float64 `json:"matmul_flops_per_s"` // measured on the gate/up projection: best of three 50 ms bursts
	PrefillGEMMFloorMS *float64 `json:"prefill_gemm_floor_ms"`
	// DecodeFLOPs counts a decode step's projections the same way (every
	// matrix for each of the batch's rows, the LM head included);
	// DecodeGEMMFloorMS is that at MatMulFLOPsPerS: the floor of a step
	// large enough to be bound by arithmetic rather than bytes (the
	// step's floor is the larger of it and DecodeFloorMS).
	DecodeFLOPs       float64  `json:"decode_flops"`
	DecodeGEMMFloorMS *float64 `json:"decode_gemm_floor_ms"`
	// The same over the second half of SustainedProbe of back-to-back
	// products (null when not measured): the floor at the rate the device
	// sustains under its power limit.
	MatMulFLOPsPerSSustained    *float64 `json:"matmul_flops_per_s_sustained"`
	PrefillGEMMFloorSustainedMS *float64 `json:"prefill_gemm_floor_sustained_ms"`

	// QueuedStepMS is the last decode step's forward run queuedSteps times
	// back to back, with nothing sampled or read back in between, per step
	// (null when OutputLen < 2): the device's own time for a step. ITL
	// minus it is what the host round trip (packing, copies, sampling,
	// reading the ids) adds to each step.
	QueuedStepMS *float64 `json:"queued_step_ms"`
	// QueueAhead says whether decode steps were queued on the device's
	// sampled ids before the host read them.
	QueueAhead bool `json:"queue_ahead"`

	// With StepTrace: DeviceStepMS summarises, over the timed iterations,
	// the device-timed intervals between the ends of successive decode
	// steps (each a step's sampling and read-back copy, then the next
	// step's forward). While steps are queued ahead the device never waits
	// for the host, so an interval is the device's own time for a step;
	// ITL beyond it is the host's. Null where the backend has no
	// StepClock. The traces are per timed iteration, in step order:
	// ITLTraceMS[i][j] is decode step j+1's ITL, DeviceStepTraceMS[i][j]
	// the interval ending with decode step j+2.
	DeviceStepMS      *Summary    `json:"device_step_ms,omitempty"`
	ITLTraceMS        [][]float64 `json:"itl_trace_ms,omitempty"`
	DeviceStepTraceMS [][]float64 `json:"device_step_trace_ms,omitempty"`

	// With VerifyTokens: VerifyStepMS is the verify step of K draft tokens
	// per sequence, VerifyDecodeStepMS a plain decode step timed the same
	// way at the same context, VerifyRatio their mean ratio (what a verify
	// step costs in decode steps). Both replay their graphs where
	// CUDAGraphs is on (the first steps of each run untimed: eager, then
	// the capture, and for the verify step the same of its decode-row
	// form and the timing between the two, runner/verify.go).
	// VerifyForm is the form the timed verify steps ran in: "native"
	// (sequences of 1+K rows) or "flat" (decode rows).
	VerifyTokens       int      `json:"verify_tokens,omitempty"`
	VerifyStepMS       *Summary `json:"verify_step_ms,omitempty"`
	VerifyDecodeStepMS *Summary `json:"verify_decode_step_ms,omitempty"`
	VerifyRatio        *float64 `json:"verify_ratio,omitempty"`
	VerifyForm         string   `json:"verify_form,omitempty"`
	// VerifyForms are the verify shapes the runner decided a form for,
	// with the replay times it decided by (runner.VerifyForm).
	VerifyForms []VerifyFormTiming `json:"verify_forms,omitempty"`

	// KernelChoices lists, where the backend reports them, the kernels
	// its autotuner kept for this run's products (the CUDA backend: own
	// GEMV or cuBLASLt per decode shape, with the times it saw).
	KernelChoices []string `json:"kernel_choices,omitempty"`

	// Tokens are the greedy tokens of the last iteration, [batch][outputLen].
	Tokens [][]int32 `json:"-"`
}

// latencyRun is the state of one RunLatency.
type latencyRun struct {
	opts    LatencyOptions
	b       backend.Backend
	cfg     model.Config
	m       model.Model   // rank 0's
	ms      []model.Model // every rank's
	r       *runner.Runner
	prompts [][]int32 // [batch][inputLen]
	tables  [][]int32 // [batch][blocksPerSeq]
	greedy  []backend.SampleRow

	tokens [][]int32
}

// RunLatency builds the model and runner on opts.Backend and times
// opts.Iters iterations of: prefill every prompt (random token ids, in
// chunks of PrefillChunk tokens), then OutputLen-1 decode steps of one
// token per sequence, sampled greedily on the device. The token sampled
// from the prefill's logits is the first of OutputLen, as in Hugging Face
// generate's max_new_tokens.
func RunLatency(ctx context.Context, opts LatencyOptions) (*LatencyResult, error) {
	if err := checkLatencyOptions(&opts); err != nil {
		return nil, err
	}
	run := &latencyRun{opts: opts, b: opts.Backend, cfg: opts.Config}
	defer run.close()
	if err := run.setup(); err != nil {
		return nil, err
	}
	res := run.newResult()

	var prefill, e2e, itl, devSteps []float64
	var kvBytes, decodeSecs float64
	for it := range opts.Warmup + opts.Iters {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		p, steps, dev, err := run.iteration(ctx, it == opts.Warmup+opts.Iters-1)
		if err != nil {
			return nil, err
		}
		if it < opts.Warmup {
			continue
		}
		if opts.StepTrace {
			res.ITLTraceMS = append(res.ITLTraceMS, scaledCopy(steps, 1e3))
			if dev != nil {
				res.DeviceStepTraceMS = append(res.DeviceStepTraceMS, dev)
				devSteps = append(devSteps, dev...)
			}
		}
		prefill = append(prefill, p)
		total := p
		for k, s := range steps {
			itl = append(itl, s)
			total += s
			decodeSecs += s
			ctxLen := opts.InputLen + k + 1
			kvBytes += float64(opts.Batch) * float64(run.kvStepBytes(ctxLen))
		}
		e2e = append(e2e, total)
	}
	if err := run.finish(res, prefill, itl, e2e, kvBytes, decodeSecs); err != nil {
		return nil, err
	}
	if len(devSteps) > 0 {
		res.DeviceStepMS = ptr(Summarize(devSteps))
	}
	if opts.OutputLen >= 2 {
		ms, err := run.queuedStepTime()
		if err != nil {
			return nil, err
		}
		res.QueuedStepMS = &ms
	}
	if opts.VerifyTokens > 0 {
		if err := run.verifySteps(res); err != nil {
			return nil, err
		}
	}
	res.Tokens = run.tokens
	if k, ok := run.b.(interface{ GEMMChoices() []string }); ok {
		res.KernelChoices = k.GEMMChoices()
	}
	return res, nil
}

// checkModelRun checks what every model-driven benchmark needs: a
// backend, weights, a valid config and a batch of 1..4096 sequences.
// name prefixes the errors ("bench latency").
func checkModelRun(name string, b backend.Backend, w model.Weights, c model.Config, batch int) error {
	if b == nil || w == nil {
		return fmt.Errorf("%s: a backend and weights are required", name)
	}
	if err := c.Validate(); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if batch < 1 || batch > 4096 {
		return fmt.Errorf("%s: batch %d outside 1..4096", name, batch)
	}
	return nil
}

func checkLatencyOptions(o *LatencyOptions) error {
	if err := checkModelRun("bench latency", o.Backend, o.Weights, o.Config, o.Batch); err != nil {
		return err
	}
	if o.PrefillChunk == 0 {
		o.PrefillChunk = 2048
	}
	switch {
	case o.InputLen < 1 || o.OutputLen < 1:
		return fmt.Errorf("bench latency: input length %d and output length %d must be >= 1", o.InputLen, o.OutputLen)
	case o.InputLen > o.Config.MaxPositions-o.OutputLen:
		return fmt.Errorf("bench latency: input %d + output %d tokens exceed the model's context of %d",
			o.InputLen, o.OutputLen, o.Config.MaxPositions)
	case o.VerifyTokens < 0 || o.VerifyTokens > 16:
		return fmt.Errorf("bench latency: %d verify tokens: want 0 to 16", o.VerifyTokens)
	case o.InputLen > o.Config.MaxPositions-o.OutputLen-o.VerifyTokens:
		return fmt.Errorf("bench latency: input %d + output %d + %d verify tokens exceed the model's context of %d",
			o.InputLen, o.OutputLen, o.VerifyTokens, o.Config.MaxPositions)
	case o.ProfileSteps < 0:
		return fmt.Errorf("bench latency: profile steps %d must be >= 0", o.ProfileSteps)
	case o.PrefillChunk < 1:
		return fmt.Errorf("bench latency: prefill chunk %d must be positive", o.PrefillChunk)
	case o.Warmup < 0 || o.Iters < 1:
		return fmt.Errorf("bench latency: warmup %d must be >= 0 and iters %d >= 1", o.Warmup, o.Iters)
	case o.PeakBandwidth < 0 || math.IsNaN(o.PeakBandwidth) || math.IsInf(o.PeakBandwidth, 0):
		return fmt.Errorf("bench latency: peak bandwidth %g must be finite and >= 0", o.PeakBandwidth)
	}
	if _, err := checkedMul(o.Batch, o.InputLen+o.OutputLen); err != nil {
		return fmt.Errorf("bench latency: %w", err)
	}
	if _, can := o.Backend.(backend.GraphCapturer); o.CUDAGraphs && !can {
		return fmt.Errorf("bench latency: --cuda-graphs on: the %s backend cannot capture graphs", o.Backend.Name())
	}
	return nil
}

func (run *latencyRun) setup() error {
	o, c := run.opts, run.cfg
	rows := o.Batch * (1 + o.VerifyTokens) // a verify step's logits rows
	maxTokens := max(o.PrefillChunk, rows)
	ranks := o.Ranks
	if len(ranks) == 0 {
		ranks = []backend.Backend{run.b}
	}
	ms, shards, err := arch.NewSharded(ranks, o.Comms, c, o.Weights, model.Options{MaxTokens: maxTokens, MaxLogits: rows})
	if err != nil {
		return fmt.Errorf("bench latency: %w", err)
	}
	run.ms, run.m = ms, ms[0]
	rm := make([]runner.Model, len(ms))
	for i, m := range ms {
		rm[i] = m
	}
	bs := kvcache.DefaultBlockSize
	seqLen := o.InputLen + o.OutputLen + o.VerifyTokens
	perSeq := (seqLen + bs - 1) / bs
	blocks, err := checkedMul(perSeq, o.Batch)
	if err != nil {
		return fmt.Errorf("bench latency: %w", err)
	}
	// The runner's decode graphs, as serving uses them: one bucket, the
	// batch. Its first decode step runs eagerly, the second captures.
	// With VerifyTokens the verify steps replay theirs too, as the
	// engine's do when speculation is on, and a second bucket of the
	// verify step's rows lets the runner time the step run as decode
	// rows against its native form, as it does among the engine's
	// buckets.
	buckets, maxSeqs := []int{o.Batch}, o.Batch
	if o.VerifyTokens > 0 {
		buckets, maxSeqs = append(buckets, rows), rows
	}
	r, err := runner.NewSharded(ranks, rm, shards, runner.Options{
		NumBlocks: blocks + 1, BlockSize: bs, MaxTokens: maxTokens, MaxSeqs: maxSeqs, MaxSeqLen: seqLen,
		NumLayers: c.NumLayers, NumKVHeads: c.NumKVHeads, HeadDim: c.HeadDim, KV: o.KV,
		Graphs: runner.GraphOptions{Enabled: o.CUDAGraphs, Buckets: buckets, VerifyTokens: o.VerifyTokens},
	}, o.Abort)
	if err != nil {
		return fmt.Errorf("bench latency: %w", err)
	}
	run.r = r
	// Sequence s owns blocks 1+s*perSeq ..; block 0 is the null block.
	rng := rand.New(rand.NewPCG(o.Seed, 0x6c61_7465_6e63_79))
	for s := range o.Batch {
		t := make([]int32, perSeq)
		for i := range t {
			t[i] = int32(1 + s*perSeq + i)
		}
		run.tables = append(run.tables, t)
		p := make([]int32, o.InputLen)
		for i := range p {
			p[i] = int32(rng.IntN(c.VocabSize))
		}
		run.prompts = append(run.prompts, p)
	}
	run.greedy = make([]backend.SampleRow, o.Batch) // Temperature 0: argmax
	return nil
}

func (run *latencyRun) close() {
	if run.r != nil {
		run.r.Close()
	}
	for _, m := range run.ms {
		m.Close()
	}
}

// iteration runs one prefill and the decode steps, returning their
// durations in seconds.
//
// dev, with StepTrace on a StepClock backend, is the device-timed
// intervals between the ends of successive decode steps' forwards.
func (run *latencyRun) iteration(ctx context.Context, last bool) (prefill float64, steps, dev []float64, err error) {
	o := run.opts
	tokens := make([][]int32, o.Batch)
	if err := run.b.Sync(); err != nil {
		return 0, nil, nil, fmt.Errorf("bench latency: sync before prefill: %w", err)
	}
	prof, _ := run.b.(Profiler)
	profiling := last && o.ProfileSteps > 0 && prof != nil
	if profiling {
		if err := prof.ProfilerStart(); err != nil {
			return 0, nil, nil, fmt.Errorf("bench latency: %w", err)
		}
	}
	clock, _ := run.b.(StepClock)
	if !o.StepTrace {
		clock = nil
	}
	// mark timestamps the end of a decode step's forward on the device.
	mark := func() error {
		if clock == nil {
			return nil
		}
		return clock.MarkStep()
	}
	// Where the backend can leave the sampled ids on the device
	// (runner.Output.SampleNext), decode step k+1 is queued on step k's
	// ids before the host waits for them, so the host's work for a step
	// (packing, copies, the launch) overlaps the device's previous step.
	// The first decode step is queued on the last prefill step's ids the
	// same way: the sequences that step sampled come first in every
	// decode step (order), the others' first tokens are on the host
	// already. (Not while profiling: a queued step would fall inside the
	// profiled range.)
	feed := run.r.CanFeed() && !o.NoQueueAhead && !profiling
	var queued *runner.Output // step k, queued on step k-1's ids
	t0 := time.Now()
	first, tail, err := run.prefill(feed && o.OutputLen > 1)
	if err != nil {
		return 0, nil, nil, err
	}
	order := make([]int, 0, o.Batch) // order[i]: the sequence of decode row i
	if tail != nil {
		order = append(order, tail.owners...)
	}
	for s := range o.Batch {
		if !slices.Contains(order, s) {
			order = append(order, s)
		}
	}
	cur := make([]int32, o.Batch) // the tokens of the next step, by row
	for i, s := range order {
		cur[i] = first[s]
	}
	if tail != nil {
		wait, err := tail.out.SampleNext(run.greedy[:tail.out.Rows])
		if err != nil {
			return 0, nil, nil, fmt.Errorf("bench latency: prefill sample: %w", err)
		}
		if queued, err = run.decodeStep(order, cur, 1, true); err != nil {
			return 0, nil, nil, fmt.Errorf("bench latency: decode step 1: %w", err)
		}
		if err := mark(); err != nil {
			return 0, nil, nil, fmt.Errorf("bench latency: decode step 1: %w", err)
		}
		ids, err := wait()
		if err != nil {
			return 0, nil, nil, fmt.Errorf("bench latency: prefill sample: %w", err)
		}
		for i, id := range ids {
			first[tail.owners[i]] = id
			cur[i] = id
		}
	}
	prefill = time.Since(t0).Seconds()
	for s := range tokens {
		tokens[s] = append(make([]int32, 0, o.OutputLen), first[s])
	}
	// Decode. A step's time runs from the previous step's ids reaching
	// the host to its own.
	t := time.Now()
	for k := 1; k < o.OutputLen; k++ {
		if err := ctx.Err(); err != nil {
			return 0, nil, nil, err
		}
		out := queued
		queued = nil
		if out == nil {
			if out, err = run.decodeStep(order, cur, k, false); err != nil {
				return 0, nil, nil, fmt.Errorf("bench latency: decode step %d: %w", k, err)
			}
			if err := mark(); err != nil {
				return 0, nil, nil, fmt.Errorf("bench latency: decode step %d: %w", k, err)
			}
		}
		if feed && k+1 < o.OutputLen {
			var wait func() ([]int32, error)
			if wait, err = out.SampleNext(run.greedy); err != nil {
				return 0, nil, nil, fmt.Errorf("bench latency: decode step %d: %w", k, err)
			}
			if queued, err = run.decodeStep(order, nil, k+1, true); err != nil {
				return 0, nil, nil, fmt.Errorf("bench latency: decode step %d: %w", k+1, err)
			}
			if err := mark(); err != nil {
				return 0, nil, nil, fmt.Errorf("bench latency: decode step %d: %w", k+1, err)
			}
			cur, err = wait()
		} else {
			cur, err = out.Sample(run.greedy)
		}
		if err != nil {
			return 0, nil, nil, fmt.Errorf("bench latency: decode step %d: %w", k, err)
		}
		now := time.Now()
		steps = append(steps, now.Sub(t).Seconds())
		t = now
		for i, s := range order {
			tokens[s] = append(tokens[s], cur[i])
		}
		if profiling && k == o.ProfileSteps {
			profiling = false
			if err := prof.ProfilerStop(); err != nil {
				return 0, nil, nil, fmt.Errorf("bench latency: %w", err)
			}
		}
	}
	if profiling {
		if err := prof.ProfilerStop(); err != nil {
			return 0, nil, nil, fmt.Errorf("bench latency: %w", err)
		}
	}
	if err := run.b.Sync(); err != nil {
		return 0, nil, nil, fmt.Errorf("bench latency: sync after decode: %w", err)
	}
	if clock != nil {
		if dev, err = clock.StepIntervals(); err != nil {
			return 0, nil, nil, fmt.Errorf("bench latency: %w", err)
		}
	}
	run.tokens = tokens
	return prefill, steps, dev, nil
}

// scaledCopy is v times f, in a new slice.
func scaledCopy(v []float64, f float64) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = x * f
	}
	return out
}

// prefillTail is a prefill's last step, not yet sampled: its output and
// the sequence of each of its logits rows.
type prefillTail struct {
	out    *runner.Output
	owners []int
}

// prefill computes every prompt's KV in steps of at most PrefillChunk
// tokens (several sequences share a step when they fit) and returns the
// token sampled from each prompt's last logits. With leaveLast the last
// step is not sampled: it is returned, and first holds zeros for its
// sequences.
func (run *latencyRun) prefill(leaveLast bool) (first []int32, tail *prefillTail, err error) {
	o := run.opts
	first = make([]int32, o.Batch)
	done := make([]int, o.Batch) // prompt tokens computed per sequence
	for s := 0; s < o.Batch; {
		var step runner.Step
		var owner []int // owner[i]: sequence of step.Seqs[i]
		budget := o.PrefillChunk
		for q := s; q < o.Batch && budget > 0; q++ {
			n := min(o.InputLen-done[q], budget)
			step.Seqs = append(step.Seqs, runner.Seq{
				Tokens: run.prompts[q][done[q] : done[q]+n], Start: done[q], BlockTable: run.tables[q],
				WantLogits: done[q]+n == o.InputLen,
			})
			owner = append(owner, q)
			done[q] += n
			budget -= n
		}
		out, err := run.r.Execute(&step)
		if err != nil {
			return nil, nil, fmt.Errorf("bench latency: prefill: %w", err)
		}
		for s < o.Batch && done[s] == o.InputLen {
			s++
		}
		if out.Rows == 0 {
			continue
		}
		if leaveLast && s == o.Batch {
			tail = &prefillTail{out: out}
			for i := range out.Rows {
				tail.owners = append(tail.owners, owner[out.Seq[i]])
			}
			return first, tail, nil
		}
		ids, err := out.Sample(run.greedy[:out.Rows])
		if err != nil {
			return nil, nil, fmt.Errorf("bench latency: prefill sample: %w", err)
		}
		for i, id := range ids {
			first[owner[out.Seq[i]]] = id
		}
	}
	return first, nil, nil
}

// decodeStep queues decode step k (from a graph replay when the runner
// has graphs on): one token per sequence, row i for sequence order[i],
// each sequence's previous token at position InputLen+k-1, taken from
// cur[i] (nil: a placeholder) or, fed, for the first rows, from the ids
// the previous step's SampleNext left on the device.
func (run *latencyRun) decodeStep(order []int, cur []int32, k int, fed bool) (*runner.Output, error) {
	o := run.opts
	step := runner.Step{Seqs: make([]runner.Seq, o.Batch), FedTokens: fed}
	placeholder := []int32{0}
	for i, s := range order {
		tok := placeholder
		if cur != nil {
			tok = cur[i : i+1]
		}
		step.Seqs[i] = runner.Seq{Tokens: tok, Start: o.InputLen + k - 1, BlockTable: run.tables[s], WantLogits: true}
	}
	return run.r.Execute(&step)
}

// queuedSteps is how many times queuedStepTime runs the last decode step.
const queuedSteps = 16

// queuedStepTime re-runs the last iteration's last decode step
// queuedSteps times without sampling (each run writes the same KV slots
// with the same values) and returns the time per step in ms, from one
// sync before to one after: the host only queues, so this is the device's
// time.
func (run *latencyRun) queuedStepTime() (float64, error) {
	o := run.opts
	k := o.OutputLen - 1
	step := runner.Step{Seqs: make([]runner.Seq, o.Batch)}
	for s := range step.Seqs {
		tok := run.tokens[s][k-1 : k]
		step.Seqs[s] = runner.Seq{Tokens: tok, Start: o.InputLen + k - 1, BlockTable: run.tables[s], WantLogits: true}
	}
	if err := run.b.Sync(); err != nil {
		return 0, fmt.Errorf("bench latency: queued steps: %w", err)
	}
	t0 := time.Now()
	for range queuedSteps {
		if _, err := run.r.Execute(&step); err != nil {
			return 0, fmt.Errorf("bench latency: queued steps: %w", err)
		}
	}
	if err := run.b.Sync(); err != nil {
		return 0, fmt.Errorf("bench latency: queued steps: %w", err)
	}
	return time.Since(t0).Seconds() * 1e3 / queuedSteps, nil
}

// VerifyFormTiming is one verify shape's decided form (runner.VerifyForm):
// the mean replay of each form in milliseconds, 0 where it was not timed.
type VerifyFormTiming struct {
	Bucket   int     `json:"bucket"`
	Query    int     `json:"query"`
	Width    int     `json:"width"`
	Flat     bool    `json:"flat"`
	NativeMS float64 `json:"native_ms"`
	FlatMS   float64 `json:"flat_ms"`
}

// verifySteps are verifyRounds plain decode steps and as many verify
// steps, after verifyWarm of each untimed: a graph shape's first step
// runs eagerly and its second captures; a verify shape that may run as
// decode rows does that for each form, then times the two (five steps).
const verifyRounds, verifyWarm = 16, 5

// verifySteps times speculative decoding's verify step (VerifyTokens)
// against a plain decode step at the context after the last iteration:
// each step is queued, sampled and read back (Output.Sample), as the
// engine runs a verify step. The draft tokens are the prompt's first;
// what they are does not change the work.
func (run *latencyRun) verifySteps(res *LatencyResult) error {
	o := run.opts
	k := o.VerifyTokens
	start := o.InputLen + o.OutputLen - 1 // the next position after the last token
	timeSteps := func(verify bool) ([]float64, error) {
		step := runner.Step{Seqs: make([]runner.Seq, o.Batch)}
		for s := range step.Seqs {
			toks := run.tokens[s]
			seq := runner.Seq{Tokens: toks[len(toks)-1:], Start: start, BlockTable: run.tables[s], WantLogits: true}
			if verify {
				feed := append([]int32{toks[len(toks)-1]}, make([]int32, k)...)
				for i := range k {
					feed[1+i] = run.prompts[s][i%o.InputLen]
				}
				seq = runner.Seq{Tokens: feed, Start: start, BlockTable: run.tables[s], AllLogits: true}
			}
			step.Seqs[s] = seq
		}
		var times []float64
		var flat0 uint64
		for i := range verifyWarm + verifyRounds {
			if i == verifyWarm {
				flat0 = run.r.GraphStats().FlatVerifies
			}
			if err := run.b.Sync(); err != nil {
				return nil, err
			}
			t0 := time.Now()
			out, err := run.r.Execute(&step)
			if err != nil {
				return nil, err
			}
			if _, err := out.Sample(make([]backend.SampleRow, out.Rows)); err != nil { // greedy
				return nil, err
			}
			if i >= verifyWarm {
				times = append(times, time.Since(t0).Seconds())
			}
		}
		if verify {
			res.VerifyForm = "native"
			if run.r.GraphStats().FlatVerifies-flat0 == verifyRounds {
				res.VerifyForm = "flat"
			}
			for _, f := range run.r.VerifyForms() {
				res.VerifyForms = append(res.VerifyForms, VerifyFormTiming{Bucket: f.Bucket, Query: f.Query, Width: f.Width, Flat: f.Flat,
					NativeMS: f.Native.Seconds() * 1e3, FlatMS: f.FlatTime.Seconds() * 1e3})
			}
		}
		return times, nil
	}
	dec, err := timeSteps(false)
	if err != nil {
		return fmt.Errorf("bench latency: decode steps against verify steps: %w", err)
	}
	ver, err := timeSteps(true)
	if err != nil {
		return fmt.Errorf("bench latency: verify steps: %w", err)
	}
	d, v := Summarize(dec).scaled(1e3), Summarize(ver).scaled(1e3)
	res.VerifyTokens, res.VerifyDecodeStepMS, res.VerifyStepMS = k, &d, &v
	if d.Mean > 0 {
		res.VerifyRatio = ptr(v.Mean / d.Mean)
	}
	return nil
}

// kvStepBytes is the KV cache one decode step reads for a sequence of
// ctxLen tokens.
func (run *latencyRun) kvStepBytes(ctxLen int) int64 {
	c := run.cfg
	return decodeKVBytes(run.r.KVSpec(), c.NumLayers, c.NumKVHeads, c.HeadDim, ctxLen)
}

// decodeKVBytes is the K and V bytes, over numLayers layers, that a decode
// step's attention reads for one sequence of ctxLen tokens: every token
// in the cache's format, its scales and zero points included (spread over
// the tokens that share them). An int4 cache (KVScaleKIVI) reads its
// newest tokens from their bf16 window copies instead, at bf16 width and
// with no scales: those at positions from ctxLen - Window on and those of
// the last, partial block, which has no int4 K yet (backend.KVSpec). A
// block that straddles the window's start has both forms read on the
// GPU (its tile's int4 codes and its bf16 rows); that is at most one
// block a sequence and is counted by its rows' forms alone.
func decodeKVBytes(spec backend.KVSpec, numLayers, numKVHeads, headDim, ctxLen int) int64 {
	// tokens read in the cache's format, at a block's bytes over its tokens
	stored := func(tokens int) int64 {
		return int64(numLayers) * int64(tokens) * int64(spec.LayerBlockBytes(numKVHeads, headDim)) / int64(spec.BlockSize)
	}
	if spec.Scales != backend.KVScaleKIVI {
		return stored(ctxLen)
	}
	bf16 := max(min(spec.Window, ctxLen), ctxLen%spec.BlockSize)
	bf16Row := int64(2 * numKVHeads * headDim * 2) // a token's K and V rows of a layer, 2 bytes an element
	return int64(numLayers)*int64(bf16)*bf16Row + stored(ctxLen-bf16)
}

// newResult fills the run's description and the static byte counts.
func (run *latencyRun) newResult() *LatencyResult {
	o, c := run.opts, run.cfg
	res := &LatencyResult{
		Benchmark: "latency", Engine: "trigon", Arch: o.Arch, Weights: o.WeightsSource,
		KVDType: run.r.KVSpec().Name(), Backend: run.b.Name(),
		Batch: o.Batch, InputLen: o.InputLen, OutputLen: o.OutputLen, PrefillChunk: o.PrefillChunk,
		Warmup: o.Warmup, Iters: o.Iters, CUDAGraphs: "off", Notes: []string{}, TensorParallel: run.r.Ranks(),
		KVPoolBytes: run.r.KVBytes(),
	}
	if d, ok := run.b.(interface{ Device() string }); ok {
		res.Device = d.Device()
	}
	if res.QueueAhead = run.r.CanFeed() && !o.NoQueueAhead; res.QueueAhead {
		res.Notes = append(res.Notes, "each decode step is queued on the device's sampled ids (the first on the last prefill step's) before the host reads them")
		if o.ProfileSteps > 0 {
			res.Notes = append(res.Notes, "except in the last, profiled iteration, whose steps run one at a time")
		}
	}
	if _, can := run.b.(backend.GraphCapturer); o.CUDAGraphs {
		res.CUDAGraphs = "on"
		res.Notes = append(res.Notes, "decode steps replay the runner's captured graph (the first decode step of the first iteration runs eagerly, the second captures)")
	} else if can {
		res.Notes = append(res.Notes, "decode steps launch op by op (--cuda-graphs on replays a captured graph)")
	}
	dtypes := map[backend.DType]bool{}
	var matrixParams int64
	for _, s := range model.ExpectedWeights(c) {
		dt, shape, ok := weightSpec(o.Weights, s.Name)
		if !ok {
			continue // arch.New validated the weights; cannot happen
		}
		size, err := dt.Bytes(shape)
		if err != nil {
			continue // validated too
		}
		n := int64(size)
		elems := int64(1)
		for _, d := range s.Shape {
			elems *= int64(d)
		}
		res.Params += elems
		if !s.Matrix {
			// Norms and biases live on the device as F32.
			res.WeightBytes += 4 * elems
			res.DecodeWeightBytes += 4 * elems
			continue
		}
		dtypes[dt] = true
		res.WeightBytes += n
		switch s.Name {
		case model.NameEmbed:
			// A decode step gathers one row per sequence, unless the
			// table is also the LM head.
			row := n / int64(s.Shape[0])
			res.DecodeWeightBytes += int64(o.Batch) * row
			if c.TieEmbeddings {
				res.DecodeWeightBytes += n
			}
		case model.NameLMHead:
			res.DecodeWeightBytes += n
		default:
			res.DecodeWeightBytes += n
			matrixParams += elems
		}
	}
	for dt := range dtypes {
		if res.WeightDType != "" {
			res.WeightDType += "+"
		}
		res.WeightDType += dt.String()
	}
	// Projections for every prompt token, the LM head for the batch's
	// logits rows.
	prefillTokens := float64(o.Batch) * float64(o.InputLen)
	res.PrefillFLOPs = 2*float64(matrixParams)*prefillTokens + 2*float64(c.VocabSize)*float64(c.Hidden)*float64(o.Batch)
	res.DecodeFLOPs = 2 * (float64(matrixParams) + float64(c.VocabSize)*float64(c.Hidden)) * float64(o.Batch)
	return res
}

// finish computes the summaries, rates and floors.
func (run *latencyRun) finish(res *LatencyResult, prefill, itl, e2e []float64, kvBytes, decodeSecs float64) error {
	o := run.opts
	res.PrefillMS = Summarize(prefill).scaled(1e3)
	res.ITLMS = Summarize(itl).scaled(1e3)
	res.E2EMS = Summarize(e2e).scaled(1e3)
	if m := res.PrefillMS.Mean; m > 0 {
		res.PrefillTokensPerS = float64(o.Batch*o.InputLen) / (m / 1e3)
	}
	if m := res.E2EMS.Mean; m > 0 {
		res.OutputTokensPerS = float64(o.Batch*o.OutputLen) / (m / 1e3)
	}
	if n := len(itl); n > 0 && decodeSecs > 0 {
		mean := res.ITLMS.Mean / 1e3
		res.DecodeTokensPerS = ptr(float64(o.Batch) / mean)
		kv := kvBytes / float64(n)
		perStep := float64(res.DecodeWeightBytes) + kv
		res.DecodeKVBytes = ptr(kv)
		res.DecodeBytesPerStep = ptr(perStep)
		res.AchievedBytesPerS = ptr(perStep * float64(n) / decodeSecs)
	} else {
		res.Notes = append(res.Notes, "output length 1: no decode steps to time")
	}

	// An explicit --peak-bandwidth wins over the backend's own probe.
	if p, ok := run.b.(BandwidthProber); ok && o.PeakBandwidth == 0 {
		bw, err := p.MeasureCopyBandwidth(1 << 30)
		if err != nil {
			return fmt.Errorf("bench latency: measure copy bandwidth: %w", err)
		}
		res.CopyCeiling, res.CeilingSource = ptr(bw), "measured"
	} else if o.PeakBandwidth > 0 {
		res.CopyCeiling, res.CeilingSource = ptr(o.PeakBandwidth), "nominal"
		res.Notes = append(res.Notes, "the ceiling is the nominal --peak-bandwidth")
	} else {
		res.Notes = append(res.Notes, fmt.Sprintf("the %s backend does not measure its copy bandwidth (bench.BandwidthProber): ceiling and floor n/a", run.b.Name()))
	}
	if res.CopyCeiling != nil && *res.CopyCeiling > 0 && res.DecodeBytesPerStep != nil {
		res.CeilingShare = ptr(*res.AchievedBytesPerS / *res.CopyCeiling)
		res.DecodeFloorMS = ptr(*res.DecodeBytesPerStep / *res.CopyCeiling * 1e3)
		res.DecodeFloorAllWeightsMS = ptr((float64(res.WeightBytes) + *res.DecodeKVBytes) / *res.CopyCeiling * 1e3)
	}

	rate, sustained, err := run.matmulRate()
	if err != nil {
		return err
	}
	if rate > 0 {
		res.MatMulFLOPsPerS = ptr(rate)
		res.PrefillGEMMFloorMS = ptr(res.PrefillFLOPs / rate * 1e3)
		if res.DecodeTokensPerS != nil {
			res.DecodeGEMMFloorMS = ptr(res.DecodeFLOPs / rate * 1e3)
		}
	}
	if sustained > 0 {
		res.MatMulFLOPsPerSSustained = ptr(sustained)
		res.PrefillGEMMFloorSustainedMS = ptr(res.PrefillFLOPs / sustained * 1e3)
	}
	return nil
}

// weightSpec is a tensor's dtype and shape, without making a
// model.Filler's bytes on the host.
func weightSpec(w model.Weights, name string) (backend.DType, []int, bool) {
	if f, ok := w.(model.Filler); ok {
		return f.Spec(name)
	}
	t, ok := w.Tensor(name)
	return t.DType, t.Shape, ok
}

// gateUpProbe puts layer 0's gate and up projections, stacked, on b: made
// there by a model.Filler where it can, else uploaded. ok is false where
// the two cannot be stacked (dtypes differ).
func (run *latencyRun) gateUpProbe() (w backend.Tensor, ok bool, err error) {
	o, c, b := run.opts, run.cfg, run.b
	gname, uname := model.LayerName(0, model.SuffixGate), model.LayerName(0, model.SuffixUp)
	gdt, _, ok1 := weightSpec(o.Weights, gname)
	udt, _, ok2 := weightSpec(o.Weights, uname)
	if !ok1 || !ok2 || gdt != udt {
		return nil, false, nil
	}
	if f, isFiller := o.Weights.(model.Filler); isFiller {
		if w, err = b.Alloc(gdt, 2*c.Intermediate, c.Hidden); err != nil {
			return nil, false, err
		}
		filled := true
		for i, name := range []string{gname, uname} {
			part, err := b.View(w, i*c.Intermediate, c.Intermediate)
			if err == nil {
				filled, err = f.Fill(b, name, part)
			}
			if err != nil {
				b.Free(w)
				return nil, false, err
			}
			if !filled {
				break
			}
		}
		if filled {
			return w, true, nil
		}
		b.Free(w)
	}
	gate, _ := o.Weights.Tensor(gname)
	up, _ := o.Weights.Tensor(uname)
	wdata := make([]byte, 0, len(gate.Data)+len(up.Data))
	wdata = append(append(wdata, gate.Data...), up.Data...)
	if w, err = b.Upload(gdt, []int{2 * c.Intermediate, c.Hidden}, wdata); err != nil {
		return nil, false, err
	}
	return w, true, nil
}

// matmulRate measures FLOP/s of the model's largest projection (layer 0's
// fused gate/up) on one prefill chunk's rows: the rate prefill's GEMMs can
// reach on this backend, in the weights' own dtype. burst is the best of
// three 50 ms trials; sustained, with opts.SustainedProbe > 0, the rate
// over the second half of that long a run (else 0).
func (run *latencyRun) matmulRate() (burst, sustained float64, err error) {
	o, c, b := run.opts, run.cfg, run.b
	w, ok, err := run.gateUpProbe()
	if err != nil {
		return 0, 0, fmt.Errorf("bench latency: matmul probe: %w", err)
	}
	if !ok {
		return 0, 0, nil
	}
	defer b.Free(w)
	n := min(o.PrefillChunk, o.Batch*o.InputLen)
	x, err := b.Alloc(b.ActDType(), n, c.Hidden)
	if err != nil {
		return 0, 0, fmt.Errorf("bench latency: matmul probe: %w", err)
	}
	defer b.Free(x)
	out, err := b.Alloc(b.ActDType(), n, 2*c.Intermediate)
	if err != nil {
		return 0, 0, fmt.Errorf("bench latency: matmul probe: %w", err)
	}
	defer b.Free(out)
	// Random activations: zeros can run faster than real data.
	vals := make([]float32, n*c.Hidden)
	fillNormal(vals, o.Seed, 0x70726f6265, 0, 1)
	xb, err := encodeF32(vals, b.ActDType())
	if err != nil {
		return 0, 0, fmt.Errorf("bench latency: matmul probe: %w", err)
	}
	if err := b.Write(x, xb); err != nil {
		return 0, 0, fmt.Errorf("bench latency: matmul probe: %w", err)
	}
	if err := b.MatMul(out, x, w, nil); err != nil { // warm: kernel load, GEMM plan
		return 0, 0, fmt.Errorf("bench latency: matmul probe: %w", err)
	}
	if err := b.Sync(); err != nil {
		return 0, 0, fmt.Errorf("bench latency: matmul probe: %w", err)
	}
	// Three trials of back-to-back launches between syncs, each at least
	// 50 ms; the fastest counts, as a ceiling should (the others lost time
	// to something else).
	flops := 2 * float64(n) * float64(c.Hidden) * float64(2*c.Intermediate)
	best := 0.0
	for range 3 {
		reps, start := 0, time.Now()
		for batch := 1; ; batch *= 2 {
			for range batch {
				if err := b.MatMul(out, x, w, nil); err != nil {
					return 0, 0, fmt.Errorf("bench latency: matmul probe: %w", err)
				}
			}
			reps += batch
			if err := b.Sync(); err != nil {
				return 0, 0, fmt.Errorf("bench latency: matmul probe: %w", err)
			}
			if time.Since(start) >= 50*time.Millisecond || reps >= 1024 {
				break
			}
		}
		best = max(best, flops*float64(reps)/time.Since(start).Seconds())
	}
	if o.SustainedProbe <= 0 {
		return best, 0, nil
	}
	// One long run, synchronised every 8 products; the rate counts from
	// the first sync past half the duration to the last.
	var (
		reps, midReps int
		start         = time.Now()
		mid           time.Time
	)
	for {
		for range 8 {
			if err := b.MatMul(out, x, w, nil); err != nil {
				return 0, 0, fmt.Errorf("bench latency: sustained matmul probe: %w", err)
			}
		}
		reps += 8
		if err := b.Sync(); err != nil {
			return 0, 0, fmt.Errorf("bench latency: sustained matmul probe: %w", err)
		}
		el := time.Since(start)
		if mid.IsZero() && el >= o.SustainedProbe/2 {
			mid, midReps = time.Now(), reps
		} else if !mid.IsZero() && el >= o.SustainedProbe {
			break
		}
	}
	return best, flops * float64(reps-midReps) / time.Since(mid).Seconds(), nil
}

// encodeF32 encodes vals in a float (activation) dtype.
func encodeF32(vals []float32, dt backend.DType) ([]byte, error) {
	switch dt {
	case backend.F32, backend.BF16, backend.F16:
	default:
		return nil, fmt.Errorf("activation dtype %v is not F32, BF16 or F16", dt)
	}
	out := make([]byte, len(vals)*dt.BlockBytes())
	if err := encodeChunk(out, dt, 0, vals); err != nil {
		return nil, err
	}
	return out, nil
}

func ptr[T any](v T) *T { return &v }

// checkedMul returns a*b for non-negative a, b, or an error on overflow.
func checkedMul(a, b int) (int, error) {
	if a < 0 || b < 0 {
		return 0, fmt.Errorf("negative size %d x %d", a, b)
	}
	if a != 0 && b > math.MaxInt64/a {
		return 0, fmt.Errorf("size %d x %d overflows", a, b)
	}
	return a * b, nil
}
