package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/trigon-llm/trigon/engine"
	"github.com/trigon-llm/trigon/eval"
)

func evalCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "eval", Short: "Measure model quality"}
	cmd.AddCommand(perplexityCmd())
	return cmd
}

func perplexityCmd() *cobra.Command {
	var df deviceFlags
	var modelPath string
	var window, chunk, kvWindow, kvGroup int
	var kvDType string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "perplexity [--model M] FILE",
		Short: "Perplexity of a text file: consecutive non-overlapping windows, mean token NLL",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			mf := modelFlags{model: modelPath}
			path, err := mf.modelPath()
			if err != nil {
				return err
			}
			text, err := os.ReadFile(args[0])
			if err != nil {
				return err
			}
			tok, err := engine.LoadTokenizer(path)
			if err != nil {
				return err
			}
			ids, err := tok.Encode(string(text), false)
			if err != nil {
				return err
			}
			b, err := df.open(newLogger(cmd.ErrOrStderr(), false))
			if err != nil {
				return err
			}
			t0 := time.Now()
			res, err := eval.Perplexity(b, path, ids, eval.Options{Window: window, Chunk: chunk, KVCacheDType: kvDType, KVWindow: kvWindow, KVGroup: kvGroup})
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(map[string]any{
					"file": args[0], "model": path, "tokens": res.Tokens, "predicted": res.Predicted,
					"window": window, "nll": res.NLL, "ppl": res.PPL, "backend": b.Name(), "kv_cache_dtype": kvDType,
				})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: %d tokens, %d predicted, window %d: nll %.4f, perplexity %.4f (%s, %.1fs)\n",
				args[0], res.Tokens, res.Predicted, window, res.NLL, res.PPL, b.Name(), time.Since(t0).Seconds())
			return nil
		},
	}
	df.register(cmd)
	cmd.Flags().StringVarP(&modelPath, "model", "m", "", "model (default: the embedded Go-code model)")
	cmd.Flags().IntVar(&window, "window", 1024, "tokens per scored window")
	cmd.Flags().IntVar(&chunk, "chunk", 256, "tokens per forward step")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	registerKVFlags(cmd, &kvDType, &kvWindow)
	cmd.Flags().IntVar(&kvGroup, "kv-cache-group", 0, "int8 and int4 KV caches: channels per scale, 8, 16, 32 or 128 (0: the default)")
	return cmd
}
