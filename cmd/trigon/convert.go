package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/trigon-llm/trigon/convert"
	"github.com/trigon-llm/trigon/engine"
	"github.com/trigon-llm/trigon/tokenizer"
)

func convertCmd() *cobra.Command {
	var typ, name, pre string
	cmd := &cobra.Command{
		Use:   "convert SRC OUT.gguf",
		Short: "Convert an HF model directory (or a GGUF file) to GGUF (f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k, q4_k_m, q5_k_m)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			dt, kmix, err := convert.ParseTarget(typ)
			if err != nil {
				return err
			}
			tok, err := engine.LoadTokenizer(args[0])
			if err != nil {
				return err
			}
			rep, err := convert.File(args[0], args[1], tok, convert.Options{Type: dt, KMix: kmix, Name: name, Pre: pre})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: %d tensors, %.1f MiB of tensor data (%s)\n", args[1], rep.Tensors, float64(rep.Bytes)/(1<<20), strings.ToLower(typ))
			if rep.PreDiffers != "" {
				fmt.Fprintf(cmd.ErrOrStderr(), "warning: %s: %s\n", args[1], rep.PreDiffers)
			}
			if rep.NotLlamaCpp != "" {
				fmt.Fprintf(cmd.ErrOrStderr(), "warning: llama.cpp will not load %s: %s (trigon reads it)\n", args[1], rep.NotLlamaCpp)
			}
			if len(rep.Fallback) > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "kept %d tensors in a fallback type (rows not whole %s blocks; Q8_0 for the K-quants, else F16): %s\n", len(rep.Fallback), strings.ToLower(typ), strings.Join(rep.Fallback, ", "))
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&typ, "type", "q8_0", "tensor type of matrices: f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k, or the mixes q4_k_m and q5_k_m (llama.cpp's rule: Q6_K for the LM head and some V and down projections)")
	cmd.Flags().StringVar(&name, "name", "", "general.name (default: the source's base name)")
	cmd.Flags().StringVar(&pre, "pre-tokenizer", "", "tokenizer.ggml.pre to write instead of the tokenizer's own (byte-level BPE only): "+strings.Join(tokenizer.PreNames(), ", ")+
		"; llama.cpp refuses trigon-go, and llama-bpe is its nearest split (docs/quantization.md); a warning says when the name's split is not the tokenizer's")
	return cmd
}
