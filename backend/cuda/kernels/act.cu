// act.cu: element-wise kernels: SiLU-gated product, bias add, dtype
// conversion. Specialised with -DIT=<input dtype> -DOT=<output dtype>.
#include "common.cuh"

// silu_mul: out[r, c] = silu(gu[r, c]) * gu[r, inter + c].
//   out [n, inter] OT;  gu [n, 2*inter] IT
// grid-stride, any grid.
extern "C" __global__ void silu_mul(void* out, const void* gu, int n, int inter) {
  grid_dep_sync();
  if constexpr (IT == DT_BF16 && OT == DT_BF16) {
    // BF16 with 8-aligned rows: 8 elements per thread through 16-byte
    // loads and stores (the scalar loop below reached half the memory
    // bandwidth on prefill); the same arithmetic, so the same bits.
    if ((inter & 7) == 0 && (((u64)out | (u64)gu) & 15) == 0) {
      int per = inter >> 3;
      i64 total = (i64)n * per;
      for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (i64)gridDim.x * blockDim.x) {
        i64 r = idx / per;
        int c = (int)(idx - r * per) * 8;
        uint4 g = *(const uint4*)((const u16*)gu + r * 2 * inter + c);
        uint4 u = *(const uint4*)((const u16*)gu + r * 2 * inter + inter + c);
        const u32* gp = (const u32*)&g;
        const u32* up = (const u32*)&u;
        uint4 o;
        u32* op = (u32*)&o;
#pragma unroll
        for (int j = 0; j < 4; j++) {
          float g0 = __uint_as_float(gp[j] << 16), g1 = __uint_as_float(gp[j] & 0xffff0000u);
          float u0 = __uint_as_float(up[j] << 16), u1 = __uint_as_float(up[j] & 0xffff0000u);
          float s0 = g0 / (1.f + expf(-g0)), s1 = g1 / (1.f + expf(-g1));
          op[j] = (u32)f32_to_bf16(s0 * u0) | ((u32)f32_to_bf16(s1 * u1) << 16);
        }
        *(uint4*)((u16*)out + r * inter + c) = o;
      }
      return;
    }
  }
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
