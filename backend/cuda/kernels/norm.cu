// norm.cu: fused residual add + RMS norm.
// Specialised with -DXT=<x/residual dtype> -DOT=<out dtype> -DWT=<weight dtype>.
#include "common.cuh"

// Elements of a row one thread keeps in registers (the fast path: rows up
// to VPT * blockDim.x elements, 16384 at 1024 threads).
#define VPT 16

// add_rmsnorm: with has_res, residual += x (stored as XT) and
// out = (r * rsqrt(mean(r^2) + eps)) * w with r the stored residual;
// otherwise the same of x. out may alias x.
//   out, x, residual [rows, dim]
//   w                [dim]
// grid (rows + extra), block 256..1024 (multiple of 32). Blocks past rows
// only prefetch pf[0, pf_bytes) into L2, without waiting for the kernel
// before: a decode step's norm is a chain of memory latencies during
// which HBM idles, and the product after it can find the start of its
// weight already in L2. The norm lets that product launch before it waits
// (grid_dep_launch_wait), so the product's own early weight loads overlap
// the tail of the product before the norm.
//
// Decode rows are tiny (a few KiB), so the kernel's time is its chain of
// memory latencies, not bandwidth: the fast path issues every load of the
// row (x, residual and weight) before its first store, so they overlap,
// and keeps the row in registers instead of re-reading it.
extern "C" __global__ void __launch_bounds__(1024) add_rmsnorm(void* out, const void* x, void* res, const void* w, int dim, float eps, int has_res,
                                                              int rows, const char* pf, i64 pf_bytes) {
  if ((int)blockIdx.x >= rows) {
    // A prefetch only asks L2 for lines, which is coherent: it needs no wait.
    grid_dep_launch();
    const i64 stride = (i64)(gridDim.x - rows) * blockDim.x * 128;
    for (i64 off = ((i64)(blockIdx.x - rows) * blockDim.x + threadIdx.x) * 128; off < pf_bytes; off += stride) prefetch_l2(pf + off);
    return;
  }
  grid_dep_launch_wait();
  __shared__ float scratch[32];
  i64 base = (i64)blockIdx.x * dim;
  int nt = blockDim.x, tid = threadIdx.x;
  if constexpr (XT == DT_BF16 && OT == DT_BF16 && (WT == DT_BF16 || WT == DT_F32)) {
    // BF16 rows of up to 16 * blockDim.x elements, BF16 or F32 weights:
    // each thread owns up to two 8-element chunks and moves them with
    // 16-byte loads and stores (prefill rows: 8x fewer memory instructions
    // than the path below, which is bound by them; the arithmetic is the
    // same, the sum of squares is added in another order).
    u64 addr = (u64)x | (u64)res | (u64)out | (u64)w;
    if ((dim & 7) == 0 && (addr & 15) == 0 && dim <= 16 * nt) {
      uint4 xv[2], rv[2];
      float wv[2][8];
      bool in[2];
#pragma unroll
      for (int k = 0; k < 2; k++) {
        int c = (tid + k * nt) * 8;
        in[k] = c < dim;
        xv[k] = rv[k] = make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int j = 0; j < 8; j++) wv[k][j] = 0.f;
        if (in[k]) {
          xv[k] = *(const uint4*)((const u16*)x + base + c);
          if (has_res) rv[k] = *(const uint4*)((const u16*)res + base + c);
          if constexpr (WT == DT_F32) {
            float4 w0 = *(const float4*)((const float*)w + c), w1 = *(const float4*)((const float*)w + c + 4);
            wv[k][0] = w0.x, wv[k][1] = w0.y, wv[k][2] = w0.z, wv[k][3] = w0.w;
            wv[k][4] = w1.x, wv[k][5] = w1.y, wv[k][6] = w1.z, wv[k][7] = w1.w;
          } else {
            uint4 wq = *(const uint4*)((const u16*)w + c);
            const u32* wp = (const u32*)&wq;
#pragma unroll
            for (int j = 0; j < 4; j++) {
              wv[k][2 * j] = __uint_as_float(wp[j] << 16);
              wv[k][2 * j + 1] = __uint_as_float(wp[j] & 0xffff0000u);
            }
          }
        }
      }
      float v[2][8];
      float ss = 0.f;
#pragma unroll
      for (int k = 0; k < 2; k++) {
        const u32* xp = (const u32*)&xv[k];
        const u32* rp = (const u32*)&rv[k];
        uint4 sum;
        u32* sp = (u32*)&sum;
#pragma unroll
        for (int j = 0; j < 4; j++) {
          float a0 = __uint_as_float(xp[j] << 16), a1 = __uint_as_float(xp[j] & 0xffff0000u);
          if (has_res) {
            a0 = round_to<DT_BF16>(a0 + __uint_as_float(rp[j] << 16));
            a1 = round_to<DT_BF16>(a1 + __uint_as_float(rp[j] & 0xffff0000u));
          }
          v[k][2 * j] = a0;
          v[k][2 * j + 1] = a1;
          sp[j] = (u32)f32_to_bf16(a0) | ((u32)f32_to_bf16(a1) << 16);
          ss += in[k] ? a0 * a0 + a1 * a1 : 0.f;
        }
        if (has_res && in[k]) *(uint4*)((u16*)res + base + (tid + k * nt) * 8) = sum;
      }
      ss = block_sum(ss, scratch);
      float rs = rsqrtf(ss / (float)dim + eps);
#pragma unroll
      for (int k = 0; k < 2; k++) {
        if (!in[k]) continue;
        uint4 o;
        u32* op = (u32*)&o;
#pragma unroll
        for (int j = 0; j < 4; j++) {
          op[j] = (u32)f32_to_bf16((v[k][2 * j] * rs) * wv[k][2 * j]) |
                  ((u32)f32_to_bf16((v[k][2 * j + 1] * rs) * wv[k][2 * j + 1]) << 16);
        }
        *(uint4*)((u16*)out + base + (tid + k * nt) * 8) = o;
      }
      return;
    }
  }
  if (dim <= VPT * nt) {
    float v[VPT], r[VPT], wv[VPT];
#pragma unroll
    for (int k = 0; k < VPT; k++) {
      int j = tid + k * nt;
      v[k] = r[k] = wv[k] = 0.f;
      if (j < dim) {
        v[k] = load_f<XT>(x, base + j);
        if (has_res) r[k] = load_f<XT>(res, base + j);
        wv[k] = load_f<WT>(w, j);
      }
    }
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < VPT; k++) {
      int j = tid + k * nt;
      if (j < dim) {
        if (has_res) {
          v[k] = round_to<XT>(v[k] + r[k]);
          store_f<XT>(res, base + j, v[k]);
        }
        ss += v[k] * v[k];
      }
    }
    ss = block_sum(ss, scratch);
    float rs = rsqrtf(ss / (float)dim + eps);
#pragma unroll
    for (int k = 0; k < VPT; k++) {
      int j = tid + k * nt;
      if (j < dim) store_f<OT>(out, base + j, (v[k] * rs) * wv[k]);
    }
    return;
  }
  float ss = 0.f;
  for (int j = tid; j < dim; j += nt) {
    float v = load_f<XT>(x, base + j);
    if (has_res) {
      v = round_to<XT>(v + load_f<XT>(res, base + j));
      store_f<XT>(res, base + j, v);
    }
    ss += v * v;
  }
  ss = block_sum(ss, scratch);
  float rs = rsqrtf(ss / (float)dim + eps);
  const void* src = has_res ? (const void*)res : x;
  // Each thread re-reads only the elements it wrote itself, so no barrier
  // is needed between the passes (and out aliasing x is safe).
  for (int j = tid; j < dim; j += nt) {
    float v = load_f<XT>(src, base + j);
    store_f<OT>(out, base + j, (v * rs) * load_f<WT>(w, j));
  }
}
