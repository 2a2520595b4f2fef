//go:build arm64 && !purego

package cpu

import (
	"fmt"
	"math"
	"testing"
)

// TestSoftmaxRowRange checks every kernel set's softmaxRow against
// math.Exp in f64 on rows whose scaled scores reach far below the f32
// range of exp (and -Inf, a masked score), where the NEON exp sets its
// result to 0: within 1e-37 of the exact value there, and as
// TestSoftmaxRow elsewhere.
func TestSoftmaxRowRange(t *testing.T) {
	r := newRand(t)
	for _, set := range kernelSets() {
		for _, n := range []int{4, 64, 130} {
			t.Run(fmt.Sprintf("%s/n=%d", set.name, n), func(t *testing.T) {
				row := make([]float32, n)
				for i := range row {
					// Scores from 0 down to about -200, in random order.
					row[i] = -200 * float32(r.Float64())
				}
				row[r.IntN(n)] = 0
				if n > 4 {
					row[r.IntN(n)] = float32(math.Inf(-1))
				}
				const scale = 1
				m := math.Inf(-1)
				for _, v := range row {
					m = math.Max(m, float64(v))
				}
				want, tol := make([]float64, n), make([]float64, n)
				var sum float64
				for i, v := range row {
					a := scale * (float64(v) - m)
					want[i] = math.Exp(a)
					if want[i] > 0 {
						tol[i] = want[i] * (1 + math.Abs(a))
					}
					sum += want[i]
				}
				inv := set.softmaxRow(row, scale)
				checkClose(t, "exp", row, want, tol, 1e-6, 1e-37)
				checkClose(t, "1/sum", []float32{inv}, []float64{1 / sum}, nil, 1e-5, 0)
			})
		}
	}
}
