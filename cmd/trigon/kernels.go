package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/trigon-llm/trigon/backend/cuda"
)

func kernelsCmd() *cobra.Command {
	var gpu int
	cmd := &cobra.Command{
		Use:   "kernels",
		Short: "Compile the CUDA kernels for this GPU into the on-disk cache and report compile times",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cuda.Available(); err != nil {
				return fmt.Errorf("kernels: %w", err)
			}
			b, err := cuda.New(cuda.Options{Device: gpu})
			if err != nil {
				return err
			}
			defer b.Close()
			t0 := time.Now()
			reps, err := b.WarmKernels(cmd.Context())
			if err != nil {
				return err
			}
			o := cmd.OutOrStdout()
			fmt.Fprintf(o, "%-48s %-8s %10s  %s\n", "module", "arch", "time", "source")
			for _, r := range reps {
				src := "compiled"
				if r.Cached {
					src = "cache"
				}
				fmt.Fprintf(o, "%-48s %-8s %10s  %s\n", r.Name, r.Arch, r.CompileTime.Round(time.Millisecond), src)
			}
			fmt.Fprintf(o, "%d modules ready in %s (options: %s)\n", len(reps), time.Since(t0).Round(time.Millisecond), strings.Join(optionsOf(reps), " "))
			return nil
		},
	}
	cmd.Flags().IntVar(&gpu, "gpu", 0, "CUDA device ordinal")
	return cmd
}

func optionsOf(reps []cuda.KernelReport) []string {
	if len(reps) == 0 {
		return nil
	}
	return reps[0].Options
}
