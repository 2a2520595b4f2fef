//go:build arm64 && !purego

// The arm64 kernels that are one short loop each, written by hand (NEON;
// SDOT where the dot-product extension is present): the quantized and
// float decode dots, axpy, attention's row kernels, the row quantizer
// and the softmax's exp.
// The unrolled GEMM micro-kernels and K-quant dots are generated into
// kernels_gen_arm64.s; kernels_arm64.h encodes the instructions Go's
// assembler lacks.

#include "textflag.h"
#include "kernels_arm64.h"

// The quantized dots. R0 walks the int8 activations (32 a block), R1
// their scales, R2 the weight blocks (an f16 scale, then 32 int8 values
// for Q8_0 or 16 bytes of nibbles for Q4_0), R3 counts blocks; V0 sums
// the scaled block dots in four f32 lanes.
//
// Q8LOAD reads one Q8_0 block's scale bits into R4 and its values into
// V1, V2, and the block's activations into V3, V4.
#define Q8LOAD \
	MOVHU.P 2(R2), R4; \
	VLD1.P 32(R2), [V1.B16, V2.B16]; \
	VLD1.P 32(R0), [V3.B16, V4.B16]

// Q4LOAD is Q8LOAD for Q4_0: byte j holds value j in its low nibble and
// value j+16 in its high one, both stored plus 8 (V30 holds 0x0f bytes,
// V31 8s).
#define Q4LOAD \
	MOVHU.P 2(R2), R4; \
	VLD1.P 16(R2), [V1.B16]; \
	VUSHR $4, V1.B16, V2.B16; \
	VAND V30.B16, V1.B16, V1.B16; \
	VSUB V31.B16, V1.B16, V1.B16; \
	VSUB V31.B16, V2.B16, V2.B16; \
	VLD1.P 32(R0), [V3.B16, V4.B16]

// ISUMDOT leaves the block's exact integer dot, spread over the four
// int32 lanes of V5, with sdot.
#define ISUMDOT \
	VEOR V5.B16, V5.B16, V5.B16; \
	SDOT(5, 1, 3) /* sdot v5.4s, v1.16b, v3.16b */; \
	SDOT(5, 2, 4) /* sdot v5.4s, v2.16b, v4.16b */

// ISUMNEON is ISUMDOT without the extension: byte products widened to
// int16, two added in int16 (|w*x| <= 128*127, and the quantizer keeps x
// in [-127, 127], so a pair stays under 32768), then pairs into int32.
#define ISUMNEON \
	SMULL(6, 1, 3) /* smull v6.8h, v1.8b, v3.8b */; \
	SMLAL2(6, 1, 3) /* smlal2 v6.8h, v1.16b, v3.16b */; \
	SMULL(7, 2, 4) /* smull v7.8h, v2.8b, v4.8b */; \
	SMLAL2(7, 2, 4) /* smlal2 v7.8h, v2.16b, v4.16b */; \
	VEOR V5.B16, V5.B16, V5.B16; \
	SADALP(5, 6) /* sadalp v5.4s, v6.8h */; \
	SADALP(5, 7) /* sadalp v5.4s, v7.8h */

// QSCALE adds the block's dot, in f32, times d_w*d_x to V0, as the
// amd64 kernels do.
#define QSCALE \
	SCVTF(5, 5) /* scvtf v5.4s, v5.4s */; \
	FMOVS R4, F6; \
	FCVTHS F6, F6; \
	FMOVS.P 4(R1), F7; \
	FMULS F7, F6, F6; \
	FMLAE(0, 5, 6, 0) /* fmla v0.4s, v5.4s, v6.s[0] */

// QSCALEM is QSCALE with x's block scale read from quantizeRows' meta
// words (the scale's bits, then the block's offset sum: 8 bytes a block).
#define QSCALEM \
	SCVTF(5, 5) /* scvtf v5.4s, v5.4s */; \
	FMOVS R4, F6; \
	FCVTHS F6, F6; \
	FMOVS.P 8(R1), F7; \
	FMULS F7, F6, F6; \
	FMLAE(0, 5, 6, 0) /* fmla v0.4s, v5.4s, v6.s[0] */

// HSUM0 leaves the sum of V0's lanes in F0.
#define HSUM0 \
	FADDP4(0, 0, 0) /* faddp v0.4s, v0.4s, v0.4s */; \
	FADDP2(0, 0) /* faddp s0, v0.2s */

#define Q4CONSTS \
	VMOVI $15, V30.B16; \
	VMOVI $8, V31.B16

