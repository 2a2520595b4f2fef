//go:build amd64 && !purego

package cpu

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// The assembly kernels of kernels_amd64.s (written by internal/asmgen).

func gemmZ1(a *float32, lda uintptr, b *float32, c *float32, ldc uintptr, k int)
func gemmZ2(a *float32, lda uintptr, b *float32, c *float32, ldc uintptr, k int)
func gemmZ3(a *float32, lda uintptr, b *float32, c *float32, ldc uintptr, k int)
func gemmZ4(a *float32, lda uintptr, b *float32, c *float32, ldc uintptr, k int)
func gemmZ5(a *float32, lda uintptr, b *float32, c *float32, ldc uintptr, k int)
func gemmZ6(a *float32, lda uintptr, b *float32, c *float32, ldc uintptr, k int)
func gemmZ7(a *float32, lda uintptr, b *float32, c *float32, ldc uintptr, k int)
func gemmZ8(a *float32, lda uintptr, b *float32, c *float32, ldc uintptr, k int)
func gemmZ9(a *float32, lda uintptr, b *float32, c *float32, ldc uintptr, k int)
func gemmZ10(a *float32, lda uintptr, b *float32, c *float32, ldc uintptr, k int)
func gemmZ11(a *float32, lda uintptr, b *float32, c *float32, ldc uintptr, k int)
func gemmZ12(a *float32, lda uintptr, b *float32, c *float32, ldc uintptr, k int)
func gemmY1(a *float32, lda uintptr, b *float32, c *float32, ldc uintptr, k int)
func gemmY2(a *float32, lda uintptr, b *float32, c *float32, ldc uintptr, k int)
func gemmY3(a *float32, lda uintptr, b *float32, c *float32, ldc uintptr, k int)
func gemmY4(a *float32, lda uintptr, b *float32, c *float32, ldc uintptr, k int)
func gemmY5(a *float32, lda uintptr, b *float32, c *float32, ldc uintptr, k int)
func gemmY6(a *float32, lda uintptr, b *float32, c *float32, ldc uintptr, k int)

func gemmQZ1(x *int8, lda uintptr, meta *uint32, ldm uintptr, panel *byte, c *float32, ldc uintptr, nb int)
func gemmQZ2(x *int8, lda uintptr, meta *uint32, ldm uintptr, panel *byte, c *float32, ldc uintptr, nb int)
func gemmQZ3(x *int8, lda uintptr, meta *uint32, ldm uintptr, panel *byte, c *float32, ldc uintptr, nb int)
func gemmQZ4(x *int8, lda uintptr, meta *uint32, ldm uintptr, panel *byte, c *float32, ldc uintptr, nb int)
func gemmQZ5(x *int8, lda uintptr, meta *uint32, ldm uintptr, panel *byte, c *float32, ldc uintptr, nb int)
func gemmQZ6(x *int8, lda uintptr, meta *uint32, ldm uintptr, panel *byte, c *float32, ldc uintptr, nb int)
func gemmQY1(x *int8, lda uintptr, meta *uint32, ldm uintptr, panel *byte, c *float32, ldc uintptr, nb int)
func gemmQY2(x *int8, lda uintptr, meta *uint32, ldm uintptr, panel *byte, c *float32, ldc uintptr, nb int)
func gemmQY3(x *int8, lda uintptr, meta *uint32, ldm uintptr, panel *byte, c *float32, ldc uintptr, nb int)
func gemmQY4(x *int8, lda uintptr, meta *uint32, ldm uintptr, panel *byte, c *float32, ldc uintptr, nb int)
func gemmQY5(x *int8, lda uintptr, meta *uint32, ldm uintptr, panel *byte, c *float32, ldc uintptr, nb int)
func quantQ8Z(x *float32, q *int8, meta *uint32, nb int)
func quantQ8Y(x *float32, q *int8, meta *uint32, nb int)

func dotF32Z(x *float32, w unsafe.Pointer, n int) float32
func axpyF32Z(y *float32, x *float32, a float32, n int)
func axpyF32Y(y *float32, x *float32, a float32, n int)
func dotRowsF32Z(x *float32, rows *float32, d int, n int, out *float32)
func dotRowsF32Y(x *float32, rows *float32, d int, n int, out *float32)
func axpyRowsF32Z(y *float32, p *float32, rows *float32, d int, n int)
func axpyRowsF32Y(y *float32, p *float32, rows *float32, d int, n int)
func dotF16Z(x *float32, w unsafe.Pointer, n int) float32
func dotBF16Z(x *float32, w unsafe.Pointer, n int) float32
func dotF32Y(x *float32, w unsafe.Pointer, n int) float32
func dotF16Y(x *float32, w unsafe.Pointer, n int) float32
func dotBF16Y(x *float32, w unsafe.Pointer, n int) float32

func expSumZ(x *float32, n int, m, scale float32) float32

