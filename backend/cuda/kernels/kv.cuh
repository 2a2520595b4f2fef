// kv.cuh: the format of the paged KV cache (backend.KVSpec), the one place
// kernels that write or read the cache take it from: the element type, the
// head-major addresses (of an element, a head's tile in a block, a token
// row, a 16-byte chunk), the slot and position splits, and the element
// conversions. The writers (rope.cu, gemv.cu's qkv_rope_bf16) and the
// attention readers (attention.cu, attn_decode.cu, attn_prefill.cu,
// attn_prefill_wg.cu) compute cache addresses only through it.
//
// A module that includes it is specialised with -DKV_DT=<cache dtype> (a
// DT_* code of common.cuh; the spec's dtype). The layout is head-major:
// per layer a K and a V pool of
//   [numBlocks][numKVHeads][blockSize][headDim] elements,
// so one head's slice of a block is a contiguous [blockSize][headDim]
// tile, and a sequence's token p lives at offset p % blockSize of block
// table[p / blockSize]. The block size and head dim are arguments: some
// kernels have them as compile-time constants (BS, HD), others at run time.
//
// Quantized formats (backend.KVSpec): KV_DT DT_F8E4M3 is e4m3fn values
// with one f32 scale per (layer, KV head); DT_I8 is symmetric int8 with
// one f16 scale per token and group of KV_G channels (-DKV_G, a multiple
// of 8 dividing the head dim), the scales of a pool laid out as
//   [numBlocks][numKVHeads][blockSize][headDim/KV_G] f16
// so a head's scales in a block are contiguous too. KV_QUANT is 1 for
// them (the formats of a byte a value, quantized row by row).
//
// DT_U4 is int4 in the KIVI manner (KV_KIVI is 1; backend.KVScaleKIVI):
// values 0..15 two a byte, the lower channel in the low nibble, so a
// token row of a head is hd/2 bytes and a head's tile in a block
// bs*hd/2 bytes; decoded as q*s + z. K's scales and zero points are per
// channel over the tokens of a block, V's per token and group of KV_G
// channels:
//   K scales [numBlocks][numKVHeads][2][headDim] f16: scales, zero points
//   V scales [numBlocks][numKVHeads][blockSize][headDim/KV_G][2] f16
//   K, V window [numWindowBlocks][numKVHeads][blockSize][headDim] bf16
//   window map [numBlocks] i32: a block's window block, or -1
// The window pools are addressed as the pools are (kv_at with the window
// block for the block). Every written token goes to its block's window
// block in bf16 and its V to the pool at once; a block's K is quantized
// from its window copy once the block is full (rope.cu's kivi_seal_k).
#pragma once
#include "common.cuh"

#ifndef KV_DT
#error "kv.cuh needs -DKV_DT, the KV cache dtype"
#endif

#define DT_F8E4M3 7  // backend.F8E4M3
#define DT_I8 8      // backend.I8
#define DT_U4 9      // backend.U4

// kv_t is the storage of one cache element.
#if KV_DT == DT_F32
typedef float kv_t;
#elif KV_DT == DT_F16 || KV_DT == DT_BF16
typedef u16 kv_t;
#elif KV_DT == DT_F8E4M3
typedef unsigned char kv_t;
#elif KV_DT == DT_I8
typedef signed char kv_t;
#elif KV_DT == DT_U4
typedef unsigned char kv_t;  // a byte of two values
#else
#error "kv.cuh: KV_DT is not a KV cache dtype the kernels take"
#endif

#if KV_DT == DT_F8E4M3 || KV_DT == DT_I8
#define KV_QUANT 1
#else
#define KV_QUANT 0
#endif
#if KV_DT == DT_U4
#define KV_KIVI 1
#else
#define KV_KIVI 0
#endif

// Readers whose arithmetic is BF16's (tensor-core operands taken straight
// from the cache rows, bf16 pairs unpacked by shifts, shared-memory tiles
// laid out as the cache rows are) define KV_BF16_ONLY before including
// this header: they take no other format, and a module built for one
// fails here rather than reading the cache wrongly.
#if defined(KV_BF16_ONLY) && KV_DT != DT_BF16
#error "this kernel reads BF16 KV caches only (KV_DT must be DT_BF16)"
#endif
// KV_BF16_OR_QUANT readers take BF16 caches, or quantized ones that they
// dequantize to BF16 tiles before the same arithmetic.
#if defined(KV_BF16_OR_QUANT) && KV_DT != DT_BF16 && !KV_QUANT && !KV_KIVI
#error "this kernel reads BF16 or quantized (fp8, int8, int4) KV caches only"
#endif

