package main

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/bench"
	"github.com/trigon-llm/trigon/engine"
	"github.com/trigon-llm/trigon/kvcache"
	"github.com/trigon-llm/trigon/model"
)

func benchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmark latency (model and runner directly) or a running server",
		Long: "bench latency times prefill and decode steps of one batch on synthetic (or given) weights;\n" +
			"bench serve sends streaming completions to an OpenAI-compatible server at a Poisson rate.\n" +
			"See docs/benchmarks.md.",
	}
	cmd.AddCommand(benchLatencyCmd(), benchServeCmd(), benchOverlapCmd())
	return cmd
}

// weightDTypes are the --dtype values of bench latency.
var weightDTypes = map[string]backend.DType{
	"bf16": backend.BF16, "f16": backend.F16, "f32": backend.F32, "q8_0": backend.Q8_0, "q4_0": backend.Q4_0,
	"q4_k": backend.Q4_K, "q5_k": backend.Q5_K, "q6_k": backend.Q6_K,
}

// quantDTypes are the --dtype values of bench latency made by quantizing
// BF16 synthetic weights on the host (model.QuantizeWeights).
var quantDTypes = map[string]backend.DType{
	"awq4_g32": backend.AWQ4G32, "awq4_g64": backend.AWQ4G64, "awq4_g128": backend.AWQ4G128, "fp8": backend.F8E4M3Row,
}

// syntheticWeights makes the --arch, --dtype, --seed weights of a
// benchmark; onDevice false hides their model.Filler (host generation).
func syntheticWeights(arch, dtype string, seed uint64, onDevice bool) (model.Config, model.Weights, error) {
	key := strings.ToLower(dtype)
	dt, ok := weightDTypes[key]
	qdt, quant := quantDTypes[key]
	if quant {
		dt, ok, onDevice = backend.BF16, true, false
	}
	if !ok {
		return model.Config{}, nil, fmt.Errorf("--dtype %q: want bf16, f16, f32, q8_0, q4_0, q4_k, q5_k, q6_k, awq4_g32, awq4_g64, awq4_g128 or fp8", dtype)
	}
	cfg, err := bench.Arch(arch)
	if err != nil {
		return model.Config{}, nil, err
	}
	w, err := bench.SyntheticWeights(cfg, dt, seed)
	if err != nil {
		return model.Config{}, nil, err
	}
	if !onDevice {
		w = bench.HostOnly(w)
	}
	if quant {
		q, err := model.QuantizeWeights(w, qdt)
		if err != nil {
			w.Close()
			return model.Config{}, nil, err
		}
		w = q
	}
	return cfg, w, nil
}