// func dotQ8SDOT(xq *int8, xs *float32, w *byte, nb int) float32
TEXT ·dotQ8SDOT(SB), NOSPLIT, $0-36
	MOVD xq+0(FP), R0
	MOVD xs+8(FP), R1
	MOVD w+16(FP), R2
	MOVD nb+24(FP), R3
	VEOR V0.B16, V0.B16, V0.B16
	CBZ  R3, done

loop:
	Q8LOAD
	ISUMDOT
	QSCALE
	SUBS $1, R3, R3
	BNE  loop

done:
	HSUM0
	FMOVS F0, ret+32(FP)
	RET

// func dotQ4SDOT(xq *int8, xs *float32, w *byte, nb int) float32
TEXT ·dotQ4SDOT(SB), NOSPLIT, $0-36
	MOVD xq+0(FP), R0
	MOVD xs+8(FP), R1
	MOVD w+16(FP), R2
	MOVD nb+24(FP), R3
	Q4CONSTS
	VEOR V0.B16, V0.B16, V0.B16
	CBZ  R3, done

loop:
	Q4LOAD
	ISUMDOT
	QSCALE
	SUBS $1, R3, R3
	BNE  loop

done:
	HSUM0
	FMOVS F0, ret+32(FP)
	RET

// func dotQ8NEON(xq *int8, xs *float32, w *byte, nb int) float32
TEXT ·dotQ8NEON(SB), NOSPLIT, $0-36
	MOVD xq+0(FP), R0
	MOVD xs+8(FP), R1
	MOVD w+16(FP), R2
	MOVD nb+24(FP), R3
	VEOR V0.B16, V0.B16, V0.B16
	CBZ  R3, done

loop:
	Q8LOAD
	ISUMNEON
	QSCALE
	SUBS $1, R3, R3
	BNE  loop

done:
	HSUM0
	FMOVS F0, ret+32(FP)
	RET

// func dotQ4NEON(xq *int8, xs *float32, w *byte, nb int) float32
TEXT ·dotQ4NEON(SB), NOSPLIT, $0-36
	MOVD xq+0(FP), R0
	MOVD xs+8(FP), R1
	MOVD w+16(FP), R2
	MOVD nb+24(FP), R3
	Q4CONSTS
	VEOR V0.B16, V0.B16, V0.B16
	CBZ  R3, done

loop:
	Q4LOAD
	ISUMNEON
	QSCALE
	SUBS $1, R3, R3
	BNE  loop

done:
	HSUM0
	FMOVS F0, ret+32(FP)
	RET

// The Rows forms run the dot over rows consecutive weight rows (R2 runs
// on from one row into the next) against the same activations, writing
// out[0..rows) through R6; R5 counts rows. x's scales come from
// quantizeRows' meta words (QSCALEM); Q4_0 does not use their offset sums.

// func dotQ8RowsSDOT(xq *int8, xm *uint32, w *byte, nb int, rows int, out *float32)
TEXT ·dotQ8RowsSDOT(SB), NOSPLIT, $0-48
	MOVD w+16(FP), R2
	MOVD rows+32(FP), R5
	MOVD out+40(FP), R6
	CBZ  R5, end

row:
	MOVD xq+0(FP), R0
	MOVD xm+8(FP), R1
	MOVD nb+24(FP), R3
	VEOR V0.B16, V0.B16, V0.B16
	CBZ  R3, done

loop:
	Q8LOAD
	ISUMDOT
	QSCALEM
	SUBS $1, R3, R3
	BNE  loop

done:
	HSUM0
	FMOVS.P F0, 4(R6)
	SUBS $1, R5, R5
	BNE  row

end:
	RET

// func dotQ4RowsSDOT(xq *int8, xm *uint32, w *byte, nb int, rows int, out *float32)
TEXT ·dotQ4RowsSDOT(SB), NOSPLIT, $0-48
	MOVD w+16(FP), R2
	MOVD rows+32(FP), R5
	MOVD out+40(FP), R6
	Q4CONSTS
	CBZ  R5, end

row:
	MOVD xq+0(FP), R0
	MOVD xm+8(FP), R1
	MOVD nb+24(FP), R3
	VEOR V0.B16, V0.B16, V0.B16
	CBZ  R3, done

loop:
	Q4LOAD
	ISUMDOT
	QSCALEM
	SUBS $1, R3, R3
	BNE  loop

done:
	HSUM0
	FMOVS.P F0, 4(R6)
	SUBS $1, R5, R5
	BNE  row

end:
	RET

// func dotQ8RowsNEON(xq *int8, xm *uint32, w *byte, nb int, rows int, out *float32)
TEXT ·dotQ8RowsNEON(SB), NOSPLIT, $0-48
	MOVD w+16(FP), R2
	MOVD rows+32(FP), R5
	MOVD out+40(FP), R6
	CBZ  R5, end

