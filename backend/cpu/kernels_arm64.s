//go:build arm64 && !purego

// The arm64 kernels (NEON; SDOT where the dot-product extension is
// present), written by hand: each is one short loop, so there is no
// repetition a generator would take away.
//
// Go's arm64 assembler has no mnemonic for several NEON instructions
// used here. The macros below encode them with WORD; they take register
// numbers in the Arm operand order (destination first), and the comment
// beside each use spells the instruction in Arm syntax. The native
// mnemonics keep Go's order (sources first, destination last).

#include "textflag.h"

// sdot vd.4s, vn.16b, vm.16b: each int32 lane of vd += the sum of the
// four products of its signed bytes (ARMv8.2 dot product).
#define SDOT(d, n, m) WORD $(0x4e809400 | (m)<<16 | (n)<<5 | (d))
// smull vd.8h, vn.8b, vm.8b and smlal2 vd.8h, vn.16b, vm.16b: signed
// widening byte products (low halves), accumulated (high halves).
#define SMULL(d, n, m) WORD $(0x0e20c000 | (m)<<16 | (n)<<5 | (d))
#define SMLAL2(d, n, m) WORD $(0x4e208000 | (m)<<16 | (n)<<5 | (d))
// sadalp vd.4s, vn.8h: vd += pairwise sums of the int16 lanes of vn.
#define SADALP(d, n) WORD $(0x4e606800 | (n)<<5 | (d))
// scvtf vd.4s, vn.4s: int32 to f32.
#define SCVTF(d, n) WORD $(0x4e21d800 | (n)<<5 | (d))
// fcvtas vd.4s, vn.4s: f32 to int32, rounding to nearest with ties away
// from zero (math.Round's rule).
#define FCVTAS(d, n) WORD $(0x4e21c800 | (n)<<5 | (d))
// fcvtl vd.4s, vn.4h and fcvtl2 vd.4s, vn.8h: f16 to f32 (low, high half).
#define FCVTL(d, n) WORD $(0x0e217800 | (n)<<5 | (d))
#define FCVTL2(d, n) WORD $(0x4e217800 | (n)<<5 | (d))
// shll vd.4s, vn.4h, #16 and shll2 vd.4s, vn.8h, #16: u16 lanes widened
// and shifted into the top half of u32 lanes (bf16 to f32).
#define SHLL16(d, n) WORD $(0x2e613800 | (n)<<5 | (d))
#define SHLL216(d, n) WORD $(0x6e613800 | (n)<<5 | (d))
// sqxtn vd.4h, vn.4s / sqxtn2 vd.8h, vn.4s and sqxtn vd.8b, vn.8h /
// sqxtn2 vd.16b, vn.8h: saturating narrows to the low / high half of vd.
#define SQXTNH(d, n) WORD $(0x0e614800 | (n)<<5 | (d))
#define SQXTN2H(d, n) WORD $(0x4e614800 | (n)<<5 | (d))
#define SQXTNB(d, n) WORD $(0x0e214800 | (n)<<5 | (d))
#define SQXTN2B(d, n) WORD $(0x4e214800 | (n)<<5 | (d))
// fadd / fmul / fmax vd.4s, vn.4s, vm.4s; fabs vd.4s, vn.4s.
#define FADD4(d, n, m) WORD $(0x4e20d400 | (m)<<16 | (n)<<5 | (d))
#define FMUL4(d, n, m) WORD $(0x6e20dc00 | (m)<<16 | (n)<<5 | (d))
#define FMAX4(d, n, m) WORD $(0x4e20f400 | (m)<<16 | (n)<<5 | (d))
#define FABS4(d, n) WORD $(0x4ea0f800 | (n)<<5 | (d))
// fmaxv sd, vn.4s: the largest lane.
#define FMAXV(d, n) WORD $(0x6e30f800 | (n)<<5 | (d))
// faddp vd.4s, vn.4s, vm.4s (pairwise sums) and faddp sd, vn.2s.
#define FADDP4(d, n, m) WORD $(0x6e20d400 | (m)<<16 | (n)<<5 | (d))
#define FADDP2(d, n) WORD $(0x7e30d800 | (n)<<5 | (d))
// fmla vd.4s, vn.4s, vm.s[l] and fmul vd.4s, vn.4s, vm.s[l]: by lane l
// of vm (m < 32, l < 4).
#define FMLAE(d, n, m, l) WORD $(0x4f801000 | ((l)&1)<<21 | ((l)>>1)<<11 | (m)<<16 | (n)<<5 | (d))
#define FMULE(d, n, m, l) WORD $(0x4f809000 | ((l)&1)<<21 | ((l)>>1)<<11 | (m)<<16 | (n)<<5 | (d))

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
// out[0..rows) through R6; R5 counts rows.

// func dotQ8RowsSDOT(xq *int8, xs *float32, w *byte, nb int, rows int, out *float32)
TEXT ·dotQ8RowsSDOT(SB), NOSPLIT, $0-48
	MOVD w+16(FP), R2
	MOVD rows+32(FP), R5
	MOVD out+40(FP), R6
	CBZ  R5, end

row:
	MOVD xq+0(FP), R0
	MOVD xs+8(FP), R1
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
	FMOVS.P F0, 4(R6)
	SUBS $1, R5, R5
	BNE  row

end:
	RET

// func dotQ4RowsSDOT(xq *int8, xs *float32, w *byte, nb int, rows int, out *float32)
TEXT ·dotQ4RowsSDOT(SB), NOSPLIT, $0-48
	MOVD w+16(FP), R2
	MOVD rows+32(FP), R5
	MOVD out+40(FP), R6
	Q4CONSTS
	CBZ  R5, end

row:
	MOVD xq+0(FP), R0
	MOVD xs+8(FP), R1
	MOVD nb+24(FP), R3
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
	FMOVS.P F0, 4(R6)
	SUBS $1, R5, R5
	BNE  row

end:
	RET

// func dotQ8RowsNEON(xq *int8, xs *float32, w *byte, nb int, rows int, out *float32)
TEXT ·dotQ8RowsNEON(SB), NOSPLIT, $0-48
	MOVD w+16(FP), R2
	MOVD rows+32(FP), R5
	MOVD out+40(FP), R6
	CBZ  R5, end

row:
	MOVD xq+0(FP), R0
	MOVD xs+8(FP), R1
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
	FMOVS.P F0, 4(R6)
	SUBS $1, R5, R5
	BNE  row

end:
	RET

// func dotQ4RowsNEON(xq *int8, xs *float32, w *byte, nb int, rows int, out *float32)
TEXT ·dotQ4RowsNEON(SB), NOSPLIT, $0-48
	MOVD w+16(FP), R2
	MOVD rows+32(FP), R5
	MOVD out+40(FP), R6
	Q4CONSTS
	CBZ  R5, end

row:
	MOVD xq+0(FP), R0
	MOVD xs+8(FP), R1
	MOVD nb+24(FP), R3
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

// The f32 GEMM micro-kernels gemmN<m>: c[i][j] = sum_p a[i][p] * b[p][j]
// for i < m and j < 16, b a packed panel of k rows of 16 floats (V0-V3 a
// step). Row i's a pointer is R10+i, its accumulators V(8+4i)-V(11+4i)
// (up to 6 rows: V8-V31); each step loads a[i][p] into lane 0 of one of
// V4-V7 and multiplies the panel row by it with fmla by element.

// GZERO clears one row's accumulators.
#define GZERO(c0, c1, c2, c3) \
	VEOR c0.B16, c0.B16, c0.B16; \
	VEOR c1.B16, c1.B16, c1.B16; \
	VEOR c2.B16, c2.B16, c2.B16; \
	VEOR c3.B16, c3.B16, c3.B16

// GSTEP adds a[i][p] (loaded through ptr into Fa, register number a)
// times the panel row V0-V3 to accumulators c0-c3 (register numbers).
#define GSTEP(ptr, Fa, a, c0, c1, c2, c3) \
	FMOVS.P 4(ptr), Fa; \
	FMLAE(c0, 0, a, 0) /* fmla v<c0>.4s, v0.4s, v<a>.s[0] */; \
	FMLAE(c1, 1, a, 0); \
	FMLAE(c2, 2, a, 0); \
	FMLAE(c3, 3, a, 0)

// GSTORE writes one row of c through R3 and moves R3 on by ldc (R4).
#define GSTORE(c0, c1, c2, c3) \
	VST1 [c0.S4, c1.S4, c2.S4, c3.S4], (R3); \
	ADD  R4, R3, R3

// func gemmN1(a *float32, lda uintptr, b *float32, c *float32, ldc uintptr, k int)
TEXT ·gemmN1(SB), NOSPLIT, $0-48
	MOVD a+0(FP), R10
	MOVD lda+8(FP), R1
	MOVD b+16(FP), R2
	MOVD c+24(FP), R3
	MOVD ldc+32(FP), R4
	MOVD k+40(FP), R5
	GZERO(V8, V9, V10, V11)
	CBZ  R5, store

loop:
	VLD1.P 64(R2), [V0.S4, V1.S4, V2.S4, V3.S4]
	GSTEP(R10, F4, 4, 8, 9, 10, 11)
	SUBS $1, R5, R5
	BNE  loop

store:
	GSTORE(V8, V9, V10, V11)
	RET

// func gemmN2(a *float32, lda uintptr, b *float32, c *float32, ldc uintptr, k int)
TEXT ·gemmN2(SB), NOSPLIT, $0-48
	MOVD a+0(FP), R10
	MOVD lda+8(FP), R1
	MOVD b+16(FP), R2
	MOVD c+24(FP), R3
	MOVD ldc+32(FP), R4
	MOVD k+40(FP), R5
	ADD  R1, R10, R11
	GZERO(V8, V9, V10, V11)
	GZERO(V12, V13, V14, V15)
	CBZ  R5, store

loop:
	VLD1.P 64(R2), [V0.S4, V1.S4, V2.S4, V3.S4]
	GSTEP(R10, F4, 4, 8, 9, 10, 11)
	GSTEP(R11, F5, 5, 12, 13, 14, 15)
	SUBS $1, R5, R5
	BNE  loop

store:
	GSTORE(V8, V9, V10, V11)
	GSTORE(V12, V13, V14, V15)
	RET

// func gemmN3(a *float32, lda uintptr, b *float32, c *float32, ldc uintptr, k int)
TEXT ·gemmN3(SB), NOSPLIT, $0-48
	MOVD a+0(FP), R10
	MOVD lda+8(FP), R1
	MOVD b+16(FP), R2
	MOVD c+24(FP), R3
	MOVD ldc+32(FP), R4
	MOVD k+40(FP), R5
	ADD  R1, R10, R11
	ADD  R1, R11, R12
	GZERO(V8, V9, V10, V11)
	GZERO(V12, V13, V14, V15)
	GZERO(V16, V17, V18, V19)
	CBZ  R5, store

loop:
	VLD1.P 64(R2), [V0.S4, V1.S4, V2.S4, V3.S4]
	GSTEP(R10, F4, 4, 8, 9, 10, 11)
	GSTEP(R11, F5, 5, 12, 13, 14, 15)
	GSTEP(R12, F6, 6, 16, 17, 18, 19)
	SUBS $1, R5, R5
	BNE  loop

store:
	GSTORE(V8, V9, V10, V11)
	GSTORE(V12, V13, V14, V15)
	GSTORE(V16, V17, V18, V19)
	RET

// func gemmN4(a *float32, lda uintptr, b *float32, c *float32, ldc uintptr, k int)
TEXT ·gemmN4(SB), NOSPLIT, $0-48
	MOVD a+0(FP), R10
	MOVD lda+8(FP), R1
	MOVD b+16(FP), R2
	MOVD c+24(FP), R3
	MOVD ldc+32(FP), R4
	MOVD k+40(FP), R5
	ADD  R1, R10, R11
	ADD  R1, R11, R12
	ADD  R1, R12, R13
	GZERO(V8, V9, V10, V11)
	GZERO(V12, V13, V14, V15)
	GZERO(V16, V17, V18, V19)
	GZERO(V20, V21, V22, V23)
	CBZ  R5, store

loop:
	VLD1.P 64(R2), [V0.S4, V1.S4, V2.S4, V3.S4]
	GSTEP(R10, F4, 4, 8, 9, 10, 11)
	GSTEP(R11, F5, 5, 12, 13, 14, 15)
	GSTEP(R12, F6, 6, 16, 17, 18, 19)
	GSTEP(R13, F7, 7, 20, 21, 22, 23)
	SUBS $1, R5, R5
	BNE  loop

store:
	GSTORE(V8, V9, V10, V11)
	GSTORE(V12, V13, V14, V15)
	GSTORE(V16, V17, V18, V19)
	GSTORE(V20, V21, V22, V23)
	RET

// func gemmN5(a *float32, lda uintptr, b *float32, c *float32, ldc uintptr, k int)
TEXT ·gemmN5(SB), NOSPLIT, $0-48
	MOVD a+0(FP), R10
	MOVD lda+8(FP), R1
	MOVD b+16(FP), R2
	MOVD c+24(FP), R3
	MOVD ldc+32(FP), R4
	MOVD k+40(FP), R5
	ADD  R1, R10, R11
	ADD  R1, R11, R12
	ADD  R1, R12, R13
	ADD  R1, R13, R14
	GZERO(V8, V9, V10, V11)
	GZERO(V12, V13, V14, V15)
	GZERO(V16, V17, V18, V19)
	GZERO(V20, V21, V22, V23)
	GZERO(V24, V25, V26, V27)
	CBZ  R5, store

loop:
	VLD1.P 64(R2), [V0.S4, V1.S4, V2.S4, V3.S4]
	GSTEP(R10, F4, 4, 8, 9, 10, 11)
	GSTEP(R11, F5, 5, 12, 13, 14, 15)
	GSTEP(R12, F6, 6, 16, 17, 18, 19)
	GSTEP(R13, F7, 7, 20, 21, 22, 23)
	GSTEP(R14, F4, 4, 24, 25, 26, 27)
	SUBS $1, R5, R5
	BNE  loop

