package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/cpu"
	"github.com/trigon-llm/trigon/bench"
	"github.com/trigon-llm/trigon/engine"
	"github.com/trigon-llm/trigon/kvcache"
	"github.com/trigon-llm/trigon/models"
	"github.com/trigon-llm/trigon/telemetry"
)

// modelFlags choose the model and size the engine.
type modelFlags struct {
	deviceFlags
	model      string
	maxContext int
	maxSeqs    int
	maxTokens  int
	kvBlocks   int
	kvMemory   int64
	maxQueue   int     // serve only
	warm       bool    // serve only: engine.LoadOptions.Warm
	mixedRatio float64 // serve only: engine.LoadOptions.MixedStepRatio
	graphs     string
	graphMem   int64
	memUtil    float64
	queueAhead bool
	loadFormat string
	tokenizer  string
	kvDType    string
	kvWindow   int
	quant      string
	spec       specFlag
	src        *modelSource // resolved once (source)
}

func (f *modelFlags) register(cmd *cobra.Command) {
	f.deviceFlags.register(cmd)
	f.deviceFlags.registerTP(cmd)
	cmd.Flags().StringVarP(&f.model, "model", "m", "", "model: HF directory or .gguf file (default: the embedded Go-code model)")
	cmd.Flags().IntVar(&f.maxContext, "max-model-len", 0, "context length served, prompt and output, at most the model's (0: the model's; also --max-context)")
	cmd.Flags().IntVar(&f.maxContext, "max-context", 0, "same as --max-model-len")
	cmd.Flags().IntVar(&f.maxSeqs, "max-seqs", 64, "most sequences running at once")
	cmd.Flags().IntVar(&f.maxTokens, "max-num-batched-tokens", 0, "token budget of one engine step: decodes first, prefill chunks in the rest (0: measured at load so that a step takes about 150 ms on this backend, at most 2048; also --max-batched-tokens)")
	// The older spelling still works (hidden).
	cmd.Flags().IntVar(&f.maxTokens, "max-batched-tokens", 0, "same as --max-num-batched-tokens")
	_ = cmd.Flags().MarkHidden("max-batched-tokens") // the flag exists: no error
	cmd.Flags().IntVar(&f.kvBlocks, "kv-blocks", 0, "KV-cache blocks of 16 tokens (0: sized from --kv-memory)")
	cmd.Flags().Int64Var(&f.kvMemory, "kv-memory", 2<<30, "bytes for the KV cache on the CPU when --kv-blocks is 0")
	cmd.Flags().Float64Var(&f.memUtil, "gpu-memory-utilization", 0.9, "share of GPU memory trigon may use; the KV cache gets what the weights leave")
	cmd.Flags().Int64Var(&f.graphMem, "cuda-graph-memory", 1<<30, "device bytes the cached decode graphs may hold (0: no bound)")
	cmd.Flags().StringVar(&f.graphs, "cuda-graphs", "auto", "replay decode steps from CUDA graphs: on, off, or auto (on where the backend can capture)")
	cmd.Flags().StringVar(&f.loadFormat, "load-format", loadAuto, "auto: the checkpoint's weights; dummy: random weights of the architecture --model names "+
		"(a preset: "+strings.Join(bench.ArchNames(), ", ")+"; an HF directory or config.json; a .gguf; none: the embedded model's), made on the device")
	cmd.Flags().StringVar(&f.tokenizer, "tokenizer", "", "tokenizer to use instead of the model's: an HF directory (tokenizer.json) or a .gguf file")
	registerKVFlags(cmd, &f.kvDType, &f.kvWindow)
	cmd.Flags().StringVar(&f.quant, "quantization", "none", quantizationUsage)
	registerSpecFlag(cmd, &f.spec, "off when not given (a draft model turns --queue-ahead off; prompt lookup queues ahead while no draft is likely)")
	cmd.Flags().BoolVar(&f.queueAhead, "queue-ahead", true, "queue each decode step on the device, fed the previous step's sampled tokens there, before they reach the host (steady decoding; requests sampled on the host are not; =false turns it off)")
}

