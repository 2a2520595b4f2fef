// rope.cu: split the fused QKV projection, optional per-head Q/K RMS norm
// (Qwen3), rotate-half RoPE, and the paged KV-cache write, in one pass.
// Specialised with -DHD=<head dim> -DBS=<cache block size>
// -DQT=<qkv and q dtype> -DCT=<cache dtype> -DNT=<norm weight dtype>.
#include "common.cuh"

#define HALF (HD / 2)
#define PAIRS ((HALF + 31) / 32)
#define VPL ((HD + 31) / 32)  // V elements per lane

// rope_store_kv: one warp per (token, head); heads [0, H) are Q heads,
// [H, H+KV) K heads (whose warp also copies the matching V head).
//   q_out  [T, H*HD]
//   qkv    [T, (H+2*KV)*HD]: Q, K, V
//   pos    [T] int32; slots [T] int32 (block*BS + offset; < 0 skips)
//   kc, vc [numBlocks, KV, BS, HD]
//   inv_freq [HD/2] f32; qn, kn [HD] or null
// grid (T, ceil((H+KV)/4)), block 128.
extern "C" __global__ void __launch_bounds__(128) rope_store_kv(
    void* q_out, const void* qkv, const int* pos, const int* slots, void* kc, void* vc,
    const float* inv_freq, const void* qn, const void* kn, float eps, int H, int KV,
    int num_slots, int* err) {
  grid_dep_sync();
  int t = blockIdx.x;
  int lane = threadIdx.x & 31;
  int head = blockIdx.y * 4 + (threadIdx.x >> 5);
  if (head >= H + KV) return;
  bool is_q = head < H;
  i64 row = (i64)t * (H + 2 * KV) * HD;
  int p = pos[t];
  int slot = 0;
  if (!is_q) {
    slot = slots[t];
    if (slot >= num_slots) {
      if (lane == 0) report(err, ERR_SLOT);
      slot = -1;
    }
  }
  if (p < 0) {
    if (lane == 0) report(err, ERR_POSITION);
    p = 0;
  }
  // The V row is read up front, with Q/K, so its latency overlaps theirs
  // (the copy at the end used to add one more memory round trip).
  float vrow[VPL];
#pragma unroll
  for (int k = 0; k < VPL; k++) {
    int i = lane + 32 * k;
    vrow[k] = (!is_q && i < HD) ? load_f<QT>(qkv, row + (i64)(H + KV + (head - H)) * HD + i) : 0.f;
  }
  float x1[PAIRS], x2[PAIRS];
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < PAIRS; k++) {
    int i = lane + 32 * k;
    x1[k] = x2[k] = 0.f;
    if (i < HALF) {
      x1[k] = load_f<QT>(qkv, row + (i64)head * HD + i);
      x2[k] = load_f<QT>(qkv, row + (i64)head * HD + i + HALF);
      ss += x1[k] * x1[k] + x2[k] * x2[k];
    }
  }
  const void* nw = is_q ? qn : kn;
  if (nw != 0) {
    ss = warp_sum(ss);
    float r = rsqrtf(ss / (float)HD + eps);
#pragma unroll
    for (int k = 0; k < PAIRS; k++) {
      int i = lane + 32 * k;
      if (i < HALF) {
        x1[k] = (x1[k] * r) * load_f<NT>(nw, i);
        x2[k] = (x2[k] * r) * load_f<NT>(nw, i + HALF);
      }
    }
  }
  i64 dst = 0;
  if (!is_q && slot >= 0) {
    int blk = slot / BS, off = slot - blk * BS;
    dst = (((i64)blk * KV + (head - H)) * BS + off) * HD;
  }
#pragma unroll
  for (int k = 0; k < PAIRS; k++) {
    int i = lane + 32 * k;
    if (i >= HALF) continue;
    float s, c;
    sincosf((float)p * inv_freq[i], &s, &c);
    float y1 = x1[k] * c - x2[k] * s;
    float y2 = x2[k] * c + x1[k] * s;
    if (is_q) {
      i64 o = ((i64)t * H + head) * HD;
      store_f<QT>(q_out, o + i, y1);
      store_f<QT>(q_out, o + i + HALF, y2);
    } else if (slot >= 0) {
      store_f<CT>(kc, dst + i, y1);
      store_f<CT>(kc, dst + i + HALF, y2);
    }
  }
  if (!is_q && slot >= 0) {
#pragma unroll
    for (int k = 0; k < VPL; k++) {
      int i = lane + 32 * k;
      if (i < HD) store_f<CT>(vc, dst + i, vrow[k]);
    }
  }
}
