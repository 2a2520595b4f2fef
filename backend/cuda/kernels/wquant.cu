// wquant.cu: products against the weight-quantized dtypes of
// backend/wquant.go (AWQ4_G32/G64/G128 and F8_E4M3_ROW), and the FP8
// activation quantizer. Specialised with -DWT=<weight dtype> -DOT=<out
// dtype> -DNT=<8-row tiles of x, awq_mma; 1 elsewhere>; x is bf16. The FP8
// kernels (f8_*) do not depend on WT.
#include "mma.cuh"

// Dtype codes of backend/wquant.go (kept equal by TestWQuantCodes).
#define DT_AWQ4_G32 40
#define DT_AWQ4_G64 41
#define DT_AWQ4_G128 42
#define DT_F8ROW 43

#define MAXN 8  // token rows per blockIdx.y of the GEMVs

// AWQ4 block: {f16 scale; f16 zero; u32 qs[AWQ_G/8]}; word w holds
// elements 8w..8w+7, nibble i (bits 4i..4i+3) element 8w + [0,2,4,6,1,3,5,7][i],
// so nibbles p and p+4 are elements 2p and 2p+1; value = (q - zero) * scale.
#define AWQ_G (WT == DT_AWQ4_G64 ? 64 : (WT == DT_AWQ4_G128 ? 128 : 32))
#define AWQ_BB (4 + AWQ_G / 2)
#define AWQ_WPB (AWQ_G / 8)  // words per block

// awq_word decodes word c (elements 8c..8c+7) of an AWQ4 row into f32.
// Blocks are multiples of 4 bytes, so on a 4-byte aligned row the header
// and every word are 4-byte aligned.
__device__ __forceinline__ void awq_word(const unsigned char* row, int c, float* wv) {
  const unsigned char* bp = row + (i64)(c / AWQ_WPB) * AWQ_BB;
  u32 hdr = *(const u32*)bp;
  float s = f16_to_f32((u16)(hdr & 0xffffu)), z = f16_to_f32((u16)(hdr >> 16));
  u32 q = *(const u32*)(bp + 4 + 4 * (c % AWQ_WPB));
#pragma unroll
  for (int p = 0; p < 4; p++) {
    wv[2 * p] = ((float)((q >> (4 * p)) & 15u) - z) * s;
    wv[2 * p + 1] = ((float)((q >> (4 * p + 16)) & 15u) - z) * s;
  }
}

// awq_gemv: y[t, o] = sum_k x[t, k] * w[o, k] for the MAXN rows of
// blockIdx.y. One warp per output feature; lanes take consecutive words
// of the row (coalesced), so the packed weight is read once per row tile
// and dequantized in registers.
//   y [n, m] OT;  x [n, k] bf16 (rows 16-byte aligned);  w [m, k] WT
// grid (ceil(m/8), ceil(n/MAXN)), block 256.
extern "C" __global__ void __launch_bounds__(256) awq_gemv(void* y, const u16* x, const unsigned char* w, int n, int m, int k) {
  grid_dep_sync();
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int o = blockIdx.x * 8 + warp;
  if (o >= m) return;
  int t0 = blockIdx.y * MAXN;
  int nt = min(MAXN, n - t0);
  const unsigned char* wr = w + (i64)o * (k / AWQ_G) * AWQ_BB;
  const u16* xb = x + (i64)t0 * k;
  float acc[MAXN];
#pragma unroll
  for (int t = 0; t < MAXN; t++) acc[t] = 0.f;
  int words = k >> 3;
  for (int c = lane; c < words; c += 32) {
    float wv[8];
    awq_word(wr, c, wv);
#pragma unroll
    for (int t = 0; t < MAXN; t++) {
      if (t < nt) {
        uint4 v = *(const uint4*)(xb + (i64)t * k + (i64)c * 8);
        u32 wd[4] = {v.x, v.y, v.z, v.w};
        float s = 0.f;
#pragma unroll
        for (int e = 0; e < 4; e++) {
          s += wv[2 * e] * __uint_as_float(wd[e] << 16);
          s += wv[2 * e + 1] * __uint_as_float(wd[e] & 0xffff0000u);
        }
        acc[t] += s;
      }
    }
  }
#pragma unroll
  for (int t = 0; t < MAXN; t++) {
    if (t < nt) {
      float s = warp_sum(acc[t]);
      if (lane == 0) store_f<OT>(y, (i64)(t0 + t) * m + o, s);
    }
  }
}

