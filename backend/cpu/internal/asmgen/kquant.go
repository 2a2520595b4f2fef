package main

// The K-quant decode dots (backend/cpu/kquant.go has the Go references and
// backend/kquant.go the layouts), AVX2 only: the AVX-512 set uses them too.
// Each takes nb super-blocks of weights at w against nb blocks of 256
// int8 activations xq, their f32 scales xd and per-16 int16 sums xs:
//
//	func dotQ4KAVX2(w *byte, xq *int8, xd *float32, xs *int16, nb int) float32
//
// The weights are unsigned (Q4_K/Q5_K's 4- and 5-bit values, Q6_K's 6-bit
// values before their offset of 32), so vpmaddubsw multiplies them with
// the signed activations directly; its pairs fit int16 (2*63*127 < 32768).
// vpmaddwd then multiplies the pair sums by each sub-block's scale as an
// int16, summing to int32 (at most 8 terms of 2*16002*128 a lane). The
// mins (Q4_K/Q5_K) and Q6_K's offset come off through the per-16 sums.

// bcastD loads the 32-bit constant c into every dword of ymm register y,
// through AX.
func (g *gen) bcastD(c uint32, y int) {
	g.p("\tMOVL $0x%08x, AX", c)
	g.p("\tVMOVD AX, X%d", y)
	g.p("\tVPBROADCASTD X%d, Y%d", y, y)
}

// kProlog loads the arguments: DX w, SI xq, R8 xd, BX xs, CX nb; Y0 the
// f32 accumulator.
func (g *gen) kProlog(name string) {
	g.p("")
	g.p("// func %s(w *byte, xq *int8, xd *float32, xs *int16, nb int) float32", name)
	g.p("TEXT ·%s(SB), NOSPLIT, $0-44", name)
	g.p("\tMOVQ w+0(FP), DX")
	g.p("\tMOVQ xq+8(FP), SI")
	g.p("\tMOVQ xd+16(FP), R8")
	g.p("\tMOVQ xs+24(FP), BX")
	g.p("\tMOVQ nb+32(FP), CX")
	g.p("\tVXORPS Y0, Y0, Y0")
}

// kEpilog sums Y0's lanes into the result.
func (g *gen) kEpilog(name string) {
	g.p("%sdone:", name)
	g.p("\tVEXTRACTF128 $1, Y0, X1")
	g.p("\tVADDPS X1, X0, X0")
	g.p("\tVHADDPS X0, X0, X0")
	g.p("\tVHADDPS X0, X0, X0")
	g.p("\tVMOVSS X0, ret+40(FP)")
	g.p("\tVZEROUPPER")
	g.p("\tRET")
}

