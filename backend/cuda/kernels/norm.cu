// norm.cu: fused residual add + RMS norm.
// Specialised with -DXT=<x/residual dtype> -DOT=<out dtype> -DWT=<weight dtype>.
#include "common.cuh"

// add_rmsnorm: with has_res, residual += x (stored as XT) and
// out = (r * rsqrt(mean(r^2) + eps)) * w with r the stored residual;
// otherwise the same of x. out may alias x.
//   out, x, residual [rows, dim]
//   w                [dim]
// grid (rows), block 256..1024 (multiple of 32).
extern "C" __global__ void __launch_bounds__(1024) add_rmsnorm(void* out, const void* x, void* res, const void* w, int dim, float eps, int has_res) {
  __shared__ float scratch[32];
  i64 base = (i64)blockIdx.x * dim;
  float ss = 0.f;
  for (int j = threadIdx.x; j < dim; j += blockDim.x) {
    float v = load_f<XT>(x, base + j);
    if (has_res) {
      v = round_to<XT>(v + load_f<XT>(res, base + j));
      store_f<XT>(res, base + j, v);
    }
    ss += v * v;
  }
  ss = block_sum(ss, scratch);
  float r = rsqrtf(ss / (float)dim + eps);
  const void* src = has_res ? (const void*)res : x;
  // Each thread re-reads only the elements it wrote itself, so no barrier
  // is needed between the passes (and out aliasing x is safe).
  for (int j = threadIdx.x; j < dim; j += blockDim.x) {
    float v = load_f<XT>(src, base + j);
    store_f<OT>(out, base + j, (v * r) * load_f<WT>(w, j));
  }
}
