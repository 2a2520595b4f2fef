package engine

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/format/gguf"
	"github.com/trigon-llm/trigon/kvcache"
	"github.com/trigon-llm/trigon/model"
	"github.com/trigon-llm/trigon/runner"
	"github.com/trigon-llm/trigon/sched"
	"github.com/trigon-llm/trigon/specdec"
	"github.com/trigon-llm/trigon/telemetry"
	"github.com/trigon-llm/trigon/tokenizer"
)

// LoadOptions say what to load and how to size the engine.
type LoadOptions struct {
	// Model is an HF directory (config.json, *.safetensors, tokenizer.json)
	// or a .gguf file; with Weights it only names the model in messages.
	Model   string
	Backend backend.Backend
	// MaxContext is the context per sequence served (--max-model-len):
	// at most the model's, which Load refuses to exceed as vLLM does a
	// max_model_len above max_position_embeddings; 0: the model's.
	MaxContext int
	// MaxSeqs caps running sequences (default 64); MaxBatchedTokens is the
	// per-step token budget, decodes first, prefill chunks in the rest;
	// ChunkSize caps one sequence's prefill chunk (default 512).
	// MaxBatchedTokens 0 measures the budget at load: prefill steps of
	// the model are timed on the backend and the budget is the step that
	// takes about StepTime, at most 2048 and at least MaxSeqs plus a KV
	// block (see budget.go).
	MaxSeqs, MaxBatchedTokens, ChunkSize int
	// StepTime is the step length a measured budget aims at; 0: 150 ms.
	StepTime time.Duration
	// MixedStepRatio caps the prefill of a step beside decodes so that
	// it costs at most this many times their decode step, an allowance
	// that grows as the decodes make their step compute-bound; Load
	// times the model's steps for it, after the warm-up (mixed.go). 0:
	// no cap (the budget alone), else above 1 (2 holds a steady load's
	// p99 token gap on a GPU near 3x its median). It trades throughput
	// at full load for that tail.
	MixedStepRatio float64
	// KVBlocks sizes the KV pools in 16-token blocks; 0: enough for
	// MaxSeqs sequences of 2048 tokens, at most KVMemory bytes.
	KVBlocks int
	// KVMemory bounds the KV pools' bytes when KVBlocks is 0 (default 2 GiB)
	// on backends that do not report their memory (the CPU).
	KVMemory int64
	// MemoryUtilization is the share of a GPU's memory trigon may use in
	// all (default 0.9): with KVBlocks 0, the KV pools take what is left of
	// it after the weights and scratch are loaded.
	MemoryUtilization float64
	MaxQueue          int
	Metrics           *telemetry.Metrics
	Logger            *slog.Logger
	// Progress, when set, is called as weight bytes are read in.
	Progress func(done, total int64)
	// Graphs replays decode steps from captured graphs (backends that
	// implement backend.GraphCapturer).
	Graphs bool
	// GraphMemory bounds the device bytes cached graphs hold (0: no bound).
	GraphMemory int64
	// QueueAhead: Options.QueueAhead.
	QueueAhead bool
	// Weights, when set, are served with Config instead of reading Model:
	// random weights of an architecture (trigon serve --load-format
	// dummy). Tokenizer is then required. Load owns them from the call on.
	Weights model.Weights
	Config  model.Config
	// Tokenizer, when set, replaces Model's tokenizer (--tokenizer).
	Tokenizer *tokenizer.Tokenizer
	// KVCacheDType is the KV cache's format (--kv-cache-dtype: auto,
	// bf16, fp8, int8, int4; "" is auto, the backend's activation dtype);
	// KVWindow the int4 cache's bf16 window in tokens (0: the default,
	// backend.KVNoWindow: none; see KVSpec.WithWindowOption).
	KVCacheDType string
	KVWindow     int
	// Speculative is --speculative-config (zero: off). A draft model is
	// loaded on Backend beside the target, with its own KV cache.
	Speculative specdec.Config
	// TensorParallel, when set, splits the model over its ranks; nil: the
	// whole model on Backend.
	TensorParallel *TensorParallel
	// Quantization quantizes an unquantized checkpoint's projections at
	// load (--quantization): "fp8" (e4m3 weights with a scale per output
	// feature, activations quantized per token at run time, as vLLM's
	// dynamic FP8); "" or "none" loads the weights as stored.
	Quantization string
	// Warm, on a backend that builds kernels at run time (KernelPreparer),
	// prepares its kernels and runs a decode step of each decode batch
	// bucket at load (and, with Speculative, a verify step of each and
	// the draft's decode steps), then ends the backend's GEMM tuning
	// (TuningEnder), so that no request pays for a shape's first run
	// (warm.go): for servers.
	Warm bool
}

