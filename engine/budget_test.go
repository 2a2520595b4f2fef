package engine

import (
	"errors"
	"testing"
	"time"
)

// TestFitBudget: the budget is the step length that takes the target
// under a linear cost model fitted to two timed steps, within [lo, hi].
func TestFitBudget(t *testing.T) {
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	linear := func(fixed, perToken float64) func(int) time.Duration {
		return func(n int) time.Duration { return ms(fixed + perToken*float64(n)) }
	}
	cases := []struct {
		name        string
		cost        func(n int) time.Duration
		target      time.Duration
		lo, hi, max int
		want        int
	}{
		// A CPU: the step is all per-token work.
		{"cpu", linear(0, 1), ms(150), 80, 2048, 2048, 150},
		{"cpu with a fixed part", linear(20, 0.5), ms(150), 80, 2048, 2048, 260},
		// A GPU: a small batch costs its fixed part; the budget is the cap.
		{"gpu", linear(10, 0.001), ms(150), 80, 2048, 2048, 2048},
		// So slow that the first short step is over the target: the least.
		{"too slow", linear(0, 30), ms(150), 80, 2048, 2048, 80},
		// Slower than lo allows: lo.
		{"under lo", linear(0, 4), ms(150), 80, 2048, 2048, 80},
		// Timing noise makes the longer step look faster: all fixed cost.
		{"no slope", func(n int) time.Duration { return ms(50 - float64(n)/100) }, ms(150), 80, 2048, 2048, 2048},
		// A context too short for a second length.
		{"short context", linear(0, 1), ms(150), 8, 2048, 8, 8},
		{"no room to probe", linear(0, 1), ms(150), 8, 2048, 0, 8},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			timer := func(n int) (time.Duration, error) {
				if n > tc.max || n < 1 {
					t.Fatalf("probe of %d tokens, want 1..%d", n, tc.max)
				}
				calls++
				if calls == 1 {
					return time.Hour, nil // the warm-up pays one-time costs: not used
				}
				return tc.cost(n), nil
			}
			got, err := fitBudget(timer, tc.target, tc.lo, tc.hi, tc.max)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("budget %d, want %d", got, tc.want)
			}
		})
	}
	t.Run("probe error", func(t *testing.T) {
		fault := errors.New("device fault")
		_, err := fitBudget(func(int) (time.Duration, error) { return 0, fault }, ms(150), 80, 2048, 2048)
		if !errors.Is(err, fault) {
			t.Errorf("error %v, want the probe's", err)
		}
	})
}
