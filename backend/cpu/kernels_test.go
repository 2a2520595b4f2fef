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

// TestQuantRows checks every kernel set's row quantizer against
// quantizeQ8 on fresh random blocks of several magnitudes, a zero block
// and exact ties: the same scales and int8 values, and the offset
// correction -128*sum(q) of each block.
func TestQuantRows(t *testing.T) {
	r := newRand(t)
	for _, set := range kernelSets() {
		if set.quantRows == nil {
			continue
		}
		t.Run(set.name, func(t *testing.T) {
			const nb = 40
			x := make([]float32, 0, nb*qk)
			for blk := range nb {
				scale := math.Pow(10, float64(blk%7-3))
				if blk == 5 {
					scale = 0
				}
				x = append(x, randFloats(r, qk, scale)...)
			}
			// Exact ties (half steps of a block whose max is 127 steps),
			// which math.Round takes away from zero.
			x[qk*7], x[qk*7+1], x[qk*7+2], x[qk*7+3], x[qk*7+4] = 127, 0.5, -0.5, 12.5, -66.5
			wantQ, wantS := make([]int8, nb*qk), make([]float32, nb)
			quantizeQ8(x, wantQ, wantS)
			q, meta := make([]int8, nb*qk), make([]uint32, 2*nb)
			set.quantRows(&x[0], &q[0], &meta[0], nb)
			for blk := range nb {
				if got := math.Float32frombits(meta[2*blk]); got != wantS[blk] {
					t.Errorf("block %d: scale %v, want %v", blk, got, wantS[blk])
				}
				var sum int32
				for k := blk * qk; k < (blk+1)*qk; k++ {
					sum += int32(q[k])
					if q[k] != wantQ[k] {
						t.Errorf("x[%d] = %v: q %d, want %d", k, x[k], q[k], wantQ[k])
					}
				}
				if got := int32(meta[2*blk+1]); got != -128*sum {
					t.Errorf("block %d: correction %d, want %d", blk, got, -128*sum)
				}
			}
		})
	}
}

// TestAxpy checks every kernel set's axpy (through Backend.axpyF32, which
// adds the tail in Go) against y + a*x in f64 on fresh random vectors,
// lengths that are not whole vectors included.
func TestAxpy(t *testing.T) {
	r := newRand(t)
	for _, set := range kernelSets() {
		b := &Backend{k: set}
		for _, n := range []int{1, 7, 8, 16, 17, 64, 129} {
			t.Run(fmt.Sprintf("%s/n=%d", set.name, n), func(t *testing.T) {
				x, y := randFloats(r, n, 1), randFloats(r, n, 1)
				a := float32(r.NormFloat64())
				want, tol := make([]float64, n), make([]float64, n)
				for i := range y {
					want[i] = float64(y[i]) + float64(a)*float64(x[i])
					tol[i] = math.Abs(float64(y[i])) + math.Abs(float64(a)*float64(x[i]))
				}
				b.axpyF32(y, a, x)
				checkClose(t, "axpy", y, want, tol, 2e-7, 0)
			})
		}
	}
}

// TestDotRowsAxpyRows checks every kernel set's dotRows and axpyRows
// against f64 sums on fresh random rows (head sizes 16 to 256, 1 to 16
// rows).
func TestDotRowsAxpyRows(t *testing.T) {
	r := newRand(t)
	for _, set := range kernelSets() {
		if set.dotRows == nil || set.axpyRows == nil {
			continue
		}
		for _, sh := range []struct{ d, n int }{{16, 1}, {64, 16}, {128, 7}, {256, 3}, {32, 16}} {
			if sh.d%set.lanes != 0 {
				continue
			}
			t.Run(fmt.Sprintf("%s/d=%d/n=%d", set.name, sh.d, sh.n), func(t *testing.T) {
				x, rows, p := randFloats(r, sh.d, 1), randFloats(r, sh.n*sh.d, 1), randFloats(r, sh.n, 1)
				y := randFloats(r, sh.d, 1)
				dots := make([]float32, sh.n)
				set.dotRows(&x[0], &rows[0], sh.d, sh.n, &dots[0])
				wantD, tolD := make([]float64, sh.n), make([]float64, sh.n)
				for i := range sh.n {
					for c := range sh.d {
						v := float64(x[c]) * float64(rows[i*sh.d+c])
						wantD[i] += v
						tolD[i] += math.Abs(v)
					}
				}
				checkClose(t, "dotRows", dots, wantD, tolD, 1e-6, 0)
				wantY, tolY := make([]float64, sh.d), make([]float64, sh.d)
				for c := range sh.d {
					wantY[c], tolY[c] = float64(y[c]), math.Abs(float64(y[c]))
					for i := range sh.n {
						v := float64(p[i]) * float64(rows[i*sh.d+c])
						wantY[c] += v
						tolY[c] += math.Abs(v)
					}
				}
				set.axpyRows(&y[0], &p[0], &rows[0], sh.d, sh.n)
				checkClose(t, "axpyRows", y, wantY, tolY, 1e-6, 0)
			})
		}
	}
}