// QuantizationDType is the weight dtype LoadOptions.Quantization names,
// 0 for none.
func QuantizationDType(name string) (backend.DType, error) {
	switch strings.ToLower(strings.TrimSpace(name)) {
	case "", "none":
		return 0, nil
	case "fp8":
		return backend.F8E4M3Row, nil
	}
	return 0, fmt.Errorf("quantization %q: want fp8 or none", name)
}

// AttentionChecker is an optional Backend interface, for backends whose
// kernels take only some attention shapes (the CUDA backend): Load asks
// it before it uploads any weight, and refuses a model the backend cannot
// run with an error wrapping ErrUnsupportedModel, so that the model is
// not served only to fail every request.
type AttentionChecker interface {
	CheckAttention(numHeads, numKVHeads, headDim int) error
}

// ErrUnsupportedModel is wrapped by Load's error when the backend cannot
// run the model's shapes; another backend (the CPU) may.
var ErrUnsupportedModel = errors.New("the backend cannot run this model")

// Loaded is a model ready to serve: its engine, tokenizer and configs.
type Loaded struct {
	Engine    *Engine
	Tokenizer *tokenizer.Tokenizer
	Config    model.Config
	Gen       model.GenerationConfig
	Context   int // context length served
	KVBlocks  int // blocks in the KV pools
	// MaxBatchedTokens is the step token budget in use; BudgetMeasured
	// says Load measured it (LoadOptions.MaxBatchedTokens was 0).
	MaxBatchedTokens int
	BudgetMeasured   bool
	// MixedCap is the scheduler's cap on prefill beside decodes
	// (sched.Config.MixedCap), nil where there is none.
	MixedCap []int
	weights  model.Weights
	model    rankModels
	runner   *runner.Runner
	proposer specdec.Proposer // nil: no speculation
}

// Close frees the model's memory. The engine must have stopped.
func (l *Loaded) Close() {
	if l.proposer != nil {
		l.proposer.Close()
	}
	l.runner.Close()
	l.model.Close()
	l.weights.Close()
}