row:
	MOVD xq+0(FP), R0
	MOVD xm+8(FP), R1
	MOVD nb+24(FP), R3
	VEOR V0.B16, V0.B16, V0.B16
	CBZ  R3, done

loop:
	Q8LOAD
	ISUMNEON
	QSCALEM
	SUBS $1, R3, R3
	BNE  loop

done:
	HSUM0
	FMOVS.P F0, 4(R6)
	SUBS $1, R5, R5
	BNE  row

end:
	RET

// func dotQ4RowsNEON(xq *int8, xm *uint32, w *byte, nb int, rows int, out *float32)
TEXT ·dotQ4RowsNEON(SB), NOSPLIT, $0-48
	MOVD w+16(FP), R2
	MOVD rows+32(FP), R5
	MOVD out+40(FP), R6
	Q4CONSTS
	CBZ  R5, end

row:
	MOVD xq+0(FP), R0
	MOVD xm+8(FP), R1
	MOVD nb+24(FP), R3
	VEOR V0.B16, V0.B16, V0.B16
	CBZ  R3, done

loop:
	Q4LOAD
	ISUMNEON
	QSCALEM
	SUBS $1, R3, R3
	BNE  loop

done:
	HSUM0
	FMOVS.P F0, 4(R6)
	SUBS $1, R5, R5
	BNE  row

end:
	RET

// The float dots: R0 walks x, R1 the weights, R2 counts elements (a
// multiple of 4). Four accumulators V0-V3 take 16 elements a step, then
// V0 alone takes the remaining multiple of 4.

// SUM4 leaves the sum of V0-V3's lanes in F0.
#define SUM4 \
	FADD4(0, 0, 1) /* fadd v0.4s, v0.4s, v1.4s */; \
	FADD4(2, 2, 3) /* fadd v2.4s, v2.4s, v3.4s */; \
	FADD4(0, 0, 2) /* fadd v0.4s, v0.4s, v2.4s */; \
	HSUM0

#define ZERO4 \
	VEOR V0.B16, V0.B16, V0.B16; \
	VEOR V1.B16, V1.B16, V1.B16; \
	VEOR V2.B16, V2.B16, V2.B16; \
	VEOR V3.B16, V3.B16, V3.B16

// FMLA16 adds V4-V7 times V16-V19 to V0-V3.
#define FMLA16 \
	VFMLA V16.S4, V4.S4, V0.S4; \
	VFMLA V17.S4, V5.S4, V1.S4; \
	VFMLA V18.S4, V6.S4, V2.S4; \
	VFMLA V19.S4, V7.S4, V3.S4

// func dotF32NEON(x *float32, w unsafe.Pointer, n int) float32
TEXT ·dotF32NEON(SB), NOSPLIT, $0-28
	MOVD x+0(FP), R0
	MOVD w+8(FP), R1
	MOVD n+16(FP), R2
	ZERO4
	CMP  $16, R2
	BLT  tail

loop16:
	VLD1.P 64(R0), [V4.S4, V5.S4, V6.S4, V7.S4]
	VLD1.P 64(R1), [V16.S4, V17.S4, V18.S4, V19.S4]
	FMLA16
	SUB  $16, R2, R2
	CMP  $16, R2
	BGE  loop16

tail:
	CBZ R2, done

loop4:
	VLD1.P 16(R0), [V4.S4]
	VLD1.P 16(R1), [V16.S4]
	VFMLA  V16.S4, V4.S4, V0.S4
	SUBS   $4, R2, R2
	BNE    loop4

done:
	SUM4
	FMOVS F0, ret+24(FP)
	RET

// func dotF16NEON(x *float32, w unsafe.Pointer, n int) float32
TEXT ·dotF16NEON(SB), NOSPLIT, $0-28
	MOVD x+0(FP), R0
	MOVD w+8(FP), R1
	MOVD n+16(FP), R2
	ZERO4
	CMP  $16, R2
	BLT  tail

loop16:
	VLD1.P 64(R0), [V4.S4, V5.S4, V6.S4, V7.S4]
	VLD1.P 32(R1), [V20.H8, V21.H8]
	FCVTL(16, 20)  // fcvtl v16.4s, v20.4h
	FCVTL2(17, 20) // fcvtl2 v17.4s, v20.8h
	FCVTL(18, 21)  // fcvtl v18.4s, v21.4h
	FCVTL2(19, 21) // fcvtl2 v19.4s, v21.8h
	FMLA16
	SUB  $16, R2, R2
	CMP  $16, R2
	BGE  loop16

