package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/engine"
	"github.com/trigon-llm/trigon/eval"
)

func evalCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "eval", Short: "Measure model quality"}
	cmd.AddCommand(perplexityCmd(), greedyCmd())
	return cmd
}

func perplexityCmd() *cobra.Command {
	var df deviceFlags
	var modelPath string
	var window, chunk, kvWindow, kvGroup int
	var kvDType, quant string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "perplexity [--model M] FILE",
		Short: "Perplexity of a text file: consecutive non-overlapping windows, mean token NLL",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkInts(
				intFlag{"window", int64(window), 2, "at least 2 tokens (a window's first token is not predicted)"},
				intFlag{"chunk", int64(chunk), 1, "at least 1 token"},
			); err != nil {
				return err
			}
			if _, err := parseKVDType("kv-cache-dtype", kvDType); err != nil {
				return err
			}
			if err := checkKVGroup(kvDType, kvGroup); err != nil {
				return err
			}
			qdt, err := engine.QuantizationDType(quant)
			if err != nil {
				return fmt.Errorf("--quantization: %w", err)
			}
			path, ids, err := evalText(modelPath, args[0])
			if err != nil {
				return err
			}
			b, err := df.open(newLogger(cmd.ErrOrStderr(), false))
			if err != nil {
				return err
			}
			win, err := kvWindowOption(kvWindow)
			if err != nil {
				return err
			}
			t0 := time.Now()
			res, err := eval.Perplexity(b, path, ids, eval.Options{
				Window: window, Chunk: chunk, KVCacheDType: kvDType, KVWindow: win, KVGroup: kvGroup, Quantization: qdt,
			})
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(map[string]any{
					"file": args[0], "model": path, "tokens": res.Tokens, "predicted": res.Predicted,
					"window": window, "nll": res.NLL, "ppl": res.PPL, "backend": b.Name(), "kv_cache_dtype": kvDType,
					"quantization": quant,
				})
			}
			weights := ""
			if qdt != 0 {
				weights = ", --quantization " + quant
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: %d tokens, %d predicted, window %d: nll %.4f, perplexity %.4f (%s%s, %.1fs)\n",
				args[0], res.Tokens, res.Predicted, window, res.NLL, res.PPL, b.Name(), weights, time.Since(t0).Seconds())
			return nil
		},
	}
	df.register(cmd)
	cmd.Flags().StringVarP(&modelPath, "model", "m", "", "model (default: the embedded Go-code model)")
	cmd.Flags().IntVar(&window, "window", 1024, "tokens per scored window")
	cmd.Flags().IntVar(&chunk, "chunk", 256, "tokens per forward step")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	registerKVFlags(cmd, &kvDType, &kvWindow)
	cmd.Flags().IntVar(&kvGroup, "kv-cache-group", 0, "int8 and int4 KV caches: channels per scale, 8, 16, 32 or 128 (0: the default); other dtypes have no groups and refuse it")
	cmd.Flags().StringVar(&quant, "quantization", "none", quantizationUsage)
	return cmd
}

