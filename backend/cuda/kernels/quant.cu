// quant.cu: matrix products against GGML block-quantized weights.
// Specialised with -DWT=<Q8_0 or Q4_0> -DOT=<out dtype>; x is bf16.
#include "common.cuh"

#define MAXN 8  // token rows one qgemv launch handles
#define BB (WT == DT_Q8_0 ? 34 : 18)

// Dequantize one 32-value block into w (the scale left out).
__device__ __forceinline__ void block_values(const unsigned char* blk, float* w) {
  if (WT == DT_Q8_0) {
#pragma unroll
    for (int j = 0; j < 16; j++) {
      u16 two = *(const u16*)(blk + 2 + 2 * j);  // 2-byte aligned: blocks are 34 bytes
      w[2 * j] = (float)(signed char)(two & 0xff);
      w[2 * j + 1] = (float)(signed char)(two >> 8);
    }
  } else {
#pragma unroll
    for (int j = 0; j < 8; j++) {
      u16 two = *(const u16*)(blk + 2 + 2 * j);
      int b0 = two & 0xff, b1 = two >> 8;
      w[2 * j] = (float)((b0 & 15) - 8);
      w[2 * j + 16] = (float)((b0 >> 4) - 8);
      w[2 * j + 1] = (float)((b1 & 15) - 8);
      w[2 * j + 17] = (float)((b1 >> 4) - 8);
    }
  }
}

// qgemv: y[t, o] = sum_k x[t, k] * dequant(w)[o, k] for t < n <= MAXN.
// One warp per output feature; lanes stride over the 32-value blocks, so
// each weight byte is read once for all n token rows.
//   y [n, m] OT;  x [n, k] bf16;  w [m, k] WT
// grid (ceil(m/8)), block 256.
extern "C" __global__ void __launch_bounds__(256) qgemv(void* y, const u16* x, const unsigned char* w, int n, int m, int k) {
  grid_dep_sync();
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int o = blockIdx.x * 8 + warp;
  if (o >= m) return;
  int nb = k >> 5;
  const unsigned char* wr = w + (i64)o * nb * BB;
  float acc[MAXN];
#pragma unroll
  for (int t = 0; t < MAXN; t++) acc[t] = 0.f;
  for (int b = lane; b < nb; b += 32) {
    const unsigned char* blk = wr + (i64)b * BB;
    float d = f16_to_f32(*(const u16*)blk);
    float wv[32];
    block_values(blk, wv);
#pragma unroll
    for (int t = 0; t < MAXN; t++) {
      if (t < n) {
        const uint4* xp = (const uint4*)(x + (i64)t * k + (i64)b * 32);
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
        acc[t] += d * s;
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

// dequant: dst = bf16(dequant(w)) for larger batches, which then run
// through cuBLASLt.
//   dst [m, k] bf16;  w [m, k] WT
extern "C" __global__ void dequant(u16* dst, const unsigned char* w, int m, int k) {
  grid_dep_sync();
  i64 total = (i64)m * k;
  i64 rb = (i64)(k >> 5) * BB;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
    i64 r = i / k;
    int j = (int)(i - r * k);
    dst[i] = f32_to_bf16(load_q<WT>(w + r * rb, j));
  }
}
