// kquant.cu: matrix products against GGML K-quant weights (Q4_K, Q5_K,
// Q6_K; layouts in common.cuh and backend/kquant.go).
// Specialised with -DWT=<DT_Q4_K, DT_Q5_K or DT_Q6_K> -DOT=<out dtype>; x is bf16.
#include "common.cuh"

#define MAXN 8  // token rows one kgemv launch handles
#define BB KQ_BYTES(WT)

// kgemv: y[t, o] = sum_k x[t, k] * dequant(w)[o, k] for t < n <= MAXN.
// One warp per output feature; lanes stride over the row's 32-value
// pieces (8 per 256-value block), dequantizing each piece into registers
// once for all n token rows. k is a multiple of 256; x rows are 16-byte
// aligned (k*2 bytes apart, the tensor's base aligned).
//   y [n, m] OT;  x [n, k] bf16;  w [m, k] WT
// grid (ceil(m/8)), block 256.
extern "C" __global__ void __launch_bounds__(256) kgemv(void* y, const u16* x, const unsigned char* w, int n, int m, int k) {
  grid_dep_sync();
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int o = blockIdx.x * 8 + warp;
  if (o >= m) return;
  int pieces = k >> 5;
  const unsigned char* wr = w + (i64)o * (k >> 8) * BB;
  float acc[MAXN];
#pragma unroll
  for (int t = 0; t < MAXN; t++) acc[t] = 0.f;
  for (int u = lane; u < pieces; u += 32) {
    float wv[32];
    k_sub32<WT>(wr + (i64)(u >> 3) * BB, u & 7, wv);
#pragma unroll
    for (int t = 0; t < MAXN; t++) {
      if (t < n) {
        const uint4* xp = (const uint4*)(x + (i64)t * k + (i64)u * 32);
        float s = 0.f;
#pragma unroll
        for (int c = 0; c < 4; c++) {
          uint4 v = xp[c];
          u32 wd[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
          for (int e = 0; e < 4; e++) {
            s += wv[c * 8 + 2 * e] * __uint_as_float(wd[e] << 16);
            s += wv[c * 8 + 2 * e + 1] * __uint_as_float(wd[e] & 0xffff0000u);
          }
        }
        acc[t] += s;
      }
    }
  }
#pragma unroll
  for (int t = 0; t < MAXN; t++) {
    if (t < n) {
      float s = warp_sum(acc[t]);
      if (lane == 0) store_f<OT>(y, (i64)t * m + o, s);
    }
  }
}

// kdequant: dst = bf16(dequant(w)) for larger batches, which then run
// through cuBLASLt. One thread per 32-value piece.
//   dst [m, k] bf16;  w [m, k] WT
extern "C" __global__ void kdequant(u16* dst, const unsigned char* w, int m, int k) {
  grid_dep_sync();
  i64 total = (i64)m * (k >> 5);
  int pieces = k >> 5;
  i64 rb = (i64)(k >> 8) * BB;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
    i64 r = i / pieces;
    int u = (int)(i - r * pieces);
    float wv[32];
    k_sub32<WT>(w + r * rb + (i64)(u >> 3) * BB, u & 7, wv);
    u16* d = dst + r * k + (i64)u * 32;
#pragma unroll
    for (int l = 0; l < 32; l++) d[l] = f32_to_bf16(wv[l]);
  }
}
