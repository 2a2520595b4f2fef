package engine

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/runner"
)

// Warming a served model at load (LoadOptions.Warm).
//
// A GPU backend pays for a shape's first run: NVRTC compiles the modules
// its kernels come from (an on-disk cache keeps them afterwards) and the
// GEMM tuner times its candidates for each new decode row count. Left to
// the first requests, that lands as one step that stalls every running
// stream for seconds, the first time traffic reaches a new batch size.
// Load moves it before the first request: the backend prepares its usual
// modules (KernelPreparer), compiling them in parallel, and one decode
// step runs at each decode batch bucket (warmDecode), so that each
// bucket's products are tuned and its kernels loaded. Mixed steps use the
// decode and prefill kernels that these steps and the budget probe have
// loaded; their logits products, of any row count, tune on first use
// without compiling.

// KernelPreparer is an optional Backend interface, for backends that
// build kernels at run time: PrepareKernels compiles (or loads from a
// cache) the kernel modules a typical model uses.
type KernelPreparer interface {
	PrepareKernels(ctx context.Context) error
}

// prepareKernels runs PrepareKernels on each backend that has it and
// reports whether any had. A failure is logged, not returned: a module it
// could not build is built again where a step needs it, and reports its
// error there.
func prepareKernels(bs []backend.Backend, log *slog.Logger) (found bool) {
	for _, b := range bs {
		p, ok := b.(KernelPreparer)
		if !ok {
			continue
		}
		found = true
		t0 := time.Now()
		if err := p.PrepareKernels(context.Background()); err != nil {
			log.Warn("preparing kernels at load failed; they build on first use", "backend", b.Name(), "err", err)
			continue
		}
		log.Info("kernels prepared", "backend", b.Name(), "took", time.Since(t0).Round(time.Millisecond))
	}
	return found
}

// warmDecode runs one decode step of each batch size in sizes on r, and
// samples its rows on the device, alternately greedy and at a
// temperature, so that both sampling kernels load. Sequence i feeds one
// token at position 0 in block i+1 of the pools: no sequence holds blocks
// yet, and the KV written there is never read. Sizes over the pools'
// blocks are skipped.
func warmDecode(r *runner.Runner, sizes []int, numBlocks int) error {
	for _, n := range sizes {
		if n < 1 || n > numBlocks-1 {
			continue
		}
		step := &runner.Step{Seqs: make([]runner.Seq, n)}
		for i := range step.Seqs {
			step.Seqs[i] = runner.Seq{Tokens: []int32{0}, BlockTable: []int32{int32(i + 1)}, WantLogits: true}
		}
		out, err := r.Execute(step)
		if err != nil {
			return fmt.Errorf("engine: warm decode step of %d sequences: %w", n, err)
		}
		rows := make([]backend.SampleRow, n)
		for i := 1; i < n; i += 2 {
			rows[i] = backend.SampleRow{Temperature: 1, TopP: 0.9, U: 0.5}
		}
		if _, err := out.Sample(rows); err != nil {
			return fmt.Errorf("engine: warm decode step of %d sequences: sample: %w", n, err)
		}
	}
	return nil
}