store:
	GSTORE(V8, V9, V10, V11)
	GSTORE(V12, V13, V14, V15)
	GSTORE(V16, V17, V18, V19)
	GSTORE(V20, V21, V22, V23)
	GSTORE(V24, V25, V26, V27)
	RET

// func gemmN6(a *float32, lda uintptr, b *float32, c *float32, ldc uintptr, k int)
TEXT ·gemmN6(SB), NOSPLIT, $0-48
	MOVD a+0(FP), R10
	MOVD lda+8(FP), R1
	MOVD b+16(FP), R2
	MOVD c+24(FP), R3
	MOVD ldc+32(FP), R4
	MOVD k+40(FP), R5
	ADD  R1, R10, R11
	ADD  R1, R11, R12
	ADD  R1, R12, R13
	ADD  R1, R13, R14
	ADD  R1, R14, R15
	GZERO(V8, V9, V10, V11)
	GZERO(V12, V13, V14, V15)
	GZERO(V16, V17, V18, V19)
	GZERO(V20, V21, V22, V23)
	GZERO(V24, V25, V26, V27)
	GZERO(V28, V29, V30, V31)
	CBZ  R5, store

loop:
	VLD1.P 64(R2), [V0.S4, V1.S4, V2.S4, V3.S4]
	GSTEP(R10, F4, 4, 8, 9, 10, 11)
	GSTEP(R11, F5, 5, 12, 13, 14, 15)
	GSTEP(R12, F6, 6, 16, 17, 18, 19)
	GSTEP(R13, F7, 7, 20, 21, 22, 23)
	GSTEP(R14, F4, 4, 24, 25, 26, 27)
	GSTEP(R15, F5, 5, 28, 29, 30, 31)
	SUBS $1, R5, R5
	BNE  loop

store:
	GSTORE(V8, V9, V10, V11)
	GSTORE(V12, V13, V14, V15)
	GSTORE(V16, V17, V18, V19)
	GSTORE(V20, V21, V22, V23)
	GSTORE(V24, V25, V26, V27)
	GSTORE(V28, V29, V30, V31)
	RET

// The int8 GEMM micro-kernels gemmQD<m> (dot-product extension):
// c[i][j] = sum over blocks of d_x[i] * d_w[j] * (x_i . w_j) for i < m
// and j < 8, against a panel packed by packQPanel with nr 8 and flip 0
// (signed weights): per block, 8 groups of 8 features x 4 consecutive
// weights (two vectors of 4 features), then the 8 weight scales. sdot by
// element multiplies a group's 4 features by row i's 4 bytes of that
// group (lane g%4 of the row's x vector for g/4), so each panel load
// serves every row. Row i's x pointer is R10+i (32 bytes a block), its
// meta pointer R19+i (scale bits and the unused offset correction), its
// int32 block sums V(2i), V(2i+1), its f32 sums V(8+2i), V(9+2i), its x
// block V(16+2i), V(17+2i); the panel takes V24, V25 (groups, then the
// weight scales), V26 the row's x scale.

// sdot vd.4s, vn.16b, vm.4b[l]: by lane l of vm.
#define SDOTE(d, n, m, l) WORD $(0x4f80e000 | ((l)&1)<<21 | ((l)>>1)<<11 | (m)<<16 | (n)<<5 | (d))

// func gemmQD1(x *int8, lda uintptr, meta *uint32, ldm uintptr, panel *byte, c *float32, ldc uintptr, nb int)
TEXT ·gemmQD1(SB), NOSPLIT, $0-64
	MOVD x+0(FP), R10
	MOVD lda+8(FP), R0
	MOVD meta+16(FP), R19
	MOVD ldm+24(FP), R1
	MOVD panel+32(FP), R2
	MOVD c+40(FP), R3
	MOVD ldc+48(FP), R4
	MOVD nb+56(FP), R5
	VEOR V8.B16, V8.B16, V8.B16
	VEOR V9.B16, V9.B16, V9.B16
	CBZ  R5, store

blk:
	VLD1.P 32(R10), [V16.B16, V17.B16]
	VEOR   V0.B16, V0.B16, V0.B16
	VEOR   V1.B16, V1.B16, V1.B16
	VLD1.P 32(R2), [V24.B16, V25.B16] // group 0
	SDOTE(0, 24, 16, 0) // sdot v0.4s, v24.16b, v16.4b[0]
	SDOTE(1, 25, 16, 0) // sdot v1.4s, v25.16b, v16.4b[0]
	VLD1.P 32(R2), [V24.B16, V25.B16] // group 1
	SDOTE(0, 24, 16, 1) // sdot v0.4s, v24.16b, v16.4b[1]
	SDOTE(1, 25, 16, 1) // sdot v1.4s, v25.16b, v16.4b[1]
	VLD1.P 32(R2), [V24.B16, V25.B16] // group 2
	SDOTE(0, 24, 16, 2) // sdot v0.4s, v24.16b, v16.4b[2]
	SDOTE(1, 25, 16, 2) // sdot v1.4s, v25.16b, v16.4b[2]
	VLD1.P 32(R2), [V24.B16, V25.B16] // group 3
	SDOTE(0, 24, 16, 3) // sdot v0.4s, v24.16b, v16.4b[3]
	SDOTE(1, 25, 16, 3) // sdot v1.4s, v25.16b, v16.4b[3]
	VLD1.P 32(R2), [V24.B16, V25.B16] // group 4
	SDOTE(0, 24, 17, 0) // sdot v0.4s, v24.16b, v17.4b[0]
	SDOTE(1, 25, 17, 0) // sdot v1.4s, v25.16b, v17.4b[0]
	VLD1.P 32(R2), [V24.B16, V25.B16] // group 5
	SDOTE(0, 24, 17, 1) // sdot v0.4s, v24.16b, v17.4b[1]
	SDOTE(1, 25, 17, 1) // sdot v1.4s, v25.16b, v17.4b[1]
	VLD1.P 32(R2), [V24.B16, V25.B16] // group 6
	SDOTE(0, 24, 17, 2) // sdot v0.4s, v24.16b, v17.4b[2]
	SDOTE(1, 25, 17, 2) // sdot v1.4s, v25.16b, v17.4b[2]
	VLD1.P 32(R2), [V24.B16, V25.B16] // group 7
	SDOTE(0, 24, 17, 3) // sdot v0.4s, v24.16b, v17.4b[3]
	SDOTE(1, 25, 17, 3) // sdot v1.4s, v25.16b, v17.4b[3]
	VLD1.P 32(R2), [V24.S4, V25.S4] // weight scales
	FMOVS.P 8(R19), F26
	SCVTF(0, 0)        // scvtf v0.4s, v0.4s
	SCVTF(1, 1)        // scvtf v1.4s, v1.4s
	FMUL4(0, 0, 24)    // fmul v0.4s, v0.4s, v24.4s
	FMUL4(1, 1, 25)    // fmul v1.4s, v1.4s, v25.4s
	FMLAE(8, 0, 26, 0) // fmla v8.4s, v0.4s, v26.s[0]
	FMLAE(9, 1, 26, 0) // fmla v9.4s, v1.4s, v26.s[0]
	SUBS $1, R5, R5
	BNE  blk

store:
	VST1 [V8.S4, V9.S4], (R3)
	RET

// func gemmQD2(x *int8, lda uintptr, meta *uint32, ldm uintptr, panel *byte, c *float32, ldc uintptr, nb int)
TEXT ·gemmQD2(SB), NOSPLIT, $0-64
	MOVD x+0(FP), R10
	MOVD lda+8(FP), R0
	MOVD meta+16(FP), R19
	MOVD ldm+24(FP), R1
	MOVD panel+32(FP), R2
	MOVD c+40(FP), R3
	MOVD ldc+48(FP), R4
	MOVD nb+56(FP), R5
	ADD  R0, R10, R11
	ADD  R1, R19, R20
	VEOR V8.B16, V8.B16, V8.B16
	VEOR V9.B16, V9.B16, V9.B16
	VEOR V10.B16, V10.B16, V10.B16
	VEOR V11.B16, V11.B16, V11.B16
	CBZ  R5, store

blk:
	VLD1.P 32(R10), [V16.B16, V17.B16]
	VEOR   V0.B16, V0.B16, V0.B16
	VEOR   V1.B16, V1.B16, V1.B16
	VLD1.P 32(R11), [V18.B16, V19.B16]
	VEOR   V2.B16, V2.B16, V2.B16
	VEOR   V3.B16, V3.B16, V3.B16
	VLD1.P 32(R2), [V24.B16, V25.B16] // group 0
	SDOTE(0, 24, 16, 0) // sdot v0.4s, v24.16b, v16.4b[0]
	SDOTE(1, 25, 16, 0) // sdot v1.4s, v25.16b, v16.4b[0]
	SDOTE(2, 24, 18, 0) // sdot v2.4s, v24.16b, v18.4b[0]
	SDOTE(3, 25, 18, 0) // sdot v3.4s, v25.16b, v18.4b[0]
	VLD1.P 32(R2), [V24.B16, V25.B16] // group 1
	SDOTE(0, 24, 16, 1) // sdot v0.4s, v24.16b, v16.4b[1]
	SDOTE(1, 25, 16, 1) // sdot v1.4s, v25.16b, v16.4b[1]
	SDOTE(2, 24, 18, 1) // sdot v2.4s, v24.16b, v18.4b[1]
	SDOTE(3, 25, 18, 1) // sdot v3.4s, v25.16b, v18.4b[1]
	VLD1.P 32(R2), [V24.B16, V25.B16] // group 2
	SDOTE(0, 24, 16, 2) // sdot v0.4s, v24.16b, v16.4b[2]
	SDOTE(1, 25, 16, 2) // sdot v1.4s, v25.16b, v16.4b[2]
	SDOTE(2, 24, 18, 2) // sdot v2.4s, v24.16b, v18.4b[2]
	SDOTE(3, 25, 18, 2) // sdot v3.4s, v25.16b, v18.4b[2]
	VLD1.P 32(R2), [V24.B16, V25.B16] // group 3
	SDOTE(0, 24, 16, 3) // sdot v0.4s, v24.16b, v16.4b[3]
	SDOTE(1, 25, 16, 3) // sdot v1.4s, v25.16b, v16.4b[3]
	SDOTE(2, 24, 18, 3) // sdot v2.4s, v24.16b, v18.4b[3]
	SDOTE(3, 25, 18, 3) // sdot v3.4s, v25.16b, v18.4b[3]
	VLD1.P 32(R2), [V24.B16, V25.B16] // group 4
	SDOTE(0, 24, 17, 0) // sdot v0.4s, v24.16b, v17.4b[0]
	SDOTE(1, 25, 17, 0) // sdot v1.4s, v25.16b, v17.4b[0]
	SDOTE(2, 24, 19, 0) // sdot v2.4s, v24.16b, v19.4b[0]
	SDOTE(3, 25, 19, 0) // sdot v3.4s, v25.16b, v19.4b[0]
	VLD1.P 32(R2), [V24.B16, V25.B16] // group 5
	SDOTE(0, 24, 17, 1) // sdot v0.4s, v24.16b, v17.4b[1]
	SDOTE(1, 25, 17, 1) // sdot v1.4s, v25.16b, v17.4b[1]
	SDOTE(2, 24, 19, 1) // sdot v2.4s, v24.16b, v19.4b[1]
	SDOTE(3, 25, 19, 1) // sdot v3.4s, v25.16b, v19.4b[1]
	VLD1.P 32(R2), [V24.B16, V25.B16] // group 6
	SDOTE(0, 24, 17, 2) // sdot v0.4s, v24.16b, v17.4b[2]
	SDOTE(1, 25, 17, 2) // sdot v1.4s, v25.16b, v17.4b[2]
	SDOTE(2, 24, 19, 2) // sdot v2.4s, v24.16b, v19.4b[2]
	SDOTE(3, 25, 19, 2) // sdot v3.4s, v25.16b, v19.4b[2]
	VLD1.P 32(R2), [V24.B16, V25.B16] // group 7
	SDOTE(0, 24, 17, 3) // sdot v0.4s, v24.16b, v17.4b[3]
	SDOTE(1, 25, 17, 3) // sdot v1.4s, v25.16b, v17.4b[3]
	SDOTE(2, 24, 19, 3) // sdot v2.4s, v24.16b, v19.4b[3]
	SDOTE(3, 25, 19, 3) // sdot v3.4s, v25.16b, v19.4b[3]
	VLD1.P 32(R2), [V24.S4, V25.S4] // weight scales
	FMOVS.P 8(R19), F26
	SCVTF(0, 0)        // scvtf v0.4s, v0.4s
	SCVTF(1, 1)        // scvtf v1.4s, v1.4s
	FMUL4(0, 0, 24)    // fmul v0.4s, v0.4s, v24.4s
	FMUL4(1, 1, 25)    // fmul v1.4s, v1.4s, v25.4s
	FMLAE(8, 0, 26, 0) // fmla v8.4s, v0.4s, v26.s[0]
	FMLAE(9, 1, 26, 0) // fmla v9.4s, v1.4s, v26.s[0]
	FMOVS.P 8(R20), F26
	SCVTF(2, 2)        // scvtf v2.4s, v2.4s
	SCVTF(3, 3)        // scvtf v3.4s, v3.4s
	FMUL4(2, 2, 24)    // fmul v2.4s, v2.4s, v24.4s
	FMUL4(3, 3, 25)    // fmul v3.4s, v3.4s, v25.4s
	FMLAE(10, 2, 26, 0) // fmla v10.4s, v2.4s, v26.s[0]
	FMLAE(11, 3, 26, 0) // fmla v11.4s, v3.4s, v26.s[0]
	SUBS $1, R5, R5
	BNE  blk