// The group is checked after the reader's format, so a BF16-only module
// built for int8 fails with the format error above.
#if KV_DT == DT_I8 || KV_DT == DT_U4
#if !defined(KV_G) || KV_G % 8 != 0 || (KV_G > 32 && KV_G % 32 != 0)
#error "an int8 or int4 KV cache needs -DKV_G, its channel group: 8, 16, 32 or a multiple of 32"
#endif
#endif

// KV_CHUNK is the elements of one 16-byte chunk (a vector load or a
// cp.async); a row of hd elements is kv_row_chunks(hd) chunks (kernels
// that copy by chunks take head dims that are multiples of KV_CHUNK).
#if KV_KIVI
#define KV_CHUNK 32
#else
#define KV_CHUNK (16 / (int)sizeof(kv_t))
#endif
__host__ __device__ constexpr int kv_row_chunks(int hd) { return hd / KV_CHUNK; }

// kv_chunk is the element offset of chunk u in a row.
__device__ __forceinline__ int kv_chunk(int u) { return u * KV_CHUNK; }

// kv_index is the block-table index of sequence position p (or the block
// of a slot, block*bs + offset).
__device__ __forceinline__ int kv_index(int p, int bs) { return p / bs; }

// kv_offset is p's offset in its block. Given bi = kv_index(p, bs) (a
// reader has it already, for its block-table lookup) it is p - bi*bs.
__device__ __forceinline__ int kv_offset(int p, int bs) { return p % bs; }
__device__ __forceinline__ int kv_offset(int p, int bi, int bs) { return p - bi * bs; }

// kv_split splits a slot (block*bs + offset) into its block and offset.
__device__ __forceinline__ void kv_split(int slot, int bs, int& blk, int& off) {
  blk = kv_index(slot, bs);
  off = kv_offset(slot, blk, bs);
}

// kv_at is the element index of token offset off, element 0, of KV head
// head in block blk of a pool of kvh heads, blocks of bs tokens, hd dims.
__device__ __forceinline__ i64 kv_at(int blk, int kvh, int head, int bs, int off, int hd) {
  return (((i64)blk * kvh + head) * bs + off) * hd;
}

// kv_at_pos is kv_at for sequence position p, which lies in block blk
// (the table's entry bi = kv_index(p, bs)).
__device__ __forceinline__ i64 kv_at_pos(int blk, int kvh, int head, int bs, int p, int bi, int hd) {
  return (((i64)blk * kvh + head) * bs + kv_offset(p, bi, bs)) * hd;
}

// kv_head locates one KV head's tiles in a pool: block blk's contiguous
// [bs][hd] tile of the head starts at element blk * stride + base. A
// kernel that walks one head through many blocks computes it once
// (kv_head_of) and takes each tile with kv_tile, a row of it with kv_row.
struct kv_head {
  i64 base;    // the head's tile within a block
  i64 stride;  // elements of one block (all kvh heads)
};

// kv_head_of is head's kv_head in a pool of kvh heads, bs tokens a block,
// hd dims.
__device__ __forceinline__ kv_head kv_head_of(int kvh, int head, int bs, int hd) {
  return {(i64)head * bs * hd, (i64)kvh * bs * hd};
}

// kv_tile is the element index of h's tile in block blk (its token 0,
// element 0).
__device__ __forceinline__ i64 kv_tile(const kv_head& h, int blk) { return (i64)blk * h.stride + h.base; }

// kv_row is the element offset of token offset off within a head tile of
// hd dims.
__device__ __forceinline__ i64 kv_row(int off, int hd) { return (i64)off * hd; }

#if !KV_QUANT && !KV_KIVI
// kv_store writes element i of an unquantized pool, converted from float.
__device__ __forceinline__ void kv_store(void* pool, i64 i, float v) { store_f<KV_DT>(pool, i, v); }

// kv_load reads element i of an unquantized pool, converted to float.
__device__ __forceinline__ float kv_load(const void* pool, i64 i) { return load_f<KV_DT>(pool, i); }
#endif

// ------------------------------------------------------------ quantized

