// act.cu: element-wise kernels: SiLU-gated product, bias add, dtype
// conversion. Specialised with -DIT=<input dtype> -DOT=<output dtype>.
#include "common.cuh"

// silu_mul: out[r, c] = silu(gu[r, c]) * gu[r, inter + c].
//   out [n, inter] OT;  gu [n, 2*inter] IT
// grid-stride, any grid.
extern "C" __global__ void silu_mul(void* out, const void* gu, int n, int inter) {
  grid_dep_sync();
  i64 total = (i64)n * inter;
  for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (i64)gridDim.x * blockDim.x) {
    i64 r = idx / inter, c = idx - r * inter;
    float g = load_f<IT>(gu, r * 2 * inter + c);
    float u = load_f<IT>(gu, r * 2 * inter + inter + c);
    float s = g / (1.f + expf(-g));
    store_f<OT>(out, idx, s * u);
  }
}

// add_bias: y[r, c] += bias[c] (bias IT, y OT), rounding once.
//   y [n, m];  bias [m]
extern "C" __global__ void add_bias(void* y, const void* bias, int n, int m) {
  grid_dep_sync();
  i64 total = (i64)n * m;
  for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (i64)gridDim.x * blockDim.x) {
    int c = (int)(idx % m);
    store_f<OT>(y, idx, load_f<OT>(y, idx) + load_f<IT>(bias, c));
  }
}

// convert: dst[i] = src[i] for i < count, IT -> OT.
extern "C" __global__ void convert(void* dst, const void* src, i64 count) {
  grid_dep_sync();
  for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < count; idx += (i64)gridDim.x * blockDim.x) {
    store_f<OT>(dst, idx, load_f<IT>(src, idx));
  }
}