store:
	VST1 [V8.S4, V9.S4], (R3)
	ADD  R4, R3, R3
	VST1 [V10.S4, V11.S4], (R3)
	RET

// func gemmQD3(x *int8, lda uintptr, meta *uint32, ldm uintptr, panel *byte, c *float32, ldc uintptr, nb int)
TEXT ·gemmQD3(SB), NOSPLIT, $0-64
	MOVD x+0(FP), R10
	MOVD lda+8(FP), R0
	MOVD meta+16(FP), R19
	MOVD ldm+24(FP), R1
	MOVD panel+32(FP), R2
	MOVD c+40(FP), R3
	MOVD ldc+48(FP), R4
	MOVD nb+56(FP), R5
	ADD  R0, R10, R11
	ADD  R1, R19, R20
	ADD  R0, R11, R12
	ADD  R1, R20, R21
	VEOR V8.B16, V8.B16, V8.B16
	VEOR V9.B16, V9.B16, V9.B16
	VEOR V10.B16, V10.B16, V10.B16
	VEOR V11.B16, V11.B16, V11.B16
	VEOR V12.B16, V12.B16, V12.B16
	VEOR V13.B16, V13.B16, V13.B16
	CBZ  R5, store

blk:
	VLD1.P 32(R10), [V16.B16, V17.B16]
	VEOR   V0.B16, V0.B16, V0.B16
	VEOR   V1.B16, V1.B16, V1.B16
	VLD1.P 32(R11), [V18.B16, V19.B16]
	VEOR   V2.B16, V2.B16, V2.B16
	VEOR   V3.B16, V3.B16, V3.B16
	VLD1.P 32(R12), [V20.B16, V21.B16]
	VEOR   V4.B16, V4.B16, V4.B16
	VEOR   V5.B16, V5.B16, V5.B16
	VLD1.P 32(R2), [V24.B16, V25.B16] // group 0
	SDOTE(0, 24, 16, 0) // sdot v0.4s, v24.16b, v16.4b[0]
	SDOTE(1, 25, 16, 0) // sdot v1.4s, v25.16b, v16.4b[0]
	SDOTE(2, 24, 18, 0) // sdot v2.4s, v24.16b, v18.4b[0]
	SDOTE(3, 25, 18, 0) // sdot v3.4s, v25.16b, v18.4b[0]
	SDOTE(4, 24, 20, 0) // sdot v4.4s, v24.16b, v20.4b[0]
	SDOTE(5, 25, 20, 0) // sdot v5.4s, v25.16b, v20.4b[0]
	VLD1.P 32(R2), [V24.B16, V25.B16] // group 1
	SDOTE(0, 24, 16, 1) // sdot v0.4s, v24.16b, v16.4b[1]
	SDOTE(1, 25, 16, 1) // sdot v1.4s, v25.16b, v16.4b[1]
	SDOTE(2, 24, 18, 1) // sdot v2.4s, v24.16b, v18.4b[1]
	SDOTE(3, 25, 18, 1) // sdot v3.4s, v25.16b, v18.4b[1]
	SDOTE(4, 24, 20, 1) // sdot v4.4s, v24.16b, v20.4b[1]
	SDOTE(5, 25, 20, 1) // sdot v5.4s, v25.16b, v20.4b[1]
	VLD1.P 32(R2), [V24.B16, V25.B16] // group 2
	SDOTE(0, 24, 16, 2) // sdot v0.4s, v24.16b, v16.4b[2]
	SDOTE(1, 25, 16, 2) // sdot v1.4s, v25.16b, v16.4b[2]
	SDOTE(2, 24, 18, 2) // sdot v2.4s, v24.16b, v18.4b[2]
	SDOTE(3, 25, 18, 2) // sdot v3.4s, v25.16b, v18.4b[2]
	SDOTE(4, 24, 20, 2) // sdot v4.4s, v24.16b, v20.4b[2]
	SDOTE(5, 25, 20, 2) // sdot v5.4s, v25.16b, v20.4b[2]
	VLD1.P 32(R2), [V24.B16, V25.B16] // group 3
	SDOTE(0, 24, 16, 3) // sdot v0.4s, v24.16b, v16.4b[3]
	SDOTE(1, 25, 16, 3) // sdot v1.4s, v25.16b, v16.4b[3]
	SDOTE(2, 24, 18, 3) // sdot v2.4s, v24.16b, v18.4b[3]
	SDOTE(3, 25, 18, 3) // sdot v3.4s, v25.16b, v18.4b[3]
	SDOTE(4, 24, 20, 3) // sdot v4.4s, v24.16b, v20.4b[3]
	SDOTE(5, 25, 20, 3) // sdot v5.4s, v25.16b, v20.4b[3]
	VLD1.P 32(R2), [V24.B16, V25.B16] // group 4
	SDOTE(0, 24, 17, 0) // sdot v0.4s, v24.16b, v17.4b[0]
	SDOTE(1, 25, 17, 0) // sdot v1.4s, v25.16b, v17.4b[0]
	SDOTE(2, 24, 19, 0) // sdot v2.4s, v24.16b, v19.4b[0]
	SDOTE(3, 25, 19, 0) // sdot v3.4s, v25.16b, v19.4b[0]
	SDOTE(4, 24, 21, 0) // sdot v4.4s, v24.16b, v21.4b[0]
	SDOTE(5, 25, 21, 0) // sdot v5.4s, v25.16b, v21.4b[0]
	VLD1.P 32(R2), [V24.B16, V25.B16] // group 5
	SDOTE(0, 24, 17, 1) // sdot v0.4s, v24.16b, v17.4b[1]
	SDOTE(1, 25, 17, 1) // sdot v1.4s, v25.16b, v17.4b[1]
	SDOTE(2, 24, 19, 1) // sdot v2.4s, v24.16b, v19.4b[1]
	SDOTE(3, 25, 19, 1) // sdot v3.4s, v25.16b, v19.4b[1]
	SDOTE(4, 24, 21, 1) // sdot v4.4s, v24.16b, v21.4b[1]
	SDOTE(5, 25, 21, 1) // sdot v5.4s, v25.16b, v21.4b[1]
	VLD1.P 32(R2), [V24.B16, V25.B16] // group 6
	SDOTE(0, 24, 17, 2) // sdot v0.4s, v24.16b, v17.4b[2]
	SDOTE(1, 25, 17, 2) // sdot v1.4s, v25.16b, v17.4b[2]
	SDOTE(2, 24, 19, 2) // sdot v2.4s, v24.16b, v19.4b[2]
	SDOTE(3, 25, 19, 2) // sdot v3.4s, v25.16b, v19.4b[2]
	SDOTE(4, 24, 21, 2) // sdot v4.4s, v24.16b, v21.4b[2]
	SDOTE(5, 25, 21, 2) // sdot v5.4s, v25.16b, v21.4b[2]
	VLD1.P 32(R2), [V24.B16, V25.B16] // group 7
	SDOTE(0, 24, 17, 3) // sdot v0.4s, v24.16b, v17.4b[3]
	SDOTE(1, 25, 17, 3) // sdot v1.4s, v25.16b, v17.4b[3]
	SDOTE(2, 24, 19, 3) // sdot v2.4s, v24.16b, v19.4b[3]
	SDOTE(3, 25, 19, 3) // sdot v3.4s, v25.16b, v19.4b[3]
	SDOTE(4, 24, 21, 3) // sdot v4.4s, v24.16b, v21.4b[3]
	SDOTE(5, 25, 21, 3) // sdot v5.4s, v25.16b, v21.4b[3]
	VLD1.P 32(R2), [V24.S4, V25.S4] // weight scales
	FMOVS.P 8(R19), F26
	SCVTF(0, 0)        // scvtf v0.4s, v0.4s
	SCVTF(1, 1)        // scvtf v1.4s, v1.4s
	FMUL4(0, 0, 24)    // fmul v0.4s, v0.4s, v24.4s
	FMUL4(1, 1, 25)    // fmul v1.4s, v1.4s, v25.4s
	FMLAE(8, 0, 26, 0) // fmla v8.4s, v0.4s, v26.s[0]
	FMLAE(9, 1, 26, 0) // fmla v9.4s, v1.4s, v26.s[0]
	FMOVS.P 8(R20), F26
	SCVTF(2, 2)        // scvtf v2.4s, v2.4s
	SCVTF(3, 3)        // scvtf v3.4s, v3.4s
	FMUL4(2, 2, 24)    // fmul v2.4s, v2.4s, v24.4s
	FMUL4(3, 3, 25)    // fmul v3.4s, v3.4s, v25.4s
	FMLAE(10, 2, 26, 0) // fmla v10.4s, v2.4s, v26.s[0]
	FMLAE(11, 3, 26, 0) // fmla v11.4s, v3.4s, v26.s[0]
	FMOVS.P 8(R21), F26
	SCVTF(4, 4)        // scvtf v4.4s, v4.4s
	SCVTF(5, 5)        // scvtf v5.4s, v5.4s
	FMUL4(4, 4, 24)    // fmul v4.4s, v4.4s, v24.4s
	FMUL4(5, 5, 25)    // fmul v5.4s, v5.4s, v25.4s
	FMLAE(12, 4, 26, 0) // fmla v12.4s, v4.4s, v26.s[0]
	FMLAE(13, 5, 26, 0) // fmla v13.4s, v5.4s, v26.s[0]
	SUBS $1, R5, R5
	BNE  blk

store:
	VST1 [V8.S4, V9.S4], (R3)
	ADD  R4, R3, R3
	VST1 [V10.S4, V11.S4], (R3)
	ADD  R4, R3, R3
	VST1 [V12.S4, V13.S4], (R3)
	RET

// func gemmQD4(x *int8, lda uintptr, meta *uint32, ldm uintptr, panel *byte, c *float32, ldc uintptr, nb int)
TEXT ·gemmQD4(SB), NOSPLIT, $0-64
	MOVD x+0(FP), R10
	MOVD lda+8(FP), R0
	MOVD meta+16(FP), R19
	MOVD ldm+24(FP), R1
	MOVD panel+32(FP), R2
	MOVD c+40(FP), R3
	MOVD ldc+48(FP), R4
	MOVD nb+56(FP), R5
	ADD  R0, R10, R11
	ADD  R1, R19, R20
	ADD  R0, R11, R12
	ADD  R1, R20, R21
	ADD  R0, R12, R13
	ADD  R1, R21, R22
	VEOR V8.B16, V8.B16, V8.B16
	VEOR V9.B16, V9.B16, V9.B16
	VEOR V10.B16, V10.B16, V10.B16
	VEOR V11.B16, V11.B16, V11.B16
	VEOR V12.B16, V12.B16, V12.B16
	VEOR V13.B16, V13.B16, V13.B16
	VEOR V14.B16, V14.B16, V14.B16
	VEOR V15.B16, V15.B16, V15.B16
	CBZ  R5, store