__device__ __forceinline__ u32 bf16x2_fma(u32 a, u32 b, u32 c) {
  u32 d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// awq_pairs widens AWQ4 word q into four bf16x2 registers, pair p holding
// elements 2p (low half) and 2p+1: one mask makes 128 + q of nibbles p and
// p + 4 (bf16 0x4300 is 128.0, whose last mantissa bit is worth 1), adding nz2 =
// -(128 + zero) leaves q - zero exactly (a small integer), and the
// multiply by s2 (the scale, rounded to bf16) rounds once.
__device__ __forceinline__ void awq_pairs(u32 q, u32 s2, u32 nz2, u32* out) {
#pragma unroll
  for (int p = 0; p < 4; p++) {
    u32 v = ((q >> (4 * p)) & 0x000F000Fu) | 0x43004300u;
    v = bf16x2_fma(v, 0x3F803F80u, nz2);         // * 1.0 + -(128 + zero)
    out[p] = bf16x2_fma(v, s2, 0x80008000u);     // * scale + -0.0
  }
}

// awq_load reads what awq_widen needs of the 32 elements k0..k0+31 (whole
// words of one group: groups are at least 32) of AWQ4 row `row`: the
// block's header and 4 words; zeros when !ok, which widen to zeros.
__device__ __forceinline__ void awq_load(const unsigned char* row, int k0, bool ok, u32& hdr, u32* wd) {
  hdr = 0u;
#pragma unroll
  for (int j = 0; j < 4; j++) wd[j] = 0u;
  if (ok) {
    const unsigned char* bp = row + (i64)(k0 / AWQ_G) * AWQ_BB;
    hdr = *(const u32*)bp;
    const u32* wp = (const u32*)(bp + 4) + (k0 % AWQ_G) / 8;
#pragma unroll
    for (int j = 0; j < 4; j++) wd[j] = wp[j];
  }
}

// awq_widen turns awq_load's header and words into 16 bf16x2 pairs, pair i
// holding elements k0 + 2i and k0 + 2i + 1.
__device__ __forceinline__ void awq_widen(u32 hdr, const u32* wd, u32* out) {
  float s = f16_to_f32((u16)(hdr & 0xffffu)), z = f16_to_f32((u16)(hdr >> 16));
  u32 sb = f32_to_bf16(s), nb = f32_to_bf16(-(128.f + z));
  u32 s2 = sb | (sb << 16), nz2 = nb | (nb << 16);
#pragma unroll
  for (int j = 0; j < 4; j++) awq_pairs(wd[j], s2, nz2, out + 4 * j);
}

#define AWQ_NW 4  // warps per awq_mma / f8_mma block, each owning 16 output features

// awq_mma: y = x . w^T for n <= 8*NT rows on the tensor cores (mma.sync
// m16n8k16, bf16 in, f32 accumulate), w dequantized in registers. A block
// owns 64 output features, 16 per warp (the mma's A rows gid and gid + 8
// of each thread), and a range of 128-wide k chunks: gridDim.y blocks
// split k, cps chunks each, so that small products still fill the GPU.
// Each chunk of x is staged in shared memory once for the four warps. The
// k order inside an mma is free, so thread (gid, tq) feeds mma j pairs 2j
// and 2j+1 of its own 32 contiguous elements 32tq .. of the chunk in both
// operands (A: its two weight rows, B: x row t*8 + gid): logical k 2tq,
// 2tq+1 is pair 2j, logical 2tq+8, +9 pair 2j+1, alike in A and B. The raw
// weights of the next chunk are loaded before this chunk's mmas.
//   y [n, m] OT (gridDim.y == 1), else part [gridDim.y][n][m] f32 for
//   awq_reduce;  x [n, k] bf16 (rows 16-byte aligned);  w [m, k] WT
// grid (ceil(m/64), splits), block 32*AWQ_NW.
extern "C" __global__ void __launch_bounds__(32 * AWQ_NW) awq_mma(void* y, float* part, const u16* x, const unsigned char* w, int n, int m, int k, int cps) {
  grid_dep_sync();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800  // mma.sync bf16 and fma.bf16x2: the host launches it on sm_80 and later only
  __shared__ uint4 xs[NT * 8][17];  // a 128-wide chunk of each x row (16 uint4) and one of padding
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, tq = lane & 3;
  int r0 = blockIdx.x * 64 + warp * 16;
  int ra = r0 + gid, rb = r0 + gid + 8;
  i64 rowb = (i64)(k / AWQ_G) * AWQ_BB;
  const unsigned char* wa = w + (i64)(ra < m ? ra : 0) * rowb;
  const unsigned char* wb = w + (i64)(rb < m ? rb : 0) * rowb;
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  float acc[NT][4];
#pragma unroll
  for (int t = 0; t < NT; t++) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
  int chunks = (k + 127) >> 7;
  int c0 = blockIdx.y * cps, c1 = min(chunks, c0 + cps);
  u32 ha, hb, wda[4], wdb[4];
  {
    int kk = c0 * 128 + tq * 32;
    bool ok = c0 < c1 && kk < k;
    awq_load(wa, kk, ok && ra < m, ha, wda);
    awq_load(wb, kk, ok && rb < m, hb, wdb);
  }
  for (int c = c0; c < c1; c++) {
    __syncthreads();  // the previous chunk's fragments are read
    for (int i = threadIdx.x; i < NT * 8 * 16; i += 32 * AWQ_NW) {
      int row = i >> 4, q = i & 15, kk = c * 128 + q * 8;
      xs[row][q] = row < n && kk < k ? *(const uint4*)(x + (i64)row * k + kk) : zero;
    }
    __syncthreads();
    u32 pa[16], pb[16];
    awq_widen(ha, wda, pa);
    awq_widen(hb, wdb, pb);
    {
      int kk = (c + 1) * 128 + tq * 32;
      bool ok = c + 1 < c1 && kk < k;
      awq_load(wa, kk, ok && ra < m, ha, wda);
      awq_load(wb, kk, ok && rb < m, hb, wdb);
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
      u32 xp[16];
#pragma unroll
      for (int q = 0; q < 4; q++) {
        uint4 v = xs[t * 8 + gid][tq * 4 + q];
        xp[4 * q] = v.x;
        xp[4 * q + 1] = v.y;
        xp[4 * q + 2] = v.z;
        xp[4 * q + 3] = v.w;
      }
#pragma unroll
      for (int j = 0; j < 8; j++) mma16816(acc[t], pa[2 * j], pb[2 * j], pa[2 * j + 1], pb[2 * j + 1], xp[2 * j], xp[2 * j + 1]);
    }
  }
  // C element e: feature r0 + gid + (e/2)*8, x row t*8 + tq*2 + e%2.
#pragma unroll
  for (int t = 0; t < NT; t++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      int f = r0 + gid + (e >> 1) * 8, row = t * 8 + tq * 2 + (e & 1);
      if (f < m && row < n) {
        if (gridDim.y == 1) store_f<OT>(y, (i64)row * m + f, acc[t][e]);
        else part[((i64)blockIdx.y * n + row) * m + f] = acc[t][e];
      }
    }
  }
#endif
}

