// act.cu: element-wise kernels: SiLU-gated product, bias add, dtype
// conversion. Specialised with -DIT=<input dtype> -DOT=<output dtype>.
#include "common.cuh"

// silu_mul: out[r, c] = silu(gu[r, c]) * gu[r, inter + c].
//   out [n, inter] OT;  gu [n, 2*inter] IT
// grid-stride, any grid. BF16 rows that silu_mul_v8 takes go there.
extern "C" __global__ void silu_mul(void* out, const void* gu, int n, int inter) {
  grid_dep_sync();
  i64 total = (i64)n * inter;
  for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (i64)gridDim.x * blockDim.x) {
    i64 r = idx / inter, c = idx - r * inter;
    float g = load_f<IT>(gu, r * 2 * inter + c);
    float u = load_f<IT>(gu, r * 2 * inter + inter + c);
    store_f<OT>(out, idx, silu_f(g) * u);
  }
}

// silu8 is silu_mul of 8 bf16 gate and up values.
__device__ __forceinline__ uint4 silu8(uint4 g, uint4 u) {
  const u32* gp = (const u32*)&g;
  const u32* up = (const u32*)&u;
  uint4 o;
  u32* op = (u32*)&o;
#pragma unroll
  for (int j = 0; j < 4; j++) {
    float g0 = __uint_as_float(gp[j] << 16), g1 = __uint_as_float(gp[j] & 0xffff0000u);
    float u0 = __uint_as_float(up[j] << 16), u1 = __uint_as_float(up[j] & 0xffff0000u);
    op[j] = pack_bf16x2(silu_f(g0) * u0, silu_f(g1) * u1);
  }
  return o;
}

// silu_mul_v8 is silu_mul for BF16 with inter % 8 == 0 and 16-byte aligned
// operands: 8 elements per thread and step through 16-byte loads and
// stores, a thread's two chunks of a row loaded before either is used, and
// no 64-bit division per element (the grid is 2D). The same values as
// silu_mul.
//   out [n, inter] bf16;  gu [n, 2*inter] bf16
// grid (chunk blocks, row blocks), any; block any multiple of 32.
extern "C" __global__ void silu_mul_v8(u16* out, const u16* gu, int n, int inter) {
  grid_dep_sync();
  const int per = inter >> 3;  // 16-byte chunks of a row
  const int step = gridDim.x * blockDim.x;
  for (int r = blockIdx.y; r < n; r += gridDim.y) {
    const uint4* g = (const uint4*)(gu + (i64)r * 2 * inter);
    const uint4* u = g + per;
    uint4* o = (uint4*)(out + (i64)r * inter);
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < per; c += 2 * step) {
      const int c1 = c + step;
      const bool two = c1 < per;
      uint4 g0 = g[c], u0 = u[c], g1, u1;
      if (two) {
        g1 = g[c1];
        u1 = u[c1];
      }
      o[c] = silu8(g0, u0);
      if (two) o[c1] = silu8(g1, u1);
    }
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

// fill_normal: out[i] = mean + std * z(seed, i), z the Irwin-Hall sum of
// backend.SyntheticNormal (four 16-bit uniforms of a splitmix64 hash,
// centred, times scale = sqrt(3)/65536): integer arithmetic and
// round-to-nearest float operations that cannot contract into an FMA, so
// the bits equal the CPU backend's.
//   out [n] OT (F32 or BF16)
// grid-stride, any grid.
extern "C" __global__ void fill_normal(void* out, i64 n, u64 seed, float scale, float mean, float stdv) {
  grid_dep_sync();
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
    u64 z = seed + (u64)i * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    int s = (int)(z & 0xffffu) + (int)((z >> 16) & 0xffffu) + (int)((z >> 32) & 0xffffu) + (int)(z >> 48);
    float u = __fmul_rn((float)(s + 2 - 131072), scale);
    store_f<OT>(out, i, __fadd_rn(mean, __fmul_rn(stdv, u)));
  }
}
