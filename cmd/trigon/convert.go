package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/trigon-llm/trigon/convert"
	"github.com/trigon-llm/trigon/engine"
)

func convertCmd() *cobra.Command {
	var typ, name string
	cmd := &cobra.Command{
		Use:   "convert SRC OUT.gguf",
		Short: "Convert an HF model directory (or a GGUF file) to GGUF (f32, f16, bf16, q8_0, q4_0)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			dt, err := convert.ParseType(typ)
			if err != nil {
				return err
			}
			tok, err := engine.LoadTokenizer(args[0])
			if err != nil {
				return err
			}
			rep, err := convert.File(args[0], args[1], tok, convert.Options{Type: dt, Name: name})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: %d tensors, %.1f MiB of tensor data (%s)\n", args[1], rep.Tensors, float64(rep.Bytes)/(1<<20), strings.ToLower(typ))
			if rep.NotLlamaCpp != "" {
				fmt.Fprintf(cmd.ErrOrStderr(), "warning: llama.cpp will not load %s: %s (trigon reads it)\n", args[1], rep.NotLlamaCpp)
			}
			if len(rep.Fallback) > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "kept %d tensors in F16 (inner dimension not a multiple of 32): %s\n", len(rep.Fallback), strings.Join(rep.Fallback, ", "))
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&typ, "type", "q8_0", "tensor type of matrices: f32, f16, bf16, q8_0 or q4_0")
	cmd.Flags().StringVar(&name, "name", "", "general.name (default: the source's base name)")
	return cmd
}
