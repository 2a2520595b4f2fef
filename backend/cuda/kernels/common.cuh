// common.cuh: helpers shared by every trigon kernel file.
//
// Needs no CUDA toolkit header (NVRTC 13 ships none for bf16/f16): bf16 is
// an unsigned short converted with bit operations, f16 through PTX cvt.
// Dtype codes match backend.DType in Go.
#pragma once

#define DT_F32 1
#define DT_F16 2
#define DT_BF16 3
#define DT_Q8_0 4
#define DT_Q4_0 5
#define DT_I32 6
// GGML's K-quants (backend/kquant.go): super-blocks of 256 values.
#define DT_Q4_K 32
#define DT_Q5_K 33
#define DT_Q6_K 34

// Device-side input checks report through a flag in host-mapped memory
// that Backend.Sync reads; codes are bits so several can be seen at once.
#define ERR_EMBED_ID 1
#define ERR_SLOT 2
#define ERR_BLOCK_ID 4
#define ERR_QUERY_LEN 8
#define ERR_POSITION 16
#define ERR_LOGITS 32
#define ERR_WINDOW 64  // an int4 (KIVI) KV block's window block is missing or outside the window pool

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

__device__ __forceinline__ void report(int* err, int code) {
  // Plain store: host-mapped memory need not support atomics; a lost bit
  // of a second error in the same step is acceptable, the first is kept.
  *(volatile int*)err = code;
}

// grid_dep_sync or grid_dep_wait is the first statement of every kernel.
// Launched with programmatic dependent launch (launch.go), a kernel may
// start while the previous kernel of the stream still runs:
// griddepcontrol.wait blocks until that kernel has completed and its
// writes are visible. griddepcontrol.launch_dependents lets the next
// kernel launch (its blocks become resident and wait in turn) once every
// block of this one has called it or exited.
//
// When to let the next kernel in is a trade: early hides its launch and
// lets it start loading what does not depend on this kernel (the GEMV's
// weights), but its waiting blocks hold registers and shared memory that
// this kernel's later blocks may need. Short kernels of a few blocks
// (RoPE, SiLU, the CUDA-core combine) use grid_dep_sync: wait, then let
// the next kernel in at once; the norm and the tensor-core decode
// combine, whose successors stream weights before they wait, let it in
// before they wait (grid_dep_launch_wait). Kernels that fill the GPU (the GEMV, decode
// attention) use grid_dep_wait and call grid_dep_launch after their main
// loop, so the next kernel's launch overlaps only their tail. Without PDL
// (or before sm_90) all three are no-ops.
__device__ __forceinline__ void grid_dep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void grid_dep_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void grid_dep_sync() {
  grid_dep_wait();
  grid_dep_launch();
}

// grid_dep_launch_wait lets the next kernel launch first, then waits: for
// a short kernel whose successor has work before its own wait (a GEMV
// streaming its weights), which then starts during the tail of the kernel
// before this one instead of after this one's wait. Safe because what any
// kernel reads before its wait is written by no kernel of the step
// (weights, the step's metadata, the KV rows of earlier steps), and the
// successor's wait still returns only once this kernel, and so the one
// before it, has completed.
__device__ __forceinline__ void grid_dep_launch_wait() {
  grid_dep_launch();
  grid_dep_wait();
}

__device__ __forceinline__ float bf16_to_f32(u16 v) { return __uint_as_float(((u32)v) << 16); }

// Round to nearest even; NaN stays a (quiet) NaN.
__device__ __forceinline__ u16 f32_to_bf16(float f) {
  u32 u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (u16)(u >> 16);
}

__device__ __forceinline__ float f16_to_f32(u16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}

__device__ __forceinline__ u16 f32_to_f16(float f) {
  u16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}

// Two floats to packed bf16x2: lo in the low half (the lower index).
__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// load_f / store_f read and write element i of a float tensor of dtype DT.
template <int DT> __device__ __forceinline__ float load_f(const void* p, i64 i);
template <> __device__ __forceinline__ float load_f<DT_F32>(const void* p, i64 i) { return ((const float*)p)[i]; }
template <> __device__ __forceinline__ float load_f<DT_F16>(const void* p, i64 i) { return f16_to_f32(((const u16*)p)[i]); }
template <> __device__ __forceinline__ float load_f<DT_BF16>(const void* p, i64 i) { return bf16_to_f32(((const u16*)p)[i]); }

template <int DT> __device__ __forceinline__ void store_f(void* p, i64 i, float v);
template <> __device__ __forceinline__ void store_f<DT_F32>(void* p, i64 i, float v) { ((float*)p)[i] = v; }
template <> __device__ __forceinline__ void store_f<DT_F16>(void* p, i64 i, float v) { ((u16*)p)[i] = f32_to_f16(v); }
template <> __device__ __forceinline__ void store_f<DT_BF16>(void* p, i64 i, float v) { ((u16*)p)[i] = f32_to_bf16(v); }