// wq_reduce: y = the sum of the splits' partial products, in split order.
//   y [n, m] OT;  part [splits][n][m] f32
extern "C" __global__ void wq_reduce(void* y, const float* part, int splits, int n, int m) {
  grid_dep_sync();
  i64 total = (i64)n * m;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
    float v = 0.f;
    for (int s = 0; s < splits; s++) v += part[s * total + i];
    store_f<OT>(y, i, v);
  }
}

// awq_dequant: dst = bf16(dequant(w)), for products of more rows, which
// then run through cuBLASLt. One thread per 8-value word.
//   dst [m, k] bf16 (16-byte aligned);  w [m, k] WT
extern "C" __global__ void awq_dequant(u16* dst, const unsigned char* w, int m, int k) {
  grid_dep_sync();
  int words = k >> 3;
  i64 total = (i64)m * words;
  i64 rb = (i64)(k / AWQ_G) * AWQ_BB;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
    i64 r = i / words;
    int c = (int)(i - r * words);
    float wv[8];
    awq_word(w + r * rb, c, wv);
    uint4 v;
    v.x = pack_bf16x2(wv[0], wv[1]);
    v.y = pack_bf16x2(wv[2], wv[3]);
    v.z = pack_bf16x2(wv[4], wv[5]);
    v.w = pack_bf16x2(wv[6], wv[7]);
    *(uint4*)(dst + r * k + (i64)c * 8) = v;
  }
}

