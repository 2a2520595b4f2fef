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
// step runs at each decode batch bucket (warmSteps), so that each
// bucket's products are tuned and its kernels loaded; with speculative
// decoding, one verify step of 1+k rows a sequence at each bucket too,
// and a decode step at each of the draft model's buckets. Then tuning
// ends (TuningEnder): mixed steps use the decode and prefill kernels
// that these steps and the budget probe have loaded, and their products
// of row counts not warmed (the logits of a step's decodes and finished
// prompts, a short last chunk) take the library's heuristic choice
// rather than stall the step that first runs them with a timing pass.

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

// TuningEnder is an optional Backend interface, for backends that time
// candidate kernels on a shape's first run: EndTuning stops that for the
// rest of the backend's life and returns how many shapes were tuned.
type TuningEnder interface {
	EndTuning() int
}

// endTuning runs EndTuning on each backend that has it.
func endTuning(bs []backend.Backend, log *slog.Logger) {
	for _, b := range bs {
		if t, ok := b.(TuningEnder); ok {
			log.Info("GEMM tuning ended", "backend", b.Name(), "tuned_shapes", t.EndTuning())
		}
	}
}

// warmSteps runs one step of each batch size in sizes on r, every
// sequence feeding q tokens and wanting all their logits (q 1: a decode
// step; 1+k: a speculative verify step), and samples the rows on the
// device, alternately greedy and at a temperature, so that both sampling
// kernels load. Sequence i's tokens sit at positions 0..q-1 in blocks of
// its own, from 1 + i*ceil(q/BlockSize) on: no sequence holds blocks yet,
// and the KV written there is never read. Sizes whose step would not fit
// the pools' blocks or the runner's token bound are skipped.
func warmSteps(r *runner.Runner, sizes []int, numBlocks, q int) error {
	for _, n := range sizes {
		step := warmStep(r, n, numBlocks, q)
		if step == nil {
			continue
		}
		out, err := r.Execute(step)
		if err != nil {
			return fmt.Errorf("engine: warm step of %d sequences of %d tokens: %w", n, q, err)
		}
		rows := make([]backend.SampleRow, out.Rows)
		for i := 1; i < len(rows); i += 2 {
			rows[i] = backend.SampleRow{Temperature: 1, TopP: 0.9, U: 0.5}
		}
		if _, err := out.Sample(rows); err != nil {
			return fmt.Errorf("engine: warm step of %d sequences of %d tokens: sample: %w", n, q, err)
		}
	}
	return nil
}

// warmStep is warmSteps' step of n sequences of q tokens, nil where it
// would not fit the pools' blocks or the runner's bounds.
func warmStep(r *runner.Runner, n, numBlocks, q int) *runner.Step {
	o := r.Options()
	nb := (q + o.BlockSize - 1) / o.BlockSize
	if n < 1 || n*nb > numBlocks-1 || n*q > o.MaxTokens || n > o.MaxSeqs {
		return nil
	}
	step := &runner.Step{Seqs: make([]runner.Seq, n)}
	for i := range step.Seqs {
		table := make([]int32, nb)
		for j := range table {
			table[j] = int32(1 + i*nb + j)
		}
		step.Seqs[i] = runner.Seq{Tokens: make([]int32, q), BlockTable: table, WantLogits: q == 1, AllLogits: q > 1}
	}
	return step
}

// verifyWarmRuns is how many times warmVerify runs each verify shape:
// the runner's first steps of a shape run it eagerly and capture it in
// each form, the fifth times the two forms (runner/verify.go).
const verifyWarmRuns = 5

// verifyWarmBatch is the largest batch whose verify graphs warmVerify
// prepares: speculation pays at small batches, and each bucket more costs
// its shapes again at load.
const verifyWarmBatch = 4

// warmVerify prepares speculative decoding's verify steps at the graph
// buckets up to verifyWarmBatch sequences, for every draft length 1..k at
// every block-table width: each shape's graphs are captured in both forms
// and the faster form chosen before the first request, where each shape
// otherwise spends its first steps on that (a fresh server's first
// requests run many shapes: drafts vary in length, contexts cross widths;
// uneven steps take the same shapes, padded). A step of each width sits
// at the first position that needs it: its context is the null block,
// each sequence's rows go to blocks of its own from block 1 on, which no
// sequence holds yet (Load runs it before the engine starts; the fp8
// scales its made-up values set are forgotten after it). Only with graphs
// (without, a verify step has nothing to prepare), and only while the
// graph cache has room: it stops (and full reports it) before a shape
// whose graphs would pass the cache's count or memory bound, taking the
// last shape's bytes for the next one's, or at an eviction should that
// estimate fall short. Last, the one-sequence steps run once more, so
// that the cache, which drops the least recently used graph first, drops
// larger buckets' before them.
func warmVerify(r *runner.Runner, k int) (shapes int, full bool, err error) {
	o := r.Options()
	widths := r.TableWidths()
	evictions := r.GraphStats().Evictions
	var single []*runner.Step // the one-sequence steps, for the refresh
	var last int64            // device bytes the last shape's graphs took
warm:
	for _, n := range r.GraphBuckets() {
		if n > verifyWarmBatch || n > o.MaxSeqs {
			break
		}
		for i := range widths {
			start := 0
			if i > 0 {
				// The first position past the narrower width's blocks.
				start = widths[i-1] * o.BlockSize
			}
			for q := 2; q <= 1+k; q++ {
				own := (start+q-1)/o.BlockSize - start/o.BlockSize + 1 // blocks the rows are written to
				if start+q > o.MaxSeqLen || n*q > o.MaxTokens || 1+n*own > o.NumBlocks {
					continue
				}
				before := r.GraphStats()
				if before.Cached+2 > before.MaxCached || before.Budget > 0 && before.Bytes+last > before.Budget {
					full = true
					break warm
				}
				step := &runner.Step{Seqs: make([]runner.Seq, n)}
				for s := range step.Seqs {
					// The context reads the null block.
					table := make([]int32, (start+q+o.BlockSize-1)/o.BlockSize)
					for j := range own {
						table[start/o.BlockSize+j] = int32(1 + s*own + j)
					}
					step.Seqs[s] = runner.Seq{Tokens: make([]int32, q), Start: start, BlockTable: table, AllLogits: true}
				}
				for range verifyWarmRuns {
					if _, err := r.Execute(step); err != nil {
						return shapes, false, fmt.Errorf("engine: warm verify step of %d sequences of %d tokens at position %d: %w", n, q, start, err)
					}
					if r.GraphStats().Evictions != evictions {
						return shapes, true, nil
					}
				}
				last = r.GraphStats().Bytes - before.Bytes
				if n == 1 {
					single = append(single, step)
				}
				shapes++
			}
		}
	}
	if len(single) < shapes {
		for _, step := range single {
			if _, err := r.Execute(step); err != nil {
				return shapes, full, fmt.Errorf("engine: warm verify step of %d tokens again: %w", len(step.Seqs[0].Tokens), err)
			}
		}
	}
	return shapes, full, nil
}

// warmSizes are the batch sizes warmSteps runs on r: its decode graphs'
// buckets, or with graphs off the buckets they would have.
func warmSizes(r *runner.Runner) []int {
	if b := r.GraphBuckets(); b != nil {
		return b
	}
	return runner.DefaultBuckets(r.Options().MaxSeqs)
}
