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
