package main

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/convert"
	"github.com/trigon-llm/trigon/engine"
	"github.com/trigon-llm/trigon/model"
)

func inspectCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "inspect [PATH]",
		Short: "Describe a model: architecture, parameters, dtypes, context length, tokenizer",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			mf := modelFlags{}
			if len(args) == 1 {
				mf.model = args[0]
			}
			path, err := mf.modelPath()
			if err != nil {
				return err
			}
			cfg, gen, w, err := model.OpenWeights(path)
			if err != nil {
				return err
			}
			defer w.Close()
			tok, err := engine.LoadTokenizer(path)
			if err != nil {
				return err
			}
			var params int64
			var bytes int64
			dtypes := map[backend.DType]int64{}
			for _, name := range w.Names() {
				t, ok := w.Tensor(name)
				if !ok {
					continue
				}
				n := int64(1)
				for _, d := range t.Shape {
					n *= int64(d)
				}
				params += n
				bytes += int64(len(t.Data))
				dtypes[t.DType] += n
			}
			var dts []string
			for dt, n := range dtypes {
				dts = append(dts, fmt.Sprintf("%v (%.1f%%)", dt, 100*float64(n)/float64(params)))
			}
			sort.Strings(dts)
			o := cmd.OutOrStdout()
			row := func(k string, v any) { fmt.Fprintf(o, "%-16s %v\n", k+":", v) }
			row("model", path)
			row("architecture", cfg.Arch)
			row("parameters", fmt.Sprintf("%s (%d)", human(params), params))
			tensors, err := convert.TensorCount(cfg, w)
			if err != nil {
				return err
			}
			row("weights", fmt.Sprintf("%.1f MiB in %d tensors", float64(bytes)/(1<<20), tensors))
			row("dtypes", strings.Join(dts, ", "))
			row("context", cfg.MaxPositions)
			row("layers", cfg.NumLayers)
			row("hidden", cfg.Hidden)
			row("intermediate", cfg.Intermediate)
			row("heads", fmt.Sprintf("%d query, %d key/value, head dim %d", cfg.NumHeads, cfg.NumKVHeads, cfg.HeadDim))
			row("rope", ropeSummary(cfg))
			var feats []string
			if cfg.TieEmbeddings {
				feats = append(feats, "tied embeddings")
			}
			if cfg.Llama.AttentionBias {
				feats = append(feats, "QKV bias")
			}
			if cfg.Llama.QKNorm {
				feats = append(feats, "Q/K norm")
			}
			if cfg.SlidingWindow > 0 {
				feats = append(feats, fmt.Sprintf("sliding window %d", cfg.SlidingWindow))
			}
			if len(feats) > 0 {
				row("features", strings.Join(feats, ", "))
			}
			row("vocabulary", cfg.VocabSize)
			row("tokenizer", fmt.Sprintf("%s, %d tokens, chat template: %v", tok.Kind(), tok.VocabSize(), tok.HasChatTemplate()))
			row("stop tokens", model.StopTokenIDs(cfg, gen))
			if err := engine.CheckVocab(cfg, tok); err != nil {
				fmt.Fprintf(cmd.ErrOrStderr(), "warning: run and serve will refuse this model: %v\n", err)
			}
			return nil
		},
	}
}

// ropeSummary describes cfg's RoPE: theta and any scaling. A GGUF file
// stores Llama 3.1 scaling as per-pair frequency divisors
// (rope_freqs.weight) without the parameters that made them, so for one
// read from GGUF the divisors' range is shown instead.
func ropeSummary(cfg model.Config) string {
	rope := fmt.Sprintf("theta %g", cfg.RopeTheta)
	switch s := cfg.RopeScaling; {
	case s != nil && s.Type == model.RopeLlama3:
		rope += fmt.Sprintf(", llama3 scaling x%g (low freq factor %g, high freq factor %g, original context %d)",
			s.Factor, s.LowFreqFactor, s.HighFreqFactor, s.OriginalMaxPositions)
	case s != nil:
		rope += fmt.Sprintf(", %s scaling x%g", s.Type, s.Factor)
	}
	if f := cfg.RopeFreqFactors; len(f) > 0 {
		lo, hi := slices.Min(f), slices.Max(f)
		rope += fmt.Sprintf(", llama3 frequency factors (rope_freqs.weight: %d pairs, %g to %g)", len(f), lo, hi)
	}
	return rope
}

// human prints a count as 1.2K / 3.4M / 8.0B.
func human(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2fB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.2fM", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1fK", float64(n)/1e3)
	}
	return fmt.Sprint(n)
}