// round_to returns v as dtype DT would store it.
template <int DT> __device__ __forceinline__ float round_to(float v);
template <> __device__ __forceinline__ float round_to<DT_F32>(float v) { return v; }
template <> __device__ __forceinline__ float round_to<DT_F16>(float v) { return f16_to_f32(f32_to_f16(v)); }
template <> __device__ __forceinline__ float round_to<DT_BF16>(float v) { return bf16_to_f32(f32_to_bf16(v)); }

// Element j of a row of a GGML block-quantized tensor (row points at the
// row's first block). Q8_0: {f16 d; i8 q[32]}; Q4_0: {f16 d; u8 qs[16]},
// qs[k] holds element k (low nibble) and k+16 (high nibble).
template <int DT> __device__ __forceinline__ float load_q(const unsigned char* row, int j);
template <> __device__ __forceinline__ float load_q<DT_Q8_0>(const unsigned char* row, int j) {
  const unsigned char* b = row + (j >> 5) * 34;
  float d = f16_to_f32(*(const u16*)b);
  return d * (float)(signed char)b[2 + (j & 31)];
}
template <> __device__ __forceinline__ float load_q<DT_Q4_0>(const unsigned char* row, int j) {
  const unsigned char* b = row + (j >> 5) * 18;
  float d = f16_to_f32(*(const u16*)b);
  int k = j & 31;
  int q = k < 16 ? (b[2 + k] & 15) : (b[2 + k - 16] >> 4);
  return d * (float)(q - 8);
}

// K-quant blocks (backend/kquant.go has the layouts): Q4_K {f16 d, dmin;
// u8 scales[12]; u8 qs[128]} (144 bytes), Q5_K the same with u8 qh[32]
// before qs (176), Q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}
// (210). Every block size is even, so the f16 fields are 2-byte aligned.
#define KQ_BYTES(DT) ((DT) == DT_Q4_K ? 144 : (DT) == DT_Q5_K ? 176 : 210)