// bf16x8_to_f16x8 converts 8 packed bf16 to 8 packed f16 (round to
// nearest; magnitudes past 65504 become infinities).
__device__ __forceinline__ uint4 bf16x8_to_f16x8(uint4 v) {
  const u32 w[4] = {v.x, v.y, v.z, v.w};
  u32 o[4];
#pragma unroll
  for (int j = 0; j < 4; j++) {
    const float lo = __uint_as_float(w[j] << 16), hi = __uint_as_float(w[j] & 0xffff0000u);
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(o[j]) : "f"(hi), "f"(lo));
  }
  return make_uint4(o[0], o[1], o[2], o[3]);
}

// e4m3 encodes f as e4m3fn exactly as backend.F32ToE4M3 does: round to
// nearest even, magnitudes from 448 up (infinities included) saturate to
// +-448, NaN is 0x7F.
__device__ __forceinline__ unsigned char f32_to_e4m3(float f) {
  if (f != f) return 0x7F;
  const u32 sign = (__float_as_uint(f) >> 24) & 0x80u;
  const float a = fabsf(f);
  if (a >= 448.f) return (unsigned char)(sign | 0x7Eu);
  if (a < 0.015625f) return (unsigned char)(sign | (u32)rintf(a * 512.f));  // subnormals: steps of 2^-9
  int e = (int)((__float_as_uint(a) >> 23) & 0xffu) - 127;                  // a = 1.m * 2^e, e >= -6
  float q = rintf(a * __uint_as_float((u32)(127 + 3 - e) << 23));           // 8..16
  if (q == 16.f) {
    q = 8.f;
    e++;
  }
  const u32 code = min((u32)(e + 7) << 3 | ((u32)q - 8u), 0x7Eu);
  return (unsigned char)(sign | code);
}

// e4m3_to_f32 decodes an e4m3fn byte times mul: the byte's low seven bits
// shifted to an f32's exponent and mantissa are the value times 2^-120
// (subnormals included: they become f32 subnormals), so one multiply by
// mul * 2^120 finishes it. NaN codes decode to finite garbage: the
// writers never store them.
__device__ __forceinline__ float e4m3_to_f32(u32 b, float mul_2p120) {
  return __uint_as_float(((b & 0x7Fu) << 20) | ((b & 0x80u) << 24)) * mul_2p120;
}
#define E4M3_2P120 1.329227995784916e36f  // 2^120

#if KV_QUANT
// kv_scale_ng is the scales of one token row (1 for FP8, whose scale is
// per head and not stored per row).
#if KV_DT == DT_I8
#define KV_NG(hd) ((hd) / KV_G)
#else
#define KV_NG(hd) 1
#endif

// kv_store_row quantizes one token row of a KV head into the cache. The
// warp holds the row as v[k] = element lane + 32k (k < VPL, elements past
// hd are ignored) and every lane calls it. row is the cache element index
// of the row (kv_at), srow its scales' index: for DT_I8 the f16 scales
// of the row start at srow*KV_NG(hd) in scales; for DT_F8E4M3 scales is
// the f32 [numKVHeads] per-head scales and srow the head. The rounding is
// backend.QuantizeSym8's and F32ToE4M3's, so the bytes are the CPU
// backend's for the same inputs.
template <int VPL>
__device__ __forceinline__ void kv_store_row(kv_t* pool, void* scales, i64 row, i64 srow, const float (&v)[VPL], int hd,
                                             int lane) {
#if KV_DT == DT_F8E4M3
  const float s = ((const float*)scales)[srow];
#pragma unroll
  for (int k = 0; k < VPL; k++) {
    const int i = lane + 32 * k;
    if (i < hd) pool[row + i] = s > 0.f ? f32_to_e4m3(v[k] / s) : 0;
  }
#else
  float a[VPL];
#pragma unroll
  for (int k = 0; k < VPL; k++) {
    a[k] = lane + 32 * k < hd ? fabsf(v[k]) : 0.f;
#pragma unroll
    for (int o = (KV_G < 32 ? KV_G : 32) / 2; o > 0; o >>= 1) a[k] = fmaxf(a[k], __shfl_xor_sync(0xffffffffu, a[k], o));
  }
#if KV_G > 32
  // A group spans KV_G/32 consecutive k; each a[k] is already its k's
  // warp-wide maximum.
#pragma unroll
  for (int k = 0; k < VPL; k++) {
    const int k0 = k / (KV_G / 32) * (KV_G / 32);
    float m = 0.f;
#pragma unroll
    for (int j = 0; j < KV_G / 32; j++)
      if (k0 + j < VPL) m = fmaxf(m, a[k0 + j]);
    a[k] = m;
  }
#endif
  u16* sc = (u16*)scales + srow * KV_NG(hd);
#pragma unroll
  for (int k = 0; k < VPL; k++) {
    const int i = lane + 32 * k;
    if (i >= hd) continue;
    const u16 sb = f32_to_f16(a[k] / 127.f);
    const float s = f16_to_f32(sb);
    float r = 0.f;
    if (s > 0.f && s < __int_as_float(0x7f800000)) {  // a finite positive scale
      r = rintf(v[k] / s);
      r = r != r ? 0.f : fminf(fmaxf(r, -127.f), 127.f);
    }
    pool[row + i] = (signed char)(int)r;
    if (i % KV_G == 0) sc[i / KV_G] = sb;
  }
#endif
}

