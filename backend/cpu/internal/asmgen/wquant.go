package main

import "github.com/trigon-llm/trigon/backend"

// dotAWQ4 writes dotAWQ4Y: the dot product of nb AWQ4 blocks of g
// elements (backend/wquant.go: an F16 scale s, an F16 zero point z, then
// g/2 bytes of nibbles, each 32-bit word eight elements in AutoAWQ's
// interleave) with nb*g f32 activations x:
//
//	sum over blocks of s * sum_i x_i * (q_i - z)
//
// Each word is broadcast to the eight dword lanes and shifted right by
// 4 * (its nibble of that lane's element), so lane e holds element e of
// the word in the low nibble; q - z is exact in f32 (q an integer below
// 16, z an F16), the block's sum is scaled once. g/8 is even (g is 32,
// 64 or 128). AVX2 and FMA; the caller checks them.
//
//	func dotAWQ4Y(x *float32, w *byte, nb int, group int) float32
func (g *gen) dotAWQ4() {
	const name = "dotAWQ4Y"
	var inv [8]int // inv[e]: the nibble of a word holding element e
	for i, e := range backend.AWQOrder {
		inv[e] = i
	}
	g.p("")
	for e := range 8 {
		g.p("DATA awqShift<>+%d(SB)/4, $%d", 4*e, 4*inv[e])
	}
	g.p("GLOBL awqShift<>(SB), RODATA|NOPTR, $32")
	g.p("")
	g.p("// func %s(x *float32, w *byte, nb int, group int) float32", name)
	g.p("TEXT ·%s(SB), NOSPLIT, $0-36", name)
	g.p("\tMOVQ x+0(FP), SI")
	g.p("\tMOVQ w+8(FP), DX")
	g.p("\tMOVQ nb+16(FP), CX")
	g.p("\tMOVQ group+24(FP), R8")
	g.p("\tSHRQ $3, R8") // words a block
	g.p("\tVMOVDQU awqShift<>(SB), Y15")
	g.bcastD(0xf, 14)
	g.p("\tVXORPS Y0, Y0, Y0")
	g.p("\tTESTQ CX, CX")
	g.p("\tJZ %sdone", name)
	g.p("%sblock:", name)
	for i, r := range []int{1, 2} { // scale, zero point
		g.p("\tMOVWLZX %d(DX), AX", 2*i)
		g.p("\tVMOVD AX, X%d", r)
		g.p("\tVCVTPH2PS X%d, X%d", r, r)
		g.p("\tVBROADCASTSS X%d, Y%d", r, r)
	}
	g.p("\tVXORPS Y3, Y3, Y3")
	g.p("\tVXORPS Y4, Y4, Y4")
	g.p("\tLEAQ 4(DX), DX")
	g.p("\tMOVQ R8, R9")
	g.p("%sword:", name)
	for k, r := range []int{5, 6} {
		g.p("\tVPBROADCASTD %d(DX), Y%d", 4*k, r)
		g.p("\tVPSRLVD Y15, Y%d, Y%d", r, r)
		g.p("\tVPAND Y14, Y%d, Y%d", r, r)
		g.p("\tVCVTDQ2PS Y%d, Y%d", r, r)
		g.p("\tVSUBPS Y2, Y%d, Y%d", r, r)
		g.p("\tVFMADD231PS %d(SI), Y%d, Y%d", 32*k, r, 3+k)
	}
	g.p("\tADDQ $8, DX")
	g.p("\tADDQ $64, SI")
	g.p("\tSUBQ $2, R9")
	g.p("\tJNZ %sword", name)
	g.p("\tVADDPS Y4, Y3, Y3")
	g.p("\tVFMADD231PS Y1, Y3, Y0")
	g.p("\tDECQ CX")
	g.p("\tJNZ %sblock", name)
	g.p("%sdone:", name)
	g.hsum("Y", 0, 1)
	g.p("\tVMOVSS X0, ret+32(FP)")
	g.p("\tVZEROUPPER")
	g.p("\tRET")
}

// dotF8Row writes dotF8Row<v>: the dot product of n f32 activations x
// with n e4m3fn codes w (an F8E4M3Row row's values, before its scale). An e4m3fn code becomes the F16 of its value / 256:
// its exponent and mantissa bits shifted into an F16's (exponent bias 15
// against 7, which the 2^-8 accounts for, subnormals included) and its
// sign into the F16's; the sum is multiplied by 256 at the end. NaN codes
// read as 480 (weights hold none). Y: AVX2, FMA and F16C; Z: AVX-512,
// 16 codes a conversion (words in a ymm, floats in a zmm).
//
//	func dotF8RowY(x *float32, w *byte, n int) float32   n a multiple of 16
//	func dotF8RowZ(x *float32, w *byte, n int) float32   n a multiple of 32
func (g *gen) dotF8Row(v string) {
	name := "dotF8Row" + v
	h := map[string]string{"Y": "X", "Z": "Y"}[v] // the register of a vector's words
	g.p("")
	g.p("// func %s(x *float32, w *byte, n int) float32", name)
	g.p("TEXT ·%s(SB), NOSPLIT, $0-28", name)
	g.p("\tMOVQ x+0(FP), SI")
	g.p("\tMOVQ w+8(FP), DX")
	g.p("\tMOVQ n+16(FP), CX")
	g.bcastD(0x3f803f80, 14) // exponent and mantissa of two F16s
	g.bcastD(0x80008000, 13) // their signs
	g.p("\tVXORPS %s0, %s0, %s0", v, v, v)
	g.p("\tVXORPS %s1, %s1, %s1", v, v, v)
	g.p("\tTESTQ CX, CX")
	g.p("\tJZ %sdone", name)
	g.p("%sloop:", name)
	// Y: 16 codes as two vectors of eight; Z: 32 as two of sixteen.
	per := 8
	if v == "Z" {
		per = 16
	}
	for k, r := range []int{5, 6} {
		g.p("\tVPMOVZXBW %d(DX), %s%d", per*k, h, r)
		g.p("\tVPSLLW $7, %s%d, %s7", h, r, h)
		g.p("\tVPAND %s14, %s7, %s7", h, h, h)
		g.p("\tVPSLLW $8, %s%d, %s%d", h, r, h, r)
		g.p("\tVPAND %s13, %s%d, %s%d", h, h, r, h, r)
		g.p("\tVPOR %s7, %s%d, %s%d", h, h, r, h, r)
		g.p("\tVCVTPH2PS %s%d, %s%d", h, r, v, r)
		g.p("\tVFMADD231PS %d(SI), %s%d, %s%d", 4*per*k, v, r, v, k)
	}
	g.p("\tADDQ $%d, DX", 2*per)
	g.p("\tADDQ $%d, SI", 8*per)
	g.p("\tSUBQ $%d, CX", 2*per)
	g.p("\tJNZ %sloop", name)
	g.p("%sdone:", name)
	g.p("\tVADDPS %s1, %s0, %s0", v, v, v)
	g.hsum(v, 0, 1)
	g.p("\tMOVL $0x43800000, AX") // 256
	g.p("\tVMOVD AX, X1")
	g.p("\tVMULSS X1, X0, X0")
	g.p("\tVMOVSS X0, ret+24(FP)")
	g.p("\tVZEROUPPER")
	g.p("\tRET")
}