// dotKMin writes dotQ4KAVX2 (five false) or dotQ5KAVX2. Per block it
// unpacks the 12 bytes of 6-bit scales and mins with 32-bit masks (words
// w0, w1, w2 = bytes 0-3, 4-7, 8-11: scales 0-3 are w0&0x3f3f3f3f, 4-7
// (w2&0x0f0f0f0f) | ((w0>>6)&0x03030303)<<4; mins 0-3 w1&0x3f3f3f3f, 4-7
// ((w2>>4)&0x0f0f0f0f) | ((w1>>6)&0x03030303)<<4) into R11 (8 scale
// bytes) and R13 (8 min bytes). Each 64-value chunk c is 32 bytes whose
// low nibbles are sub-block 2c and high nibbles 2c+1; Q5_K's fifth bits
// are bits 2c and 2c+1 of the 32 qh bytes, moved to bit 4 by word shifts
// (bits crossing a byte boundary land outside the 0x10 mask).
//
// Registers: Y0 f32 sum, Y1/Y2 the chunk's two sub-blocks, Y3 the block's
// int32 sum, Y4 qh (Q5_K), Y5 a temporary, Y10 a broadcast scale, Y13
// 0x10 bytes, Y14 0x0f bytes.
func (g *gen) dotKMin(five bool) {
	name, bb, qs := "dotQ4KAVX2", 144, 16
	if five {
		name, bb, qs = "dotQ5KAVX2", 176, 48
	}
	g.kProlog(name)
	g.bcastD(0x0f0f0f0f, 14)
	g.bcastD(0x10101010, 13)
	g.p("\tTESTQ CX, CX")
	g.p("\tJZ %sdone", name)
	g.p("%sloop:", name)
	// Scales and mins.
	g.p("\tMOVL 4(DX), AX")   // w0
	g.p("\tMOVL 8(DX), R9")   // w1
	g.p("\tMOVL 12(DX), R10") // w2
	g.p("\tMOVL AX, R11")
	g.p("\tANDL $0x3f3f3f3f, R11") // scales 0-3
	g.p("\tMOVL AX, R12")
	g.p("\tSHRL $6, R12")
	g.p("\tANDL $0x03030303, R12")
	g.p("\tSHLL $4, R12")
	g.p("\tMOVL R10, R13")
	g.p("\tANDL $0x0f0f0f0f, R13")
	g.p("\tORL R13, R12") // scales 4-7
	g.p("\tSHLQ $32, R12")
	g.p("\tORQ R12, R11")
	g.p("\tMOVL R9, R13")
	g.p("\tANDL $0x3f3f3f3f, R13") // mins 0-3
	g.p("\tSHRL $6, R9")
	g.p("\tANDL $0x03030303, R9")
	g.p("\tSHLL $4, R9")
	g.p("\tSHRL $4, R10")
	g.p("\tANDL $0x0f0f0f0f, R10")
	g.p("\tORL R10, R9") // mins 4-7
	g.p("\tSHLQ $32, R9")
	g.p("\tORQ R9, R13")
	g.p("\tVPXOR Y3, Y3, Y3")
	if five {
		g.p("\tVMOVDQU 16(DX), Y4")
	}
	// Shift of qh (left positive) that puts bit j at bit 4.
	hShift := func(j int) int { return 4 - j }
	scale := func() {
		g.p("\tMOVBLZX R11, AX")
		g.p("\tVMOVD AX, X10")
		g.p("\tVPBROADCASTW X10, Y10")
		g.p("\tSHRQ $8, R11")
	}
	for c := range 4 {
		g.p("\tVMOVDQU %d(DX), Y1", qs+32*c)
		g.p("\tVPSRLW $4, Y1, Y2")
		g.p("\tVPAND Y14, Y1, Y1")
		g.p("\tVPAND Y14, Y2, Y2")
		if five {
			for k, y := range []int{1, 2} {
				s := hShift(2*c + k)
				switch {
				case s > 0:
					g.p("\tVPSLLW $%d, Y4, Y5", s)
				case s < 0:
					g.p("\tVPSRLW $%d, Y4, Y5", -s)
				default:
					g.p("\tVMOVDQA Y4, Y5")
				}
				g.p("\tVPAND Y13, Y5, Y5")
				g.p("\tVPOR Y5, Y%d, Y%d", y, y)
			}
		}
		g.p("\tVPMADDUBSW %d(SI), Y1, Y1", 64*c)
		g.p("\tVPMADDUBSW %d(SI), Y2, Y2", 64*c+32)
		scale()
		g.p("\tVPMADDWD Y10, Y1, Y1")
		scale()
		g.p("\tVPMADDWD Y10, Y2, Y2")
		g.p("\tVPADDD Y1, Y3, Y3")
		g.p("\tVPADDD Y2, Y3, Y3")
	}
	g.p("\tVCVTDQ2PS Y3, Y3")
	// [d, dmin] * dx.
	g.p("\tMOVL (DX), AX")
	g.p("\tVMOVD AX, X5")
	g.p("\tVCVTPH2PS X5, X5")
	g.p("\tVBROADCASTSS (R8), X6")
	g.p("\tVMULPS X6, X5, X5")
	g.p("\tVBROADCASTSS X5, Y6")
	g.p("\tVMOVSHDUP X5, X7")
	g.p("\tVBROADCASTSS X7, Y7")
	g.p("\tVFMADD231PS Y6, Y3, Y0")
	// Mins: m_j duplicated per 16-value half, times the per-16 sums.
	g.p("\tVMOVQ R13, X8")
	g.p("\tVPMOVZXBW X8, X8")
	g.p("\tVPUNPCKLWD X8, X8, X9")
	g.p("\tVPUNPCKHWD X8, X8, X8")
	g.p("\tVINSERTI128 $1, X8, Y9, Y9")
	g.p("\tVPMADDWD (BX), Y9, Y9")
	g.p("\tVCVTDQ2PS Y9, Y9")
	g.p("\tVFNMADD231PS Y7, Y9, Y0")
	g.p("\tADDQ $%d, DX", bb)
	g.p("\tADDQ $256, SI")
	g.p("\tADDQ $4, R8")
	g.p("\tADDQ $32, BX")
	g.p("\tDECQ CX")
	g.p("\tJNZ %sloop", name)
	g.kEpilog(name)
}