func benchLatencyCmd() *cobra.Command {
	var df deviceFlags
	var arch, modelPath, dtype, graphs string
	var batch, inputLen, outputLen, chunk, warmup, iters, profileSteps int
	var stepTrace bool
	var sustained time.Duration
	var seed uint64
	var peakGBps float64
	var asJSON, verbose, onDevice, queueAhead bool
	var kvDType, quantization string
	var kvWindow int
	var spec specFlag
	cmd := &cobra.Command{
		Use:   "latency",
		Short: "Time prefill and decode steps of one batch",
		Long: "latency builds the model and runner (no scheduler), prefills --batch random prompts of\n" +
			"--input-len tokens in chunks, then decodes until each has --output-len tokens (the first comes\n" +
			"from the prefill), sampling greedily on the device. Weights are synthetic random values of the\n" +
			"--arch shapes unless --model names a checkpoint. Architectures: " + strings.Join(bench.ArchNames(), ", ") +
			", or a config.json path.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch graphs {
			case "on", "off", "both", "auto":
			default:
				return fmt.Errorf("--cuda-graphs %q: want on, off, both or auto", graphs)
			}
			if modelPath != "" {
				// They shape synthetic weights: given with a checkpoint,
				// the timing would not be of what they ask for.
				for _, name := range []string{"dtype", "arch"} {
					if cmd.Flags().Changed(name) {
						return fmt.Errorf("--%s is not used with --model, which times the checkpoint's own weights (--quantization fp8 quantizes them at load)", name)
					}
				}
			}
			var (
				cfg    model.Config
				w      model.Weights
				source string
				err    error
			)
			qdt, err := engine.QuantizationDType(quantization)
			if err != nil {
				return fmt.Errorf("--quantization: %w", err)
			}
			if modelPath != "" {
				if cfg, _, w, err = model.OpenWeights(modelPath); err != nil {
					return err
				}
				source = modelPath
				arch = strings.TrimSuffix(filepath.Base(filepath.Clean(modelPath)), ".gguf")
			} else {
				if cfg, w, err = syntheticWeights(arch, dtype, seed, onDevice); err != nil {
					return err
				}
				source = fmt.Sprintf("synthetic, seed %d", seed)
				arch = bench.ArchLabel(arch)
			}
			if qdt != 0 {
				q, err := model.QuantizeWeights(w, qdt)
				if err != nil {
					w.Close()
					return err
				}
				w = q
			}
			defer w.Close()
			b, tp, err := df.openRanks(newLogger(cmd.ErrOrStderr(), verbose))
			if err != nil {
				return err
			}
			ranks := []backend.Backend{b}
			var lo bench.LatencyOptions
			if tp != nil {
				ranks, lo.Ranks, lo.Comms, lo.Abort = tp.Backends, tp.Backends, tp.Comms, tp.Abort
			}
			for _, rb := range ranks {
				if c, ok := rb.(interface{ Close() error }); ok {
					defer c.Close()
				}
			}
			for _, c := range lo.Comms { // destroyed before their backends (defers run last first)
				if c, ok := c.(interface{ Close() error }); ok {
					defer c.Close()
				}
			}
			kvSpec, err := backend.ParseKVCacheDType(kvDType, b.ActDType(), kvcache.DefaultBlockSize)
			if err != nil {
				return fmt.Errorf("--kv-cache-dtype: %w", err)
			}
			win, err := kvWindowOption(kvWindow)
			if err != nil {
				return err
			}
			if kvSpec, err = kvSpec.WithWindowOption(win); err != nil {
				return err
			}
			// auto: both rows where the backend can capture graphs, else off.
			_, canCapture := b.(backend.GraphCapturer)
			modes := map[string][]bool{"on": {true}, "off": {false}, "both": {false, true}}[graphs]
			if graphs == "auto" {
				modes = []bool{false}
				if canCapture {
					modes = []bool{false, true}
				}
			}
			var results []*bench.LatencyResult
			for _, useGraphs := range modes {
				res, err := bench.RunLatency(cmd.Context(), bench.LatencyOptions{
					Backend: b, Config: cfg, Weights: w, Arch: arch, WeightsSource: source,
					Batch: batch, InputLen: inputLen, OutputLen: outputLen, PrefillChunk: chunk,
					Warmup: warmup, Iters: iters, Seed: seed, CUDAGraphs: useGraphs, PeakBandwidth: peakGBps * 1e9,
					SustainedProbe: sustained, KV: kvSpec,
					ProfileSteps: profileSteps, NoQueueAhead: !queueAhead, StepTrace: stepTrace,
					VerifyTokens: spec.cfg.NumSpeculativeTokens,
					Ranks:        lo.Ranks, Comms: lo.Comms, Abort: lo.Abort,
				})
				if err != nil {
					return err
				}
				results = append(results, res)
			}
			if asJSON {
				if len(results) == 1 {
					return bench.WriteJSON(cmd.OutOrStdout(), results[0])
				}
				return bench.WriteJSON(cmd.OutOrStdout(), results)
			}
			for i, res := range results {
				if i > 0 {
					fmt.Fprintln(cmd.OutOrStdout())
				}
				if err := res.WriteText(cmd.OutOrStdout()); err != nil {
					return err
				}
			}
			return nil
		},
	}
	df.register(cmd)
	df.registerTP(cmd)
	fl := cmd.Flags()
	fl.StringVar(&arch, "arch", bench.ArchDefault, "architecture of the synthetic weights: a preset name or a config.json path")
	fl.StringVarP(&modelPath, "model", "m", "", "time this checkpoint (HF directory or .gguf) instead of synthetic weights")
	fl.StringVar(&dtype, "dtype", "bf16", "synthetic weight dtype: bf16, f16, f32, q8_0, q4_0, q4_k, q5_k, q6_k, or awq4_g32/awq4_g64/awq4_g128/fp8 (BF16 made on the host and quantized there, round to nearest) (not with --model)")
	fl.StringVar(&quantization, "quantization", "none", quantizationUsage)
	fl.IntVar(&batch, "batch", 1, "sequences decoded together")
	fl.IntVar(&inputLen, "input-len", 512, "prompt tokens per sequence")
	fl.IntVar(&outputLen, "output-len", 128, "generated tokens per sequence, the prefill's included")
	fl.IntVar(&chunk, "prefill-chunk", 2048, "most tokens one prefill step carries")
	fl.IntVar(&warmup, "warmup", 1, "untimed iterations first")
	fl.IntVar(&iters, "iters", 3, "timed iterations")
	fl.Uint64Var(&seed, "seed", 0, "seed of the synthetic weights and the prompts")
	fl.StringVar(&graphs, "cuda-graphs", "auto", "on: replay decode steps from a captured CUDA graph; off; both: one result each; auto: both where the backend captures graphs, else off")
	fl.Float64Var(&peakGBps, "peak-bandwidth", 0, "nominal memory bandwidth in GB/s, used as the ceiling instead of the backend's own copy measurement")
	fl.BoolVar(&asJSON, "json", false, "print JSON: one object, or an array of two with --cuda-graphs both")
	fl.BoolVarP(&verbose, "verbose", "v", false, "log backend selection")
	fl.BoolVar(&onDevice, "weights-on-device", true, "make BF16/F32 synthetic weights on the device (false: generate on the host and copy)")
	fl.BoolVar(&queueAhead, "queue-ahead", true, "queue each decode step on the device's sampled ids before the host reads them (where the backend can)")
	fl.DurationVar(&sustained, "sustained-probe", 1500*time.Millisecond, "also run the prefill GEMM probe back to back this long and report the rate over its second half, under the device's power limit (0: off)")
	fl.BoolVar(&stepTrace, "step-trace", false, "report every decode step's ITL in order (JSON) and, where the backend can, the device-timed interval between steps (device_step_ms), to tell the device's time from the host's")
	registerKVFlags(cmd, &kvDType, &kvWindow)
	registerSpecFlag(cmd, &spec, "here it times the target's verify step of num_speculative_tokens draft tokens per sequence against a decode step timed alike (no proposer runs)")
	fl.IntVar(&profileSteps, "profile-steps", 0, "in the last iteration, bracket the prefill and this many decode steps for a profiler run with collection off (ncu --profile-from-start off)")
	return cmd
}