blk:
	VLD1.P 32(R10), [V16.B16, V17.B16]
	VEOR   V0.B16, V0.B16, V0.B16
	VEOR   V1.B16, V1.B16, V1.B16
	VLD1.P 32(R11), [V18.B16, V19.B16]
	VEOR   V2.B16, V2.B16, V2.B16
	VEOR   V3.B16, V3.B16, V3.B16
	VLD1.P 32(R12), [V20.B16, V21.B16]
	VEOR   V4.B16, V4.B16, V4.B16
	VEOR   V5.B16, V5.B16, V5.B16
	VLD1.P 32(R13), [V22.B16, V23.B16]
	VEOR   V6.B16, V6.B16, V6.B16
	VEOR   V7.B16, V7.B16, V7.B16
	VLD1.P 32(R2), [V24.B16, V25.B16] // group 0
	SDOTE(0, 24, 16, 0) // sdot v0.4s, v24.16b, v16.4b[0]
	SDOTE(1, 25, 16, 0) // sdot v1.4s, v25.16b, v16.4b[0]
	SDOTE(2, 24, 18, 0) // sdot v2.4s, v24.16b, v18.4b[0]
	SDOTE(3, 25, 18, 0) // sdot v3.4s, v25.16b, v18.4b[0]
	SDOTE(4, 24, 20, 0) // sdot v4.4s, v24.16b, v20.4b[0]
	SDOTE(5, 25, 20, 0) // sdot v5.4s, v25.16b, v20.4b[0]
	SDOTE(6, 24, 22, 0) // sdot v6.4s, v24.16b, v22.4b[0]
	SDOTE(7, 25, 22, 0) // sdot v7.4s, v25.16b, v22.4b[0]
	VLD1.P 32(R2), [V24.B16, V25.B16] // group 1
	SDOTE(0, 24, 16, 1) // sdot v0.4s, v24.16b, v16.4b[1]
	SDOTE(1, 25, 16, 1) // sdot v1.4s, v25.16b, v16.4b[1]
	SDOTE(2, 24, 18, 1) // sdot v2.4s, v24.16b, v18.4b[1]
	SDOTE(3, 25, 18, 1) // sdot v3.4s, v25.16b, v18.4b[1]
	SDOTE(4, 24, 20, 1) // sdot v4.4s, v24.16b, v20.4b[1]
	SDOTE(5, 25, 20, 1) // sdot v5.4s, v25.16b, v20.4b[1]
	SDOTE(6, 24, 22, 1) // sdot v6.4s, v24.16b, v22.4b[1]
	SDOTE(7, 25, 22, 1) // sdot v7.4s, v25.16b, v22.4b[1]
	VLD1.P 32(R2), [V24.B16, V25.B16] // group 2
	SDOTE(0, 24, 16, 2) // sdot v0.4s, v24.16b, v16.4b[2]
	SDOTE(1, 25, 16, 2) // sdot v1.4s, v25.16b, v16.4b[2]
	SDOTE(2, 24, 18, 2) // sdot v2.4s, v24.16b, v18.4b[2]
	SDOTE(3, 25, 18, 2) // sdot v3.4s, v25.16b, v18.4b[2]
	SDOTE(4, 24, 20, 2) // sdot v4.4s, v24.16b, v20.4b[2]
	SDOTE(5, 25, 20, 2) // sdot v5.4s, v25.16b, v20.4b[2]
	SDOTE(6, 24, 22, 2) // sdot v6.4s, v24.16b, v22.4b[2]
	SDOTE(7, 25, 22, 2) // sdot v7.4s, v25.16b, v22.4b[2]
	VLD1.P 32(R2), [V24.B16, V25.B16] // group 3
	SDOTE(0, 24, 16, 3) // sdot v0.4s, v24.16b, v16.4b[3]
	SDOTE(1, 25, 16, 3) // sdot v1.4s, v25.16b, v16.4b[3]
	SDOTE(2, 24, 18, 3) // sdot v2.4s, v24.16b, v18.4b[3]
	SDOTE(3, 25, 18, 3) // sdot v3.4s, v25.16b, v18.4b[3]
	SDOTE(4, 24, 20, 3) // sdot v4.4s, v24.16b, v20.4b[3]
	SDOTE(5, 25, 20, 3) // sdot v5.4s, v25.16b, v20.4b[3]
	SDOTE(6, 24, 22, 3) // sdot v6.4s, v24.16b, v22.4b[3]
	SDOTE(7, 25, 22, 3) // sdot v7.4s, v25.16b, v22.4b[3]
	VLD1.P 32(R2), [V24.B16, V25.B16] // group 4
	SDOTE(0, 24, 17, 0) // sdot v0.4s, v24.16b, v17.4b[0]
	SDOTE(1, 25, 17, 0) // sdot v1.4s, v25.16b, v17.4b[0]
	SDOTE(2, 24, 19, 0) // sdot v2.4s, v24.16b, v19.4b[0]
	SDOTE(3, 25, 19, 0) // sdot v3.4s, v25.16b, v19.4b[0]
	SDOTE(4, 24, 21, 0) // sdot v4.4s, v24.16b, v21.4b[0]
	SDOTE(5, 25, 21, 0) // sdot v5.4s, v25.16b, v21.4b[0]
	SDOTE(6, 24, 23, 0) // sdot v6.4s, v24.16b, v23.4b[0]
	SDOTE(7, 25, 23, 0) // sdot v7.4s, v25.16b, v23.4b[0]
	VLD1.P 32(R2), [V24.B16, V25.B16] // group 5
	SDOTE(0, 24, 17, 1) // sdot v0.4s, v24.16b, v17.4b[1]
	SDOTE(1, 25, 17, 1) // sdot v1.4s, v25.16b, v17.4b[1]
	SDOTE(2, 24, 19, 1) // sdot v2.4s, v24.16b, v19.4b[1]
	SDOTE(3, 25, 19, 1) // sdot v3.4s, v25.16b, v19.4b[1]
	SDOTE(4, 24, 21, 1) // sdot v4.4s, v24.16b, v21.4b[1]
	SDOTE(5, 25, 21, 1) // sdot v5.4s, v25.16b, v21.4b[1]
	SDOTE(6, 24, 23, 1) // sdot v6.4s, v24.16b, v23.4b[1]
	SDOTE(7, 25, 23, 1) // sdot v7.4s, v25.16b, v23.4b[1]
	VLD1.P 32(R2), [V24.B16, V25.B16] // group 6
	SDOTE(0, 24, 17, 2) // sdot v0.4s, v24.16b, v17.4b[2]
	SDOTE(1, 25, 17, 2) // sdot v1.4s, v25.16b, v17.4b[2]
	SDOTE(2, 24, 19, 2) // sdot v2.4s, v24.16b, v19.4b[2]
	SDOTE(3, 25, 19, 2) // sdot v3.4s, v25.16b, v19.4b[2]
	SDOTE(4, 24, 21, 2) // sdot v4.4s, v24.16b, v21.4b[2]
	SDOTE(5, 25, 21, 2) // sdot v5.4s, v25.16b, v21.4b[2]
	SDOTE(6, 24, 23, 2) // sdot v6.4s, v24.16b, v23.4b[2]
	SDOTE(7, 25, 23, 2) // sdot v7.4s, v25.16b, v23.4b[2]
	VLD1.P 32(R2), [V24.B16, V25.B16] // group 7
	SDOTE(0, 24, 17, 3) // sdot v0.4s, v24.16b, v17.4b[3]
	SDOTE(1, 25, 17, 3) // sdot v1.4s, v25.16b, v17.4b[3]
	SDOTE(2, 24, 19, 3) // sdot v2.4s, v24.16b, v19.4b[3]
	SDOTE(3, 25, 19, 3) // sdot v3.4s, v25.16b, v19.4b[3]
	SDOTE(4, 24, 21, 3) // sdot v4.4s, v24.16b, v21.4b[3]
	SDOTE(5, 25, 21, 3) // sdot v5.4s, v25.16b, v21.4b[3]
	SDOTE(6, 24, 23, 3) // sdot v6.4s, v24.16b, v23.4b[3]
	SDOTE(7, 25, 23, 3) // sdot v7.4s, v25.16b, v23.4b[3]
	VLD1.P 32(R2), [V24.S4, V25.S4] // weight scales
	FMOVS.P 8(R19), F26
	SCVTF(0, 0)        // scvtf v0.4s, v0.4s
	SCVTF(1, 1)        // scvtf v1.4s, v1.4s
	FMUL4(0, 0, 24)    // fmul v0.4s, v0.4s, v24.4s
	FMUL4(1, 1, 25)    // fmul v1.4s, v1.4s, v25.4s
	FMLAE(8, 0, 26, 0) // fmla v8.4s, v0.4s, v26.s[0]
	FMLAE(9, 1, 26, 0) // fmla v9.4s, v1.4s, v26.s[0]
	FMOVS.P 8(R20), F26
	SCVTF(2, 2)        // scvtf v2.4s, v2.4s
	SCVTF(3, 3)        // scvtf v3.4s, v3.4s
	FMUL4(2, 2, 24)    // fmul v2.4s, v2.4s, v24.4s
	FMUL4(3, 3, 25)    // fmul v3.4s, v3.4s, v25.4s
	FMLAE(10, 2, 26, 0) // fmla v10.4s, v2.4s, v26.s[0]
	FMLAE(11, 3, 26, 0) // fmla v11.4s, v3.4s, v26.s[0]
	FMOVS.P 8(R21), F26
	SCVTF(4, 4)        // scvtf v4.4s, v4.4s
	SCVTF(5, 5)        // scvtf v5.4s, v5.4s
	FMUL4(4, 4, 24)    // fmul v4.4s, v4.4s, v24.4s
	FMUL4(5, 5, 25)    // fmul v5.4s, v5.4s, v25.4s
	FMLAE(12, 4, 26, 0) // fmla v12.4s, v4.4s, v26.s[0]
	FMLAE(13, 5, 26, 0) // fmla v13.4s, v5.4s, v26.s[0]
	FMOVS.P 8(R22), F26
	SCVTF(6, 6)        // scvtf v6.4s, v6.4s
	SCVTF(7, 7)        // scvtf v7.4s, v7.4s
	FMUL4(6, 6, 24)    // fmul v6.4s, v6.4s, v24.4s
	FMUL4(7, 7, 25)    // fmul v7.4s, v7.4s, v25.4s
	FMLAE(14, 6, 26, 0) // fmla v14.4s, v6.4s, v26.s[0]
	FMLAE(15, 7, 26, 0) // fmla v15.4s, v7.4s, v26.s[0]
	SUBS $1, R5, R5
	BNE  blk

store:
	VST1 [V8.S4, V9.S4], (R3)
	ADD  R4, R3, R3
	VST1 [V10.S4, V11.S4], (R3)
	ADD  R4, R3, R3
	VST1 [V12.S4, V13.S4], (R3)
	ADD  R4, R3, R3
	VST1 [V14.S4, V15.S4], (R3)
	RET

// The K-quant decode dots for kDot:
//
//	func dotQ4KSDOT(w *byte, xq *int8, xd *float32, xs *int16, nb int) float32
//
// (backend/cpu/kquant.go has the Go references, backend/kquant.go the
// layouts). R0 walks the weight blocks, R1 the Q8_K activations (256 a
// block), R2 their scales, R3 their per-16 sums, R4 counts blocks; F0
// (lane 0 of V0) sums the blocks in f32. The weights are unsigned (4, 5
// or 6 bits), so they multiply the signed activations as they are: by
// sdot (the SDOT forms), or by smull/smlal2 into int16, where a pair
// stays under 2*63*127 < 32768, and sadalp into int32 (the NEON forms).
// Each sub-block's products go to their own accumulator; three addp fold
// four of those into one vector of four sub-block dots, which mla
// multiplies by the sub-blocks' scales as int32 and adds to V28 (|sum| <
// 2^31: at most 16 sub-blocks of 64*127*32 times a 6-bit or int8 scale).

// mla vd.4s, vn.4s, vm.4s: int32 multiply-add.
#define MLA4(d, n, m) WORD $(0x4ea09400 | (m)<<16 | (n)<<5 | (d))
// smull vd.4s, vn.4h, vm.4h; smlal vd.4s, vn.4h, vm.4h; smlal2 vd.4s,
// vn.8h, vm.8h: signed int16 products widened to int32.
#define SMULLH(d, n, m) WORD $(0x0e60c000 | (m)<<16 | (n)<<5 | (d))
#define SMLALH(d, n, m) WORD $(0x0e608000 | (m)<<16 | (n)<<5 | (d))
#define SMLAL2H(d, n, m) WORD $(0x4e608000 | (m)<<16 | (n)<<5 | (d))
// sshll vd.8h, vn.8b, #0 / sshll2 vd.8h, vn.16b, #0 and sshll vd.4s,
// vn.4h, #0 / sshll2 vd.4s, vn.8h, #0: sign extension of the low / high
// half.
#define SXTLB(d, n) WORD $(0x0f08a400 | (n)<<5 | (d))
#define SXTL2B(d, n) WORD $(0x4f08a400 | (n)<<5 | (d))
#define SXTLH(d, n) WORD $(0x0f10a400 | (n)<<5 | (d))
#define SXTL2H(d, n) WORD $(0x4f10a400 | (n)<<5 | (d))

// KMINHEAD reads a Q4_K/Q5_K block's header (d bits R5, dmin bits R6)
// and leaves its 8 6-bit sub-block scales as int32 in V22 (0-3) and V23
// (4-7), and in R14 the sum over sub-blocks j of m_j times the sum of
// x's values in j (the per-16 sums in pairs). With w0, w1, w2 the scale
// bytes 0-3, 4-7, 8-11: scales 0-3 are w0&0x3f3f3f3f, 4-7
// (w2&0x0f0f0f0f) | ((w0>>6)&0x03030303)<<4; mins 0-3 w1&0x3f3f3f3f, 4-7
// ((w2>>4)&0x0f0f0f0f) | ((w1>>6)&0x03030303)<<4 (KScaleMin). R0 moves
// past the header.
#define KMINHEAD \
	MOVHU (R0), R5; \
	MOVHU 2(R0), R6; \
	MOVWU 4(R0), R7; \
	MOVWU 8(R0), R8; \
	MOVWU 12(R0), R9; \
	ADD   $16, R0, R0; \
	ANDW  $0x3f3f3f3f, R7, R10; \
	LSRW  $6, R7, R11; \
	ANDW  $0x03030303, R11, R11; \
	ANDW  $0x0f0f0f0f, R9, R12; \
	ORRW  R11<<4, R12, R11; \
	ANDW  $0x3f3f3f3f, R8, R12; \
	LSRW  $6, R8, R13; \
	ANDW  $0x03030303, R13, R13; \
	LSRW  $4, R9, R15; \
	ANDW  $0x0f0f0f0f, R15, R15; \
	ORRW  R13<<4, R15, R13; \
	VMOV  R10, V20.S[0]; \
	VMOV  R11, V20.S[1]; \
	VUXTL V20.B8, V21.H8; \
	VUXTL V21.H4, V22.S4; \
	VUXTL2 V21.H8, V23.S4; \
	VMOV  R12, V24.S[0]; \
	VMOV  R13, V24.S[1]; \
	VUXTL V24.B8, V24.H8; \
	VLD1.P 32(R3), [V25.H8, V26.H8]; \
	VADDP V26.H8, V25.H8, V25.H8; \
	SMULLH(27, 24, 25) /* smull v27.4s, v24.4h, v25.4h */; \
	SMLAL2H(27, 24, 25) /* smlal2 v27.4s, v24.8h, v25.8h */; \
	VADDV V27.S4, V27; \
	FMOVS F27, R14

// KMINTAIL adds d_x*(d*sumi - dmin*summ) to F0, sumi the lane sum of V28
// and summ R14 (dotKMin's order).
#define KMINTAIL \
	VADDV   V28.S4, V28; \
	FMOVS   F28, R15; \
	SCVTFWS R15, F1; \
	SCVTFWS R14, F2; \
	FMOVS   R5, F3; \
	FCVTHS  F3, F3; \
	FMOVS   R6, F4; \
	FCVTHS  F4, F4; \
	FMULS   F3, F1, F1; \
	FMULS   F4, F2, F2; \
	FSUBS   F2, F1, F1; \
	FMOVS.P 4(R2), F3; \
	FMULS   F3, F1, F1; \
	FADDS   F1, F0, F0

// KFOLD folds V24-V27 (four sub-blocks' lanes) into V24's four sub-block
// dots and adds them times the scales in V<sc> to V28.
#define KFOLD(sc) \
	VADDP V25.S4, V24.S4, V24.S4; \
	VADDP V27.S4, V26.S4, V26.S4; \
	VADDP V26.S4, V24.S4, V24.S4; \
	MLA4(28, 24, sc) /* mla v28.4s, v24.4s, v<sc>.4s */

