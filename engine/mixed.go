package engine

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/runner"
)

// Mixed-step caps (sched.Config.MixedCap), where Load measures the budget
// and warms the model.
//
// A step that prefills beside running decodes is, for every stream in it,
// one token gap: under a steady arrival of long prompts those steps are
// the streams' inter-token latency tail. The token budget alone bounds
// them by the budget's step, several times a decode step on a GPU, where
// a decode step of a few sequences costs about what its weight reads cost
// and a prefill token adds little to that. So Load measures what steps
// cost and caps the prefill a step may carry beside d decode tokens:
//
//	prefill step of n tokens:  t(n) = fixed + n*perToken   (eager)
//	decode step of d tokens:   dec(d)                      (as served: graphs)
//	allowed step:              ratio * dec(d) * dec(d)/dec(1)
//	cap(d) = (allowed - fixed)/perToken - d
//
// With few decodes, dec(d) is about dec(1), the weights' reads, and the
// cap holds the step within ratio times the decode step: prefill rows
// ride on those reads nearly free, so a smaller step costs little. With
// many, the decodes' own arithmetic makes the step compute-bound: GEMMs
// of a few hundred rows run well below the rate of a full budget's, so
// every cut of the prefill is paid in throughput, and the allowance grows
// by the factor dec(d)/dec(1) the decode step has grown, towards the
// whole budget (a loaded server's token gaps are long anyway).
//
// Never below the prefill that pays for its own step: where the cap
// would leave a step adding more fixed cost (fixed + d*perToken - dec(d),
// the eager mixed step's overhead over the decode step it replaces) than
// prefill work, prompts would advance at under half their rate, so the
// cap is raised to that overhead's worth of tokens (and at least one).
// The caps grow with d.

// defaultMixedStepRatio is LoadOptions.MixedStepRatio's default: the
// longest step beside decodes is 2.5x their step, inside the 3x that
// keeps a stream's p99 token gap within a small multiple of its median.
const defaultMixedStepRatio = 2.5

// stepCosts is what Load measured of the model's steps (seconds).
type stepCosts struct {
	fixed, perToken float64      // a prefill step of n tokens: fixed + n*perToken
	decode          []decodeCost // decode steps, by sequences
}

// decodeCost is a decode step's time at seqs sequences.
type decodeCost struct {
	seqs int
	t    float64
}

// decodeTime is the decode step of d sequences, interpolated through the
// measured ones: linearly between two, the first's time below the first,
// the last segment's slope past the last.
func (c stepCosts) decodeTime(d int) float64 {
	pts := c.decode
	if d <= pts[0].seqs || len(pts) == 1 {
		return pts[0].t
	}
	i := 1
	for i < len(pts)-1 && pts[i].seqs < d {
		i++
	}
	a, b := pts[i-1], pts[i]
	slope := max(b.t-a.t, 0) / float64(b.seqs-a.seqs)
	return a.t + slope*float64(d-a.seqs)
}

// mixedCaps returns the caps for 0..maxDecode decode tokens (cap[0]
// unused) at the given ratio, or nil where the costs cannot bound a step:
// no decode measured, or a prefill step that does not grow with its
// tokens.
func mixedCaps(c stepCosts, ratio float64, maxDecode int) []int {
	if len(c.decode) == 0 || !(c.perToken > 0) || maxDecode < 1 || !(ratio > 1) {
		return nil
	}
	caps := make([]int, maxDecode+1)
	light := c.decode[0].t
	for d := 1; d <= maxDecode; d++ {
		dec := c.decodeTime(d)
		bound := (ratio*dec*dec/light-c.fixed)/c.perToken - float64(d)
		floor := (c.fixed + float64(d)*c.perToken - dec) / c.perToken
		v := max(bound, floor, 1, float64(caps[d-1]))
		caps[d] = int(min(v, math.MaxInt32))
	}
	return caps
}

// decodeProbeRuns is how many times measureStepCosts runs a decode step of
// each size: the first (which may capture its graph) untimed, the fastest
// of the others kept.
const decodeProbeRuns = 3

// measureStepCosts times prefill steps of a quarter of the budget and of
// all of it (the sizes mixed steps carry; a GEMM's cost per row falls
// until its tiles fill the GPU, so the line between short steps would
// understate it) at the start of their context, where most prompts'
// chunks sit (the attention of a chunk deep in a long prompt adds to its
// cost per token, and a line fitted there would cut every short prompt's
// step), and decode steps at sizes spaced at least twice apart among the
// warmed batch sizes, on the warmed runner.
func measureStepCosts(r *runner.Runner, budget, room int, sizes []int, numBlocks int) (stepCosts, error) {
	var c stepCosts
	n2 := min(budget, room, maxAutoBudget)
	n1 := n2 / 4
	timeStep := prefillTimerAt(r, 0, n2)
	if n1 < 1 {
		return c, nil
	}
	var t [2]time.Duration
	for i, n := range []int{n1, n2} {
		if _, err := timeStep(n); err != nil {
			return c, err
		}
		var err error
		if t[i], err = fastest(timeStep, n); err != nil {
			return c, err
		}
	}
	c.perToken = (t[1] - t[0]).Seconds() / float64(n2-n1)
	c.fixed = max(t[0].Seconds()-c.perToken*float64(n1), 0)
	sizes = slices.Sorted(slices.Values(sizes))
	last := 0
	for _, n := range sizes {
		if n < 2*last {
			continue
		}
		step := warmStep(r, n, numBlocks, 1)
		if step == nil {
			continue
		}
		last = n
		best := math.Inf(1)
		for i := range decodeProbeRuns {
			t0 := time.Now()
			out, err := r.Execute(step)
			if err != nil {
				return c, fmt.Errorf("engine: decode probe of %d sequences: %w", n, err)
			}
			// Sampling reads the tokens back, so it waits for the device.
			if _, err := out.Sample(make([]backend.SampleRow, out.Rows)); err != nil {
				return c, fmt.Errorf("engine: decode probe of %d sequences: sample: %w", n, err)
			}
			if i > 0 {
				best = min(best, time.Since(t0).Seconds())
			}
		}
		c.decode = append(c.decode, decodeCost{seqs: n, t: best})
	}
	return c, nil
}