tail:
	CBZ R2, done

loop4:
	VLD1.P 16(R0), [V4.S4]
	VLD1.P 8(R1), [V20.H4]
	FCVTL(16, 20)  // fcvtl v16.4s, v20.4h
	VFMLA  V16.S4, V4.S4, V0.S4
	SUBS   $4, R2, R2
	BNE    loop4

done:
	SUM4
	FMOVS F0, ret+24(FP)
	RET

// func dotBF16NEON(x *float32, w unsafe.Pointer, n int) float32
TEXT ·dotBF16NEON(SB), NOSPLIT, $0-28
	MOVD x+0(FP), R0
	MOVD w+8(FP), R1
	MOVD n+16(FP), R2
	ZERO4
	CMP  $16, R2
	BLT  tail

loop16:
	VLD1.P 64(R0), [V4.S4, V5.S4, V6.S4, V7.S4]
	VLD1.P 32(R1), [V20.H8, V21.H8]
	SHLL16(16, 20)  // shll v16.4s, v20.4h, #16
	SHLL216(17, 20) // shll2 v17.4s, v20.8h, #16
	SHLL16(18, 21)  // shll v18.4s, v21.4h, #16
	SHLL216(19, 21) // shll2 v19.4s, v21.8h, #16
	FMLA16
	SUB  $16, R2, R2
	CMP  $16, R2
	BGE  loop16

tail:
	CBZ R2, done

loop4:
	VLD1.P 16(R0), [V4.S4]
	VLD1.P 8(R1), [V20.H4]
	SHLL16(16, 20) // shll v16.4s, v20.4h, #16
	VFMLA  V16.S4, V4.S4, V0.S4
	SUBS   $4, R2, R2
	BNE    loop4

done:
	SUM4
	FMOVS F0, ret+24(FP)
	RET

// func axpyF32NEON(y *float32, x *float32, a float32, n int)
TEXT ·axpyF32NEON(SB), NOSPLIT, $0-32
	MOVD  y+0(FP), R0
	MOVD  x+8(FP), R1
	FMOVS a+16(FP), F8
	MOVD  n+24(FP), R2
	VDUP  V8.S[0], V8.S4
	CMP   $16, R2
	BLT   tail

loop16:
	VLD1   (R0), [V4.S4, V5.S4, V6.S4, V7.S4]
	VLD1.P 64(R1), [V16.S4, V17.S4, V18.S4, V19.S4]
	VFMLA  V8.S4, V16.S4, V4.S4
	VFMLA  V8.S4, V17.S4, V5.S4
	VFMLA  V8.S4, V18.S4, V6.S4
	VFMLA  V8.S4, V19.S4, V7.S4
	VST1.P [V4.S4, V5.S4, V6.S4, V7.S4], 64(R0)
	SUB    $16, R2, R2
	CMP    $16, R2
	BGE    loop16

tail:
	CBZ R2, done

loop4:
	VLD1   (R0), [V4.S4]
	VLD1.P 16(R1), [V16.S4]
	VFMLA  V8.S4, V16.S4, V4.S4
	VST1.P [V4.S4], 16(R0)
	SUBS   $4, R2, R2
	BNE    loop4

done:
	RET

// func dotRowsF32NEON(x *float32, rows *float32, d int, n int, out *float32)
//
// dotF32NEON of x with each of n consecutive rows of d floats: R1 runs
// on from one row into the next, R5 writes out.
TEXT ·dotRowsF32NEON(SB), NOSPLIT, $0-40
	MOVD x+0(FP), R0
	MOVD rows+8(FP), R1
	MOVD d+16(FP), R3
	MOVD n+24(FP), R4
	MOVD out+32(FP), R5
	CBZ  R4, end

row:
	MOVD R0, R6
	MOVD R3, R2
	ZERO4
	CMP  $16, R2
	BLT  tail

loop16:
	VLD1.P 64(R6), [V4.S4, V5.S4, V6.S4, V7.S4]
	VLD1.P 64(R1), [V16.S4, V17.S4, V18.S4, V19.S4]
	FMLA16
	SUB  $16, R2, R2
	CMP  $16, R2
	BGE  loop16

tail:
	CBZ R2, done

loop4:
	VLD1.P 16(R6), [V4.S4]
	VLD1.P 16(R1), [V16.S4]
	VFMLA  V16.S4, V4.S4, V0.S4
	SUBS   $4, R2, R2
	BNE    loop4

done:
	SUM4
	FMOVS.P F0, 4(R5)
	SUBS $1, R4, R4
	BNE  row

