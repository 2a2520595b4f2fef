package engine

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/runner"
)

// Mixed-step caps (sched.Config.MixedCap), where LoadOptions.MixedStepRatio
// asks for them.
//
// A step that prefills beside running decodes is, for every stream in it,
// one token gap: under a steady arrival of long prompts those steps are
// the streams' inter-token latency tail. The token budget alone bounds
// them by the budget's step, several times a decode step on a GPU, where
// a decode step of a few sequences costs about what its weight reads cost
// and a prefill token adds little to that. So Load measures what steps
// cost and caps the prefill a step may carry beside d decode tokens:
//
//	prefill step of n tokens:  t(n), through steps timed at 1/8, 1/4, 1/2 and all of the budget
//	decode step of d tokens:   dec(d), through steps timed at batch sizes spaced twice apart
//	growth of the decode step: g(d) = dec(d)/dec(1)
//	allowed step:              ratio * dec(d) * g(d)^2
//	cap(d) = the largest n with t(n) <= allowed, less d
//
// With few decodes, dec(d) is about dec(1), the weights' reads, and the
// cap holds the step within ratio times the decode step: prefill rows
// ride on those reads nearly free, so a smaller step costs little. With
// many, the decodes' own arithmetic makes the step compute-bound, and
// GEMMs of a few hundred rows run well below the rate of a full budget's:
// every cut of the prefill is paid in throughput. So the allowance grows
// with the square of the decode step's growth, reaching the whole budget
// by the time the decode step has doubled (a loaded server, whose token
// gaps are long anyway). An allowance growing only as the decode step
// does cost more throughput with 256 streams in flight under bench serve
// on a GPU (docs/benchmarks.md, "Tried and refuted").
//
// Never below the smallest prefill step measured (an eighth of the
// budget, or of 2048 where the budget is larger): below it the curve would be extrapolated, and prompts advance
// at least that fast beside any number of decodes. The caps grow with d.

// A ratio of 2 (`serve --max-mixed-step-ratio 2`) suits a steady
// arrival of prompts: the cap sets a mixed step's typical length, but
// the token gaps that span mixed steps spread, their slower ones a third
// to a half over the typical step, and those set the streams' p99 token
// gap, so a typical mixed step of 2x the decode step keeps that gap near
// 3x the median one.
// The cap is off by default: at full load (hundreds of streams and
// prompts arriving as fast as they finish) it spreads prefill over more,
// smaller steps, each paying an eager step's host work and the lower GEMM
// rate of fewer rows, and costs throughput (docs/benchmarks.md).

// stepCosts is what Load measured of the model's steps (seconds).
type stepCosts struct {
	prefill curve // by tokens, one sequence from position 0
	decode  curve // by sequences
}

// curve is a step's time (seconds) against its size, through measured
// points sorted by size.
type curve []point

type point struct {
	n int
	t float64
}

// at interpolates the curve linearly between its points and extends it
// past either end along the end segment, slopes taken as at least 0 and
// times as at least 0; a one-point curve is flat.
func (c curve) at(n float64) float64 {
	if len(c) == 1 {
		return c[0].t
	}
	i := 1
	for i < len(c)-1 && float64(c[i].n) < n {
		i++
	}
	a, b := c[i-1], c[i]
	slope := max(b.t-a.t, 0) / float64(b.n-a.n)
	return max(a.t+slope*(n-float64(a.n)), 0)
}

// inverse is the largest size whose time at is at most t (+Inf where the
// curve stays below it), 0 if none.
func (c curve) inverse(t float64) float64 {
	lo, hi := 0.0, float64(c[len(c)-1].n)
	for c.at(hi) <= t {
		if hi > math.MaxInt32 {
			return math.Inf(1)
		}
		hi *= 2
	}
	if c.at(lo) > t {
		return 0
	}
	for range 64 {
		if m := (lo + hi) / 2; c.at(m) <= t {
			lo = m
		} else {
			hi = m
		}
	}
	return lo
}

// mixedCaps returns the caps for 0..maxDecode decode tokens (cap[0]
// unused) at the given ratio, at most budget (the step's whole budget:
// a larger cap means the same), or nil where the costs cannot bound a
// step: no decode measured, or a prefill step that does not grow with
// its tokens.
func mixedCaps(c stepCosts, ratio float64, maxDecode, budget int) []int {
	if len(c.decode) == 0 || len(c.prefill) < 2 || maxDecode < 1 || !(ratio > 1) ||
		!(c.prefill[len(c.prefill)-1].t > c.prefill[0].t) {
		return nil
	}
	caps := make([]int, maxDecode+1)
	light := c.decode.at(1)
	floor := float64(max(c.prefill[0].n, 1))
	for d := 1; d <= maxDecode; d++ {
		dec := c.decode.at(float64(d))
		g := dec / light
		bound := c.prefill.inverse(ratio*dec*g*g) - float64(d)
		caps[d] = int(min(max(bound, floor, float64(caps[d-1])), float64(budget)))
	}
	return caps
}

// measureStepCosts times prefill steps of an eighth, a quarter, a half
// and all of the budget (the sizes mixed steps carry: a GEMM's cost per
// row falls until its tiles fill the GPU, unevenly, so no line fits them
// all) at the start of their context, where most prompts' chunks sit (a
// chunk deep in a long prompt costs more a token for its attention, and
// a curve measured there would cut every short prompt's step), and
// decode steps at sizes spaced at least twice apart among the warmed
// batch sizes, on the warmed runner.
func measureStepCosts(r *runner.Runner, budget, room int, sizes []int, numBlocks int) (stepCosts, error) {
	var c stepCosts
	top := min(budget, room, maxAutoBudget)
	timeStep := prefillTimerAt(r, 0, top)
	for _, n := range []int{top / 8, top / 4, top / 2, top} {
		if n < 1 || len(c.prefill) > 0 && n == c.prefill[len(c.prefill)-1].n {
			continue
		}
		if _, err := timeStep(n); err != nil {
			return c, err
		}
		t, err := fastest(timeStep, n)
		if err != nil {
			return c, err
		}
		c.prefill = append(c.prefill, point{n, t.Seconds()})
	}
	sizes = slices.Sorted(slices.Values(sizes))
	last := 0
	for _, n := range sizes {
		step := warmStep(r, n, numBlocks, 1)
		if n < 2*last || step == nil {
			continue
		}
		last = n
		timeDecode := func(int) (time.Duration, error) {
			t0 := time.Now()
			out, err := r.Execute(step)
			if err != nil {
				return 0, fmt.Errorf("engine: decode probe of %d sequences: %w", n, err)
			}
			// Sampling reads the tokens back, so it waits for the device.
			if _, err := out.Sample(make([]backend.SampleRow, out.Rows)); err != nil {
				return 0, fmt.Errorf("engine: decode probe of %d sequences: sample: %w", n, err)
			}
			return time.Since(t0), nil
		}
		// The first run (which may capture the step's graph) untimed.
		if _, err := timeDecode(n); err != nil {
			return c, err
		}
		t, err := fastest(timeDecode, n)
		if err != nil {
			return c, err
		}
		c.decode = append(c.decode, point{n, t.Seconds()})
	}
	return c, nil
}

// String lists the measured steps, for the load log.
func (c curve) String() string {
	var b strings.Builder
	for i, p := range c {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%d:%v", p.n, time.Duration(p.t*float64(time.Second)).Round(10*time.Microsecond))
	}
	return b.String()
}