// kv_dequant16 converts 16 consecutive cache elements (one 16-byte chunk
// of a quantized row) to 16 bf16 values, two uint4: int8 times its
// group's f16 scale s (a chunk of 16 lies in one group, or in two of 8:
// s2 is the second's), e4m3 times mul (the per-head scale, or 1 where the
// caller folds the scale in elsewhere).
__device__ __forceinline__ void kv_dequant16(uint4 q, float s, float s2, uint4& lo, uint4& hi) {
  const u32 w[4] = {q.x, q.y, q.z, q.w};
  u32 o[8];
#pragma unroll
  for (int j = 0; j < 4; j++) {
    const float sj = j < 2 ? s : s2;
#if KV_DT == DT_I8
    // Byte b of w as a signed value: (b ^ 0x80) as the low mantissa byte
    // of 2^23 is the f32 2^23 + 128 + b; subtracting is exact, and the
    // product rounds once, as the CPU's float32(q)*s.
    const u32 x = w[j] ^ 0x80808080u;
    float f[4];
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const float m = __uint_as_float(__byte_perm(x, 0x4B000000u, 0x7650 + e));
      f[e] = (m - 8388736.f) * sj;
    }
#else
    const float mul = sj * E4M3_2P120;
    float f[4];
#pragma unroll
    for (int e = 0; e < 4; e++) f[e] = e4m3_to_f32(w[j] >> (8 * e), mul);
#endif
    o[2 * j] = pack_bf16x2(f[0], f[1]);
    o[2 * j + 1] = pack_bf16x2(f[2], f[3]);
  }
  lo = make_uint4(o[0], o[1], o[2], o[3]);
  hi = make_uint4(o[4], o[5], o[6], o[7]);
}

// kv_dequant16_f16 is kv_dequant16 to f16 (for f16 tensor-core
// operands), with integer tricks instead of f32 arithmetic: an int8 byte
// b becomes the f16 1024 + 128 + b by placing b ^ 0x80 in an f16
// mantissa (exponent 10), one packed subtraction gives b exactly, one
// packed multiply scales it (s2a: the f16x2 pair (s, s) of the first 8
// elements' scale, s2b of the last 8's; e4m3 ignores them: its scale is
// applied elsewhere). e4m3 converts two bytes an instruction on sm_89
// and newer; before, its seven magnitude bits shifted into an f16 are the
// value times 2^-8 (subnormals included), times 256 exactly.
__device__ __forceinline__ void kv_dequant16_f16(uint4 q, u32 s2a, u32 s2b, uint4& lo, uint4& hi) {
  const u32 w[4] = {q.x, q.y, q.z, q.w};
  u32 o[8];
#pragma unroll
  for (int j = 0; j < 4; j++) {
#if KV_DT == DT_I8
    const u32 x = w[j] ^ 0x80808080u;
    const u32 p0 = __byte_perm(x, 0x64646464u, 0x5140), p1 = __byte_perm(x, 0x64646464u, 0x5342);
    const u32 bias = 0x64806480u;  // f16x2 (1152, 1152)
    const u32 s2 = j < 2 ? s2a : s2b;
    u32 h0, h1;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(h0) : "r"(p0), "r"(bias));
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(h1) : "r"(p1), "r"(bias));
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(o[2 * j]) : "r"(h0), "r"(s2));
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(o[2 * j + 1]) : "r"(h1), "r"(s2));
#elif __CUDA_ARCH__ >= 890
    asm("{ .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h; }"
        : "=r"(o[2 * j]), "=r"(o[2 * j + 1])
        : "r"(w[j]));