// e4m3fn codes. f32_to_e4m3 is backend.F32ToE4M3 exactly: round to
// nearest even, magnitudes at or past 448 saturate to 448, NaN is 0x7F.
__device__ __forceinline__ u32 f32_to_e4m3(float f) {
  u32 bits = __float_as_uint(f);
  u32 sign = (bits >> 24) & 0x80u;
  float a = fabsf(f);
  if (a != a) return 0x7Fu;
  if (a >= 448.f) return sign | 0x7Eu;
  if (a < 0.015625f) return sign | (u32)__float2int_rn(a * 512.f);  // subnormals: steps of 2^-9, exact scaling
  u32 ab = __float_as_uint(a);
  int e = (int)(ab >> 23) - 127 + 7;  // e4m3's biased exponent, 1..15
  u32 man = ab & 0x7fffffu;
  u32 q = man >> 20, rem = man & 0xfffffu;
  if (rem > 0x80000u || (rem == 0x80000u && (q & 1u))) q++;
  if (q == 8u) {
    q = 0u;
    e++;
  }
  u32 code = ((u32)e << 3) | q;
  return sign | (code > 0x7Eu ? 0x7Eu : code);
}

// e4m3_to_f32 decodes a code; 0x7F/0xFF (NaN) decode as 480, since no
// code this file or the loader writes is NaN.
__device__ __forceinline__ float e4m3_to_f32(u32 b) {
  u32 e = (b >> 3) & 15u, m = b & 7u;
  float v = e ? __uint_as_float(((e + 120u) << 23) | (m << 20)) : (float)m * (1.f / 512.f);
  return __uint_as_float(__float_as_uint(v) | ((b & 0x80u) << 24));
}

// f8_act_quant: per row t, s = max|x[t]| / 448 (1 for a row of zeros or
// with an infinity; NaN ignored), xq[t, i] = e4m3(x[t, i] * (1/s)),
// sx[t] = s: backend.QuantizeActE4M3 on the bf16 values.
//   xq [n, k] e4m3;  sx [n] f32;  x [n, k] bf16
// grid (n), block 256.
extern "C" __global__ void __launch_bounds__(256) f8_act_quant(unsigned char* xq, float* sx, const u16* x, int n, int k) {
  grid_dep_sync();
  __shared__ float scratch[32];
  int t = blockIdx.x;
  const u16* xr = x + (i64)t * k;
  float amax = 0.f;
  for (int i = threadIdx.x; i < k; i += blockDim.x) amax = fmaxf(amax, fabsf(bf16_to_f32(xr[i])));
  amax = warp_max(amax);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = amax;
  __syncthreads();
  amax = (threadIdx.x & 31) < (blockDim.x >> 5) ? scratch[threadIdx.x & 31] : 0.f;
  amax = warp_max(amax);
  float s = (amax == 0.f || __float_as_uint(amax) == 0x7f800000u) ? 1.f : amax / 448.f;  // amax >= 0: +inf's bits
  float inv = 1.f / s;
  unsigned char* qr = xq + (i64)t * k;
  for (int i = threadIdx.x; i < k; i += blockDim.x) qr[i] = (unsigned char)f32_to_e4m3(bf16_to_f32(xr[i]) * inv);
  if (threadIdx.x == 0) sx[t] = s;
}

// f8_row_scale is the f32 scale in the trailer of F8_E4M3_ROW row o.
__device__ __forceinline__ float f8_row_scale(const unsigned char* w, int o, int k) {
  return *(const float*)(w + (i64)o * (k + 16) + k);
}