func benchOverlapCmd() *cobra.Command {
	var df deviceFlags
	var arch, dtype, graphs string
	var batch, contextLen, promptLen, chunk, warmup, iters int
	var seed uint64
	var asJSON, second, verbose, onDevice bool
	cmd := &cobra.Command{
		Use:   "overlap",
		Short: "Compare mixed, serial and two-stream prefill while a batch decodes",
		Long: "overlap decodes --batch sequences at --context tokens while a --prompt-len prompt is prefilled\n" +
			"in --chunk token steps, three ways: mixed (each step carries the decode rows and a chunk, as the\n" +
			"engine does), serial (a decode step, then a chunk) and overlap (decode on one stream while the\n" +
			"prompt is prefilled on a second stream, a second backend on the same device with its own copy of\n" +
			"the weights). It reports the prompt's TTFT and the decode steps and rate meanwhile. Synthetic\n" +
			"weights of --arch: " + strings.Join(bench.ArchNames(), ", ") + ", or a config.json path.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if graphs != "on" && graphs != "off" {
				return fmt.Errorf("--cuda-graphs %q: want on or off", graphs)
			}
			cfg, w, err := syntheticWeights(arch, dtype, seed, onDevice)
			if err != nil {
				return err
			}
			defer w.Close()
			log := newLogger(cmd.ErrOrStderr(), verbose)
			open := func() (backend.Backend, func(), error) {
				b, err := df.open(log)
				if err != nil {
					return nil, nil, err
				}
				closeFn := func() {}
				if c, ok := b.(interface{ Close() error }); ok {
					closeFn = func() { c.Close() }
				}
				return b, closeFn, nil
			}
			b, closeB, err := open()
			if err != nil {
				return err
			}
			defer closeB()
			opts := bench.OverlapOptions{
				Backend: b, Config: cfg, Weights: w, Arch: bench.ArchLabel(arch), WeightsSource: fmt.Sprintf("synthetic, seed %d", seed),
				Batch: batch, Context: contextLen, PromptLen: promptLen, Chunk: chunk, Warmup: warmup, Iters: iters, Seed: seed,
				CUDAGraphs: graphs == "on",
			}
			if second {
				b2, close2, err := open()
				if err != nil {
					return fmt.Errorf("second stream: %w", err)
				}
				defer close2()
				opts.Second = b2
			}
			res, err := bench.RunOverlap(cmd.Context(), opts)
			if err != nil {
				return err
			}
			if asJSON {
				return bench.WriteJSON(cmd.OutOrStdout(), res)
			}
			return res.WriteText(cmd.OutOrStdout())
		},
	}
	df.register(cmd)
	fl := cmd.Flags()
	fl.StringVar(&arch, "arch", bench.ArchDefault, "architecture of the synthetic weights: a preset name or a config.json path")
	fl.StringVar(&dtype, "dtype", "bf16", "synthetic weight dtype: bf16, f16, f32, q8_0, q4_0, q4_k, q5_k or q6_k")
	fl.IntVar(&batch, "batch", 4, "sequences decoding when the prompt arrives")
	fl.IntVar(&contextLen, "context", 2048, "their context in tokens")
	fl.IntVar(&promptLen, "prompt-len", 2048, "tokens of the arriving prompt")
	fl.IntVar(&chunk, "chunk", 512, "most prompt tokens per prefill step")
	fl.IntVar(&warmup, "warmup", 1, "untimed repetitions of each strategy first")
	fl.IntVar(&iters, "iters", 3, "timed repetitions of each strategy")
	fl.Uint64Var(&seed, "seed", 0, "seed of the synthetic weights and the tokens")
	fl.StringVar(&graphs, "cuda-graphs", "off", "on: pure decode steps replay a captured CUDA graph; off")
	fl.BoolVar(&onDevice, "weights-on-device", true, "make BF16/F32 synthetic weights on the device (false: generate on the host and copy)")
	fl.BoolVar(&second, "second-stream", true, "measure overlap on a second backend of the same device (needs memory for a second copy of the weights)")
	fl.BoolVar(&asJSON, "json", false, "print JSON")
	fl.BoolVarP(&verbose, "verbose", "v", false, "log backend selection")
	return cmd
}