end:
	RET

// func axpyRowsF32NEON(y *float32, p *float32, rows *float32, d int, n int)
//
// y += sum over r < n of p[r]*rows[r], four columns at a time: each
// vector of y stays in V0 over the n rows (R7 steps down a column by the
// row stride R8), then moves on to the next four columns.
TEXT ·axpyRowsF32NEON(SB), NOSPLIT, $0-40
	MOVD y+0(FP), R0
	MOVD p+8(FP), R1
	MOVD rows+16(FP), R2
	MOVD d+24(FP), R3
	MOVD n+32(FP), R4
	CBZ  R4, end
	CBZ  R3, end
	LSL  $2, R3, R8

col:
	VLD1 (R0), [V0.S4]
	MOVD R2, R7
	MOVD R1, R6
	MOVD R4, R5

r:
	VLD1R.P 4(R6), [V1.S4]
	VLD1    (R7), [V2.S4]
	VFMLA   V1.S4, V2.S4, V0.S4
	ADD     R8, R7, R7
	SUBS    $1, R5, R5
	BNE     r

	VST1.P [V0.S4], 16(R0)
	ADD    $16, R2, R2
	SUBS   $4, R3, R3
	BNE    col

end:
	RET

// func quantQ8NEON(x *float32, q *int8, meta *uint32, nb int)
//
// quantizeQ8 of nb blocks of 32 floats, with quantizeRows' meta: per
// block the f32 bits of d = max|x|/127 and -128 times the sum of q. The
// steps are quantizeQ8's in f32 (d, 1/d, x*(1/d) each rounded once), and
// fcvtas rounds ties away from zero as math.Round does, so q matches it
// bit for bit; |x*(1/d)| exceeds 127 by a few ulps at most, so rounding
// lands in [-127, 127] and the saturating narrows never clip.
TEXT ·quantQ8NEON(SB), NOSPLIT, $0-32
	MOVD  x+0(FP), R0
	MOVD  q+8(FP), R1
	MOVD  meta+16(FP), R2
	MOVD  nb+24(FP), R3
	MOVW  $0x42fe0000, R9 // 127.0
	FMOVS R9, F29
	FMOVS $1.0, F30
	CBZ   R3, end