// f8_gemv: y[t, o] = (sum_k e4m3(xq[t, k]) * e4m3(w[o, k])) * sx[t] *
// scale[o] for the MAXN rows of blockIdx.y. One warp per output feature,
// lanes over 16-byte chunks of the row.
//   y [n, m] OT;  xq [n, k] e4m3, sx [n] f32;  w [m, k] F8_E4M3_ROW (k % 16 == 0)
// grid (ceil(m/8), ceil(n/MAXN)), block 256.
extern "C" __global__ void __launch_bounds__(256) f8_gemv(void* y, const unsigned char* xq, const float* sx, const unsigned char* w, int n, int m, int k) {
  grid_dep_sync();
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int o = blockIdx.x * 8 + warp;
  if (o >= m) return;
  int t0 = blockIdx.y * MAXN;
  int nt = min(MAXN, n - t0);
  const unsigned char* wr = w + (i64)o * (k + 16);
  float acc[MAXN];
#pragma unroll
  for (int t = 0; t < MAXN; t++) acc[t] = 0.f;
  int chunks = k >> 4;
  for (int c = lane; c < chunks; c += 32) {
    uint4 wq = *(const uint4*)(wr + (i64)c * 16);
    u32 wd[4] = {wq.x, wq.y, wq.z, wq.w};
    float wv[16];
#pragma unroll
    for (int e = 0; e < 16; e++) wv[e] = e4m3_to_f32((wd[e >> 2] >> (8 * (e & 3))) & 0xffu);
#pragma unroll
    for (int t = 0; t < MAXN; t++) {
      if (t < nt) {
        uint4 xv = *(const uint4*)(xq + (i64)(t0 + t) * k + (i64)c * 16);
        u32 xd[4] = {xv.x, xv.y, xv.z, xv.w};
        float s = 0.f;
#pragma unroll
        for (int e = 0; e < 16; e++) s += wv[e] * e4m3_to_f32((xd[e >> 2] >> (8 * (e & 3))) & 0xffu);
        acc[t] += s;
      }
    }
  }
  float sw = f8_row_scale(w, o, k);
#pragma unroll
  for (int t = 0; t < MAXN; t++) {
    if (t < nt) {
      float s = warp_sum(acc[t]);
      if (lane == 0) store_f<OT>(y, (i64)(t0 + t) * m + o, s * sx[t0 + t] * sw);
    }
  }
}