func benchServeCmd() *cobra.Command {
	var serverURL, rate, inputLen, outputLen, modelName, apiKey, tokenIDs, plotPath string
	var datasetName, datasetPath string
	var goodput []string
	var save resultFlags
	var numPrompts, maxConc, customOutputLen int
	var seed uint64
	var timeout time.Duration
	var asJSON, showProgress, ignoreEOS bool
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Load-test a running OpenAI-compatible server with streaming completions",
		Long: "serve sends --num-prompts streaming /v1/completions requests (random token-id prompts,\n" +
			"ignore_eos, max_tokens from --output-len) with Poisson arrivals at --rate requests/s (inf: all\n" +
			"at once) and reports TTFT, ITL, TPOT and E2E percentiles and throughput, and, from a trigon\n" +
			"server's /metrics, its engine steps' host and device times.\n" +
			"Lengths: N, fixed:N, uniform:LO-HI (inclusive) or normal:MEAN,STDDEV.\n" +
			"--goodput ttft:MS tpot:MS e2el:MS (any of them, vLLM's objectives and spelling; also comma-separated\n" +
			"or repeated; and itl:MS, trigon's own: the request's p99 inter-token latency) counts the requests\n" +
			"that meet every one, as requests/s.\n" +
			"--rate 2,4,8,16,32 sweeps: the same prompts at each rate in turn, a table of the curve, and\n" +
			"with --plot FILE.png its plot (throughput, goodput, TTFT and ITL against the rate).\n" +
			"--save-result writes the JSON report (a sweep's: every point) to a file as well, as vLLM's benchmark\n" +
			"does: --result-filename in --result-dir (default: beside the --plot file, named after it, else\n" +
			"serve[-sweep]-RATEqps[-concurrencyN][-MODEL]-YYYYMMDD-HHMMSS.json in the current directory).\n" +
			"--dataset-name custom --dataset-path FILE (vLLM's spelling) sends FILE's prompts as text instead:\n" +
			"JSON Lines of {\"prompt\": \"...\"}, request i taking line i (cycling; --num-prompts defaults to the\n" +
			"file's count), max_tokens from --custom-output-len. Every request runs to max_tokens unless\n" +
			"--ignore-eos=false, so that runs of the same prompts produce the same tokens to count.",
		Args: goodputArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			rates, err := bench.ParseRates(rate)
			if err != nil {
				return err
			}
			slos, err := goodputObjectives(goodput, args)
			if err != nil {
				return err
			}
			if plotPath != "" && len(rates) < 2 {
				return fmt.Errorf("--plot needs a sweep: --rate with two or more rates, e.g. 2,4,8")
			}
			// Made now, so that a directory that cannot be made fails before the run.
			resultPath, err := save.path(plotPath, rates, modelName, maxConc, time.Now())
			if err != nil {
				return err
			}
			fl := cmd.Flags()
			ds, err := serveDataset(fl, datasetName, datasetPath, customOutputLen)
			if err != nil {
				return err
			}
			in, err := bench.ParseLengthDist(inputLen)
			if err != nil {
				return fmt.Errorf("--input-len: %w", err)
			}
			out, err := bench.ParseLengthDist(outputLen)
			if err != nil {
				return fmt.Errorf("--output-len: %w", err)
			}
			ids, err := parseTokenIDs(tokenIDs)
			if err != nil {
				return err
			}
			if ds.prompts != nil {
				in, out, ids = bench.LengthDist{}, bench.FixedLength(customOutputLen), nil
				if !fl.Changed("num-prompts") {
					numPrompts = len(ds.prompts)
				}
			}
			if apiKey == "" {
				apiKey = os.Getenv("TRIGON_API_KEY")
			}
			opts := bench.ServeOptions{
				URL: serverURL, Model: modelName, APIKey: apiKey, Rate: rates[0], NumPrompts: numPrompts,
				InputLen: in, OutputLen: out, Seed: seed, MaxConcurrency: maxConc, Timeout: timeout, TokenIDs: ids,
				Goodput: slos, Prompts: ds.prompts, Dataset: ds.path, HonorEOS: !ignoreEOS,
			}
			if showProgress {
				bar := progressbar.NewOptions(numPrompts*len(rates),
					progressbar.OptionSetWriter(os.Stderr),
					progressbar.OptionSetDescription("requests"),
					progressbar.OptionShowCount(),
					progressbar.OptionClearOnFinish(),
					progressbar.OptionThrottle(100*time.Millisecond))
				opts.OnDone = func() { _ = bar.Add(1) }
				defer bar.Finish()
			}
			if len(rates) > 1 {
				return runSweep(cmd, opts, rates, plotPath, resultPath, asJSON)
			}
			res, err := bench.RunServe(cmd.Context(), opts)
			if err != nil {
				return err
			}
			if err := saveResult(resultPath, res); err != nil {
				return err
			}
			if asJSON {
				err = bench.WriteJSON(cmd.OutOrStdout(), res)
			} else {
				err = res.WriteText(cmd.OutOrStdout())
			}
			if err == nil && res.Completed == 0 {
				// Scripts must not mistake a run where nothing worked for a
				// measurement.
				err = fmt.Errorf("no request completed (%d failed)", res.Failed)
			}
			return err
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&serverURL, "url", "http://127.0.0.1:8000", "server base URL")
	fl.StringVar(&rate, "rate", "inf", "mean request rate in requests/s (Poisson arrivals), or inf; a comma-separated list sweeps (also --request-rate)")
	fl.StringSliceVar(&goodput, "goodput", nil, "goodput objectives in ms, KEY:MS: vLLM's ttft, tpot ((E2E - TTFT) / (output tokens - 1)) and e2el, and trigon's own itl (the request's p99 inter-token latency); space-separated as in vLLM (--goodput ttft:1000 tpot:100), comma-separated or repeated")
	fl.StringVar(&plotPath, "plot", "", "with a sweep, write its throughput-latency curve to this PNG file")
	fl.BoolVar(&save.save, "save-result", false, "also write the JSON report to a file (--result-dir, --result-filename)")
	fl.StringVar(&save.dir, "result-dir", "", "directory of --save-result's file, made if missing (default: the --plot file's, else the current directory; implies --save-result)")
	fl.StringVar(&save.name, "result-filename", "", "name of --save-result's file (default: the --plot file's with .json, else serve[-sweep]-RATEqps[-concurrencyN][-MODEL]-YYYYMMDD-HHMMSS.json; implies --save-result)")
	fl.IntVar(&numPrompts, "num-prompts", 100, fmt.Sprintf("requests to send (at most %d)", bench.MaxPrompts))
	fl.StringVar(&inputLen, "input-len", "fixed:512", "prompt length distribution in tokens")
	fl.StringVar(&outputLen, "output-len", "fixed:128", "output length distribution in tokens (max_tokens, ignore_eos)")
	fl.StringVar(&modelName, "model", "", "model name sent in requests (default: omitted, the served model)")
	fl.StringVar(&apiKey, "api-key", "", "Bearer key (also $TRIGON_API_KEY)")
	fl.Uint64Var(&seed, "seed", 0, "seed of prompts, lengths and arrival times (a sweep's point i: seed+i, so no point's prompts are in the prefix cache from an earlier one)")
	fl.IntVar(&maxConc, "max-concurrency", 0, "most requests in flight (0: no cap)")
	fl.DurationVar(&timeout, "timeout", 30*time.Minute, "bound on the whole run; requests unfinished by then count as failed")
	fl.StringVar(&tokenIDs, "token-ids", "auto", "prompt token ids: auto (ask the server's /tokenize) or LO-HI")
	fl.BoolVar(&showProgress, "progress", true, "draw a progress bar on stderr")
	fl.BoolVar(&asJSON, "json", false, "print JSON (a sweep: every point)")
	fl.StringVar(&datasetName, "dataset-name", "random", "prompts: random (token ids, --input-len) or custom (--dataset-path)")
	fl.StringVar(&datasetPath, "dataset-path", "", "custom dataset: JSON Lines of {\"prompt\": TEXT} (implies --dataset-name custom)")
	fl.IntVar(&customOutputLen, "custom-output-len", 256, "custom dataset: max_tokens of every request")
	fl.BoolVar(&ignoreEOS, "ignore-eos", true, "send ignore_eos: every request runs to max_tokens")
	// vLLM's benchmark spells the rate --request-rate.
	fl.SetNormalizeFunc(func(_ *pflag.FlagSet, name string) pflag.NormalizedName {
		if name == "request-rate" {
			name = "rate"
		}
		return pflag.NormalizedName(name)
	})
	return cmd
}