// k_scale_min unpacks sub-block j's 6-bit scale and min (j < 8) from a
// Q4_K/Q5_K block's 12 packed bytes s.
__device__ __forceinline__ void k_scale_min(const unsigned char* s, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// k_sub32 dequantizes the 32 values 32j..32j+31 (j < 8) of one K-quant
// block into w. Q4_K/Q5_K: sub-block j, value d*sc*q - dmin*m; its
// nibbles are the low (j even) or high (j odd) halves of qs[32(j/2)+l],
// Q5_K's fifth bit bit j of qh[l]. Q6_K: half h = j/4, group g = j%4:
// the low 4 bits are a nibble of ql[64h+32(g%2)+l] (high for g >= 2), the
// top 2 bits bits 2g..2g+1 of qh[32h+l], value d*scales[8h+2g+l/16]*(q-32).
template <int DT> __device__ __forceinline__ void k_sub32(const unsigned char* blk, int j, float* w) {
  if constexpr (DT == DT_Q6_K) {
    float d = f16_to_f32(*(const u16*)(blk + 208));
    int h = j >> 2, g = j & 3;
    const unsigned char* ql = blk + 64 * h + 32 * (g & 1);
    const unsigned char* qh = blk + 128 + 32 * h;
    const signed char* sc = (const signed char*)(blk + 192 + 8 * h + 2 * g);
    int ls = (g >> 1) * 4, hs = 2 * g;
    float d0 = d * (float)sc[0], d1 = d * (float)sc[1];
#pragma unroll
    for (int l = 0; l < 32; l++) {
      int q = ((ql[l] >> ls) & 15) | (((qh[l] >> hs) & 3) << 4);
      w[l] = (l < 16 ? d0 : d1) * (float)(q - 32);
    }
  } else {
    float d = f16_to_f32(*(const u16*)blk), dmin = f16_to_f32(*(const u16*)(blk + 2));
    int sc, m;
    k_scale_min(blk + 4, j, &sc, &m);
    float dl = d * (float)sc, ml = dmin * (float)m;
    // Word loads: Q4_K/Q5_K blocks (144, 176 bytes) keep qs and qh 4-byte
    // aligned wherever the row starts are (the tensor's base, rows of
    // whole blocks).
    const u32* qs = (const u32*)(blk + (DT == DT_Q5_K ? 48 : 16) + 32 * (j >> 1));
    const u32* qh = (const u32*)(blk + 16);
    int s = (j & 1) * 4;
#pragma unroll
    for (int c = 0; c < 8; c++) {
      u32 v = qs[c] >> s;
      u32 hb = DT == DT_Q5_K ? qh[c] >> j : 0u;
#pragma unroll
      for (int e = 0; e < 4; e++) {
        int q = (int)((v >> (8 * e)) & 15u) | (int)(((hb >> (8 * e)) & 1u) << 4);
        w[4 * c + e] = dl * (float)q - ml;
      }
    }
  }
}

// Element j of a row of K-quant blocks (one value: embedding rows and the
// dequantizing copy; the GEMV decodes 32 at a time with k_sub32).
template <int DT> __device__ __forceinline__ float load_k(const unsigned char* row, int j) {
  const unsigned char* blk = row + (i64)(j >> 8) * KQ_BYTES(DT);
  int i = j & 255, sub = i >> 5, l = i & 31;
  if constexpr (DT == DT_Q6_K) {
    float d = f16_to_f32(*(const u16*)(blk + 208));
    int h = sub >> 2, g = sub & 3;
    int lo = (blk[64 * h + 32 * (g & 1) + l] >> ((g >> 1) * 4)) & 15;
    int hi = (blk[128 + 32 * h + l] >> (2 * g)) & 3;
    int sc = ((const signed char*)blk)[192 + 8 * h + 2 * g + (l >> 4)];
    return d * (float)sc * (float)((lo | (hi << 4)) - 32);
  } else {
    float d = f16_to_f32(*(const u16*)blk), dmin = f16_to_f32(*(const u16*)(blk + 2));
    int sc, m;
    k_scale_min(blk + 4, sub, &sc, &m);
    int q = (blk[(DT == DT_Q5_K ? 48 : 16) + 32 * (sub >> 1) + l] >> ((sub & 1) * 4)) & 15;
    if (DT == DT_Q5_K) q |= ((blk[16 + l] >> sub) & 1) << 4;
    return d * (float)sc * (float)q - dmin * (float)m;
  }
}

#define IS_KQ(DT) ((DT) == DT_Q4_K || (DT) == DT_Q5_K || (DT) == DT_Q6_K)

// Bytes of one row of dim elements of dtype DT.
template <int DT> __device__ __forceinline__ i64 row_bytes(int dim) {
  if (DT == DT_F32) return (i64)dim * 4;
  if (DT == DT_Q8_0) return (i64)(dim >> 5) * 34;
  if (DT == DT_Q4_0) return (i64)(dim >> 5) * 18;
  if (IS_KQ(DT)) return (i64)(dim >> 8) * KQ_BYTES(DT);
  return (i64)dim * 2;
}

// Element j of row r of a [rows, dim] tensor of any dtype.
template <int DT> __device__ __forceinline__ float load_row(const void* base, i64 r, int dim, int j) {
  if constexpr (IS_KQ(DT)) {
    return load_k<DT>((const unsigned char*)base + r * row_bytes<DT>(dim), j);
  } else if constexpr (DT == DT_Q8_0 || DT == DT_Q4_0) {
    return load_q<DT>((const unsigned char*)base + r * row_bytes<DT>(dim), j);
  } else {
    return load_f<DT>(base, r * dim + j);
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// block_sum returns the sum of v over the block to every thread. scratch
// holds at least 32 floats; blockDim.x is a multiple of 32.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nw ? scratch[lane] : 0.f;
  return warp_sum(v);
}

// prefetch_l2 asks L2 to fetch the 128-byte line at p (a hint: nothing
// waits for it) and to keep it in preference to streamed data.
__device__ __forceinline__ void prefetch_l2(const char* p) {
  asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(p));
}

// 2^x through the MUFU unit; ex2(-inf) = 0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

#define NEG_INF (__int_as_float(0xff800000))

// silu_f is x * sigmoid(x) = x / (1 + e^-x) through the MUFU unit (ex2
// and rcp, each within a few f32 ulps): with the accurate expf and IEEE
// division, some thirty instructions an element, prefill's silu_mul is
// bound by its arithmetic rather than by memory. Large negative x give -0
// (e^-x is inf, its reciprocal 0). Every SiLU of the kernels uses it, so
// fused and unfused products round the same values.
__device__ __forceinline__ float silu_f(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.f + fast_exp2(-1.4426950408889634f * x)));
  return x * r;
}

// rows_ok checks an attention sequence's metadata: its query rows lie
// inside the batch and its context holds them and fits max_seq_len.
__device__ __forceinline__ bool rows_ok(int q0, int qlen, int L, int num_tokens, int max_seq_len) {
  return q0 >= 0 && qlen >= 0 && q0 + qlen <= num_tokens && L >= qlen && L <= max_seq_len;
}

// ld_stream16 and ld_stream4 load 16 and 4 bytes of a weight, read once per
// product: through the non-coherent path, keeping them out of L1 (which
// holds the activations the product reads again).
__device__ __forceinline__ uint4 ld_stream16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ u32 ld_stream4(const void* p) {
  u32 v;
  asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