func dotQ8VNNI(xq *int8, xs *float32, w *byte, nb int) float32
func dotQ4VNNI(xq *int8, xs *float32, w *byte, nb int) float32
func dotQ8AVX2(xq *int8, xs *float32, w *byte, nb int) float32
func dotQ8RowsVNNI(xq *int8, xm *uint32, w *byte, nb int, rows int, out *float32)
func dotQ4RowsVNNI(xq *int8, xm *uint32, w *byte, nb int, rows int, out *float32)
func dotQ8RowsAVX2(xq *int8, xm *uint32, w *byte, nb int, rows int, out *float32)
func dotQ4RowsAVX2(xq *int8, xm *uint32, w *byte, nb int, rows int, out *float32)
func dotQ4AVX2(xq *int8, xs *float32, w *byte, nb int) float32

// The K-quant dots (AVX2, also in the AVX-512 set).
func dotQ4KAVX2(w *byte, xq *int8, xd *float32, xs *int16, nb int) float32
func dotQ5KAVX2(w *byte, xq *int8, xd *float32, xs *int16, nb int) float32
func dotQ6KAVX2(w *byte, xq *int8, xd *float32, xs *int16, nb int) float32

// The weight-quantized dots (AVX2, also in the AVX-512 set).
func dotAWQ4Y(x *float32, w *byte, nb int, group int) float32
func dotF8RowY(x *float32, w *byte, n int) float32
func dotF8RowZ(x *float32, w *byte, n int) float32

// dotF8RowZY is dotF8RowZ over n's whole multiple of 32 and dotF8RowY over
// the rest (F8E4M3Row rows are multiples of 16).
func dotF8RowZY(x *float32, w *byte, n int) float32 {
	m := n &^ 31
	var s float32
	if m > 0 {
		s = dotF8RowZ(x, w, m)
	}
	if m < n {
		s += dotF8RowY((*float32)(unsafe.Add(unsafe.Pointer(x), 4*m)), (*byte)(unsafe.Add(unsafe.Pointer(w), m)), n-m)
	}
	return s
}

// kernelSets lists the vector kernel sets this CPU can run, best first,
// and the pure-Go set last.
func kernelSets() []kernels {
	x := cpu.X86
	var sets []kernels
	avx2 := x.HasAVX2 && x.HasFMA && x.HasF16C
	// The AVX-512 set needs F (zmm, masks) and VL+VNNI for vpdpbusd on ymm;
	// BW and DQ come with every such CPU and are checked for the
	// assembler's encodings of the byte and conversion instructions.
	if avx2 && x.HasAVX512F && x.HasAVX512BW && x.HasAVX512DQ && x.HasAVX512VL && x.HasAVX512VNNI {
		sets = append(sets, kernels{
			name:  "avx512",
			gemm:  []gemmKernel{gemmZ1, gemmZ2, gemmZ3, gemmZ4, gemmZ5, gemmZ6, gemmZ7, gemmZ8, gemmZ9, gemmZ10, gemmZ11, gemmZ12},
			gemmQ: []quantGemmKernel{gemmQZ1, gemmQZ2, gemmQZ3, gemmQZ4, gemmQZ5, gemmQZ6},
			nrQ:   32, qFlip: 0x80,
			quantRows: quantQ8Z,
			nr:        32, lanes: 16,
			dotF32: dotF32Z, dotF16: dotF16Z, dotBF16: dotBF16Z,
			dotQ8: dotQ8VNNI, dotQ4: dotQ4VNNI, dotQ8Rows: dotQ8RowsVNNI, dotQ4Rows: dotQ4RowsVNNI,
			dotQ4K: dotQ4KAVX2, dotQ5K: dotQ5KAVX2, dotQ6K: dotQ6KAVX2,
			dotAWQ4: dotAWQ4Y, dotF8: dotF8RowZY,
			expSum: expSumZ, axpy: axpyF32Z, dotRows: dotRowsF32Z, axpyRows: axpyRowsF32Z,
		})
	}
	if avx2 {
		sets = append(sets, kernels{
			name: "avx2",
			gemm: []gemmKernel{gemmY1, gemmY2, gemmY3, gemmY4, gemmY5, gemmY6},
			nr:   16, lanes: 8,
			dotF32: dotF32Y, dotF16: dotF16Y, dotBF16: dotBF16Y, axpy: axpyF32Y, dotRows: dotRowsF32Y, axpyRows: axpyRowsF32Y,
			dotQ8: dotQ8AVX2, dotQ4: dotQ4AVX2, dotQ8Rows: dotQ8RowsAVX2, dotQ4Rows: dotQ4RowsAVX2,
			dotQ4K: dotQ4KAVX2, dotQ5K: dotQ5KAVX2, dotQ6K: dotQ6KAVX2,
			dotAWQ4: dotAWQ4Y, dotF8: dotF8RowY,
			gemmQ:     []quantGemmKernel{gemmQY1, gemmQY2, gemmQY3, gemmQY4, gemmQY5},
			nrQ:       8,
			quantRows: quantQ8Y,
		})
	}
	return append(sets, kernels{name: "go"})
}