// Load opens a model, uploads it to the backend and builds the engine.
func Load(opts LoadOptions) (*Loaded, error) {
	if r := opts.MixedStepRatio; r != 0 && !(r > 1 && !math.IsInf(r, 1)) {
		if opts.Weights != nil {
			opts.Weights.Close()
		}
		return nil, fmt.Errorf("load %s: mixed-step ratio %g: want 0 (no cap) or a finite ratio above 1", opts.Model, r)
	}
	cfg, gen, w, tok, err := openModel(opts)
	if err != nil {
		if opts.Weights != nil {
			opts.Weights.Close()
		}
		return nil, err
	}
	if err := CheckVocab(cfg, tok); err != nil {
		w.Close()
		return nil, fmt.Errorf("load %s: %w", opts.Model, err)
	}
	if p := DefaultParams(gen); p.Validate() != nil {
		w.Close()
		return nil, fmt.Errorf("load %s: generation_config.json: %w", opts.Model, p.Validate())
	}
	ctxLen, err := contextLength(cfg, opts.MaxContext)
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("load %s: %w", opts.Model, err)
	}
	shards, err := planShards(opts, cfg, w)
	if err != nil {
		w.Close()
		return nil, err
	}
	if act := opts.Backend.ActDType(); act != backend.F32 && hasF32Matrices(w) {
		// As vLLM warns when it casts: results differ from an F32 run.
		log := opts.Logger
		if log == nil {
			log = slog.Default()
		}
		log.Warn("the checkpoint's weights are F32; this backend computes activations and the KV cache in "+act.String(),
			"backend", opts.Backend.Name())
	}
	setDefault(&opts.MaxSeqs, 64)
	// A measured budget is at most maxAutoBudget: the model and the runner
	// are sized for that, and the probe runs in it.
	measure := opts.MaxBatchedTokens <= 0
	setDefault(&opts.MaxBatchedTokens, maxAutoBudget)
	setDefault(&opts.ChunkSize, 512)
	opts.MaxBatchedTokens = max(opts.MaxBatchedTokens, opts.MaxSeqs)
	if opts.KVMemory <= 0 {
		opts.KVMemory = 2 << 30
	}
	b := opts.Backend
	spec, kvScales, err := kvFormat(opts, b, cfg, w)
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("load %s on %s: %w", opts.Model, b.Name(), err)
	}
	// A rank's pools: its share of the KV heads (the whole on one rank).
	kvHeads := maxKVHeads(shards)
	perBlock := spec.CacheBlockBytes(cfg.NumLayers, kvHeads, cfg.HeadDim)
	fixed := spec.FixedBytes(cfg.NumLayers, kvHeads, cfg.HeadDim, spec.WindowBlocks(opts.MaxSeqs, opts.MaxBatchedTokens))
	if opts.Progress != nil {
		prefetch(w, opts.Progress)
	}
	// A verify step wants the logits of each decoding sequence's draft
	// tokens too.
	maxLogits := opts.MaxSeqs
	if k := opts.Speculative.NumSpeculativeTokens; opts.Speculative.Enabled() {
		maxLogits = min(opts.MaxSeqs*(1+k), opts.MaxBatchedTokens)
	}
	ms, shards, err := loadRanks(opts, cfg, w, model.Options{MaxTokens: opts.MaxBatchedTokens, MaxLogits: maxLogits})
	m := rankModels(ms)
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("load %s: %w", opts.Model, err)
	}
	proposer, err := newProposer(opts, b, cfg, tok, ctxLen)
	if err != nil {
		m.Close()
		w.Close()
		return nil, fmt.Errorf("load %s: %w", opts.Model, err)
	}
	closeProposer := func() {
		if proposer != nil {
			proposer.Close()
		}
	}
	blocks, err := kvBlocks(opts, b, perBlock, fixed, ctxLen)
	if err != nil {
		closeProposer()
		m.Close()
		w.Close()
		return nil, fmt.Errorf("load %s: %w", opts.Model, err)
	}
	r, err := newRankRunners(opts, m, shards, runner.Options{
		NumBlocks: blocks, BlockSize: kvcache.DefaultBlockSize,
		MaxTokens: opts.MaxBatchedTokens, MaxSeqs: opts.MaxSeqs, MaxSeqLen: ctxLen,
		NumLayers: cfg.NumLayers, NumKVHeads: cfg.NumKVHeads, HeadDim: cfg.HeadDim,
		KV: spec, KVScales: kvScales,
		Graphs: runner.GraphOptions{Enabled: opts.Graphs, MemoryBudget: opts.GraphMemory,
			VerifyTokens: opts.Speculative.NumSpeculativeTokens}, // the model takes MaxSeqs x (1+K) logits rows (maxLogits)
	})
	if err != nil {
		m.Close()
		w.Close()
		closeProposer()
		return nil, fmt.Errorf("load %s: %w", opts.Model, err)
	}
	// fail frees what Load has made, the runner included.
	fail := func(err error) (*Loaded, error) {
		r.Close()
		m.Close()
		w.Close()
		closeProposer()
		return nil, err
	}
	opts.Metrics.SetKVCache(spec.Name(), r.CapacityTokens())
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	// Only backends that build kernels at run time pay for a shape's
	// first run.
	warm := opts.Warm && prepareKernels(opts.TensorParallel.backends(b), log)
	budget := opts.MaxBatchedTokens
	if measure {
		target := opts.StepTime
		if target <= 0 {
			target = defaultStepTime
		}
		// At least every decode and a block of prefill, so that prompts
		// still advance with MaxSeqs streams running.
		lo := min(opts.MaxSeqs+kvcache.DefaultBlockSize, budget)
		timeStep, maxN := prefillTimer(r, ctxLen, blocks)
		if budget, err = fitBudget(timeStep, target, lo, budget, maxN); err != nil {
			return fail(fmt.Errorf("load %s: %w", opts.Model, err))
		}
	}
	var mixedCap []int
	if warm {
		sizes := warmSizes(r)
		t0 := time.Now()
		err := warmSteps(r, sizes, blocks, 1)
		if k := opts.Speculative.NumSpeculativeTokens; err == nil && opts.Speculative.Enabled() {
			err = warmSteps(r, sizes, blocks, 1+k)
		}
		if d, ok := proposer.(*specdec.Draft); err == nil && ok {
			dr := d.Runner()
			err = warmSteps(dr, warmSizes(dr), dr.Options().NumBlocks, 1)
		}
		if err == nil {
			log.Info("decode shapes warmed", "batch_sizes", len(sizes), "took", time.Since(t0).Round(time.Millisecond))
		}
		if k := opts.Speculative.NumSpeculativeTokens; err == nil && opts.Speculative.Enabled() {
			t0 = time.Now()
			var shapes int
			var full bool
			if shapes, full, err = warmVerify(r, k); err == nil && (shapes > 0 || full) {
				log.Info("verify graphs warmed", "shapes", shapes, "cache_full", full, "took", time.Since(t0).Round(time.Millisecond))
			}
		}
		if err != nil {
			return fail(fmt.Errorf("load %s: %w", opts.Model, err))
		}
		endTuning(opts.TensorParallel.backends(b), log)
	}
	if ratio := opts.MixedStepRatio; ratio > 0 {
		// After the warm-up, so that the decode steps timed run as served.
		costs, err := measureStepCosts(r, budget, probeRoom(ctxLen, blocks), warmSizes(r), blocks)
		if err != nil {
			return fail(fmt.Errorf("load %s: %w", opts.Model, err))
		}
		maxDecode := opts.MaxSeqs
		if opts.Speculative.Enabled() {
			maxDecode *= 1 + opts.Speculative.NumSpeculativeTokens
		}
		if mixedCap = mixedCaps(costs, ratio, min(maxDecode, budget), budget); mixedCap != nil {
			at := func(d int) int { return mixedCap[min(d, len(mixedCap)-1)] }
			log.Info("mixed-step prefill capped", "ratio", ratio,
				"prefill_steps", costs.prefill.String(), "decode_steps", costs.decode.String(),
				"cap_at_1", at(1), "cap_at_8", at(8), "cap_at_64", at(64), "cap_at_max", at(maxDecode))
		} else {
			log.Warn("mixed-step prefill not capped: the step costs measured do not bound a step", "ratio", ratio,
				"prefill_steps", costs.prefill.String(), "decode_steps", costs.decode.String())
		}
	}
	// The budget probe and the warm-up ran made-up tokens: an fp8 cache's
	// dynamic scales are the first real prompt's to set.
	err = r.ForgetDynamicKVScales()
	if d, ok := proposer.(*specdec.Draft); err == nil && ok {
		err = d.Runner().ForgetDynamicKVScales()
	}
	if err != nil {
		return fail(fmt.Errorf("load %s: %w", opts.Model, err))
	}
	pool, err := kvcache.NewPool(kvcache.Options{NumBlocks: blocks, BlockSize: kvcache.DefaultBlockSize, EnablePrefixCache: true})
	if err != nil {
		return fail(err)
	}
	eng, err := New(r, pool, tok, Options{
		Sched:      sched.Config{MaxNumSeqs: opts.MaxSeqs, MaxNumBatchedTokens: budget, ChunkSize: opts.ChunkSize, MixedCap: mixedCap},
		MaxQueue:   opts.MaxQueue,
		MaxContext: ctxLen,
		EOS:        model.StopTokenIDs(cfg, gen),
		Metrics:    opts.Metrics,
		Logger:     opts.Logger,
		QueueAhead: opts.QueueAhead,
		Spec:       SpecOptions{Proposer: proposer, Tokens: opts.Speculative.NumSpeculativeTokens},
	})
	if err != nil {
		return fail(err)
	}
	return &Loaded{Engine: eng, Tokenizer: tok, Config: cfg, Gen: gen, Context: ctxLen, KVBlocks: blocks,
		MaxBatchedTokens: budget, BudgetMeasured: measure, MixedCap: mixedCap, weights: w, model: m, runner: r, proposer: proposer}, nil
}

