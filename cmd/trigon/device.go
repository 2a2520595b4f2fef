package main

import (
	"fmt"
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/cpu"
	"github.com/trigon-llm/trigon/backend/cuda"
	"github.com/trigon-llm/trigon/engine"
)

// The CUDA backend tells engine.Load which models it cannot run.
var _ engine.AttentionChecker = (*cuda.Backend)(nil)

// deviceFlags are the flags that choose and size the backend.
type deviceFlags struct {
	device  string
	threads int
	gpu     int
	tp      int // --tensor-parallel-size (registerTP)
}

func (f *deviceFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.device, "device", "auto", "backend: auto (CUDA when usable, else CPU), cpu or cuda")
	cmd.Flags().IntVar(&f.threads, "threads", 0, "CPU backend threads (0: all cores)")
	cmd.Flags().IntVar(&f.gpu, "gpu", 0, "CUDA device ordinal")
}

// open returns the backend the flags ask for. auto falls back to the CPU
// with one log line saying why CUDA is not used.
func (f *deviceFlags) open(log *slog.Logger) (backend.Backend, error) {
	if err := f.check(); err != nil {
		return nil, err
	}
	switch f.device {
	case "cpu":
		return cpu.New(cpu.Options{Threads: f.threads}), nil
	case "cuda":
		if err := cuda.Available(); err != nil {
			return nil, fmt.Errorf("--device cuda: %w", err)
		}
		return cuda.New(cuda.Options{Device: f.gpu})
	case "auto":
		if err := cuda.Available(); err != nil {
			// Warn level, so that the line shows without -v: a user who
			// expected the GPU learns at once why it is not used.
			log.Warn("using the CPU backend", "reason", err.Error())
			return cpu.New(cpu.Options{Threads: f.threads}), nil
		}
		b, err := cuda.New(cuda.Options{Device: f.gpu})
		if err != nil {
			log.Warn("CUDA failed to start; using the CPU backend", "err", err)
			return cpu.New(cpu.Options{Threads: f.threads}), nil
		}
		return b, nil
	}
	return nil, fmt.Errorf("--device %q: want auto, cpu or cuda", f.device)
}