__device__ __forceinline__ void mma16832_e4m3(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// f8_mma: f8_gemv's product for n <= 8*NT rows on the FP8 tensor cores
// (mma.sync m16n8k32 e4m3, f32 accumulate; sm_89 and later): the codes go
// into the mma as stored and the scales multiply the sums. Blocks, k
// splits and the shared x chunk as in awq_mma; thread (gid, tq) loads 32
// contiguous codes 32tq .. of the chunk of its two weight rows and of x
// row t*8 + gid, and mma j takes their words 2j (logical k 4tq..4tq+3) and
// 2j + 1 (logical 4tq+16..+19), alike in A and B. m16n8k32's fragments:
// A a0 (row gid, k 4tq..+3), a1 (row gid+8, same), a2/a3 (k 4tq+16..+19);
// B b0 (k 4tq..+3, col gid), b1 (k 4tq+16..+19); C as m16n8k16's.
//   y [n, m] OT (gridDim.y == 1; scaled), else part [gridDim.y][n][m] f32
//   (unscaled, for f8_epilogue_parts);  xq [n, k] e4m3, sx [n] f32;
//   w [m, k] F8_E4M3_ROW
// grid (ceil(m/64), splits), block 32*AWQ_NW.
extern "C" __global__ void __launch_bounds__(32 * AWQ_NW) f8_mma(void* y, float* part, const unsigned char* xq, const float* sx, const unsigned char* w, int n, int m, int k, int cps) {
  grid_dep_sync();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890  // e4m3 mma.sync: the host launches it on sm_89 and later only
  __shared__ uint4 xs[NT * 8][9];  // a 128-code chunk of each x row (8 uint4) and one of padding
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, tq = lane & 3;
  int r0 = blockIdx.x * 64 + warp * 16;
  int ra = r0 + gid, rb = r0 + gid + 8;
  const unsigned char* wa = w + (i64)(ra < m ? ra : 0) * (k + 16);
  const unsigned char* wb = w + (i64)(rb < m ? rb : 0) * (k + 16);
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  float acc[NT][4];
#pragma unroll
  for (int t = 0; t < NT; t++) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
  int chunks = (k + 127) >> 7;
  int c0 = blockIdx.y * cps, c1 = min(chunks, c0 + cps);
  // k is a multiple of 16: each 16-code half of a thread's 32 is wholly
  // in or out.
  uint4 a0, a1, b0, b1;
  {
    int kk = c0 * 128 + tq * 32;
    bool in0 = c0 < c1 && kk < k, in1 = c0 < c1 && kk + 16 < k;
    a0 = in0 && ra < m ? *(const uint4*)(wa + kk) : zero;
    a1 = in1 && ra < m ? *(const uint4*)(wa + kk + 16) : zero;
    b0 = in0 && rb < m ? *(const uint4*)(wb + kk) : zero;
    b1 = in1 && rb < m ? *(const uint4*)(wb + kk + 16) : zero;
  }
  for (int c = c0; c < c1; c++) {
    __syncthreads();  // the previous chunk's fragments are read
    for (int i = threadIdx.x; i < NT * 8 * 8; i += 32 * AWQ_NW) {
      int row = i >> 3, q = i & 7, kk = c * 128 + q * 16;
      xs[row][q] = row < n && kk < k ? *(const uint4*)(xq + (i64)row * k + kk) : zero;
    }
    __syncthreads();
    u32 pa[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
    u32 pb[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
    {
      int kk = (c + 1) * 128 + tq * 32;
      bool n0 = c + 1 < c1 && kk < k, n1 = c + 1 < c1 && kk + 16 < k;
      a0 = n0 && ra < m ? *(const uint4*)(wa + kk) : zero;
      a1 = n1 && ra < m ? *(const uint4*)(wa + kk + 16) : zero;
      b0 = n0 && rb < m ? *(const uint4*)(wb + kk) : zero;
      b1 = n1 && rb < m ? *(const uint4*)(wb + kk + 16) : zero;
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
      uint4 x0 = xs[t * 8 + gid][tq * 2], x1 = xs[t * 8 + gid][tq * 2 + 1];
      u32 xp[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
      for (int j = 0; j < 4; j++) mma16832_e4m3(acc[t], pa[2 * j], pb[2 * j], pa[2 * j + 1], pb[2 * j + 1], xp[2 * j], xp[2 * j + 1]);
    }
  }
#pragma unroll
  for (int t = 0; t < NT; t++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      int f = r0 + gid + (e >> 1) * 8, row = t * 8 + tq * 2 + (e & 1);
      if (f < m && row < n) {
        if (gridDim.y == 1) store_f<OT>(y, (i64)row * m + f, acc[t][e] * sx[row] * f8_row_scale(w, f, k));
        else part[((i64)blockIdx.y * n + row) * m + f] = acc[t][e];
      }
    }
  }
#endif
}

// f8_epilogue_parts: y[t, o] = (the sum of the splits' partial sums, in
// split order) * sx[t] * scale[o].
//   y [n, m] OT;  part [splits][n][m] f32;  sx [n] f32;  w [m, k] F8_E4M3_ROW
extern "C" __global__ void f8_epilogue_parts(void* y, const float* part, int splits, const float* sx, const unsigned char* w, int n, int m, int k) {
  grid_dep_sync();
  i64 total = (i64)n * m;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
    i64 t = i / m;
    int o = (int)(i - t * m);
    float v = 0.f;
    for (int s = 0; s < splits; s++) v += part[s * total + i];
    store_f<OT>(y, i, v * sx[t] * f8_row_scale(w, o, k));
  }
}

// f8_epilogue: y[t, o] = acc[t, o] * sx[t] * scale[o], the scales of an
// FP8 GEMM whose product of codes (acc, f32) ran without them.
//   y [n, m] OT;  acc [n, m] f32;  sx [n] f32;  w [m, k] F8_E4M3_ROW
extern "C" __global__ void f8_epilogue(void* y, const float* acc, const float* sx, const unsigned char* w, int n, int m, int k) {
  grid_dep_sync();
  i64 total = (i64)n * m;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
    i64 t = i / m;
    int o = (int)(i - t * m);
    store_f<OT>(y, i, acc[i] * sx[t] * f8_row_scale(w, o, k));
  }
}

// f8_codes: dst[r, i] = bf16(e4m3(src[r * ld + i])), the codes without
// their scales (exact in bf16: 4 significant bits), for devices without
// FP8 GEMMs, whose BF16 GEMM of codes then equals the FP8 one.
//   dst [rows, k] bf16;  src rows of ld bytes
extern "C" __global__ void f8_codes(u16* dst, const unsigned char* src, int rows, int k, int ld) {
  grid_dep_sync();
  i64 total = (i64)rows * k;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
    i64 r = i / k;
    int j = (int)(i - r * k);
    dst[i] = f32_to_bf16(e4m3_to_f32(src[r * ld + j]));
  }
}