// goodputArgs takes vLLM's space-separated --goodput (argparse's
// nargs="+": --goodput ttft:1000 tpot:100), which pflag cannot: it gives
// the flag its first objective and leaves the others as arguments. bench
// serve takes no other arguments, so these are accepted only with
// --goodput given, and only as KEY:VALUE (ParseGoodput checks the rest);
// anything else is refused.
func goodputArgs(cmd *cobra.Command, args []string) error {
	for _, a := range args {
		if !cmd.Flags().Changed("goodput") {
			return fmt.Errorf("unexpected argument %q: bench serve takes flags only", a)
		}
		if k, v, ok := strings.Cut(a, ":"); !ok || k == "" || v == "" || strings.HasPrefix(a, "-") {
			return fmt.Errorf("unexpected argument %q: bench serve takes flags only, and after --goodput more objectives KEY:MS (--goodput ttft:1000 tpot:100)", a)
		}
	}
	return nil
}

// goodputObjectives parses --goodput's values and the objectives that
// followed it as arguments (goodputArgs).
func goodputObjectives(flagVals, args []string) (bench.SLOs, error) {
	slos, err := bench.ParseGoodput(slices.Concat(flagVals, args))
	if err != nil {
		return nil, fmt.Errorf("--goodput: %w", err)
	}
	return slos, nil
}