// dotQ6K writes dotQ6KAVX2. Per half h of a block, ql's two 32-byte runs
// A and B and the 32 qh bytes give four groups g of 32 values: the low 4
// bits A&15, B&15, A>>4, B>>4; the top 2 bits qh's bit pairs 0-1, 2-3,
// 4-5, 6-7, moved to bits 4-5 by word shifts and the 0x30 mask. Group g's
// first 16 values have scale 8h+2g, the next 16 scale 8h+2g+1; vpmaddwd
// takes them from a vector of the 16 scales as int16 (Y11) whose half h
// is copied to both lanes (Y7) and shuffled so that the low lane holds
// scale 2g and the high lane scale 2g+1 of that half (masks Y12-Y15).
// The offset of 32 comes off as 32 * sum of scale*per-16 sum.
//
// Registers: Y0 f32 sum, Y1 A, Y2 B, Y3 qh, Y4 a group's values, Y5 a
// temporary, Y6 the block's int32 sum, Y7 the half's scales, Y8 a
// group's scales, Y9 0x0f bytes, Y10 0x30 bytes, Y11 the block's scales.
func (g *gen) dotQ6K() {
	name := "dotQ6KAVX2"
	g.kProlog(name)
	g.bcastD(0x0f0f0f0f, 9)
	g.bcastD(0x30303030, 10)
	for grp := range 4 {
		lo := uint32(4*grp) | uint32(4*grp+1)<<8
		hi := lo + 0x0202
		g.p("\tMOVL $0x%08x, AX", lo|lo<<16)
		g.p("\tVMOVD AX, X%d", 12+grp)
		g.p("\tVPBROADCASTD X%d, X%d", 12+grp, 12+grp)
		g.p("\tMOVL $0x%08x, AX", hi|hi<<16)
		g.p("\tVMOVD AX, X5")
		g.p("\tVPBROADCASTD X5, X5")
		g.p("\tVINSERTI128 $1, X5, Y%d, Y%d", 12+grp, 12+grp)
	}
	g.p("\tTESTQ CX, CX")
	g.p("\tJZ %sdone", name)
	g.p("%sloop:", name)
	g.p("\tVPMOVSXBW 192(DX), Y11")
	g.p("\tVPXOR Y6, Y6, Y6")
	for h := range 2 {
		g.p("\tVPERMQ $0x%02x, Y11, Y7", []int{0x44, 0xee}[h])
		g.p("\tVMOVDQU %d(DX), Y1", 64*h)
		g.p("\tVMOVDQU %d(DX), Y2", 64*h+32)
		g.p("\tVMOVDQU %d(DX), Y3", 128+32*h)
		for grp := range 4 {
			src := []int{1, 2, 1, 2}[grp]
			if grp < 2 {
				g.p("\tVPAND Y9, Y%d, Y4", src)
			} else {
				g.p("\tVPSRLW $4, Y%d, Y4", src)
				g.p("\tVPAND Y9, Y4, Y4")
			}
			// qh bits 2g..2g+1 to bits 4-5: shift left by 4-2g.
			switch s := 4 - 2*grp; {
			case s > 0:
				g.p("\tVPSLLW $%d, Y3, Y5", s)
			case s < 0:
				g.p("\tVPSRLW $%d, Y3, Y5", -s)
			default:
				g.p("\tVMOVDQA Y3, Y5")
			}
			g.p("\tVPAND Y10, Y5, Y5")
			g.p("\tVPOR Y5, Y4, Y4")
			g.p("\tVPMADDUBSW %d(SI), Y4, Y4", 128*h+32*grp)
			g.p("\tVPSHUFB Y%d, Y7, Y8", 12+grp)
			g.p("\tVPMADDWD Y8, Y4, Y4")
			g.p("\tVPADDD Y4, Y6, Y6")
		}
	}
	// The offset: 32 * sum_j scale_j * sum_j(x).
	g.p("\tVPMADDWD (BX), Y11, Y5")
	g.p("\tVPSLLD $5, Y5, Y5")
	g.p("\tVPSUBD Y5, Y6, Y6")
	g.p("\tVCVTDQ2PS Y6, Y6")
	g.p("\tMOVWLZX 208(DX), AX")
	g.p("\tVMOVD AX, X5")
	g.p("\tVCVTPH2PS X5, X5")
	g.p("\tVMULSS (R8), X5, X5")
	g.p("\tVBROADCASTSS X5, Y5")
	g.p("\tVFMADD231PS Y5, Y6, Y0")
	g.p("\tADDQ $210, DX")
	g.p("\tADDQ $256, SI")
	g.p("\tADDQ $4, R8")
	g.p("\tADDQ $32, BX")
	g.p("\tDECQ CX")
	g.p("\tJNZ %sloop", name)
	g.kEpilog(name)
}