#else
    const u32 t0 = __byte_perm(w[j], 0, 0x1404), t1 = __byte_perm(w[j], 0, 0x3424);  // bytes to the halves' high bytes
    const u32 k256 = 0x5C005C00u;                                                   // f16x2 (256, 256)
    const u32 m0 = ((t0 >> 1) & 0x3FFF3FFFu) | (t0 & 0x80008000u), m1 = ((t1 >> 1) & 0x3FFF3FFFu) | (t1 & 0x80008000u);
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(o[2 * j]) : "r"(m0), "r"(k256));
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(o[2 * j + 1]) : "r"(m1), "r"(k256));
#endif
  }
  lo = make_uint4(o[0], o[1], o[2], o[3]);
  hi = make_uint4(o[4], o[5], o[6], o[7]);
}

// kv_dequant8 is kv_dequant16 for 8 elements (8 bytes): one uint4 of bf16.
__device__ __forceinline__ uint4 kv_dequant8(uint2 q, float s) {
  uint4 lo, hi;
  kv_dequant16(make_uint4(q.x, q.y, 0, 0), s, s, lo, hi);
  return lo;
}
#endif  // KV_QUANT

// ------------------------------------------------------------ int4 (KIVI)

// kv_win is what the kernels that write or read a KIVI cache take beside
// the pools and their scales: the window pools, the window map, the
// window pool's block count and the window (the newest tokens of a
// sequence read in bf16, backend.KVSpec.Window). The kernels declare its
// parameters with KV_WIN_PARAMS and build it with KV_WIN_ARGS; for the
// other formats all three are empty, so their code does not change.
#if KV_KIVI
struct kv_win {
  u16* k;          // [n][numKVHeads][blockSize][headDim] bf16
  u16* v;          // alike
  const int* map;  // [numBlocks]: a block's window block, or -1
  int n;           // window blocks
  int window;      // tokens
};
#define KV_WIN_PARAMS , u16 *kwin, u16 *vwin, const int *wmap, int num_win, int kv_window
#define KV_WIN_ARGS {kwin, vwin, wmap, num_win, kv_window}
#else
struct kv_win {};
#define KV_WIN_PARAMS
#define KV_WIN_ARGS {}
#endif

#if KV_KIVI
// kivi_window is block blk's window block, or -1 when it has none; an id
// past the window pool is reported (ERR_WINDOW) and taken as none.
__device__ __forceinline__ int kivi_window(const kv_win& kw, int blk, int* err) {
  const int w = kw.map[blk];
  if (w >= kw.n) {
    report(err, ERR_WINDOW);
    return -1;
  }
  return w < 0 ? -1 : w;
}

// kivi_first_bf16 is the first of n rows, positions p0..p0+n-1 of a
// sequence of length L in block table entry bi (one block), that is read
// in bf16 (backend.KVSpec): all of them (0) when the block is not full,
// none (n) when it has no window block (w < 0), else those at positions
// from L - window on. A block that is not full and has no window block
// has no valid form (the CPU refuses it); the kernels read its int4
// bytes, which for the graphs' padding rows (the null block, never
// written, its scales zero) decode to zeros.
__device__ __forceinline__ int kivi_first_bf16(int w, int p0, int bi, int L, int window, int bs, int n) {
  if (w < 0) return n;
  if ((bi + 1) * bs > L) return 0;
  return min(max(L - window - p0, 0), n);
}

// kivi_params is backend.QuantizeAsym4's scale and zero point of a group
// whose smallest value is lo and largest hi: s = f16((hi-lo)/15),
// z = f16(lo), as stored (sb, zb) and as floats.
__device__ __forceinline__ void kivi_params(float lo, float hi, u16& sb, u16& zb, float& s, float& z) {
  sb = f32_to_f16((hi - lo) / 15.f);
  zb = f32_to_f16(lo);
  s = f16_to_f32(sb);
  z = f16_to_f32(zb);
}

// kivi_code is v's code: clamp(round((v-z)/s), 0, 15), ties to even, 0
// when s is not a positive finite number or the quotient is NaN
// (backend's quantStep).
__device__ __forceinline__ u32 kivi_code(float v, float z, float s) {
  if (!(s > 0.f) || s == __int_as_float(0x7f800000)) return 0;
  const float r = rintf((v - z) / s);
  if (r != r) return 0;
  return (u32)fminf(fmaxf(r, 0.f), 15.f);
}

