package engine

import (
	"fmt"
	"time"

	"github.com/trigon-llm/trigon/kvcache"
	"github.com/trigon-llm/trigon/runner"
)

// Step token budget, where LoadOptions.MaxBatchedTokens is 0.
//
// The scheduler fills each step as vLLM's chunked prefill does: running
// decodes first, one token each, then prefill chunks with what is left of
// the budget. A step's length grows with its tokens, so the budget bounds
// the inter-token latency of every running stream while prompts arrive.
// A fixed budget fits one kind of device only: the 2048 tokens a GPU runs
// in a few tens of milliseconds stall a CPU for seconds. So Load times
// prefill steps of the model on the backend and picks the budget whose
// step takes about LoadOptions.StepTime.
const (
	// maxAutoBudget caps a measured budget: vLLM's default for online
	// serving, and a step a GPU runs well within StepTime.
	maxAutoBudget = 2048
	// defaultStepTime is the step length a measured budget aims at when
	// LoadOptions.StepTime is 0: streams then advance a few times a
	// second on a small CPU while prompts are prefilled beside them.
	defaultStepTime = 150 * time.Millisecond
	// probeTokens is the first probe's length: small, so that even a model
	// far too slow for StepTime is probed quickly.
	probeTokens = 8
	// probeStart bounds where the probes' tokens sit in their context.
	probeStart = 4096
)

// prefillStepTimer times one prefill step of n tokens on the loaded model.
type prefillStepTimer func(n int) (time.Duration, error)

// fitBudget picks the token budget whose step takes about target, from
// steps timed at two lengths, as t(n) = fixed + n*perToken (fixed being
// what a step costs however few its tokens: launches, the LM head, a
// GPU's weight reads at small batch). The result lies in [lo, hi]; maxN
// is the longest step the timer can run.
func fitBudget(timeStep prefillStepTimer, target time.Duration, lo, hi, maxN int) (int, error) {
	if maxN < 1 {
		return lo, nil // no room to probe in: the least
	}
	n1 := min(probeTokens, maxN)
	// The first step pays one-time costs (allocations, kernel compiles):
	// untimed.
	if _, err := timeStep(n1); err != nil {
		return 0, err
	}
	t1, err := fastest(timeStep, n1)
	if err != nil {
		return 0, err
	}
	if t1 >= target {
		return lo, nil // even a short step is over the target: the least
	}
	// Second length: where n1's rate per token would take half the
	// target, so that the slope is measured over a step the target allows.
	n2 := maxN
	if t1 > 0 {
		n2 = int(min(float64(n1)*float64(target)/(2*float64(t1)), float64(maxN)))
	}
	n2 = min(max(n2, 4*n1), hi, maxN)
	if n2 <= n1 {
		return lo, nil // too short a context to measure: the least
	}
	// A new step length pays its own one-time costs on some backends (a
	// GPU's per-shape kernel compiles and GEMM tuning): untimed too.
	if _, err := timeStep(n2); err != nil {
		return 0, err
	}
	t2, err := fastest(timeStep, n2)
	if err != nil {
		return 0, err
	}
	perToken := float64(t2-t1) / float64(n2-n1)
	if perToken <= 0 {
		return hi, nil // no growth measurable: the step cost is all fixed
	}
	fixed := max(float64(t1)-perToken*float64(n1), 0)
	n := (float64(target) - fixed) / perToken
	return int(min(max(n, float64(lo)), float64(hi))), nil
}

// probeRepeats is how many times fastest times a step length.
const probeRepeats = 2

// fastest is the least of probeRepeats timings of a step of n tokens:
// whatever else the machine runs only adds to a step's time, and one
// slowed timing of the short step would tilt the fitted line towards a
// budget whose steps run long.
func fastest(timeStep prefillStepTimer, n int) (time.Duration, error) {
	var best time.Duration
	for i := range probeRepeats {
		t, err := timeStep(n)
		if err != nil {
			return 0, err
		}
		if i == 0 || t < best {
			best = t
		}
	}
	return best, nil
}

// prefillTimer times prefill steps of one sequence on r: n tokens at the
// middle of the context, the average place of a long prompt's chunks
// (attention's share of a token grows with its position), but at most
// probeStart tokens in: a model's context can be far longer than the
// prompts its steps mostly carry, and a budget fitted to chunks deep in a
// 128k context would cut every ordinary prompt into small pieces. The sequence
// writes KV into blocks 1.. of the pools, which no sequence holds yet;
// the step reads only garbage KV, which only the timing sees.
func prefillTimer(r *runner.Runner, ctxLen, numBlocks int) (prefillStepTimer, int) {
	room := probeRoom(ctxLen, numBlocks)
	start := min(room/2, probeStart) / kvcache.DefaultBlockSize * kvcache.DefaultBlockSize
	maxN := min(room-start, maxAutoBudget)
	return prefillTimerAt(r, start, maxN), maxN
}

// probeRoom is how many tokens a probe sequence may span: the context,
// within the pools' blocks 1..numBlocks-1 (0 is the null block).
func probeRoom(ctxLen, numBlocks int) int {
	return min(ctxLen, (numBlocks-1)*kvcache.DefaultBlockSize)
}

// prefillTimerAt is prefillTimer's timer with the step's tokens from
// position start (a multiple of the block size) on, at most maxN of them.
func prefillTimerAt(r *runner.Runner, start, maxN int) prefillStepTimer {
	bs := kvcache.DefaultBlockSize
	return func(n int) (time.Duration, error) {
		if n > maxN {
			return 0, fmt.Errorf("engine: budget probe of %d tokens over %d", n, maxN)
		}
		table := make([]int32, (start+n+bs-1)/bs)
		for i := range table {
			table[i] = int32(i + 1)
		}
		t0 := time.Now()
		out, err := r.Execute(&runner.Step{Seqs: []runner.Seq{{
			Tokens: make([]int32, n), Start: start, BlockTable: table, WantLogits: true,
		}}})
		if err != nil {
			return 0, fmt.Errorf("engine: budget probe: %w", err)
		}
		// Reading the logits waits for the device.
		if _, err := out.Logits(0); err != nil {
			return 0, fmt.Errorf("engine: budget probe: %w", err)
		}
		return time.Since(t0), nil
	}
}