// CheckVocab is Load's refusal of a tokenizer with more tokens than the
// model's vocabulary: the embedding and the LM head have no row for the
// ids past it, which the tokenizer may encode.
func CheckVocab(cfg model.Config, tok *tokenizer.Tokenizer) error {
	if tok.VocabSize() > cfg.VocabSize {
		return fmt.Errorf("tokenizer has %d tokens but the model's vocabulary is %d: ids from %d on have no embedding",
			tok.VocabSize(), cfg.VocabSize, cfg.VocabSize)
	}
	return nil
}

// hasF32Matrices reports whether any weight matrix is stored as F32 (the
// norms and biases are widened to F32 whatever the checkpoint, so only
// matrices say what it is).
func hasF32Matrices(w model.Weights) bool {
	for _, name := range w.Names() {
		if t, ok := w.Tensor(name); ok && t.DType == backend.F32 && len(t.Shape) == 2 {
			return true
		}
	}
	return false
}

// LoadTokenizer reads the tokenizer of an HF directory or a GGUF file,
// told apart as model.OpenWeights does: a directory is an HF one, a file
// must start with the GGUF magic, whatever its name. Its errors name path
// once, after "load tokenizer from" (tokenizer.FromHFDir's own prefix).
func LoadTokenizer(path string) (*tokenizer.Tokenizer, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer from %s: %w", path, withoutPath(err, path))
	}
	if st.IsDir() {
		// FromHFDir names the directory.
		return tokenizer.FromHFDir(path)
	}
	if ok, err := model.IsGGUF(path); err != nil {
		return nil, fmt.Errorf("load tokenizer from %s: %w", path, withoutPath(err, path))
	} else if !ok {
		return nil, fmt.Errorf("load tokenizer from %s: not a model directory or a GGUF file", path)
	}
	f, err := gguf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer from %s: %w", path, withoutPath(err, path))
	}
	defer f.Close()
	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer from %s: %w", path, err)
	}
	return tok, nil
}