blk:
	VLD1.P 64(R0), [V0.S4, V1.S4, V2.S4, V3.S4]
	VLD1.P 64(R0), [V4.S4, V5.S4, V6.S4, V7.S4]
	FABS4(16, 0)       // fabs v16.4s, v0.4s
	FABS4(17, 1)       // fabs v17.4s, v1.4s
	FABS4(18, 2)       // fabs v18.4s, v2.4s
	FABS4(19, 3)       // fabs v19.4s, v3.4s
	FABS4(20, 4)       // fabs v20.4s, v4.4s
	FABS4(21, 5)       // fabs v21.4s, v5.4s
	FABS4(22, 6)       // fabs v22.4s, v6.4s
	FABS4(23, 7)       // fabs v23.4s, v7.4s
	FMAX4(16, 16, 17)  // fmax v16.4s, v16.4s, v17.4s
	FMAX4(18, 18, 19)  // fmax v18.4s, v18.4s, v19.4s
	FMAX4(20, 20, 21)  // fmax v20.4s, v20.4s, v21.4s
	FMAX4(22, 22, 23)  // fmax v22.4s, v22.4s, v23.4s
	FMAX4(16, 16, 18)  // fmax v16.4s, v16.4s, v18.4s
	FMAX4(20, 20, 22)  // fmax v20.4s, v20.4s, v22.4s
	FMAX4(16, 16, 20)  // fmax v16.4s, v16.4s, v20.4s
	FMAXV(16, 16)      // fmaxv s16, v16.4s
	FDIVS F29, F16, F17 // d = amax/127
	FMOVS F17, (R2)
	FCMPS $(0.0), F17
	BEQ   zero
	FDIVS F17, F30, F18 // 1/d
	FMULE(0, 0, 18, 0) // fmul v0.4s, v0.4s, v18.s[0]
	FMULE(1, 1, 18, 0) // fmul v1.4s, v1.4s, v18.s[0]
	FMULE(2, 2, 18, 0) // fmul v2.4s, v2.4s, v18.s[0]
	FMULE(3, 3, 18, 0) // fmul v3.4s, v3.4s, v18.s[0]
	FMULE(4, 4, 18, 0) // fmul v4.4s, v4.4s, v18.s[0]
	FMULE(5, 5, 18, 0) // fmul v5.4s, v5.4s, v18.s[0]
	FMULE(6, 6, 18, 0) // fmul v6.4s, v6.4s, v18.s[0]
	FMULE(7, 7, 18, 0) // fmul v7.4s, v7.4s, v18.s[0]
	FCVTAS(0, 0)       // fcvtas v0.4s, v0.4s
	FCVTAS(1, 1)       // fcvtas v1.4s, v1.4s
	FCVTAS(2, 2)       // fcvtas v2.4s, v2.4s
	FCVTAS(3, 3)       // fcvtas v3.4s, v3.4s
	FCVTAS(4, 4)       // fcvtas v4.4s, v4.4s
	FCVTAS(5, 5)       // fcvtas v5.4s, v5.4s
	FCVTAS(6, 6)       // fcvtas v6.4s, v6.4s
	FCVTAS(7, 7)       // fcvtas v7.4s, v7.4s
	VADD  V1.S4, V0.S4, V24.S4
	VADD  V3.S4, V2.S4, V25.S4
	VADD  V5.S4, V4.S4, V26.S4
	VADD  V7.S4, V6.S4, V27.S4
	VADD  V25.S4, V24.S4, V24.S4
	VADD  V27.S4, V26.S4, V26.S4
	VADD  V26.S4, V24.S4, V24.S4
	VADDV V24.S4, V24
	FMOVS F24, R9
	NEGW  R9, R9
	LSLW  $7, R9, R9
	MOVW  R9, 4(R2)
	SQXTNH(16, 0)      // sqxtn v16.4h, v0.4s
	SQXTN2H(16, 1)     // sqxtn2 v16.8h, v1.4s
	SQXTNH(17, 2)      // sqxtn v17.4h, v2.4s
	SQXTN2H(17, 3)     // sqxtn2 v17.8h, v3.4s
	SQXTNH(18, 4)      // sqxtn v18.4h, v4.4s
	SQXTN2H(18, 5)     // sqxtn2 v18.8h, v5.4s
	SQXTNH(19, 6)      // sqxtn v19.4h, v6.4s
	SQXTN2H(19, 7)     // sqxtn2 v19.8h, v7.4s
	SQXTNB(20, 16)     // sqxtn v20.8b, v16.8h
	SQXTN2B(20, 17)    // sqxtn2 v20.16b, v17.8h
	SQXTNB(21, 18)     // sqxtn v21.8b, v18.8h
	SQXTN2B(21, 19)    // sqxtn2 v21.16b, v19.8h
	VST1.P [V20.B16, V21.B16], 32(R1)
	B     next

zero:
	VEOR   V20.B16, V20.B16, V20.B16
	VEOR   V21.B16, V21.B16, V21.B16
	VST1.P [V20.B16, V21.B16], 32(R1)
	MOVW   ZR, 4(R2)

next:
	ADD  $8, R2, R2
	SUBS $1, R3, R3
	BNE  blk

end:
	RET

// func expSumNEON(x *float32, n int, m, scale float32) float32
//
// x[i] = exp(t), t = scale*(x[i] - m), for n elements (a multiple of 4),
// returning their sum. exp(t) = 2^k * e^f with k = round(t*log2 e) and
// f = t - k*ln 2 in [-ln2/2, ln2/2] (ln 2 in two parts, so f is exact to
// f32 rounding); e^f is its degree-6 Taylor polynomial (truncation under
// 1.3e-7 relative), and 2^k is added to its exponent field as an integer.
// That scale is a normal number for t >= -87; below (-Inf included) the
// result is set to 0, the exact one being under 2^-125.
TEXT ·expSumNEON(SB), NOSPLIT, $0-28
	MOVD  x+0(FP), R0
	MOVD  n+8(FP), R1
	FMOVS m+16(FP), F20
	VDUP  V20.S[0], V20.S4
	FMOVS scale+20(FP), F19
	VDUP  V19.S[0], V19.S4
	MOVW  $0x3FB8AA3B, R9 // log2 e
	VDUP  R9, V21.S4
	MOVW  $0x3F318000, R9 // ln 2, high part
	VDUP  R9, V22.S4
	MOVW  $0xB95E8083, R9 // ln 2, low part (negative)
	VDUP  R9, V23.S4
	MOVW  $0x3AB60B61, R9 // 1/720
	VDUP  R9, V24.S4
	MOVW  $0x3C088889, R9 // 1/120
	VDUP  R9, V25.S4
	MOVW  $0x3D2AAAAB, R9 // 1/24
	VDUP  R9, V26.S4
	MOVW  $0x3E2AAAAB, R9 // 1/6
	VDUP  R9, V27.S4
	MOVW  $0x3F000000, R9 // 1/2
	VDUP  R9, V28.S4
	MOVW  $0x3F800000, R9 // 1
	VDUP  R9, V29.S4
	MOVW  $0xC2AE0000, R9 // -87
	VDUP  R9, V30.S4
	VEOR  V0.B16, V0.B16, V0.B16
	CBZ   R1, done