// servePrompts is bench serve's custom dataset, if one is asked for.
type servePrompts struct {
	path    string
	prompts []string // nil: random token-id prompts
}

// serveDataset reads --dataset-name, --dataset-path and --custom-output-len
// and refuses the flags of the other kind of prompts.
func serveDataset(fl *pflag.FlagSet, name, path string, customOut int) (servePrompts, error) {
	if path != "" && !fl.Changed("dataset-name") {
		name = "custom"
	}
	switch name {
	case "random":
		switch {
		case path != "":
			return servePrompts{}, errors.New("--dataset-path needs --dataset-name custom")
		case fl.Changed("custom-output-len"):
			return servePrompts{}, errors.New("--custom-output-len needs --dataset-name custom (random prompts: --output-len)")
		}
		return servePrompts{}, nil
	case "custom":
	default:
		return servePrompts{}, fmt.Errorf("--dataset-name %q: want random or custom", name)
	}
	for _, f := range []string{"input-len", "output-len", "token-ids"} {
		if fl.Changed(f) {
			return servePrompts{}, fmt.Errorf("--%s is for random prompts; a custom dataset's lengths are its prompts and --custom-output-len", f)
		}
	}
	if path == "" {
		return servePrompts{}, errors.New("--dataset-name custom needs --dataset-path FILE")
	}
	if customOut < 1 || customOut > bench.MaxLength {
		return servePrompts{}, fmt.Errorf("--custom-output-len %d outside 1..%d", customOut, bench.MaxLength)
	}
	prompts, err := bench.LoadCustomDataset(path)
	if err != nil {
		return servePrompts{}, err
	}
	return servePrompts{path: path, prompts: prompts}, nil
}