// func dotQ4KSDOT(w *byte, xq *int8, xd *float32, xs *int16, nb int) float32
//
// Q4_K: each 64-value chunk c is 32 bytes whose low nibbles are
// sub-block 2c and high nibbles 2c+1 (V31 holds 0x0f bytes).
TEXT ·dotQ4KSDOT(SB), NOSPLIT, $0-44
	MOVD w+0(FP), R0
	MOVD xq+8(FP), R1
	MOVD xd+16(FP), R2
	MOVD xs+24(FP), R3
	MOVD nb+32(FP), R4
	VMOVI $15, V31.B16
	VEOR V0.B16, V0.B16, V0.B16
	CBZ  R4, done

blk:
	KMINHEAD
	VEOR V28.B16, V28.B16, V28.B16
	// chunk 0: sub-blocks 0 (V24) and 1 (V25)
	VLD1.P 32(R0), [V1.B16, V2.B16]
	VAND   V31.B16, V1.B16, V3.B16
	VAND   V31.B16, V2.B16, V4.B16
	VUSHR  $4, V1.B16, V5.B16
	VUSHR  $4, V2.B16, V6.B16
	VLD1.P 64(R1), [V16.B16, V17.B16, V18.B16, V19.B16]
	VEOR   V24.B16, V24.B16, V24.B16
	VEOR   V25.B16, V25.B16, V25.B16
	SDOT(24, 3, 16) // sdot v24.4s, v3.16b, v16.16b
	SDOT(24, 4, 17) // sdot v24.4s, v4.16b, v17.16b
	SDOT(25, 5, 18) // sdot v25.4s, v5.16b, v18.16b
	SDOT(25, 6, 19) // sdot v25.4s, v6.16b, v19.16b
	// chunk 1: sub-blocks 2 (V26) and 3 (V27)
	VLD1.P 32(R0), [V1.B16, V2.B16]
	VAND   V31.B16, V1.B16, V3.B16
	VAND   V31.B16, V2.B16, V4.B16
	VUSHR  $4, V1.B16, V5.B16
	VUSHR  $4, V2.B16, V6.B16
	VLD1.P 64(R1), [V16.B16, V17.B16, V18.B16, V19.B16]
	VEOR   V26.B16, V26.B16, V26.B16
	VEOR   V27.B16, V27.B16, V27.B16
	SDOT(26, 3, 16) // sdot v26.4s, v3.16b, v16.16b
	SDOT(26, 4, 17) // sdot v26.4s, v4.16b, v17.16b
	SDOT(27, 5, 18) // sdot v27.4s, v5.16b, v18.16b
	SDOT(27, 6, 19) // sdot v27.4s, v6.16b, v19.16b
	KFOLD(22)
	// chunk 2: sub-blocks 4 (V24) and 5 (V25)
	VLD1.P 32(R0), [V1.B16, V2.B16]
	VAND   V31.B16, V1.B16, V3.B16
	VAND   V31.B16, V2.B16, V4.B16
	VUSHR  $4, V1.B16, V5.B16
	VUSHR  $4, V2.B16, V6.B16
	VLD1.P 64(R1), [V16.B16, V17.B16, V18.B16, V19.B16]
	VEOR   V24.B16, V24.B16, V24.B16
	VEOR   V25.B16, V25.B16, V25.B16
	SDOT(24, 3, 16) // sdot v24.4s, v3.16b, v16.16b
	SDOT(24, 4, 17) // sdot v24.4s, v4.16b, v17.16b
	SDOT(25, 5, 18) // sdot v25.4s, v5.16b, v18.16b
	SDOT(25, 6, 19) // sdot v25.4s, v6.16b, v19.16b
	// chunk 3: sub-blocks 6 (V26) and 7 (V27)
	VLD1.P 32(R0), [V1.B16, V2.B16]
	VAND   V31.B16, V1.B16, V3.B16
	VAND   V31.B16, V2.B16, V4.B16
	VUSHR  $4, V1.B16, V5.B16
	VUSHR  $4, V2.B16, V6.B16
	VLD1.P 64(R1), [V16.B16, V17.B16, V18.B16, V19.B16]
	VEOR   V26.B16, V26.B16, V26.B16
	VEOR   V27.B16, V27.B16, V27.B16
	SDOT(26, 3, 16) // sdot v26.4s, v3.16b, v16.16b
	SDOT(26, 4, 17) // sdot v26.4s, v4.16b, v17.16b
	SDOT(27, 5, 18) // sdot v27.4s, v5.16b, v18.16b
	SDOT(27, 6, 19) // sdot v27.4s, v6.16b, v19.16b
	KFOLD(23)
	KMINTAIL
	SUBS $1, R4, R4
	BNE  blk

done:
	FMOVS F0, ret+40(FP)
	RET

// func dotQ5KSDOT(w *byte, xq *int8, xd *float32, xs *int16, nb int) float32
//
// Q5_K: Q4_K's chunks, with the fifth bits of chunk c's values in bits
// 2c (low nibbles) and 2c+1 (high) of the 32 qh bytes (V9, V10, shifted
// down 2 a chunk), moved to bit 4 (V29 holds 0x01 bytes, V30 0x02).
TEXT ·dotQ5KSDOT(SB), NOSPLIT, $0-44
	MOVD w+0(FP), R0
	MOVD xq+8(FP), R1
	MOVD xd+16(FP), R2
	MOVD xs+24(FP), R3
	MOVD nb+32(FP), R4
	VMOVI $15, V31.B16
	VMOVI $1, V29.B16
	VMOVI $2, V30.B16
	VEOR V0.B16, V0.B16, V0.B16
	CBZ  R4, done

blk:
	KMINHEAD
	VLD1.P 32(R0), [V9.B16, V10.B16]
	VEOR V28.B16, V28.B16, V28.B16
	// chunk 0: sub-blocks 0 (V24) and 1 (V25)
	VLD1.P 32(R0), [V1.B16, V2.B16]
	VAND   V31.B16, V1.B16, V3.B16
	VAND   V31.B16, V2.B16, V4.B16
	VUSHR  $4, V1.B16, V5.B16
	VUSHR  $4, V2.B16, V6.B16
	VAND   V29.B16, V9.B16, V11.B16
	VAND   V29.B16, V10.B16, V12.B16
	VAND   V30.B16, V9.B16, V13.B16
	VAND   V30.B16, V10.B16, V14.B16
	VSHL   $4, V11.B16, V11.B16
	VSHL   $4, V12.B16, V12.B16
	VSHL   $3, V13.B16, V13.B16
	VSHL   $3, V14.B16, V14.B16
	VORR   V11.B16, V3.B16, V3.B16
	VORR   V12.B16, V4.B16, V4.B16
	VORR   V13.B16, V5.B16, V5.B16
	VORR   V14.B16, V6.B16, V6.B16
	VUSHR  $2, V9.B16, V9.B16
	VUSHR  $2, V10.B16, V10.B16
	VLD1.P 64(R1), [V16.B16, V17.B16, V18.B16, V19.B16]
	VEOR   V24.B16, V24.B16, V24.B16
	VEOR   V25.B16, V25.B16, V25.B16
	SDOT(24, 3, 16) // sdot v24.4s, v3.16b, v16.16b
	SDOT(24, 4, 17) // sdot v24.4s, v4.16b, v17.16b
	SDOT(25, 5, 18) // sdot v25.4s, v5.16b, v18.16b
	SDOT(25, 6, 19) // sdot v25.4s, v6.16b, v19.16b
	// chunk 1: sub-blocks 2 (V26) and 3 (V27)
	VLD1.P 32(R0), [V1.B16, V2.B16]
	VAND   V31.B16, V1.B16, V3.B16
	VAND   V31.B16, V2.B16, V4.B16
	VUSHR  $4, V1.B16, V5.B16
	VUSHR  $4, V2.B16, V6.B16
	VAND   V29.B16, V9.B16, V11.B16
	VAND   V29.B16, V10.B16, V12.B16
	VAND   V30.B16, V9.B16, V13.B16
	VAND   V30.B16, V10.B16, V14.B16
	VSHL   $4, V11.B16, V11.B16
	VSHL   $4, V12.B16, V12.B16
	VSHL   $3, V13.B16, V13.B16
	VSHL   $3, V14.B16, V14.B16
	VORR   V11.B16, V3.B16, V3.B16
	VORR   V12.B16, V4.B16, V4.B16
	VORR   V13.B16, V5.B16, V5.B16
	VORR   V14.B16, V6.B16, V6.B16
	VUSHR  $2, V9.B16, V9.B16
	VUSHR  $2, V10.B16, V10.B16
	VLD1.P 64(R1), [V16.B16, V17.B16, V18.B16, V19.B16]
	VEOR   V26.B16, V26.B16, V26.B16
	VEOR   V27.B16, V27.B16, V27.B16
	SDOT(26, 3, 16) // sdot v26.4s, v3.16b, v16.16b
	SDOT(26, 4, 17) // sdot v26.4s, v4.16b, v17.16b
	SDOT(27, 5, 18) // sdot v27.4s, v5.16b, v18.16b
	SDOT(27, 6, 19) // sdot v27.4s, v6.16b, v19.16b
	KFOLD(22)
	// chunk 2: sub-blocks 4 (V24) and 5 (V25)
	VLD1.P 32(R0), [V1.B16, V2.B16]
	VAND   V31.B16, V1.B16, V3.B16
	VAND   V31.B16, V2.B16, V4.B16
	VUSHR  $4, V1.B16, V5.B16
	VUSHR  $4, V2.B16, V6.B16
	VAND   V29.B16, V9.B16, V11.B16
	VAND   V29.B16, V10.B16, V12.B16
	VAND   V30.B16, V9.B16, V13.B16
	VAND   V30.B16, V10.B16, V14.B16
	VSHL   $4, V11.B16, V11.B16
	VSHL   $4, V12.B16, V12.B16
	VSHL   $3, V13.B16, V13.B16
	VSHL   $3, V14.B16, V14.B16
	VORR   V11.B16, V3.B16, V3.B16
	VORR   V12.B16, V4.B16, V4.B16
	VORR   V13.B16, V5.B16, V5.B16
	VORR   V14.B16, V6.B16, V6.B16
	VUSHR  $2, V9.B16, V9.B16
	VUSHR  $2, V10.B16, V10.B16
	VLD1.P 64(R1), [V16.B16, V17.B16, V18.B16, V19.B16]
	VEOR   V24.B16, V24.B16, V24.B16
	VEOR   V25.B16, V25.B16, V25.B16
	SDOT(24, 3, 16) // sdot v24.4s, v3.16b, v16.16b
	SDOT(24, 4, 17) // sdot v24.4s, v4.16b, v17.16b
	SDOT(25, 5, 18) // sdot v25.4s, v5.16b, v18.16b
	SDOT(25, 6, 19) // sdot v25.4s, v6.16b, v19.16b
	// chunk 3: sub-blocks 6 (V26) and 7 (V27)
	VLD1.P 32(R0), [V1.B16, V2.B16]
	VAND   V31.B16, V1.B16, V3.B16
	VAND   V31.B16, V2.B16, V4.B16
	VUSHR  $4, V1.B16, V5.B16
	VUSHR  $4, V2.B16, V6.B16
	VAND   V29.B16, V9.B16, V11.B16
	VAND   V29.B16, V10.B16, V12.B16
	VAND   V30.B16, V9.B16, V13.B16
	VAND   V30.B16, V10.B16, V14.B16
	VSHL   $4, V11.B16, V11.B16
	VSHL   $4, V12.B16, V12.B16
	VSHL   $3, V13.B16, V13.B16
	VSHL   $3, V14.B16, V14.B16
	VORR   V11.B16, V3.B16, V3.B16
	VORR   V12.B16, V4.B16, V4.B16
	VORR   V13.B16, V5.B16, V5.B16
	VORR   V14.B16, V6.B16, V6.B16
	VLD1.P 64(R1), [V16.B16, V17.B16, V18.B16, V19.B16]
	VEOR   V26.B16, V26.B16, V26.B16
	VEOR   V27.B16, V27.B16, V27.B16
	SDOT(26, 3, 16) // sdot v26.4s, v3.16b, v16.16b
	SDOT(26, 4, 17) // sdot v26.4s, v4.16b, v17.16b
	SDOT(27, 5, 18) // sdot v27.4s, v5.16b, v18.16b
	SDOT(27, 6, 19) // sdot v27.4s, v6.16b, v19.16b
	KFOLD(23)
	KMINTAIL
	SUBS $1, R4, R4
	BNE  blk

done:
	FMOVS F0, ret+40(FP)
	RET

// func dotQ6KSDOT(w *byte, xq *int8, xd *float32, xs *int16, nb int) float32
//
// Q6_K: sumi = sum over the 16 sub-blocks j of sc_j*dot_j, less 32 times
// sum_j sc_j*(the sum of x's values in j) for the stored offset of 32
// (R9). Half h's values come from ql (64 bytes, V1-V4) and qh (32 bytes,
// V5, V6, through R7): group g of 32 values takes the low (g 0, 1) or high
// (g 2, 3) nibbles of ql bytes 0-31 (g even) or 32-63 (g odd) and bits
// 2g, 2g+1 of qh as bits 4, 5; its sub-blocks 8h+2g and 8h+2g+1 are its
// first and second 16 values. V30 holds 0x0f bytes, V31 0x03.
TEXT ·dotQ6KSDOT(SB), NOSPLIT, $0-44
	MOVD w+0(FP), R0
	MOVD xq+8(FP), R1
	MOVD xd+16(FP), R2
	MOVD xs+24(FP), R3
	MOVD nb+32(FP), R4
	VMOVI $15, V30.B16
	VMOVI $3, V31.B16
	VEOR V0.B16, V0.B16, V0.B16
	CBZ  R4, done

