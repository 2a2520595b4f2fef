package cpu

import (
	"fmt"
	"math"
	"testing"
)

// TestSoftmaxRow checks every kernel set's softmaxRow against math.Exp in
// f64 on fresh random rows, including lengths that are not whole vectors.
func TestSoftmaxRow(t *testing.T) {
	r := newRand(t)
	for _, set := range kernelSets() {
		for _, n := range []int{1, 15, 16, 17, 64, 333} {
			t.Run(fmt.Sprintf("%s/n=%d", set.name, n), func(t *testing.T) {
				row := randFloats(r, n, 4)
				const scale = 0.7
				m := math.Inf(-1)
				for _, v := range row {
					m = math.Max(m, float64(v))
				}
				want, tol := make([]float64, n), make([]float64, n)
				var sum float64
				for i, v := range row {
					a := scale * (float64(v) - m)
					want[i] = math.Exp(a)
					// The f32 argument carries a relative rounding of |a|*2^-24.
					tol[i] = want[i] * (1 + math.Abs(a))
					sum += want[i]
				}
				inv := set.softmaxRow(row, scale)
				checkClose(t, "exp", row, want, tol, 1e-6, 1e-30)
				checkClose(t, "1/sum", []float32{inv}, []float64{1 / sum}, nil, 1e-5, 0)
			})
		}
	}
}