// kivi_store_v quantizes one V row of a KV head into the cache: per group
// of KV_G channels, scale and zero point as kivi_params, the values as
// kivi_code. The warp holds the row as v[k] = element lane + 32k
// (elements past hd ignored) and every lane calls it. row is the cache
// element index of the row (kv_at; even: a row is hd values), srow the
// row's index in the V scales (its (block, head, offset)).
template <int VPL>
__device__ __forceinline__ void kivi_store_v(kv_t* pool, void* scales, i64 row, i64 srow, const float (&v)[VPL], int hd,
                                             int lane) {
  float lo[VPL], hi[VPL];
#pragma unroll
  for (int k = 0; k < VPL; k++) {
    const bool in = lane + 32 * k < hd;
    lo[k] = in ? v[k] : __int_as_float(0x7f800000);
    hi[k] = in ? v[k] : -__int_as_float(0x7f800000);
#pragma unroll
    for (int o = (KV_G < 32 ? KV_G : 32) / 2; o > 0; o >>= 1) {
      lo[k] = fminf(lo[k], __shfl_xor_sync(0xffffffffu, lo[k], o));
      hi[k] = fmaxf(hi[k], __shfl_xor_sync(0xffffffffu, hi[k], o));
    }
  }
#if KV_G > 32
  // A group spans KV_G/32 consecutive k; each k's range is already its
  // warp-wide one.
#pragma unroll
  for (int k = 0; k < VPL; k++) {
    const int k0 = k / (KV_G / 32) * (KV_G / 32);
    float a = __int_as_float(0x7f800000), b = -a;
#pragma unroll
    for (int j = 0; j < KV_G / 32; j++)
      if (k0 + j < VPL) {
        a = fminf(a, lo[k0 + j]);
        b = fmaxf(b, hi[k0 + j]);
      }
    lo[k] = a;
    hi[k] = b;
  }
#endif
  u32* sc = (u32*)scales + srow * (hd / KV_G);  // (scale, zero point) pairs
#pragma unroll
  for (int k = 0; k < VPL; k++) {
    const int i = lane + 32 * k;
    u16 sb, zb;
    float s, z;
    kivi_params(lo[k], hi[k], sb, zb, s, z);
    const u32 q = kivi_code(v[k], z, s);
    const u32 qn = __shfl_down_sync(0xffffffffu, q, 1);  // element i+1's code (lane+1, same k)
    if (i >= hd) continue;
    if ((i & 1) == 0) pool[(row + i) >> 1] = (unsigned char)(q | qn << 4);
    if (i % KV_G == 0) sc[i / KV_G] = (u32)sb | (u32)zb << 16;
  }
}

// kivi_pair_f16 turns byte b (bits 8j..8j+7 of w, j = sel & 3) of packed
// codes into the f16x2 pair of its two values, low nibble in the low
// half: prmt places the byte under the exponents of 1024 (low half) and
// 64 (high half), whose f16 ulps are 1 and 1/16, so masking each half's
// nibble gives 1024 + lo and 64 + hi exactly; one packed subtraction
// leaves (lo, hi), and one packed fma scales and shifts them, rounding
// once (the CPU's q*s + z in f32, rounded to f16 after, may differ by
// an f16 ulp). ex holds the exponent bytes, 0x00005464: a caller that
// keeps them in a register lets the selector be prmt's immediate.
__device__ __forceinline__ u32 kivi_pair_f16(u32 w, u32 ex, u32 sel, u32 s2, u32 z2) {
  u32 t = __byte_perm(w, ex, sel);
  t &= 0xFFF0FF0Fu;
  u32 h;
  asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(h) : "r"(t), "r"(0x54006400u));
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(h) : "r"(h), "r"(s2), "r"(z2));
  return h;
}

// kivi_dequant8_bf16 decodes 8 consecutive values (4 bytes, q) to 8 bf16
// (one uint4) as the CPU does: f32(q*s) + z (the product is exact in
// f32), rounded to bf16; value e has scale s[e] and zero point z[e].
__device__ __forceinline__ uint4 kivi_dequant8_bf16(u32 q, const float (&s)[8], const float (&z)[8]) {
  float f[8];
#pragma unroll
  for (int e = 0; e < 8; e++) f[e] = (float)((q >> (4 * e)) & 0xFu) * s[e] + z[e];
  return make_uint4(pack_bf16x2(f[0], f[1]), pack_bf16x2(f[2], f[3]), pack_bf16x2(f[4], f[5]), pack_bf16x2(f[6], f[7]));
}
#endif  // KV_KIVI
