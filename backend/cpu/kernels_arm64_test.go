//go:build arm64 && !purego

package cpu

import (
	"fmt"
	"math"
	"testing"

	"github.com/trigon-llm/trigon/backend"
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

// TestQuantDotExact checks every kernel set's Q8_0/Q4_0 dots (dotQ8,
// dotQ4 and their Rows forms) against the exact sum over blocks of
// d_w*d_x times the integer block dot, on fresh random weight bytes (the
// whole int8 range, -128 included, and every nibble) and activations in
// [-127, 127] (quantizeQ8's range), with blocks at the extremes (w = -128
// against x = -127: the int16 pair sums of the NEON form at their
// largest).
func TestQuantDotExact(t *testing.T) {
	r := newRand(t)
	f16 := backend.F16Table()
	for _, set := range kernelSets() {
		if set.dotQ8 == nil {
			continue
		}
		for _, bits := range []int{8, 4} {
			dot, rowsDot, blk := set.dotQ8, set.dotQ8Rows, 34
			if bits == 4 {
				dot, rowsDot, blk = set.dotQ4, set.dotQ4Rows, 18
			}
			for _, nb := range []int{1, 5, 33} {
				t.Run(fmt.Sprintf("%s/Q%d/nb=%d", set.name, bits, nb), func(t *testing.T) {
					const rows = 3
					xq, xs := make([]int8, nb*qk), make([]float32, nb)
					for i := range xq {
						xq[i] = int8(r.IntN(255) - 127)
					}
					for i := range xs {
						xs[i] = float32(r.Float64()) / 64
					}
					w := make([]byte, rows*nb*blk)
					for i := range w {
						w[i] = byte(r.Uint32())
					}
					for b := range rows * nb {
						// f16 scales of magnitude under 2 (exponent field under 15).
						w[b*blk+1] &= 0xbb
					}
					// Row 0's first block at the extremes.
					for j := range qk {
						xq[j] = -127
					}
					if bits == 8 {
						for j := 2; j < blk; j++ {
							w[j] = 0x80
						}
					} else {
						for j := 2; j < blk; j++ {
							w[j] = 0x00 // both nibbles -8
						}
					}
					want, scale := make([]float64, rows), make([]float64, rows)
					for row := range rows {
						for b := range nb {
							wb := w[(row*nb+b)*blk : (row*nb+b+1)*blk]
							var isum int64
							for j := range qk {
								var v int64
								if bits == 8 {
									v = int64(int8(wb[2+j]))
								} else if j < 16 {
									v = int64(wb[2+j]&15) - 8
								} else {
									v = int64(wb[2+j-16]>>4) - 8
								}
								isum += v * int64(xq[b*qk+j])
							}
							p := float64(f16[uint16(wb[0])|uint16(wb[1])<<8]) * float64(xs[b]) * float64(isum)
							want[row] += p
							scale[row] += math.Abs(p)
						}
					}
					got := make([]float32, rows)
					for row := range rows {
						got[row] = dot(&xq[0], &xs[0], &w[row*nb*blk], nb)
					}
					checkClose(t, "dot", got, want, scale, 1e-5, 1e-30)
					if rowsDot != nil {
						// The Rows forms take quantizeRows' meta words: each
						// block's scale bits, then -128 times its sum.
						xm := make([]uint32, 2*nb)
						for b := range nb {
							var sum int32
							for _, v := range xq[b*qk : (b+1)*qk] {
								sum += int32(v)
							}
							xm[2*b], xm[2*b+1] = math.Float32bits(xs[b]), uint32(-128*sum)
						}
						gotRows := make([]float32, rows)
						rowsDot(&xq[0], &xm[0], &w[0], nb, rows, &gotRows[0])
						checkClose(t, "rows", gotRows, want, scale, 1e-5, 1e-30)
					}
				})
			}
		}
	}
}
