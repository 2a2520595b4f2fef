//go:build arm64 && !purego

package cpu

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// The assembly kernels of kernels_arm64.s (by hand) and
// kernels_gen_arm64.s (written by internal/arm64gen). SDOT needs the
// dot-product extension (ASIMDDP); the others are base NEON (ASIMD),
// whose f16 conversions (fcvtl, fcvt) need no half-precision arithmetic
// extension.

func dotQ8SDOT(xq *int8, xs *float32, w *byte, nb int) float32
func dotQ4SDOT(xq *int8, xs *float32, w *byte, nb int) float32
func dotQ8NEON(xq *int8, xs *float32, w *byte, nb int) float32
func dotQ4NEON(xq *int8, xs *float32, w *byte, nb int) float32
func dotQ8RowsSDOT(xq *int8, xm *uint32, w *byte, nb int, rows int, out *float32)
func dotQ4RowsSDOT(xq *int8, xm *uint32, w *byte, nb int, rows int, out *float32)
func dotQ8RowsNEON(xq *int8, xm *uint32, w *byte, nb int, rows int, out *float32)
func dotQ4RowsNEON(xq *int8, xm *uint32, w *byte, nb int, rows int, out *float32)

func dotF32NEON(x *float32, w unsafe.Pointer, n int) float32
func dotF16NEON(x *float32, w unsafe.Pointer, n int) float32
func dotBF16NEON(x *float32, w unsafe.Pointer, n int) float32
func axpyF32NEON(y *float32, x *float32, a float32, n int)
func dotRowsF32NEON(x *float32, rows *float32, d int, n int, out *float32)
func axpyRowsF32NEON(y *float32, p *float32, rows *float32, d int, n int)
func quantQ8NEON(x *float32, q *int8, meta *uint32, nb int)
func expSumNEON(x *float32, n int, m, scale float32) float32
func dotAWQ4NEON(x *float32, w *byte, nb int, group int) float32
func dotF8RowNEON(x *float32, w *byte, n int) float32

func gemmN1(a *float32, lda uintptr, b *float32, c *float32, ldc uintptr, k int)
func gemmN2(a *float32, lda uintptr, b *float32, c *float32, ldc uintptr, k int)
func gemmN3(a *float32, lda uintptr, b *float32, c *float32, ldc uintptr, k int)
func gemmN4(a *float32, lda uintptr, b *float32, c *float32, ldc uintptr, k int)
func gemmN5(a *float32, lda uintptr, b *float32, c *float32, ldc uintptr, k int)
func gemmN6(a *float32, lda uintptr, b *float32, c *float32, ldc uintptr, k int)

func gemmQD1(x *int8, lda uintptr, meta *uint32, ldm uintptr, panel *byte, c *float32, ldc uintptr, nb int)
func gemmQD2(x *int8, lda uintptr, meta *uint32, ldm uintptr, panel *byte, c *float32, ldc uintptr, nb int)
func gemmQD3(x *int8, lda uintptr, meta *uint32, ldm uintptr, panel *byte, c *float32, ldc uintptr, nb int)
func gemmQD4(x *int8, lda uintptr, meta *uint32, ldm uintptr, panel *byte, c *float32, ldc uintptr, nb int)

func dotQ4KSDOT(w *byte, xq *int8, xd *float32, xs *int16, nb int) float32
func dotQ5KSDOT(w *byte, xq *int8, xd *float32, xs *int16, nb int) float32
func dotQ6KSDOT(w *byte, xq *int8, xd *float32, xs *int16, nb int) float32
func dotQ4KNEON(w *byte, xq *int8, xd *float32, xs *int16, nb int) float32
func dotQ5KNEON(w *byte, xq *int8, xd *float32, xs *int16, nb int) float32
func dotQ6KNEON(w *byte, xq *int8, xd *float32, xs *int16, nb int) float32

// kernelSets lists the vector kernel sets this CPU can run, best first,
// and the pure-Go set last: "neon-dotprod" where the CPU has the
// dot-product extension, and "neon" (which every arm64 CPU Go runs on
// has) after it, so the tests cover both on such a CPU.
func kernelSets() []kernels {
	var sets []kernels
	if !cpu.ARM64.HasASIMD {
		return []kernels{{name: "go"}}
	}
	neon := kernels{
		name: "neon",
		// 6 rows of 16 features: 24 accumulators of the 32 registers.
		gemm:   []gemmKernel{gemmN1, gemmN2, gemmN3, gemmN4, gemmN5, gemmN6},
		nr:     16,
		lanes:  4,
		dotF32: dotF32NEON, dotF16: dotF16NEON, dotBF16: dotBF16NEON,
		dotQ8: dotQ8NEON, dotQ4: dotQ4NEON, dotQ8Rows: dotQ8RowsNEON, dotQ4Rows: dotQ4RowsNEON,
		dotQ4K: dotQ4KNEON, dotQ5K: dotQ5KNEON, dotQ6K: dotQ6KNEON,
		axpy: axpyF32NEON, dotRows: dotRowsF32NEON, axpyRows: axpyRowsF32NEON,
		quantRows: quantQ8NEON, expSum: expSumNEON,
		dotAWQ4: dotAWQ4NEON, dotF8: dotF8RowNEON,
	}
	if cpu.ARM64.HasASIMDDP {
		dp := neon
		dp.name = "neon-dotprod"
		dp.dotQ8, dp.dotQ4, dp.dotQ8Rows, dp.dotQ4Rows = dotQ8SDOT, dotQ4SDOT, dotQ8RowsSDOT, dotQ4RowsSDOT
		// Quantized prefill: 4 rows of 8 features, signed weights.
		dp.gemmQ = []quantGemmKernel{gemmQD1, gemmQD2, gemmQD3, gemmQD4}
		dp.nrQ, dp.qFlip = 8, 0
		dp.dotQ4K, dp.dotQ5K, dp.dotQ6K = dotQ4KSDOT, dotQ5KSDOT, dotQ6KSDOT
		sets = append(sets, dp)
	}
	return append(sets, neon, kernels{name: "go"})
}