// quantizationUsage is the help of --quantization (serve, run, bench
// latency, eval perplexity and greedy).
const quantizationUsage = "quantize an unquantized checkpoint's projections at load: fp8 (e4m3 weights, a scale per output feature; activations quantized per token at run time, as vLLM's dynamic FP8) or none; pre-quantized AWQ and FP8 checkpoints load as they are (docs/quantization.md)"

// modelPath resolves --model, extracting the embedded default when empty.
func (f *modelFlags) modelPath() (string, error) {
	if f.model != "" {
		return f.model, nil
	}
	return models.DefaultPath()
}

// load opens the model on the chosen backend and starts the engine's step
// loop; stop cancels it.
func (f *modelFlags) load(ctx context.Context, log *slog.Logger, metrics *telemetry.Metrics) (l *engine.Loaded, stop func(), err error) {
	if err := f.check(); err != nil {
		return nil, nil, err
	}
	kvWindow, err := kvWindowOption(f.kvWindow)
	if err != nil {
		return nil, nil, err
	}
	src, err := f.source(log)
	if err != nil {
		return nil, nil, err
	}
	b, tp, err := f.openRanks(log)
	if err != nil {
		return nil, nil, err
	}
	t0 := time.Now()
	opts := engine.LoadOptions{
		GraphMemory: f.graphMem, MemoryUtilization: f.memUtil,
		Model: src.path, MaxContext: f.maxContext,
		MaxSeqs: f.maxSeqs, MaxBatchedTokens: f.maxTokens, MaxQueue: f.maxQueue, KVBlocks: f.kvBlocks, KVMemory: f.kvMemory,
		Metrics: metrics, Logger: log, QueueAhead: f.queueAhead, Tokenizer: src.tok, Warm: f.warm, MixedStepRatio: f.mixedRatio,
		KVCacheDType: f.kvDType, KVWindow: kvWindow, Speculative: f.spec.cfg, TensorParallel: tp, Quantization: f.quant,
	}
	if src.dummy {
		// BF16, as the checkpoints serving benchmarks stand in for;
		// made on the device where the backend can (model.Filler).
		w, err := bench.SyntheticWeights(src.cfg, backend.BF16, 0)
		if err != nil {
			return nil, nil, err
		}
		opts.Model, opts.Weights, opts.Config = src.label, w, src.cfg
	} else {
		opts.Progress = progress(src.path)
	}
	if l, b, err = f.loadOn(b, log, opts); err != nil {
		return nil, nil, err
	}
	budget := "given"
	if l.BudgetMeasured {
		budget = "measured"
	}
	if f.spec.cfg.Enabled() {
		log.Info("speculative decoding", "config", f.spec.cfg.String())
	}
	log.Info("model loaded", "model", src.label, "arch", l.Config.Arch, "backend", b.Name(), "tensor_parallel_size", engine.RunnerOf(l).Ranks(),
		"context", l.Context, "kv_cache_dtype", engine.RunnerOf(l).KVSpec().Name(),
		"kv_capacity_tokens", engine.RunnerOf(l).CapacityTokens(), "kv_blocks", l.KVBlocks, "max_num_batched_tokens", l.MaxBatchedTokens, "budget", budget,
		"took", time.Since(t0).Round(time.Millisecond))
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := l.Engine.Run(runCtx); err != nil {
			log.Error("engine stopped", "err", err)
		}
	}()
	return l, func() { cancel(); <-done; l.Close() }, nil
}

