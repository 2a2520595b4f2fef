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
// them. The int4 (KIVI) format has no kernels.
#pragma once
#include "common.cuh"

#ifndef KV_DT
#error "kv.cuh needs -DKV_DT, the KV cache dtype"
#endif

#define DT_F8E4M3 7  // backend.F8E4M3
#define DT_I8 8      // backend.I8

// kv_t is the storage of one cache element.
#if KV_DT == DT_F32
typedef float kv_t;
#elif KV_DT == DT_F16 || KV_DT == DT_BF16
typedef u16 kv_t;
#elif KV_DT == DT_F8E4M3
typedef unsigned char kv_t;
#elif KV_DT == DT_I8
typedef signed char kv_t;
#else
#error "kv.cuh: KV_DT is not a KV cache dtype the kernels take"
#endif

#if KV_DT == DT_F8E4M3 || KV_DT == DT_I8
#define KV_QUANT 1
#else
#define KV_QUANT 0
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
#if defined(KV_BF16_OR_QUANT) && KV_DT != DT_BF16 && !KV_QUANT
#error "this kernel reads BF16 or quantized (fp8, int8) KV caches only"
#endif

// The group is checked after the reader's format, so a BF16-only module
// built for int8 fails with the format error above.
#if KV_DT == DT_I8
#if !defined(KV_G) || KV_G % 8 != 0 || (KV_G > 32 && KV_G % 32 != 0)
#error "an int8 KV cache needs -DKV_G, its channel group: 8, 16, 32 or a multiple of 32"
#endif
#endif

// KV_CHUNK is the elements of one 16-byte chunk (a vector load or a
// cp.async); a row of hd elements is kv_row_chunks(hd) chunks (kernels
// that copy by chunks take head dims that are multiples of KV_CHUNK).
#define KV_CHUNK (16 / (int)sizeof(kv_t))
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

#if !KV_QUANT
// kv_store writes element i of an unquantized pool, converted from float.
__device__ __forceinline__ void kv_store(void* pool, i64 i, float v) { store_f<KV_DT>(pool, i, v); }

// kv_load reads element i of an unquantized pool, converted to float.
__device__ __forceinline__ float kv_load(const void* pool, i64 i) { return load_f<KV_DT>(pool, i); }
#endif

// ------------------------------------------------------------ quantized

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

// kv_dequant8 is kv_dequant16 for 8 elements (8 bytes): one uint4 of bf16.
__device__ __forceinline__ uint4 kv_dequant8(uint2 q, float s) {
  uint4 lo, hi;
  kv_dequant16(make_uint4(q.x, q.y, 0, 0), s, s, lo, hi);
  return lo;
}
#endif  // KV_QUANT