loop:
	VLD1   (R0), [V1.S4]
	FSUB4(1, 1, 20)   // fsub v1.4s, v1.4s, v20.4s
	FMUL4(1, 1, 19)   // fmul v1.4s, v1.4s, v19.4s
	FCMGE4(6, 1, 30)  // fcmge v6.4s, v1.4s, v30.4s
	FMUL4(2, 1, 21)   // fmul v2.4s, v1.4s, v21.4s
	FCVTNS(4, 2)      // fcvtns v4.4s, v2.4s
	SCVTF(2, 4)       // scvtf v2.4s, v4.4s
	VFMLS  V22.S4, V2.S4, V1.S4
	VFMLS  V23.S4, V2.S4, V1.S4
	FMUL4(3, 24, 1)   // fmul v3.4s, v24.4s, v1.4s
	FADD4(3, 3, 25)   // fadd v3.4s, v3.4s, v25.4s
	FMUL4(3, 3, 1)    // fmul v3.4s, v3.4s, v1.4s
	FADD4(3, 3, 26)   // fadd v3.4s, v3.4s, v26.4s
	FMUL4(3, 3, 1)    // fmul v3.4s, v3.4s, v1.4s
	FADD4(3, 3, 27)   // fadd v3.4s, v3.4s, v27.4s
	FMUL4(3, 3, 1)    // fmul v3.4s, v3.4s, v1.4s
	FADD4(3, 3, 28)   // fadd v3.4s, v3.4s, v28.4s
	FMUL4(3, 3, 1)    // fmul v3.4s, v3.4s, v1.4s
	FADD4(3, 3, 29)   // fadd v3.4s, v3.4s, v29.4s
	FMUL4(3, 3, 1)    // fmul v3.4s, v3.4s, v1.4s
	FADD4(3, 3, 29)   // fadd v3.4s, v3.4s, v29.4s
	VSHL   $23, V4.S4, V4.S4
	VADD   V4.S4, V3.S4, V3.S4
	VAND   V6.B16, V3.B16, V3.B16
	VST1.P [V3.S4], 16(R0)
	FADD4(0, 0, 3)    // fadd v0.4s, v0.4s, v3.4s
	SUBS   $4, R1, R1
	BNE    loop

done:
	HSUM0
	FMOVS F0, ret+24(FP)
	RET

// func dotAWQ4NEON(x *float32, w *byte, nb int, group int) float32
//
// nb AWQ4 blocks of group elements (an F16 scale, an F16 zero point, then
// group/2 bytes of nibbles, a 32-bit word eight elements in AutoAWQ's
// interleave: nibble i holds element backend.AWQOrder[i]) against f32 x:
// the sum over blocks of scale * sum x*(q - zero). Each word is
// duplicated to four lanes twice and shifted right by the nibble
// positions of elements 0-3 (nibbles 0, 4, 1, 5) and 4-7 (2, 6, 3, 7).
TEXT ·dotAWQ4NEON(SB), NOSPLIT, $0-36
	MOVD x+0(FP), R0
	MOVD w+8(FP), R1
	MOVD nb+16(FP), R2
	MOVD group+24(FP), R3
	LSR  $3, R3, R3 // words a block
	MOVW $-16, R5
	VMOV R5, V30.S[1]
	MOVW $-4, R5
	VMOV R5, V30.S[2]
	MOVW $-20, R5
	VMOV R5, V30.S[3]
	VMOV ZR, V30.S[0]
	MOVW $-8, R5
	VMOV R5, V31.S[0]
	MOVW $-24, R5
	VMOV R5, V31.S[1]
	MOVW $-12, R5
	VMOV R5, V31.S[2]
	MOVW $-28, R5
	VMOV R5, V31.S[3]
	MOVW $15, R5
	VDUP R5, V29.S4
	VEOR V0.B16, V0.B16, V0.B16
	CBZ  R2, awqdone

awqblock:
	MOVWU.P 4(R1), R5 // scale, zero point
	VMOV    R5, V4.S[0]
	FCVTL(4, 4)       // fcvtl v4.4s, v4.4h
	VDUP    V4.S[0], V5.S4
	VDUP    V4.S[1], V6.S4
	VEOR    V1.B16, V1.B16, V1.B16
	VEOR    V2.B16, V2.B16, V2.B16
	MOVD    R3, R6