// loadOn loads the model on b. With --device auto, a model b cannot run
// (engine.ErrUnsupportedModel: a shape the CUDA kernels do not take) is
// loaded on the CPU instead, with one warning, as auto does when CUDA is
// not usable at all; with --device cuda the error says so.
func (f *modelFlags) loadOn(b backend.Backend, log *slog.Logger, opts engine.LoadOptions) (*engine.Loaded, backend.Backend, error) {
	load := func(b backend.Backend) (*engine.Loaded, error) {
		graphs, err := f.useGraphs(b)
		if err != nil {
			return nil, err
		}
		opts.Backend, opts.Graphs = b, graphs
		return engine.Load(opts)
	}
	l, err := load(b)
	if !errors.Is(err, engine.ErrUnsupportedModel) || opts.TensorParallel != nil {
		return l, b, err
	}
	if f.device != "auto" {
		return nil, b, fmt.Errorf("%w (the CPU backend runs it: --device cpu)", err)
	}
	log.Warn("the "+b.Name()+" backend cannot run this model; using the CPU backend", "reason", err.Error())
	if c, ok := b.(io.Closer); ok {
		c.Close()
	}
	b = cpu.New(cpu.Options{Threads: f.threads})
	l, err = load(b)
	return l, b, err
}

// newLogger logs to w (the command's stderr): warnings, or info with
// verbose.
func newLogger(w io.Writer, verbose bool) *slog.Logger {
	level := slog.LevelWarn
	if verbose {
		level = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

// useGraphs resolves --cuda-graphs for backend b.
func (f *modelFlags) useGraphs(b backend.Backend) (bool, error) {
	_, can := b.(backend.GraphCapturer)
	switch f.graphs {
	case "off", "":
		return false, nil
	case "auto":
		return can, nil
	case "on":
		if !can {
			return false, fmt.Errorf("--cuda-graphs on: the %s backend cannot capture graphs", b.Name())
		}
		return true, nil
	}
	return false, fmt.Errorf("--cuda-graphs %q: want on, off or auto", f.graphs)
}

// registerKVFlags adds --kv-cache-dtype and --kv-cache-window.
func registerKVFlags(cmd *cobra.Command, dtype *string, window *int) {
	cmd.Flags().StringVar(dtype, "kv-cache-dtype", "auto", "KV cache format: auto (the backend's activation dtype), bf16, fp8 (e4m3, a scale per layer and KV head), "+
		"int8 (a scale per 32 channels) or int4 (KIVI, the newest --kv-cache-window tokens in bf16); see docs/kv-cache.md")
	cmd.Flags().IntVar(window, "kv-cache-window", backend.DefaultKVWindow, "int4 KV cache: the newest tokens of each sequence kept in bf16; "+
		"0 keeps none (only each sequence's last, partial block); other dtypes ignore it")
}

// kvWindowOption is the KVWindow option (backend.KVSpec.WithWindowOption)
// of a --kv-cache-window value: the flag's 0 is no window, where the
// option's 0 is the default, so it maps to backend.KVNoWindow.
func kvWindowOption(flag int) (int, error) {
	switch {
	case flag < 0:
		return 0, fmt.Errorf("--kv-cache-window %d: want a token count, or 0 for no bf16 window", flag)
	case flag == 0:
		return backend.KVNoWindow, nil
	}
	return flag, nil
}

// checkKVGroup refuses a --kv-cache-group that --kv-cache-dtype does not
// take, before any model work: only the int8 and int4 caches scale
// groups of channels (docs/kv-cache.md), and only of backend.KVGroupSizes.
func checkKVGroup(dtype string, group int) error {
	if group == 0 {
		return nil
	}
	if !slices.Contains(backend.KVGroupSizes, group) {
		return fmt.Errorf("--kv-cache-group %d: want one of %v, or 0 for the default", group, backend.KVGroupSizes)
	}
	spec, err := parseKVDType("kv-cache-dtype", dtype)
	if err != nil {
		return err
	}
	if spec.GroupSize == 0 {
		return fmt.Errorf("--kv-cache-group %d with --kv-cache-dtype %s: only the int8 and int4 caches have channel groups", group, dtype)
	}
	return nil
}

// parseKVDType is the cache format of the KV cache dtype name given to
// flag, for checks before any model work; its pool dtype for auto is
// F32's, the activation dtype being the backend's to say.
func parseKVDType(flag, name string) (backend.KVSpec, error) {
	spec, err := backend.ParseKVCacheDType(name, backend.F32, kvcache.DefaultBlockSize)
	if err != nil {
		return spec, fmt.Errorf("--%s %s: want one of %v", flag, name, backend.KVCacheDTypes)
	}
	return spec, nil
}