// withoutPath is err less an *fs.PathError naming path (os.Stat's,
// gguf.Open's), for a message that names path itself.
func withoutPath(err error, path string) error {
	if pe, ok := err.(*fs.PathError); ok && pe.Path == path {
		return pe.Err
	}
	return err
}

func setDefault(v *int, d int) {
	if *v <= 0 {
		*v = d
	}
}

// prefetch reads every weight's pages once, reporting progress, so a large
// mmapped file is read in (from disk to the page cache) under a progress
// bar rather than by page faults during the first steps.
func prefetch(w model.Weights, progress func(done, total int64)) {
	var total, done int64
	for _, name := range w.Names() {
		if t, ok := w.Tensor(name); ok {
			total += int64(len(t.Data))
		}
	}
	var sink byte
	for _, name := range w.Names() {
		t, ok := w.Tensor(name)
		if !ok {
			continue
		}
		for i := 0; i < len(t.Data); i += 4096 {
			sink ^= t.Data[i]
		}
		done += int64(len(t.Data))
		progress(done, total)
	}
	prefetchSink.Store(uint32(sink))
}

// prefetchSink keeps the compiler from dropping prefetch's reads.
var prefetchSink atomic.Uint32

// RunnerOf exposes a loaded model's runner, for tools that drive steps
// directly (scoring, tests). The engine's loop must not be running.
func RunnerOf(l *Loaded) *runner.Runner { return l.runner }

