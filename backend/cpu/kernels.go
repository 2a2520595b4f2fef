package cpu

import (
	"math"
	"unsafe"
)

//go:generate go run ./internal/asmgen -o kernels_amd64.s
//go:generate go run ./internal/arm64gen -o kernels_gen_arm64.s

// gemmKernel computes c[i][j] = sum_p a[i][p] * b[p][j] for the kernel's
// row count i and panel width j over k steps: a and c are row-major with
// strides lda and ldc bytes, b is a packed panel of k rows of nr floats.
type gemmKernel func(a *float32, lda uintptr, b *float32, c *float32, ldc uintptr, k int)

// quantGemmKernel computes c[i][j] for the kernel's row count i and nr
// features j over nb blocks of int8 x rows (stride lda bytes) against a
// panel packed by packQPanel; meta holds each x row's per-block scale
// and offset correction (quantizeRows), stride ldm bytes.
type quantGemmKernel func(x *int8, lda uintptr, meta *uint32, ldm uintptr, panel *byte, c *float32, ldc uintptr, nb int)

// floatDot returns the dot product of n f32 x values with n weights in
// the kernel's encoding at w; n is a multiple of the set's lanes.
type floatDot func(x *float32, w unsafe.Pointer, n int) float32

// quantDot returns the dot product of nb Q8_0 or Q4_0 weight blocks at w
// with nb blocks of int8 activations xq scaled by xs.
type quantDot func(xq *int8, xs *float32, w *byte, nb int) float32

// kernels is the set of vector kernels a Backend uses, picked from the
// CPU's features when the Backend is made. A nil field (the whole set on
// a CPU or architecture without them) selects the pure-Go code, which is
// also the reference the vector kernels are tested against.
type kernels struct {
	name string
	// gemm[m-1] handles m rows against a panel of nr output features.
	gemm []gemmKernel
	nr   int
	// gemmQ[m-1] handles m int8 x rows against a Q8_0/Q4_0 panel of nrQ
	// features (nil: quantized prefill goes through the f32 gemm), whose
	// weights are stored plus qFlip (packQPanel).
	gemmQ []quantGemmKernel
	nrQ   int
	qFlip byte
	// quantRows quantizes nb blocks of x exactly as quantizeQ8 does and
	// writes quantizeRows' meta (nil: the Go code).
	quantRows func(x *float32, q *int8, meta *uint32, nb int)
	// lanes is the element multiple the float dots take; the caller adds
	// the rest of a row in Go.
	lanes                   int
	dotF32, dotF16, dotBF16 floatDot
	// dotQ8 and dotQ4 read weights against activations quantized per
	// 32-element block (quantizeQ8), as llama.cpp computes quantized
	// products.
	dotQ8, dotQ4 quantDot
	// dotQ8Rows and dotQ4Rows are dotQ8 and dotQ4 of rows consecutive
	// weight rows into out (nil: a dotQ8/dotQ4 call a row), the
	// activations' scales taken from quantizeRows' meta words xm.
	dotQ8Rows, dotQ4Rows func(xq *int8, xm *uint32, w *byte, nb int, rows int, out *float32)
	// dotQ4K, dotQ5K and dotQ6K read K-quant weights against activations
	// quantized per 256-value block (quantizeQ8K); nil: the Go kernels.
	dotQ4K, dotQ5K, dotQ6K kDot
	// dotAWQ4 reads nb AWQ4 blocks of g elements against f32 x, as
	// dotAWQ4's Go form; dotF8 n e4m3 codes (a multiple of 16) of an
	// F8E4M3Row row against f32 x, before the row's scale. nil: the Go
	// kernels.
	dotAWQ4 func(x *float32, w *byte, nb int, g int) float32
	dotF8   func(x *float32, w *byte, n int) float32
	// axpy adds a*x[i] to y[i] for n (a multiple of lanes) elements; nil:
	// the Go loop.
	axpy func(y *float32, x *float32, a float32, n int)
	// dotRows sets out[r] = x . rows[r] and axpyRows adds sum of
	// p[r]*rows[r] to y, over n consecutive rows of d floats (d a multiple
	// of lanes); nil: the Go loops.
	dotRows  func(x *float32, rows *float32, d int, n int, out *float32)
	axpyRows func(y *float32, p *float32, rows *float32, d int, n int)
	// expSum sets x[i] = exp(scale*(x[i]-m)) for n (a multiple of lanes)
	// elements and returns their sum, within a few f32 ulps of math.Exp.
	expSum func(x *float32, n int, m, scale float32) float32
}

// softmaxRow sets row[i] = exp(scale*(row[i]-max(row))) and returns
// 1/sum of them: the unnormalised probabilities of one attention row
// (scale > 0, so the largest scaled score comes from the largest score).
func (k *kernels) softmaxRow(row []float32, scale float32) float32 {
	m := float32(math.Inf(-1))
	for _, v := range row {
		if v > m {
			m = v
		}
	}
	var sum float32
	vec := 0
	if k.expSum != nil {
		vec = len(row) / k.lanes * k.lanes
		if vec > 0 {
			sum = k.expSum(&row[0], vec, m, scale)
		}
	}
	for i := vec; i < len(row); i++ {
		e := float32(math.Exp(float64(scale * (row[i] - m))))
		row[i] = e
		sum += e
	}
	return 1 / sum
}

// quantizeQ8 writes x, whose length is a multiple of 32, as int8 values q
// and one f32 scale per 32 elements: d = max|x|/127, q = round(x/d), so
// |x - d*q| <= d/2 element-wise and q lies in [-127, 127].
func quantizeQ8(x []float32, q []int8, s []float32) {
	for blk := range len(x) / qk {
		xx := x[blk*qk : blk*qk+qk : blk*qk+qk]
		var amax float32
		for _, v := range xx {
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		d := amax / 127
		s[blk] = d
		qq := q[blk*qk : blk*qk+qk : blk*qk+qk]
		if d == 0 {
			clear(qq)
			continue
		}
		id := 1 / d
		for j, v := range xx {
			qq[j] = int8(max(-127, min(127, math.Round(float64(v*id)))))
		}
	}
}