blk:
	ADD    $192, R0, R5
	VLD1   (R5), [V20.B16]
	MOVHU  208(R0), R6
	ADD    $128, R0, R7
	SXTLB(21, 20)  // sshll v21.8h, v20.8b, #0
	SXTL2B(22, 20) // sshll2 v22.8h, v20.16b, #0
	SXTLH(23, 21)  // sshll v23.4s, v21.4h, #0
	SXTL2H(24, 21) // sshll2 v24.4s, v21.8h, #0
	SXTLH(25, 22)  // sshll v25.4s, v22.4h, #0
	SXTL2H(26, 22) // sshll2 v26.4s, v22.8h, #0
	VLD1.P 32(R3), [V16.H8, V17.H8]
	SMULLH(18, 21, 16)  // smull v18.4s, v21.4h, v16.4h
	SMLAL2H(18, 21, 16) // smlal2 v18.4s, v21.8h, v16.8h
	SMLALH(18, 22, 17)  // smlal v18.4s, v22.4h, v17.4h
	SMLAL2H(18, 22, 17) // smlal2 v18.4s, v22.8h, v17.8h
	VADDV  V18.S4, V18
	FMOVS  F18, R9
	VEOR   V28.B16, V28.B16, V28.B16
	// half 0: sub-blocks 0-7
	VLD1.P 64(R0), [V1.B16, V2.B16, V3.B16, V4.B16]
	VLD1.P 32(R7), [V5.B16, V6.B16]
	VEOR   V9.B16, V9.B16, V9.B16
	VEOR   V10.B16, V10.B16, V10.B16
	VEOR   V11.B16, V11.B16, V11.B16
	VEOR   V12.B16, V12.B16, V12.B16
	VEOR   V13.B16, V13.B16, V13.B16
	VEOR   V14.B16, V14.B16, V14.B16
	VEOR   V15.B16, V15.B16, V15.B16
	VEOR   V18.B16, V18.B16, V18.B16
	VLD1.P 32(R1), [V16.B16, V17.B16]
	VAND   V30.B16, V1.B16, V7.B16
	VAND   V31.B16, V5.B16, V8.B16
	VSHL   $4, V8.B16, V8.B16
	VORR   V8.B16, V7.B16, V7.B16
	SDOT(9, 7, 16) // sdot v9.4s, v7.16b, v16.16b
	VAND   V30.B16, V2.B16, V7.B16
	VAND   V31.B16, V6.B16, V8.B16
	VSHL   $4, V8.B16, V8.B16
	VORR   V8.B16, V7.B16, V7.B16
	SDOT(10, 7, 17) // sdot v10.4s, v7.16b, v17.16b
	VLD1.P 32(R1), [V16.B16, V17.B16]
	VAND   V30.B16, V3.B16, V7.B16
	VUSHR  $2, V5.B16, V8.B16
	VAND   V31.B16, V8.B16, V8.B16
	VSHL   $4, V8.B16, V8.B16
	VORR   V8.B16, V7.B16, V7.B16
	SDOT(11, 7, 16) // sdot v11.4s, v7.16b, v16.16b
	VAND   V30.B16, V4.B16, V7.B16
	VUSHR  $2, V6.B16, V8.B16
	VAND   V31.B16, V8.B16, V8.B16
	VSHL   $4, V8.B16, V8.B16
	VORR   V8.B16, V7.B16, V7.B16
	SDOT(12, 7, 17) // sdot v12.4s, v7.16b, v17.16b
	VLD1.P 32(R1), [V16.B16, V17.B16]
	VUSHR  $4, V1.B16, V7.B16
	VUSHR  $4, V5.B16, V8.B16
	VAND   V31.B16, V8.B16, V8.B16
	VSHL   $4, V8.B16, V8.B16
	VORR   V8.B16, V7.B16, V7.B16
	SDOT(13, 7, 16) // sdot v13.4s, v7.16b, v16.16b
	VUSHR  $4, V2.B16, V7.B16
	VUSHR  $4, V6.B16, V8.B16
	VAND   V31.B16, V8.B16, V8.B16
	VSHL   $4, V8.B16, V8.B16
	VORR   V8.B16, V7.B16, V7.B16
	SDOT(14, 7, 17) // sdot v14.4s, v7.16b, v17.16b
	VLD1.P 32(R1), [V16.B16, V17.B16]
	VUSHR  $4, V3.B16, V7.B16
	VUSHR  $6, V5.B16, V8.B16
	VSHL   $4, V8.B16, V8.B16
	VORR   V8.B16, V7.B16, V7.B16
	SDOT(15, 7, 16) // sdot v15.4s, v7.16b, v16.16b
	VUSHR  $4, V4.B16, V7.B16
	VUSHR  $6, V6.B16, V8.B16
	VSHL   $4, V8.B16, V8.B16
	VORR   V8.B16, V7.B16, V7.B16
	SDOT(18, 7, 17) // sdot v18.4s, v7.16b, v17.16b
	VADDP  V10.S4, V9.S4, V9.S4
	VADDP  V12.S4, V11.S4, V11.S4
	VADDP  V11.S4, V9.S4, V9.S4
	VADDP  V14.S4, V13.S4, V13.S4
	VADDP  V18.S4, V15.S4, V15.S4
	VADDP  V15.S4, V13.S4, V13.S4
	MLA4(28, 9, 23)  // mla v28.4s, v9.4s, v23.4s
	MLA4(28, 13, 24) // mla v28.4s, v13.4s, v24.4s
	// half 1: sub-blocks 8-15
	VLD1.P 64(R0), [V1.B16, V2.B16, V3.B16, V4.B16]
	VLD1.P 32(R7), [V5.B16, V6.B16]
	VEOR   V9.B16, V9.B16, V9.B16
	VEOR   V10.B16, V10.B16, V10.B16
	VEOR   V11.B16, V11.B16, V11.B16
	VEOR   V12.B16, V12.B16, V12.B16
	VEOR   V13.B16, V13.B16, V13.B16
	VEOR   V14.B16, V14.B16, V14.B16
	VEOR   V15.B16, V15.B16, V15.B16
	VEOR   V18.B16, V18.B16, V18.B16
	VLD1.P 32(R1), [V16.B16, V17.B16]
	VAND   V30.B16, V1.B16, V7.B16
	VAND   V31.B16, V5.B16, V8.B16
	VSHL   $4, V8.B16, V8.B16
	VORR   V8.B16, V7.B16, V7.B16
	SDOT(9, 7, 16) // sdot v9.4s, v7.16b, v16.16b
	VAND   V30.B16, V2.B16, V7.B16
	VAND   V31.B16, V6.B16, V8.B16
	VSHL   $4, V8.B16, V8.B16
	VORR   V8.B16, V7.B16, V7.B16
	SDOT(10, 7, 17) // sdot v10.4s, v7.16b, v17.16b
	VLD1.P 32(R1), [V16.B16, V17.B16]
	VAND   V30.B16, V3.B16, V7.B16
	VUSHR  $2, V5.B16, V8.B16
	VAND   V31.B16, V8.B16, V8.B16
	VSHL   $4, V8.B16, V8.B16
	VORR   V8.B16, V7.B16, V7.B16
	SDOT(11, 7, 16) // sdot v11.4s, v7.16b, v16.16b
	VAND   V30.B16, V4.B16, V7.B16
	VUSHR  $2, V6.B16, V8.B16
	VAND   V31.B16, V8.B16, V8.B16
	VSHL   $4, V8.B16, V8.B16
	VORR   V8.B16, V7.B16, V7.B16
	SDOT(12, 7, 17) // sdot v12.4s, v7.16b, v17.16b
	VLD1.P 32(R1), [V16.B16, V17.B16]
	VUSHR  $4, V1.B16, V7.B16
	VUSHR  $4, V5.B16, V8.B16
	VAND   V31.B16, V8.B16, V8.B16
	VSHL   $4, V8.B16, V8.B16
	VORR   V8.B16, V7.B16, V7.B16
	SDOT(13, 7, 16) // sdot v13.4s, v7.16b, v16.16b
	VUSHR  $4, V2.B16, V7.B16
	VUSHR  $4, V6.B16, V8.B16
	VAND   V31.B16, V8.B16, V8.B16
	VSHL   $4, V8.B16, V8.B16
	VORR   V8.B16, V7.B16, V7.B16
	SDOT(14, 7, 17) // sdot v14.4s, v7.16b, v17.16b
	VLD1.P 32(R1), [V16.B16, V17.B16]
	VUSHR  $4, V3.B16, V7.B16
	VUSHR  $6, V5.B16, V8.B16
	VSHL   $4, V8.B16, V8.B16
	VORR   V8.B16, V7.B16, V7.B16
	SDOT(15, 7, 16) // sdot v15.4s, v7.16b, v16.16b
	VUSHR  $4, V4.B16, V7.B16
	VUSHR  $6, V6.B16, V8.B16
	VSHL   $4, V8.B16, V8.B16
	VORR   V8.B16, V7.B16, V7.B16
	SDOT(18, 7, 17) // sdot v18.4s, v7.16b, v17.16b
	VADDP  V10.S4, V9.S4, V9.S4
	VADDP  V12.S4, V11.S4, V11.S4
	VADDP  V11.S4, V9.S4, V9.S4
	VADDP  V14.S4, V13.S4, V13.S4
	VADDP  V18.S4, V15.S4, V15.S4
	VADDP  V15.S4, V13.S4, V13.S4
	MLA4(28, 9, 25)  // mla v28.4s, v9.4s, v25.4s
	MLA4(28, 13, 26) // mla v28.4s, v13.4s, v26.4s
	ADD     $82, R0, R0
	VADDV   V28.S4, V28
	FMOVS   F28, R10
	SUBW    R9<<5, R10, R10
	SCVTFWS R10, F1
	FMOVS   R6, F2
	FCVTHS  F2, F2
	FMOVS.P 4(R2), F3
	FMULS   F2, F3, F3
	FMULS   F3, F1, F1
	FADDS   F1, F0, F0
	SUBS    $1, R4, R4
	BNE     blk

done:
	FMOVS F0, ret+40(FP)
	RET

// func dotQ4KNEON(w *byte, xq *int8, xd *float32, xs *int16, nb int) float32
//
// Q4_K: each 64-value chunk c is 32 bytes whose low nibbles are
// sub-block 2c and high nibbles 2c+1 (V31 holds 0x0f bytes).
TEXT ·dotQ4KNEON(SB), NOSPLIT, $0-44
	MOVD w+0(FP), R0
	MOVD xq+8(FP), R1
	MOVD xd+16(FP), R2
	MOVD xs+24(FP), R3
	MOVD nb+32(FP), R4
	VMOVI $15, V31.B16
	VEOR V0.B16, V0.B16, V0.B16
	CBZ  R4, done