// ContextLength is the context Load would serve for the model at path with
// LoadOptions.MaxContext maxContext, read without loading the weights.
func ContextLength(path string, maxContext int) (int, error) {
	cfg, _, w, err := model.OpenWeights(path)
	if err != nil {
		return 0, err
	}
	w.Close()
	return contextLength(cfg, maxContext)
}

// contextLength is the context served: maxContext, or the model's for 0.
// One past the model's is refused: positions past the ones it was
// trained for give no meaningful output.
func contextLength(cfg model.Config, maxContext int) (int, error) {
	switch {
	case maxContext > cfg.MaxPositions:
		return 0, fmt.Errorf("--max-model-len %d is more than the model's context of %d tokens (max_position_embeddings)", maxContext, cfg.MaxPositions)
	case maxContext > 0:
		return maxContext, nil
	}
	return cfg.MaxPositions, nil
}

// kvFormat is the KV cache format opts ask for and, for FP8, the
// checkpoint's scales; a format the backend has no kernels for is an
// error here, before any weight is uploaded.
func kvFormat(opts LoadOptions, b backend.Backend, cfg model.Config, w model.Weights) (backend.KVSpec, []model.KVScales, error) {
	spec, err := backend.ParseKVCacheDType(opts.KVCacheDType, b.ActDType(), kvcache.DefaultBlockSize)
	if err != nil {
		return spec, nil, err
	}
	if spec, err = spec.WithWindowOption(opts.KVWindow); err != nil {
		return spec, nil, err
	}
	if err := spec.CheckModel(cfg.NumKVHeads, cfg.HeadDim); err != nil {
		return spec, nil, err
	}
	if c, ok := b.(backend.KVSpecChecker); ok {
		if err := c.CheckKVSpec(spec); err != nil {
			return spec, nil, err
		}
	}
	if spec.Scales != backend.KVScalePerHead {
		return spec, nil, nil
	}
	scales, err := model.ReadKVScales(w, cfg.NumLayers)
	return spec, scales, err
}

// kvBlocks sizes the KV pools: KVBlocks when given; on a backend that
// reports its memory, what MemoryUtilization leaves after the weights; else
// MaxSeqs sequences of up to 2048 tokens within KVMemory. Always at least
// one sequence of the whole context. perBlock is a block's bytes over all
// layers (scales included), fixed what the cache takes besides its blocks.
func kvBlocks(opts LoadOptions, b backend.Backend, perBlock, fixed int64, ctxLen int) (int, error) {
	oneSeq := (ctxLen+kvcache.DefaultBlockSize-1)/kvcache.DefaultBlockSize + 1
	if opts.KVBlocks > 0 {
		return opts.KVBlocks, nil
	}
	if mr, ok := b.(backend.MemoryReporter); ok {
		util := opts.MemoryUtilization
		if util <= 0 || util > 1 {
			util = 0.9
		}
		free, total, err := mr.MemoryInfo()
		if err != nil {
			return 0, err
		}
		budget := free - int64((1-util)*float64(total)) - fixed
		// Device pools round allocations up to a size class (at most 12.5%
		// over), so count each block at 9/8 of its bytes.
		blocks := budget / (perBlock + perBlock/8)
		if blocks < int64(oneSeq) {
			return 0, fmt.Errorf("%.1f GiB of device memory left for the KV cache holds %d blocks, fewer than one %d-token sequence needs (%d): lower --max-model-len or raise --gpu-memory-utilization",
				float64(max(budget, 0))/(1<<30), max(blocks, 0), ctxLen, oneSeq)
		}
		return int(min(blocks, 1<<30)), nil
	}
	want := opts.MaxSeqs*((min(ctxLen, 2048)+kvcache.DefaultBlockSize-1)/kvcache.DefaultBlockSize) + 1
	blocks := int(min(int64(want), max(opts.KVMemory-fixed, 0)/perBlock))
	return max(blocks, oneSeq), nil
}
