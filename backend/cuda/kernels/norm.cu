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
// grid (rows), block 256..1024 (multiple of 32).
//
// Decode rows are tiny (a few KiB), so the kernel's time is its chain of
// memory latencies, not bandwidth: the fast path issues every load of the
// row (x, residual and weight) before its first store, so they overlap,
// and keeps the row in registers instead of re-reading it.
extern "C" __global__ void __launch_bounds__(1024) add_rmsnorm(void* out, const void* x, void* res, const void* w, int dim, float eps, int has_res) {
  grid_dep_sync();
  __shared__ float scratch[32];
  i64 base = (i64)blockIdx.x * dim;
  int nt = blockDim.x, tid = threadIdx.x;
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