awqword:
	MOVWU.P 4(R1), R5
	VDUP    R5, V7.S4
	USHL4(16, 7, 30) // ushl v16.4s, v7.4s, v30.4s
	USHL4(17, 7, 31) // ushl v17.4s, v7.4s, v31.4s
	VAND    V29.B16, V16.B16, V16.B16
	VAND    V29.B16, V17.B16, V17.B16
	UCVTF(16, 16)     // ucvtf v16.4s, v16.4s
	UCVTF(17, 17)     // ucvtf v17.4s, v17.4s
	FSUB4(16, 16, 6)  // fsub v16.4s, v16.4s, v6.4s: q - zero
	FSUB4(17, 17, 6)  // fsub v17.4s, v17.4s, v6.4s
	VLD1.P  32(R0), [V18.S4, V19.S4]
	VFMLA   V16.S4, V18.S4, V1.S4
	VFMLA   V17.S4, V19.S4, V2.S4
	SUBS    $1, R6, R6
	BNE     awqword
	FADD4(1, 1, 2)    // fadd v1.4s, v1.4s, v2.4s
	VFMLA   V5.S4, V1.S4, V0.S4
	SUBS    $1, R2, R2
	BNE     awqblock

awqdone:
	FADDP4(0, 0, 0) // faddp v0.4s, v0.4s, v0.4s
	FADDP2(0, 0)    // faddp s0, v0.2s
	FMOVS F0, ret+32(FP)
	RET

// func dotF8RowNEON(x *float32, w *byte, n int) float32
//
// n f32 x against n e4m3fn codes (n a multiple of 16), before the row's
// scale. A code becomes the F16 of its value / 256 by shifts and masks
// (exponent and mantissa into the F16's, the sign into its sign; the
// biases 15 and 7 differ by 8, subnormals included); the sum is
// multiplied by 256. NaN codes read as 480 (weights hold none).
TEXT ·dotF8RowNEON(SB), NOSPLIT, $0-28
	MOVD x+0(FP), R0
	MOVD w+8(FP), R1
	MOVD n+16(FP), R2
	MOVW $0x3f803f80, R5
	VDUP R5, V28.S4
	MOVW $0x80008000, R5
	VDUP R5, V27.S4
	VEOR V0.B16, V0.B16, V0.B16
	VEOR V1.B16, V1.B16, V1.B16
	VEOR V2.B16, V2.B16, V2.B16
	VEOR V3.B16, V3.B16, V3.B16
	CBZ  R2, f8done

f8loop:
	VLD1.P 16(R1), [V8.B16]
	UXTLB(16, 8)  // ushll v16.8h, v8.8b, #0
	UXTL2B(17, 8) // ushll2 v17.8h, v8.16b, #0
	VSHL   $7, V16.H8, V18.H8
	VSHL   $7, V17.H8, V19.H8
	VAND   V28.B16, V18.B16, V18.B16
	VAND   V28.B16, V19.B16, V19.B16
	VSHL   $8, V16.H8, V16.H8
	VSHL   $8, V17.H8, V17.H8
	VAND   V27.B16, V16.B16, V16.B16
	VAND   V27.B16, V17.B16, V17.B16
	VORR   V18.B16, V16.B16, V16.B16
	VORR   V19.B16, V17.B16, V17.B16
	FCVTL(20, 16)  // fcvtl v20.4s, v16.4h
	FCVTL2(21, 16) // fcvtl2 v21.4s, v16.8h
	FCVTL(22, 17)  // fcvtl v22.4s, v17.4h
	FCVTL2(23, 17) // fcvtl2 v23.4s, v17.8h
	VLD1.P 64(R0), [V4.S4, V5.S4, V6.S4, V7.S4]
	VFMLA  V20.S4, V4.S4, V0.S4
	VFMLA  V21.S4, V5.S4, V1.S4
	VFMLA  V22.S4, V6.S4, V2.S4
	VFMLA  V23.S4, V7.S4, V3.S4
	SUBS   $16, R2, R2
	BNE    f8loop

f8done:
	FADD4(0, 0, 1) // fadd v0.4s, v0.4s, v1.4s
	FADD4(2, 2, 3) // fadd v2.4s, v2.4s, v3.4s
	FADD4(0, 0, 2) // fadd v0.4s, v0.4s, v2.4s
	FADDP4(0, 0, 0)
	FADDP2(0, 0)
	MOVW $0x43800000, R5 // 256
	FMOVS R5, F1
	FMULS F1, F0, F0
	FMOVS F0, ret+24(FP)
	RET