blk:
	KMINHEAD
	VEOR V28.B16, V28.B16, V28.B16
	// chunk 0: sub-blocks 0 (V24) and 1 (V25)
	VLD1.P 32(R0), [V1.B16, V2.B16]
	VAND   V31.B16, V1.B16, V3.B16
	VAND   V31.B16, V2.B16, V4.B16
	VUSHR  $4, V1.B16, V5.B16
	VUSHR  $4, V2.B16, V6.B16
	VLD1.P 64(R1), [V16.B16, V17.B16, V18.B16, V19.B16]
	VEOR   V24.B16, V24.B16, V24.B16
	VEOR   V25.B16, V25.B16, V25.B16
	SMULL(7, 3, 16)  // smull v7.8h, v3.8b, v16.8b
	SMLAL2(7, 3, 16) // smlal2 v7.8h, v3.16b, v16.16b
	SADALP(24, 7)     // sadalp v24.4s, v7.8h
	SMULL(7, 4, 17)  // smull v7.8h, v4.8b, v17.8b
	SMLAL2(7, 4, 17) // smlal2 v7.8h, v4.16b, v17.16b
	SADALP(24, 7)     // sadalp v24.4s, v7.8h
	SMULL(7, 5, 18)  // smull v7.8h, v5.8b, v18.8b
	SMLAL2(7, 5, 18) // smlal2 v7.8h, v5.16b, v18.16b
	SADALP(25, 7)     // sadalp v25.4s, v7.8h
	SMULL(7, 6, 19)  // smull v7.8h, v6.8b, v19.8b
	SMLAL2(7, 6, 19) // smlal2 v7.8h, v6.16b, v19.16b
	SADALP(25, 7)     // sadalp v25.4s, v7.8h
	// chunk 1: sub-blocks 2 (V26) and 3 (V27)
	VLD1.P 32(R0), [V1.B16, V2.B16]
	VAND   V31.B16, V1.B16, V3.B16
	VAND   V31.B16, V2.B16, V4.B16
	VUSHR  $4, V1.B16, V5.B16
	VUSHR  $4, V2.B16, V6.B16
	VLD1.P 64(R1), [V16.B16, V17.B16, V18.B16, V19.B16]
	VEOR   V26.B16, V26.B16, V26.B16
	VEOR   V27.B16, V27.B16, V27.B16
	SMULL(7, 3, 16)  // smull v7.8h, v3.8b, v16.8b
	SMLAL2(7, 3, 16) // smlal2 v7.8h, v3.16b, v16.16b
	SADALP(26, 7)     // sadalp v26.4s, v7.8h
	SMULL(7, 4, 17)  // smull v7.8h, v4.8b, v17.8b
	SMLAL2(7, 4, 17) // smlal2 v7.8h, v4.16b, v17.16b
	SADALP(26, 7)     // sadalp v26.4s, v7.8h
	SMULL(7, 5, 18)  // smull v7.8h, v5.8b, v18.8b
	SMLAL2(7, 5, 18) // smlal2 v7.8h, v5.16b, v18.16b
	SADALP(27, 7)     // sadalp v27.4s, v7.8h
	SMULL(7, 6, 19)  // smull v7.8h, v6.8b, v19.8b
	SMLAL2(7, 6, 19) // smlal2 v7.8h, v6.16b, v19.16b
	SADALP(27, 7)     // sadalp v27.4s, v7.8h
	KFOLD(22)
	// chunk 2: sub-blocks 4 (V24) and 5 (V25)
	VLD1.P 32(R0), [V1.B16, V2.B16]
	VAND   V31.B16, V1.B16, V3.B16
	VAND   V31.B16, V2.B16, V4.B16
	VUSHR  $4, V1.B16, V5.B16
	VUSHR  $4, V2.B16, V6.B16
	VLD1.P 64(R1), [V16.B16, V17.B16, V18.B16, V19.B16]
	VEOR   V24.B16, V24.B16, V24.B16
	VEOR   V25.B16, V25.B16, V25.B16
	SMULL(7, 3, 16)  // smull v7.8h, v3.8b, v16.8b
	SMLAL2(7, 3, 16) // smlal2 v7.8h, v3.16b, v16.16b
	SADALP(24, 7)     // sadalp v24.4s, v7.8h
	SMULL(7, 4, 17)  // smull v7.8h, v4.8b, v17.8b
	SMLAL2(7, 4, 17) // smlal2 v7.8h, v4.16b, v17.16b
	SADALP(24, 7)     // sadalp v24.4s, v7.8h
	SMULL(7, 5, 18)  // smull v7.8h, v5.8b, v18.8b
	SMLAL2(7, 5, 18) // smlal2 v7.8h, v5.16b, v18.16b
	SADALP(25, 7)     // sadalp v25.4s, v7.8h
	SMULL(7, 6, 19)  // smull v7.8h, v6.8b, v19.8b
	SMLAL2(7, 6, 19) // smlal2 v7.8h, v6.16b, v19.16b
	SADALP(25, 7)     // sadalp v25.4s, v7.8h
	// chunk 3: sub-blocks 6 (V26) and 7 (V27)
	VLD1.P 32(R0), [V1.B16, V2.B16]
	VAND   V31.B16, V1.B16, V3.B16
	VAND   V31.B16, V2.B16, V4.B16
	VUSHR  $4, V1.B16, V5.B16
	VUSHR  $4, V2.B16, V6.B16
	VLD1.P 64(R1), [V16.B16, V17.B16, V18.B16, V19.B16]
	VEOR   V26.B16, V26.B16, V26.B16
	VEOR   V27.B16, V27.B16, V27.B16
	SMULL(7, 3, 16)  // smull v7.8h, v3.8b, v16.8b
	SMLAL2(7, 3, 16) // smlal2 v7.8h, v3.16b, v16.16b
	SADALP(26, 7)     // sadalp v26.4s, v7.8h
	SMULL(7, 4, 17)  // smull v7.8h, v4.8b, v17.8b
	SMLAL2(7, 4, 17) // smlal2 v7.8h, v4.16b, v17.16b
	SADALP(26, 7)     // sadalp v26.4s, v7.8h
	SMULL(7, 5, 18)  // smull v7.8h, v5.8b, v18.8b
	SMLAL2(7, 5, 18) // smlal2 v7.8h, v5.16b, v18.16b
	SADALP(27, 7)     // sadalp v27.4s, v7.8h
	SMULL(7, 6, 19)  // smull v7.8h, v6.8b, v19.8b
	SMLAL2(7, 6, 19) // smlal2 v7.8h, v6.16b, v19.16b
	SADALP(27, 7)     // sadalp v27.4s, v7.8h
	KFOLD(23)
	KMINTAIL
	SUBS $1, R4, R4
	BNE  blk

done:
	FMOVS F0, ret+40(FP)
	RET

// func dotQ5KNEON(w *byte, xq *int8, xd *float32, xs *int16, nb int) float32
//
// Q5_K: Q4_K's chunks, with the fifth bits of chunk c's values in bits
// 2c (low nibbles) and 2c+1 (high) of the 32 qh bytes (V9, V10, shifted
// down 2 a chunk), moved to bit 4 (V29 holds 0x01 bytes, V30 0x02).
TEXT ·dotQ5KNEON(SB), NOSPLIT, $0-44
	MOVD w+0(FP), R0
	MOVD xq+8(FP), R1
	MOVD xd+16(FP), R2
	MOVD xs+24(FP), R3
	MOVD nb+32(FP), R4
	VMOVI $15, V31.B16
	VMOVI $1, V29.B16
	VMOVI $2, V30.B16
	VEOR V0.B16, V0.B16, V0.B16
	CBZ  R4, done

blk:
	KMINHEAD
	VLD1.P 32(R0), [V9.B16, V10.B16]
	VEOR V28.B16, V28.B16, V28.B16
	// chunk 0: sub-blocks 0 (V24) and 1 (V25)
	VLD1.P 32(R0), [V1.B16, V2.B16]
	VAND   V31.B16, V1.B16, V3.B16
	VAND   V31.B16, V2.B16, V4.B16
	VUSHR  $4, V1.B16, V5.B16
	VUSHR  $4, V2.B16, V6.B16
	VAND   V29.B16, V9.B16, V11.B16
	VAND   V29.B16, V10.B16, V12.B16
	VAND   V30.B16, V9.B16, V13.B16
	VAND   V30.B16, V10.B16, V14.B16
	VSHL   $4, V11.B16, V11.B16
	VSHL   $4, V12.B16, V12.B16
	VSHL   $3, V13.B16, V13.B16
	VSHL   $3, V14.B16, V14.B16
	VORR   V11.B16, V3.B16, V3.B16
	VORR   V12.B16, V4.B16, V4.B16
	VORR   V13.B16, V5.B16, V5.B16
	VORR   V14.B16, V6.B16, V6.B16
	VUSHR  $2, V9.B16, V9.B16
	VUSHR  $2, V10.B16, V10.B16
	VLD1.P 64(R1), [V16.B16, V17.B16, V18.B16, V19.B16]
	VEOR   V24.B16, V24.B16, V24.B16
	VEOR   V25.B16, V25.B16, V25.B16
	SMULL(7, 3, 16)  // smull v7.8h, v3.8b, v16.8b
	SMLAL2(7, 3, 16) // smlal2 v7.8h, v3.16b, v16.16b
	SADALP(24, 7)     // sadalp v24.4s, v7.8h
	SMULL(7, 4, 17)  // smull v7.8h, v4.8b, v17.8b
	SMLAL2(7, 4, 17) // smlal2 v7.8h, v4.16b, v17.16b
	SADALP(24, 7)     // sadalp v24.4s, v7.8h
	SMULL(7, 5, 18)  // smull v7.8h, v5.8b, v18.8b
	SMLAL2(7, 5, 18) // smlal2 v7.8h, v5.16b, v18.16b
	SADALP(25, 7)     // sadalp v25.4s, v7.8h
	SMULL(7, 6, 19)  // smull v7.8h, v6.8b, v19.8b
	SMLAL2(7, 6, 19) // smlal2 v7.8h, v6.16b, v19.16b
	SADALP(25, 7)     // sadalp v25.4s, v7.8h
	// chunk 1: sub-blocks 2 (V26) and 3 (V27)
	VLD1.P 32(R0), [V1.B16, V2.B16]
	VAND   V31.B16, V1.B16, V3.B16
	VAND   V31.B16, V2.B16, V4.B16
	VUSHR  $4, V1.B16, V5.B16
	VUSHR  $4, V2.B16, V6.B16
	VAND   V29.B16, V9.B16, V11.B16
	VAND   V29.B16, V10.B16, V12.B16
	VAND   V30.B16, V9.B16, V13.B16
	VAND   V30.B16, V10.B16, V14.B16
	VSHL   $4, V11.B16, V11.B16
	VSHL   $4, V12.B16, V12.B16
	VSHL   $3, V13.B16, V13.B16
	VSHL   $3, V14.B16, V14.B16
	VORR   V11.B16, V3.B16, V3.B16
	VORR   V12.B16, V4.B16, V4.B16
	VORR   V13.B16, V5.B16, V5.B16
	VORR   V14.B16, V6.B16, V6.B16
	VUSHR  $2, V9.B16, V9.B16
	VUSHR  $2, V10.B16, V10.B16
	VLD1.P 64(R1), [V16.B16, V17.B16, V18.B16, V19.B16]
	VEOR   V26.B16, V26.B16, V26.B16
	VEOR   V27.B16, V27.B16, V27.B16
	SMULL(7, 3, 16)  // smull v7.8h, v3.8b, v16.8b
	SMLAL2(7, 3, 16) // smlal2 v7.8h, v3.16b, v16.16b
	SADALP(26, 7)     // sadalp v26.4s, v7.8h
	SMULL(7, 4, 17)  // smull v7.8h, v4.8b, v17.8b
	SMLAL2(7, 4, 17) // smlal2 v7.8h, v4.16b, v17.16b
	SADALP(26, 7)     // sadalp v26.4s, v7.8h
	SMULL(7, 5, 18)  // smull v7.8h, v5.8b, v18.8b
	SMLAL2(7, 5, 18) // smlal2 v7.8h, v5.16b, v18.16b
	SADALP(27, 7)     // sadalp v27.4s, v7.8h
	SMULL(7, 6, 19)  // smull v7.8h, v6.8b, v19.8b
	SMLAL2(7, 6, 19) // smlal2 v7.8h, v6.16b, v19.16b
	SADALP(27, 7)     // sadalp v27.4s, v7.8h
	KFOLD(22)
	// chunk 2: sub-blocks 4 (V24) and 5 (V25)
	VLD1.P 32(R0), [V1.B16, V2.B16]
	VAND   V31.B16, V1.B16, V3.B16
	VAND   V31.B16, V2.B16, V4.B16
	VUSHR  $4, V1.B16, V5.B16
	VUSHR  $4, V2.B16, V6.B16
	VAND   V29.B16, V9.B16, V11.B16
	VAND   V29.B16, V10.B16, V12.B16
	VAND   V30.B16, V9.B16, V13.B16
	VAND   V30.B16, V10.B16, V14.B16
	VSHL   $4, V11.B16, V11.B16
	VSHL   $4, V12.B16, V12.B16
	VSHL   $3, V13.B16, V13.B16
	VSHL   $3, V14.B16, V14.B16
	VORR   V11.B16, V3.B16, V3.B16
	VORR   V12.B16, V4.B16, V4.B16
	VORR   V13.B16, V5.B16, V5.B16
	VORR   V14.B16, V6.B16, V6.B16
	VUSHR  $2, V9.B16, V9.B16
	VUSHR  $2, V10.B16, V10.B16
	VLD1.P 64(R1), [V16.B16, V17.B16, V18.B16, V19.B16]
	VEOR   V24.B16, V24.B16, V24.B16
	VEOR   V25.B16, V25.B16, V25.B16
	SMULL(7, 3, 16)  // smull v7.8h, v3.8b, v16.8b
	SMLAL2(7, 3, 16) // smlal2 v7.8h, v3.16b, v16.16b
	SADALP(24, 7)     // sadalp v24.4s, v7.8h
	SMULL(7, 4, 17)  // smull v7.8h, v4.8b, v17.8b
	SMLAL2(7, 4, 17) // smlal2 v7.8h, v4.16b, v17.16b
	SADALP(24, 7)     // sadalp v24.4s, v7.8h
	SMULL(7, 5, 18)  // smull v7.8h, v5.8b, v18.8b
	SMLAL2(7, 5, 18) // smlal2 v7.8h, v5.16b, v18.16b
	SADALP(25, 7)     // sadalp v25.4s, v7.8h
	SMULL(7, 6, 19)  // smull v7.8h, v6.8b, v19.8b
	SMLAL2(7, 6, 19) // smlal2 v7.8h, v6.16b, v19.16b
	SADALP(25, 7)     // sadalp v25.4s, v7.8h
	// chunk 3: sub-blocks 6 (V26) and 7 (V27)
	VLD1.P 32(R0), [V1.B16, V2.B16]
	VAND   V31.B16, V1.B16, V3.B16
	VAND   V31.B16, V2.B16, V4.B16
	VUSHR  $4, V1.B16, V5.B16
	VUSHR  $4, V2.B16, V6.B16
	VAND   V29.B16, V9.B16, V11.B16
	VAND   V29.B16, V10.B16, V12.B16
	VAND   V30.B16, V9.B16, V13.B16
	VAND   V30.B16, V10.B16, V14.B16
	VSHL   $4, V11.B16, V11.B16
	VSHL   $4, V12.B16, V12.B16
	VSHL   $3, V13.B16, V13.B16
	VSHL   $3, V14.B16, V14.B16
	VORR   V11.B16, V3.B16, V3.B16
	VORR   V12.B16, V4.B16, V4.B16
	VORR   V13.B16, V5.B16, V5.B16
	VORR   V14.B16, V6.B16, V6.B16
	VLD1.P 64(R1), [V16.B16, V17.B16, V18.B16, V19.B16]
	VEOR   V26.B16, V26.B16, V26.B16
	VEOR   V27.B16, V27.B16, V27.B16
	SMULL(7, 3, 16)  // smull v7.8h, v3.8b, v16.8b
	SMLAL2(7, 3, 16) // smlal2 v7.8h, v3.16b, v16.16b
	SADALP(26, 7)     // sadalp v26.4s, v7.8h
	SMULL(7, 4, 17)  // smull v7.8h, v4.8b, v17.8b
	SMLAL2(7, 4, 17) // smlal2 v7.8h, v4.16b, v17.16b
	SADALP(26, 7)     // sadalp v26.4s, v7.8h
	SMULL(7, 5, 18)  // smull v7.8h, v5.8b, v18.8b
	SMLAL2(7, 5, 18) // smlal2 v7.8h, v5.16b, v18.16b
	SADALP(27, 7)     // sadalp v27.4s, v7.8h
	SMULL(7, 6, 19)  // smull v7.8h, v6.8b, v19.8b
	SMLAL2(7, 6, 19) // smlal2 v7.8h, v6.16b, v19.16b
	SADALP(27, 7)     // sadalp v27.4s, v7.8h
	KFOLD(23)
	KMINTAIL
	SUBS $1, R4, R4
	BNE  blk

