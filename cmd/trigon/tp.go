package main

import (
	"fmt"
	"log/slog"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/collective"
	"github.com/trigon-llm/trigon/backend/cpu"
	"github.com/trigon-llm/trigon/backend/cuda"
	"github.com/trigon-llm/trigon/engine"
)

// registerTP adds --tensor-parallel-size (vLLM's flag) to a command whose
// model may be split over ranks: serve, run, bench latency.
func (f *deviceFlags) registerTP(cmd *cobra.Command) {
	cmd.Flags().IntVar(&f.tp, "tensor-parallel-size", 1, "split the model over this many ranks (Megatron-style): GPUs --gpu, --gpu+1, ... joined by NCCL, or, on the CPU, "+
		"goroutines of their own --threads/N threads; heads, intermediate and vocabulary split as docs/architecture.md says, shapes that do not split are refused")
}

// openRanks opens --tensor-parallel-size ranks for --device: nil, with b
// the one backend, for one rank. auto takes CUDA when NCCL and enough GPUs
// are usable, else the CPU, saying why.
func (f *deviceFlags) openRanks(log *slog.Logger) (backend.Backend, *engine.TensorParallel, error) {
	if f.tp < 1 { // the commands that call openRanks register the flag (default 1)
		return nil, nil, fmt.Errorf("--tensor-parallel-size %d: want at least 1", f.tp)
	}
	if err := f.check(); err != nil {
		return nil, nil, err
	}
	if f.tp <= 1 {
		b, err := f.open(log)
		return b, nil, err
	}
	n := f.tp
	// gpuErr says why the ranks cannot be GPUs --gpu.., or nil.
	gpuErr := func() error {
		if err := cuda.Available(); err != nil {
			return err
		}
		if err := cuda.NCCLAvailable(); err != nil {
			return err
		}
		count, err := cuda.DeviceCount()
		if err == nil && f.gpu+n > count {
			err = fmt.Errorf("%d ranks from GPU %d need %d GPUs; the driver sees %d", n, f.gpu, f.gpu+n, count)
		}
		return err
	}
	useCUDA := false
	switch f.device {
	case "cuda":
		if err := gpuErr(); err != nil {
			return nil, nil, fmt.Errorf("--device cuda --tensor-parallel-size %d: %w", n, err)
		}
		useCUDA = true
	case "auto":
		err := gpuErr()
		if err != nil {
			log.Warn("using the CPU backend for every rank", "reason", err.Error())
		}
		useCUDA = err == nil
	case "cpu":
	default:
		return nil, nil, fmt.Errorf("--device %q: want auto, cpu or cuda", f.device)
	}
	tp := &engine.TensorParallel{}
	if !useCUDA {
		threads := f.threads
		if threads <= 0 {
			threads = runtime.GOMAXPROCS(0)
		}
		for range n {
			tp.Backends = append(tp.Backends, cpu.New(cpu.Options{Threads: max(1, threads/n)}))
		}
		comms, err := collective.New(tp.Backends)
		if err != nil {
			return nil, nil, err
		}
		for _, c := range comms {
			tp.Comms = append(tp.Comms, c)
		}
		tp.Abort = comms[0].Group()
		return tp.Backends[0], tp, nil
	}
	var gpus []*cuda.Backend
	closeAll := func() {
		for _, g := range gpus {
			g.Close()
		}
	}
	for r := range n {
		g, err := cuda.New(cuda.Options{Device: f.gpu + r})
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("--tensor-parallel-size %d: rank %d (GPU %d): %w", n, r, f.gpu+r, err)
		}
		gpus = append(gpus, g)
		tp.Backends = append(tp.Backends, g)
	}
	comms, err := cuda.NewNCCLGroup(gpus)
	if err != nil {
		closeAll()
		return nil, nil, fmt.Errorf("--tensor-parallel-size %d: %w", n, err)
	}
	for _, c := range comms {
		tp.Comms = append(tp.Comms, c)
	}
	return tp.Backends[0], tp, nil
}