// runSweep runs bench serve at each rate and reports the curve; with
// plotPath it also draws it.
func runSweep(cmd *cobra.Command, opts bench.ServeOptions, rates []float64, plotPath, resultPath string, asJSON bool) error {
	sw, err := bench.RunSweep(cmd.Context(), opts, rates, nil)
	if err != nil {
		return err
	}
	if err := saveResult(resultPath, sw); err != nil {
		return err
	}
	if plotPath != "" {
		f, err := os.Create(plotPath)
		if err != nil {
			return fmt.Errorf("--plot: %w", err)
		}
		if err := sw.WritePlot(f); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return fmt.Errorf("--plot: %w", err)
		}
	}
	if asJSON {
		err = bench.WriteJSON(cmd.OutOrStdout(), sw)
	} else {
		err = sw.WriteText(cmd.OutOrStdout())
	}
	if err != nil {
		return err
	}
	for _, p := range sw.Points {
		if p.Completed == 0 {
			return fmt.Errorf("no request completed at %g requests/s (%d failed)", float64(p.RequestRate), p.Failed)
		}
	}
	return nil
}

// resultFlags are bench serve's --save-result, --result-dir and
// --result-filename, vLLM's benchmark's flags for its JSON file.
type resultFlags struct {
	save      bool
	dir, name string
}