done:
	FMOVS F0, ret+40(FP)
	RET

// func dotQ6KNEON(w *byte, xq *int8, xd *float32, xs *int16, nb int) float32
//
// dotQ6KSDOT without the extension.
TEXT ·dotQ6KNEON(SB), NOSPLIT, $0-44
	MOVD w+0(FP), R0
	MOVD xq+8(FP), R1
	MOVD xd+16(FP), R2
	MOVD xs+24(FP), R3
	MOVD nb+32(FP), R4
	VMOVI $15, V30.B16
	VMOVI $3, V31.B16
	VEOR V0.B16, V0.B16, V0.B16
	CBZ  R4, done

blk:
	ADD    $192, R0, R5
	VLD1   (R5), [V20.B16]
	MOVHU  208(R0), R6
	ADD    $128, R0, R7
	SXTLB(21, 20)  // sshll v21.8h, v20.8b, #0
	SXTL2B(22, 20) // sshll2 v22.8h, v20.16b, #0
	SXTLH(23, 21)  // sshll v23.4s, v21.4h, #0
	SXTL2H(24, 21) // sshll2 v24.4s, v21.8h, #0
	SXTLH(25, 22)  // sshll v25.4s, v22.4h, #0
	SXTL2H(26, 22) // sshll2 v26.4s, v22.8h, #0
	VLD1.P 32(R3), [V16.H8, V17.H8]
	SMULLH(18, 21, 16)  // smull v18.4s, v21.4h, v16.4h
	SMLAL2H(18, 21, 16) // smlal2 v18.4s, v21.8h, v16.8h
	SMLALH(18, 22, 17)  // smlal v18.4s, v22.4h, v17.4h
	SMLAL2H(18, 22, 17) // smlal2 v18.4s, v22.8h, v17.8h
	VADDV  V18.S4, V18
	FMOVS  F18, R9
	VEOR   V28.B16, V28.B16, V28.B16
	// half 0: sub-blocks 0-7
	VLD1.P 64(R0), [V1.B16, V2.B16, V3.B16, V4.B16]
	VLD1.P 32(R7), [V5.B16, V6.B16]
	VEOR   V9.B16, V9.B16, V9.B16
	VEOR   V10.B16, V10.B16, V10.B16
	VEOR   V11.B16, V11.B16, V11.B16
	VEOR   V12.B16, V12.B16, V12.B16
	VEOR   V13.B16, V13.B16, V13.B16
	VEOR   V14.B16, V14.B16, V14.B16
	VEOR   V15.B16, V15.B16, V15.B16
	VEOR   V18.B16, V18.B16, V18.B16
	VLD1.P 32(R1), [V16.B16, V17.B16]
	VAND   V30.B16, V1.B16, V7.B16
	VAND   V31.B16, V5.B16, V8.B16
	VSHL   $4, V8.B16, V8.B16
	VORR   V8.B16, V7.B16, V7.B16
	SMULL(8, 7, 16)  // smull v8.8h, v7.8b, v16.8b
	SMLAL2(8, 7, 16) // smlal2 v8.8h, v7.16b, v16.16b
	SADALP(9, 8)     // sadalp v9.4s, v8.8h
	VAND   V30.B16, V2.B16, V7.B16
	VAND   V31.B16, V6.B16, V8.B16
	VSHL   $4, V8.B16, V8.B16
	VORR   V8.B16, V7.B16, V7.B16
	SMULL(8, 7, 17)  // smull v8.8h, v7.8b, v17.8b
	SMLAL2(8, 7, 17) // smlal2 v8.8h, v7.16b, v17.16b
	SADALP(10, 8)     // sadalp v10.4s, v8.8h
	VLD1.P 32(R1), [V16.B16, V17.B16]
	VAND   V30.B16, V3.B16, V7.B16
	VUSHR  $2, V5.B16, V8.B16
	VAND   V31.B16, V8.B16, V8.B16
	VSHL   $4, V8.B16, V8.B16
	VORR   V8.B16, V7.B16, V7.B16
	SMULL(8, 7, 16)  // smull v8.8h, v7.8b, v16.8b
	SMLAL2(8, 7, 16) // smlal2 v8.8h, v7.16b, v16.16b
	SADALP(11, 8)     // sadalp v11.4s, v8.8h
	VAND   V30.B16, V4.B16, V7.B16
	VUSHR  $2, V6.B16, V8.B16
	VAND   V31.B16, V8.B16, V8.B16
	VSHL   $4, V8.B16, V8.B16
	VORR   V8.B16, V7.B16, V7.B16
	SMULL(8, 7, 17)  // smull v8.8h, v7.8b, v17.8b
	SMLAL2(8, 7, 17) // smlal2 v8.8h, v7.16b, v17.16b
	SADALP(12, 8)     // sadalp v12.4s, v8.8h
	VLD1.P 32(R1), [V16.B16, V17.B16]
	VUSHR  $4, V1.B16, V7.B16
	VUSHR  $4, V5.B16, V8.B16
	VAND   V31.B16, V8.B16, V8.B16
	VSHL   $4, V8.B16, V8.B16
	VORR   V8.B16, V7.B16, V7.B16
	SMULL(8, 7, 16)  // smull v8.8h, v7.8b, v16.8b
	SMLAL2(8, 7, 16) // smlal2 v8.8h, v7.16b, v16.16b
	SADALP(13, 8)     // sadalp v13.4s, v8.8h
	VUSHR  $4, V2.B16, V7.B16
	VUSHR  $4, V6.B16, V8.B16
	VAND   V31.B16, V8.B16, V8.B16
	VSHL   $4, V8.B16, V8.B16
	VORR   V8.B16, V7.B16, V7.B16
	SMULL(8, 7, 17)  // smull v8.8h, v7.8b, v17.8b
	SMLAL2(8, 7, 17) // smlal2 v8.8h, v7.16b, v17.16b
	SADALP(14, 8)     // sadalp v14.4s, v8.8h
	VLD1.P 32(R1), [V16.B16, V17.B16]
	VUSHR  $4, V3.B16, V7.B16
	VUSHR  $6, V5.B16, V8.B16
	VSHL   $4, V8.B16, V8.B16
	VORR   V8.B16, V7.B16, V7.B16
	SMULL(8, 7, 16)  // smull v8.8h, v7.8b, v16.8b
	SMLAL2(8, 7, 16) // smlal2 v8.8h, v7.16b, v16.16b
	SADALP(15, 8)     // sadalp v15.4s, v8.8h
	VUSHR  $4, V4.B16, V7.B16
	VUSHR  $6, V6.B16, V8.B16
	VSHL   $4, V8.B16, V8.B16
	VORR   V8.B16, V7.B16, V7.B16
	SMULL(8, 7, 17)  // smull v8.8h, v7.8b, v17.8b
	SMLAL2(8, 7, 17) // smlal2 v8.8h, v7.16b, v17.16b
	SADALP(18, 8)     // sadalp v18.4s, v8.8h
	VADDP  V10.S4, V9.S4, V9.S4
	VADDP  V12.S4, V11.S4, V11.S4
	VADDP  V11.S4, V9.S4, V9.S4
	VADDP  V14.S4, V13.S4, V13.S4
	VADDP  V18.S4, V15.S4, V15.S4
	VADDP  V15.S4, V13.S4, V13.S4
	MLA4(28, 9, 23)  // mla v28.4s, v9.4s, v23.4s
	MLA4(28, 13, 24) // mla v28.4s, v13.4s, v24.4s
	// half 1: sub-blocks 8-15
	VLD1.P 64(R0), [V1.B16, V2.B16, V3.B16, V4.B16]
	VLD1.P 32(R7), [V5.B16, V6.B16]
	VEOR   V9.B16, V9.B16, V9.B16
	VEOR   V10.B16, V10.B16, V10.B16
	VEOR   V11.B16, V11.B16, V11.B16
	VEOR   V12.B16, V12.B16, V12.B16
	VEOR   V13.B16, V13.B16, V13.B16
	VEOR   V14.B16, V14.B16, V14.B16
	VEOR   V15.B16, V15.B16, V15.B16
	VEOR   V18.B16, V18.B16, V18.B16
	VLD1.P 32(R1), [V16.B16, V17.B16]
	VAND   V30.B16, V1.B16, V7.B16
	VAND   V31.B16, V5.B16, V8.B16
	VSHL   $4, V8.B16, V8.B16
	VORR   V8.B16, V7.B16, V7.B16
	SMULL(8, 7, 16)  // smull v8.8h, v7.8b, v16.8b
	SMLAL2(8, 7, 16) // smlal2 v8.8h, v7.16b, v16.16b
	SADALP(9, 8)     // sadalp v9.4s, v8.8h
	VAND   V30.B16, V2.B16, V7.B16
	VAND   V31.B16, V6.B16, V8.B16
	VSHL   $4, V8.B16, V8.B16
	VORR   V8.B16, V7.B16, V7.B16
	SMULL(8, 7, 17)  // smull v8.8h, v7.8b, v17.8b
	SMLAL2(8, 7, 17) // smlal2 v8.8h, v7.16b, v17.16b
	SADALP(10, 8)     // sadalp v10.4s, v8.8h
	VLD1.P 32(R1), [V16.B16, V17.B16]
	VAND   V30.B16, V3.B16, V7.B16
	VUSHR  $2, V5.B16, V8.B16
	VAND   V31.B16, V8.B16, V8.B16
	VSHL   $4, V8.B16, V8.B16
	VORR   V8.B16, V7.B16, V7.B16
	SMULL(8, 7, 16)  // smull v8.8h, v7.8b, v16.8b
	SMLAL2(8, 7, 16) // smlal2 v8.8h, v7.16b, v16.16b
	SADALP(11, 8)     // sadalp v11.4s, v8.8h
	VAND   V30.B16, V4.B16, V7.B16
	VUSHR  $2, V6.B16, V8.B16
	VAND   V31.B16, V8.B16, V8.B16
	VSHL   $4, V8.B16, V8.B16
	VORR   V8.B16, V7.B16, V7.B16
	SMULL(8, 7, 17)  // smull v8.8h, v7.8b, v17.8b
	SMLAL2(8, 7, 17) // smlal2 v8.8h, v7.16b, v17.16b
	SADALP(12, 8)     // sadalp v12.4s, v8.8h
	VLD1.P 32(R1), [V16.B16, V17.B16]
	VUSHR  $4, V1.B16, V7.B16
	VUSHR  $4, V5.B16, V8.B16
	VAND   V31.B16, V8.B16, V8.B16
	VSHL   $4, V8.B16, V8.B16
	VORR   V8.B16, V7.B16, V7.B16
	SMULL(8, 7, 16)  // smull v8.8h, v7.8b, v16.8b
	SMLAL2(8, 7, 16) // smlal2 v8.8h, v7.16b, v16.16b
	SADALP(13, 8)     // sadalp v13.4s, v8.8h
	VUSHR  $4, V2.B16, V7.B16
	VUSHR  $4, V6.B16, V8.B16
	VAND   V31.B16, V8.B16, V8.B16
	VSHL   $4, V8.B16, V8.B16
	VORR   V8.B16, V7.B16, V7.B16
	SMULL(8, 7, 17)  // smull v8.8h, v7.8b, v17.8b
	SMLAL2(8, 7, 17) // smlal2 v8.8h, v7.16b, v17.16b
	SADALP(14, 8)     // sadalp v14.4s, v8.8h
	VLD1.P 32(R1), [V16.B16, V17.B16]
	VUSHR  $4, V3.B16, V7.B16
	VUSHR  $6, V5.B16, V8.B16
	VSHL   $4, V8.B16, V8.B16
	VORR   V8.B16, V7.B16, V7.B16
	SMULL(8, 7, 16)  // smull v8.8h, v7.8b, v16.8b
	SMLAL2(8, 7, 16) // smlal2 v8.8h, v7.16b, v16.16b
	SADALP(15, 8)     // sadalp v15.4s, v8.8h
	VUSHR  $4, V4.B16, V7.B16
	VUSHR  $6, V6.B16, V8.B16
	VSHL   $4, V8.B16, V8.B16
	VORR   V8.B16, V7.B16, V7.B16
	SMULL(8, 7, 17)  // smull v8.8h, v7.8b, v17.8b
	SMLAL2(8, 7, 17) // smlal2 v8.8h, v7.16b, v17.16b
	SADALP(18, 8)     // sadalp v18.4s, v8.8h
	VADDP  V10.S4, V9.S4, V9.S4
	VADDP  V12.S4, V11.S4, V11.S4
	VADDP  V11.S4, V9.S4, V9.S4
	VADDP  V14.S4, V13.S4, V13.S4
	VADDP  V18.S4, V15.S4, V15.S4
	VADDP  V15.S4, V13.S4, V13.S4
	MLA4(28, 9, 25)  // mla v28.4s, v9.4s, v25.4s
	MLA4(28, 13, 26) // mla v28.4s, v13.4s, v26.4s
	ADD     $82, R0, R0
	VADDV   V28.S4, V28
	FMOVS   F28, R10
	SUBW    R9<<5, R10, R10
	SCVTFWS R10, F1
	FMOVS   R6, F2
	FCVTHS  F2, F2
	FMOVS.P 4(R2), F3
	FMULS   F2, F3, F3
	FMULS   F3, F1, F1
	FADDS   F1, F0, F0
	SUBS    $1, R4, R4
	BNE     blk

done:
	FMOVS F0, ret+40(FP)
	RET
