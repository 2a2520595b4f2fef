package engine

import (
	"testing"
)

// TestMixedCaps checks the caps against the cost model they come from, on
// a GPU-like model (a decode step mostly fixed cost, growing 2.2x by 256
// sequences) and a CPU-like one (little fixed cost), a ratio where the
// floor binds, and the inputs that cannot bound a step.
func TestMixedCaps(t *testing.T) {
	gpu := stepCosts{fixed: 5.9e-3, perToken: 16.7e-6,
		decode: []decodeCost{{1, 4.4e-3}, {8, 4.5e-3}, {64, 6.0e-3}, {256, 9.6e-3}}}
	cpu := stepCosts{fixed: 1e-3, perToken: 1e-3, decode: []decodeCost{{1, 3e-3}, {8, 10e-3}}}
	for _, tc := range []struct {
		name      string
		c         stepCosts
		ratio     float64
		maxDecode int
		want      map[int]int // d -> cap, from the formulas by hand
		nilCaps   bool
	}{
		// allowed(d) = 2.5*dec(d)*dec(d)/dec(1). At 1: (2.5*4.4e-3 -
		// 5.9e-3)/16.7e-6 - 1 = 304.4; at 8: (2.5*4.5e-3*4.5/4.4 -
		// 5.9e-3)/16.7e-6 - 8 = 327.7; at 256: (2.5*9.6e-3*9.6/4.4 -
		// 5.9e-3)/16.7e-6 - 256 = 2526.3, the decode step grown 2.2x.
		{name: "gpu", c: gpu, ratio: 2.5, maxDecode: 300, want: map[int]int{1: 304, 8: 327, 256: 2526}},
		// Bound (2.5*3e-3 - 1e-3)/1e-3 - 1 = 5.5; floor (1e-3 + 1e-3 -
		// 3e-3)/1e-3 < 1. At 8: (2.5*10e-3*10/3 - 1e-3)/1e-3 - 8 = 74.3.
		{name: "cpu", c: cpu, ratio: 2.5, maxDecode: 8, want: map[int]int{1: 5, 8: 74}},
		// A ratio just above 1: the bound is under the floor, which is
		// (5.9e-3 + 16.7e-6 - 4.4e-3)/16.7e-6 = 90.8 at d = 1.
		{name: "floor", c: gpu, ratio: 1.01, maxDecode: 2, want: map[int]int{1: 90}},
		{name: "flat prefill", c: stepCosts{fixed: 1e-3, decode: gpu.decode}, ratio: 2.5, maxDecode: 4, nilCaps: true},
		{name: "no decode measured", c: stepCosts{fixed: 1e-3, perToken: 1e-5}, ratio: 2.5, maxDecode: 4, nilCaps: true},
		{name: "ratio 1", c: gpu, ratio: 1, maxDecode: 4, nilCaps: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			caps := mixedCaps(tc.c, tc.ratio, tc.maxDecode)
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
			for d := 1; d <= tc.maxDecode; d++ {
				if caps[d] < 1 || caps[d] < caps[d-1] {
					t.Fatalf("caps not at least 1 and non-decreasing at %d: %v", d, caps[max(d-1, 0):d+1])
				}
				// Within the ratio, or at the floor (one token more would pass it).
				step := tc.c.fixed + float64(d+caps[d])*tc.c.perToken
				dec := tc.c.decodeTime(d)
				allowed := tc.ratio * dec * dec / tc.c.decode[0].t
				floor := (tc.c.fixed + float64(d)*tc.c.perToken - dec) / tc.c.perToken
				if step > allowed*(1+1e-9) && float64(caps[d]) > floor+1 && caps[d] > caps[d-1] && caps[d] > 1 {
					t.Errorf("at %d decodes, cap %d: a step of %.3g s over the allowed %.3g s", d, caps[d], step, allowed)
				}
				if step+tc.c.perToken <= allowed {
					t.Errorf("at %d decodes, cap %d: one more token (a step of %.3g s) fits the allowed %.3g s", d, caps[d], step+tc.c.perToken, allowed)
				}
			}
		})
	}
}