// path is the file to write the JSON report to ("" when not asked) for a
// run at rates. Beside a plot it defaults to the plot's directory and
// name, so that a sweep's curve and its numbers stay together; otherwise
// to vLLM's pattern, RATEqps[-concurrencyN]-MODEL-TIME, under "serve"
// (there is no backend to name: the server is any OpenAI one). A name
// that is an absolute path is used as it is (vLLM joins it so too). The
// directory is made here.
func (f resultFlags) path(plot string, rates []float64, model string, maxConc int, now time.Time) (string, error) {
	if !f.save && f.dir == "" && f.name == "" {
		return "", nil
	}
	dir, name := f.dir, f.name
	if plot != "" {
		dir = cmp.Or(dir, filepath.Dir(plot))
		name = cmp.Or(name, strings.TrimSuffix(filepath.Base(plot), filepath.Ext(plot))+".json")
	}
	if name == "" {
		rs := make([]string, len(rates))
		for i, r := range rates {
			rs[i] = strconv.FormatFloat(r, 'g', -1, 64)
			if math.IsInf(r, 1) {
				rs[i] = "inf"
			}
		}
		kind := "serve"
		if len(rates) > 1 {
			kind = "serve-sweep"
		}
		name = kind + "-" + strings.Join(rs, "_") + "qps"
		if maxConc > 0 {
			name += fmt.Sprintf("-concurrency%d", maxConc)
		}
		if m := filepath.Base(model); model != "" && m != "." && m != string(filepath.Separator) {
			name += "-" + m
		}
		name += now.Format("-20060102-150405") + ".json"
	}
	if filepath.IsAbs(name) {
		dir, name = filepath.Split(name)
	}
	dir = cmp.Or(dir, ".")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("--result-dir: %w", err)
	}
	return filepath.Join(dir, name), nil
}

// saveResult writes v's JSON to path, when there is one.
func saveResult(path string, v any) error {
	if path == "" {
		return nil
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--save-result: %w", err)
	}
	if err := bench.WriteJSON(f, v); err != nil {
		f.Close()
		return fmt.Errorf("--save-result %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("--save-result: %w", err)
	}
	return nil
}

// parseTokenIDs reads --token-ids: "auto" (nil) or an inclusive range
// LO-HI of at most a million ids.
func parseTokenIDs(s string) ([]int32, error) {
	if s == "auto" {
		return nil, nil
	}
	bad := fmt.Errorf("--token-ids %q: want auto or LO-HI with 0 <= LO <= HI < 2^31 and at most 2^20 ids", s)
	l, h, ok := strings.Cut(s, "-")
	if !ok {
		return nil, bad
	}
	lo, err1 := strconv.ParseInt(l, 10, 32)
	hi, err2 := strconv.ParseInt(h, 10, 32)
	if err1 != nil || err2 != nil || lo < 0 || hi < lo || hi-lo >= 1<<20 {
		return nil, bad
	}
	ids := make([]int32, 0, hi-lo+1)
	for id := lo; id <= hi; id++ {
		ids = append(ids, int32(id))
	}
	return ids, nil
}
