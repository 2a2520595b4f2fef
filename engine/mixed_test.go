package engine

import (
	"math"
	"testing"
)

// line is a prefill curve through the budget's eighths of a step that
// costs fixed + n*perToken, as measureStepCosts samples it.
func line(fixed, perToken float64, budget int) curve {
	var c curve
	for _, n := range []int{budget / 8, budget / 4, budget / 2, budget} {
		c = append(c, point{n, fixed + float64(n)*perToken})
	}
	return c
}

// TestMixedCaps checks the caps against the cost model they come from, on
// a GPU-like model (a decode step mostly fixed cost, growing 2.2x by 256
// sequences) and a CPU-like one (little fixed cost), a ratio where the
// floor (the smallest prefill step measured) binds, a prefill curve with
// a knee, and the inputs that cannot bound a step.
func TestMixedCaps(t *testing.T) {
	gpuDecode := curve{{1, 4.4e-3}, {8, 4.5e-3}, {64, 6.0e-3}, {256, 9.6e-3}}
	gpu := stepCosts{prefill: line(5.9e-3, 16.7e-6, 2048), decode: gpuDecode}
	cpu := stepCosts{prefill: line(1e-3, 1e-3, 128), decode: curve{{1, 3e-3}, {8, 10e-3}}}
	// Flat to 512 tokens, then 20 us a token.
	knee := stepCosts{prefill: curve{{256, 10e-3}, {512, 10e-3}, {1024, 20.24e-3}, {2048, 40.72e-3}}, decode: gpuDecode}
	for _, tc := range []struct {
		name      string
		c         stepCosts
		ratio     float64
		maxDecode int
		budget    int         // 0: 1<<20
		want      map[int]int // d -> cap, from the formulas by hand
		nilCaps   bool
	}{
		// allowed(d) = 2.5*dec(d)*g^2, g = dec(d)/dec(1). At 1: (2.5*4.4e-3
		// - 5.9e-3)/16.7e-6 - 1 = 304.4; at 8: (2.5*4.5e-3*(4.5/4.4)^2 -
		// 5.9e-3)/16.7e-6 - 8 = 343.3; at 256, the decode step grown 2.2x:
		// 6231.9, past the curve's last point along its slope.
		{name: "gpu", c: gpu, ratio: 2.5, maxDecode: 300, want: map[int]int{1: 304, 8: 343, 256: 6231}},
		// The same within a budget of 2048: 2048 from where the allowance
		// passes it.
		{name: "gpu within the budget", c: gpu, ratio: 2.5, maxDecode: 300, budget: 2048, want: map[int]int{1: 304, 8: 343, 256: 2048, 300: 2048}},
		// At 1: (2.5*3e-3 - 1e-3)/1e-3 - 1 = 5.5, under the floor of 16
		// (the smallest step measured). At 8: (2.5*10e-3*(10/3)^2 -
		// 1e-3)/1e-3 - 8 = 268.8.
		{name: "cpu", c: cpu, ratio: 2.5, maxDecode: 8, want: map[int]int{1: 16, 8: 268}},
		// A ratio just above 1: the allowed step is under the eager
		// step's fixed cost, and the floor holds.
		{name: "floor", c: gpu, ratio: 1.01, maxDecode: 2, want: map[int]int{1: 256, 2: 256}},
		// The allowed 11 ms at 1 decode is past the flat part: 512 +
		// 1e-3/20e-6 - 1 = 561 (on the segment 512-1024, 20 us a token).
		{name: "knee", c: knee, ratio: 2.5, maxDecode: 2, want: map[int]int{1: 561}},
		{name: "flat prefill", c: stepCosts{prefill: curve{{256, 1e-3}, {2048, 1e-3}}, decode: gpuDecode}, ratio: 2.5, maxDecode: 4, nilCaps: true},
		{name: "one prefill point", c: stepCosts{prefill: curve{{256, 1e-3}}, decode: gpuDecode}, ratio: 2.5, maxDecode: 4, nilCaps: true},
		{name: "no decode measured", c: stepCosts{prefill: gpu.prefill}, ratio: 2.5, maxDecode: 4, nilCaps: true},
		{name: "ratio 1", c: gpu, ratio: 1, maxDecode: 4, nilCaps: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.budget == 0 {
				tc.budget = 1 << 20
			}
			caps := mixedCaps(tc.c, tc.ratio, tc.maxDecode, tc.budget)
			if tc.nilCaps {
				if caps != nil {
					t.Fatalf("caps %v, want none", caps)
				}
				return
			}
			if len(caps) != tc.maxDecode+1 {
				t.Fatalf("%d caps, want %d", len(caps), tc.maxDecode+1)
			}
			for d, want := range tc.want {
				if caps[d] != want {
					t.Errorf("cap at %d decodes %d, want %d", d, caps[d], want)
				}
			}
			pre := tc.c.prefill
			for d := 1; d <= tc.maxDecode; d++ {
				if caps[d] < 1 || caps[d] < caps[d-1] || caps[d] > tc.budget {
					t.Fatalf("caps not at least 1, non-decreasing and within the budget %d at %d: %v", tc.budget, d, caps[d-1:d+1])
				}
				if caps[d] == tc.budget {
					continue
				}
				// Within the allowance, or raised (to the floor or the
				// previous cap); and tight: one token more would not fit.
				dec := tc.c.decode.at(float64(d))
				g := dec / tc.c.decode.at(1)
				allowed := tc.ratio * dec * g * g
				step := pre.at(float64(d + caps[d]))
				if step > allowed*(1+1e-9) && caps[d] > pre[0].n && caps[d] > caps[d-1] {
					t.Errorf("at %d decodes, cap %d: a step of %.4g s over the allowed %.4g s", d, caps[d], step, allowed)
				}
				if next := pre.at(float64(d + caps[d] + 1)); next <= allowed*(1-1e-9) {
					t.Errorf("at %d decodes, cap %d: one more token (a step of %.4g s) fits the allowed %.4g s", d, caps[d], next, allowed)
				}
			}
		})
	}
}

// TestCurve checks interpolation, extension past the ends (slopes at
// least 0, times at least 0) and the inverse.
func TestCurve(t *testing.T) {
	c := curve{{10, 1}, {20, 3}, {40, 3}, {50, 4}}
	for _, tc := range []struct{ n, want float64 }{
		{10, 1}, {15, 2}, {30, 3}, {45, 3.5}, {60, 5}, {5, 0}, {0, 0}, {9, 0.8},
	} {
		if got := c.at(tc.n); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("at(%v) = %v, want %v", tc.n, got, tc.want)
		}
	}
	for _, tc := range []struct{ t, want float64 }{
		{2, 15}, {3, 40}, {3.5, 45}, {5, 60}, {0.8, 9},
	} {
		if got := c.inverse(tc.t); math.Abs(got-tc.want) > 1e-6 {
			t.Errorf("inverse(%v) = %v, want %v", tc.t, got, tc.want)
		}
	}
	if got := (curve{{1, 2}, {4, 2}}).inverse(3); !math.IsInf(got, 1) {
		t.Errorf("flat curve below the time: inverse %v, want +Inf", got)
	}
	if got := (curve{{1, 2}}).at(100); got != 2 {
		t.Errorf("one-point curve at 100: %v, want 2", got)
	}
}
