// Encodings of the NEON instructions Go's arm64 assembler has no
// mnemonic for, for kernels_arm64.s and kernels_gen_arm64.s. Each macro
// takes register numbers in the Arm operand order (destination first)
// and emits the instruction with WORD; the comment beside each use spells
// it in Arm syntax. The native mnemonics keep Go's order (sources first,
// destination last).

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

// sdot vd.4s, vn.16b, vm.4b[l]: by lane l of vm.
#define SDOTE(d, n, m, l) WORD $(0x4f80e000 | ((l)&1)<<21 | ((l)>>1)<<11 | (m)<<16 | (n)<<5 | (d))
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
// fsub vd.4s, vn.4s, vm.4s; fcmge vd.4s, vn.4s, vm.4s (all ones where
// vn >= vm); fcvtns vd.4s, vn.4s (f32 to int32, nearest, ties to even).
#define FSUB4(d, n, m) WORD $(0x4ea0d400 | (m)<<16 | (n)<<5 | (d))
#define FCMGE4(d, n, m) WORD $(0x6e20e400 | (m)<<16 | (n)<<5 | (d))
#define FCVTNS(d, n) WORD $(0x4e21a800 | (n)<<5 | (d))

// ushl vd.4s, vn.4s, vm.4s: each lane of vn shifted left by the signed
// lane of vm (right where negative).
#define USHL4(d, n, m) WORD $(0x6ea04400 | (m)<<16 | (n)<<5 | (d))
// ucvtf vd.4s, vn.4s: uint32 to f32.
#define UCVTF(d, n) WORD $(0x6e21d800 | (n)<<5 | (d))
// ushll vd.8h, vn.8b, #0 / ushll2 vd.8h, vn.16b, #0: zero extension of
// the low / high bytes.
#define UXTLB(d, n) WORD $(0x2f08a400 | (n)<<5 | (d))
#define UXTL2B(d, n) WORD $(0x6f08a400 | (n)<<5 | (d))