func greedyCmd() *cobra.Command {
	var df deviceFlags
	var modelPath, baseline, quant string
	var dtypes, others []string
	var prompts, promptLen, tokens, kvWindow, kvGroup int
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "greedy [--model M] FILE",
		Short: "Greedy agreement of KV cache formats against a baseline format",
		Long: "greedy cuts --prompts prompts of --prompt-len tokens from FILE at evenly spaced offsets,\n" +
			"continues each by --tokens greedy tokens (all prompts in one batch) with the --baseline KV\n" +
			"cache and with each --kv-cache-dtype, and prints per format the mean share of positions\n" +
			"before the first divergence from the baseline, the mean share of equal positions, and the\n" +
			"prompts that never diverge. With --compare-models the other checkpoints (the same tokenizer:\n" +
			"the model quantized, say) are compared against --model, all with the --baseline cache.\n" +
			"--quantization quantizes the compared checkpoints at load: those of --compare-models when\n" +
			"given (--model, the reference, then loads as stored; --compare-models set to --model itself\n" +
			"measures the quantization), else --model.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkInts(
				intFlag{"prompts", int64(prompts), 1, "at least 1"},
				intFlag{"prompt-len", int64(promptLen), 1, "at least 1 token"},
				intFlag{"tokens", int64(tokens), 1, "at least 1 token"},
			); err != nil {
				return err
			}
			// Every format before the baseline's run, not at its own.
			if _, err := parseKVDType("baseline", baseline); err != nil {
				return err
			}
			for _, dt := range dtypes {
				if _, err := parseKVDType("kv-cache-dtype", dt); err != nil {
					return err
				}
			}
			// --kv-cache-group applies to the grouped formats among the
			// baseline and --kv-cache-dtype; at least one must take it.
			grouped := func(dtype string) bool {
				spec, _ := parseKVDType("kv-cache-dtype", dtype)
				return spec.GroupSize > 0
			}
			if kvGroup != 0 {
				found := false
				for _, dt := range append([]string{baseline}, dtypes...) {
					if grouped(dt) {
						found = true
						if err := checkKVGroup(dt, kvGroup); err != nil {
							return err
						}
					}
				}
				if !found {
					return fmt.Errorf("--kv-cache-group %d: none of --baseline %s and --kv-cache-dtype %s has channel groups (int8 and int4 have)", kvGroup, baseline, strings.Join(dtypes, ","))
				}
			}
			win, err := kvWindowOption(kvWindow)
			if err != nil {
				return err
			}
			qdt, err := engine.QuantizationDType(quant)
			if err != nil {
				return fmt.Errorf("--quantization: %w", err)
			}
			// The reference is as stored when other checkpoints are
			// compared against it; otherwise every run is of the one
			// model, quantized.
			modelQuant := qdt
			if len(others) > 0 {
				modelQuant = 0
			}
			path, ids, err := evalText(modelPath, args[0])
			if err != nil {
				return err
			}
			ps, err := eval.Slices(ids, prompts, promptLen)
			if err != nil {
				return fmt.Errorf("%s: %w", args[0], err)
			}
			b, err := df.open(newLogger(cmd.ErrOrStderr(), false))
			if err != nil {
				return err
			}
			runOn := func(path, dtype string, quant backend.DType) ([][]int32, error) {
				group := 0
				if grouped(dtype) {
					group = kvGroup
				}
				out, err := eval.Greedy(b, path, ps, eval.GreedyOptions{Tokens: tokens, KVCacheDType: dtype, KVWindow: win, KVGroup: group, Quantization: quant})
				if err != nil {
					return nil, fmt.Errorf("%s, --kv-cache-dtype %s: %w", path, dtype, err)
				}
				return out, nil
			}
			run := func(dtype string) ([][]int32, error) { return runOn(path, dtype, modelQuant) }
			if len(others) > 0 && !cmd.Flags().Changed("kv-cache-dtype") {
				dtypes = nil // models only, unless formats are asked for too
			}
			base, err := run(baseline)
			if err != nil {
				return err
			}
			type row struct {
				Model     string  `json:"model,omitempty"`
				DType     string  `json:"kv_cache_dtype"`
				Prefix    float64 `json:"prefix"`
				Overall   float64 `json:"overall"`
				Identical int     `json:"identical"`
				Seconds   float64 `json:"seconds"`
			}
			var rows []row
			if !asJSON {
				fmt.Fprintf(cmd.OutOrStdout(), "%d prompts of %d tokens from %s, %d greedy tokens each, against %s (%s):\n", prompts, promptLen, args[0], tokens, baseline, b.Name())
			}
			for _, dt := range dtypes {
				t0 := time.Now()
				got, err := run(dt)
				if err != nil {
					return err
				}
				a, err := eval.Compare(base, got)
				if err != nil {
					return err
				}
				r := row{DType: dt, Prefix: a.Prefix, Overall: a.Overall, Identical: a.Identical, Seconds: time.Since(t0).Seconds()}
				rows = append(rows, r)
				if !asJSON {
					fmt.Fprintf(cmd.OutOrStdout(), "%-6s before first divergence %6.2f%%, overall %6.2f%%, identical %d/%d (%.1fs)\n",
						dt, 100*r.Prefix, 100*r.Overall, r.Identical, a.Prompts, r.Seconds)
				}
			}
			for _, other := range others {
				t0 := time.Now()
				got, err := runOn(other, baseline, qdt)
				if err != nil {
					return err
				}
				a, err := eval.Compare(base, got)
				if err != nil {
					return err
				}
				r := row{Model: other, DType: baseline, Prefix: a.Prefix, Overall: a.Overall, Identical: a.Identical, Seconds: time.Since(t0).Seconds()}
				rows = append(rows, r)
				if !asJSON {
					fmt.Fprintf(cmd.OutOrStdout(), "%s: before first divergence %6.2f%%, overall %6.2f%%, identical %d/%d (%.1fs)\n",
						other, 100*r.Prefix, 100*r.Overall, r.Identical, a.Prompts, r.Seconds)
				}
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(map[string]any{
					"file": args[0], "model": path, "prompts": prompts, "prompt_len": promptLen, "tokens": tokens,
					"baseline": baseline, "kv_cache_window": kvWindow, "kv_cache_group": kvGroup, "backend": b.Name(), "quantization": quant, "results": rows,
				})
			}
			return nil
		},
	}
	df.register(cmd)
	cmd.Flags().StringVarP(&modelPath, "model", "m", "", "model (default: the embedded Go-code model)")
	cmd.Flags().IntVar(&prompts, "prompts", 20, "prompts cut from FILE")
	cmd.Flags().IntVar(&promptLen, "prompt-len", 64, "tokens per prompt")
	cmd.Flags().IntVar(&tokens, "tokens", 256, "greedy tokens per prompt")
	cmd.Flags().StringVar(&baseline, "baseline", "bf16", "the KV cache format compared against")
	cmd.Flags().StringSliceVar(&others, "compare-models", nil, "other checkpoints with --model's tokenizer (quantized copies, say) compared against --model with the --baseline cache; only these are compared unless --kv-cache-dtype is given too")
	cmd.Flags().StringSliceVar(&dtypes, "kv-cache-dtype", []string{"fp8", "int8", "int4"}, "KV cache formats to compare (see eval perplexity)")
	cmd.Flags().IntVar(&kvWindow, "kv-cache-window", backend.DefaultKVWindow, "int4 KV cache: the newest tokens of each sequence kept in bf16; "+
		"0 keeps none (only each sequence's last, partial block)")
	cmd.Flags().IntVar(&kvGroup, "kv-cache-group", 0, "int8 and int4 KV caches among --baseline and --kv-cache-dtype: channels per scale, 8, 16, 32 or 128 (0: the default)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().StringVar(&quant, "quantization", "none", quantizationUsage+"; applied to --compare-models' checkpoints when given, else to --model's")
	return cmd
}

// evalText resolves --model (the embedded default when empty) and returns
// its path with the token ids of the text file at file, in the model's
// tokenizer.
func evalText(modelPath, file string) (path string, ids []int32, err error) {
	mf := modelFlags{model: modelPath}
	if path, err = mf.modelPath(); err != nil {
		return "", nil, err
	}
	text, err := os.ReadFile(file)
	if err != nil {
		return "", nil, err
	}
	tok, err := engine.LoadTokenizer(path)
	if err != nil {
		return "", nil, err
	}
	if ids, err = tok.Encode(string(text), false); err != nil {
		return "", nil, fmt.Errorf("%s: %w", file, err)
	}
	return path, ids, nil
}
