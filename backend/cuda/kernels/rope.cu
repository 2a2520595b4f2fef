// rope.cu: split the fused QKV projection, optional per-head Q/K RMS norm
// (Qwen3), rotate-half RoPE, and the paged KV-cache write, in one pass.
// Specialised with -DHD=<head dim> -DBS=<cache block size>
// -DQT=<qkv and q dtype> -DKV_DT=<cache dtype> -DNT=<norm weight dtype>.
#include "common.cuh"
#include "kv.cuh"

#define HALF (HD / 2)
#define PAIRS ((HALF + 31) / 32)
#define VPL ((HD + 31) / 32)  // V elements per lane

// Tokens per warp: a warp issues the loads of all of them before it
// computes, so that prefill's warps keep more bytes in flight.
#define TPW 2
// Heads per block, a warp each: the block's TPW x HD/2 rotation angles
// are computed once, into shared memory, and shared by its heads (with a
// warp per token and head, every head would recompute its token's precise
// sincosf pairs, which makes prefill's rope_store_kv instruction-bound).
#define HPB 8

// rope_store_kv: one warp per TPW tokens and a head; heads [0, H) are Q
// heads, [H, H+KV) K heads (whose warp also copies the matching V head).
//   q_out  [T, H*HD]
//   qkv    [T, (H+2*KV)*HD]: Q, K, V
//   pos    [T] int32; slots [T] int32 (block*BS + offset; < 0 skips)
//   kc, vc [numBlocks, KV, BS, HD] in kv.cuh's format
//   inv_freq [HD/2] f32; qn, kn [HD] or null
// grid (ceil(T/TPW), ceil((H+KV)/HPB)), block HPB*32.
extern "C" __global__ void __launch_bounds__(HPB * 32) rope_store_kv(
    void* q_out, const void* qkv, const int* pos, const int* slots, void* kc, void* vc,
    const float* inv_freq, const void* qn, const void* kn, float eps, int H, int KV,
    int num_slots, int* err, int T) {
  grid_dep_sync();
  __shared__ float sn[TPW][HALF], cs[TPW][HALF];
  int lane = threadIdx.x & 31;
  int head = blockIdx.y * HPB + (threadIdx.x >> 5);
  const bool live = head < H + KV;  // warps past the last head only help with the angles
  bool is_q = head < H;
  int tk[TPW], slot[TPW];
  // The V row is read up front, with Q/K, so its latency overlaps theirs.
  float vrow[TPW][VPL], x1[TPW][PAIRS], x2[TPW][PAIRS];
#pragma unroll
  for (int u = 0; u < TPW; u++) {
    const int t = blockIdx.x * TPW + u;
    const bool in = live && t < T;
    tk[u] = in ? t : -1;
    const i64 row = (i64)(t < T ? t : 0) * (H + 2 * KV) * HD;
    int sl = -1;
    if (in && !is_q) {
      sl = slots[t];
      if (sl >= num_slots) {
        if (lane == 0) report(err, ERR_SLOT);
        sl = -1;
      }
    }
    if (in && pos[t] < 0 && lane == 0) report(err, ERR_POSITION);
    slot[u] = sl;
#pragma unroll
    for (int k = 0; k < VPL; k++) {
      int i = lane + 32 * k;
      vrow[u][k] = (in && !is_q && i < HD) ? load_f<QT>(qkv, row + (i64)(H + KV + (head - H)) * HD + i) : 0.f;
    }
#pragma unroll
    for (int k = 0; k < PAIRS; k++) {
      int i = lane + 32 * k;
      x1[u][k] = x2[u][k] = 0.f;
      if (in && i < HALF) {
        x1[u][k] = load_f<QT>(qkv, row + (i64)head * HD + i);
        x2[u][k] = load_f<QT>(qkv, row + (i64)head * HD + i + HALF);
      }
    }
  }
  // The angles, while the loads are in flight. A negative position
  // (reported above) rotates as position 0.
  for (int idx = threadIdx.x; idx < TPW * HALF; idx += HPB * 32) {
    const int u = idx / HALF, i = idx - u * HALF;
    const int t = blockIdx.x * TPW + u;
    float s = 0.f, c = 1.f;
    if (t < T) sincosf((float)max(pos[t], 0) * inv_freq[i], &s, &c);
    sn[u][i] = s;
    cs[u][i] = c;
  }
  __syncthreads();
  if (!live) return;
  const void* nw = is_q ? qn : kn;
#pragma unroll
  for (int u = 0; u < TPW; u++) {
    const int t = tk[u];
    if (t < 0) continue;  // the same for the whole warp
    if (nw != 0) {
      float ss = 0.f;
#pragma unroll
      for (int k = 0; k < PAIRS; k++) ss += x1[u][k] * x1[u][k] + x2[u][k] * x2[u][k];
      ss = warp_sum(ss);
      float r = rsqrtf(ss / (float)HD + eps);
#pragma unroll
      for (int k = 0; k < PAIRS; k++) {
        int i = lane + 32 * k;
        if (i < HALF) {
          x1[u][k] = (x1[u][k] * r) * load_f<NT>(nw, i);
          x2[u][k] = (x2[u][k] * r) * load_f<NT>(nw, i + HALF);
        }
      }
    }
    i64 dst = 0;
    if (!is_q && slot[u] >= 0) {
      int blk, off;
      kv_split(slot[u], BS, blk, off);
      dst = kv_at(blk, KV, head - H, BS, off, HD);
    }
#pragma unroll
    for (int k = 0; k < PAIRS; k++) {
      int i = lane + 32 * k;
      if (i >= HALF) continue;
      const float s = sn[u][i], c = cs[u][i];
      float y1 = x1[u][k] * c - x2[u][k] * s;
      float y2 = x2[u][k] * c + x1[u][k] * s;
      if (is_q) {
        i64 o = ((i64)t * H + head) * HD;
        store_f<QT>(q_out, o + i, y1);
        store_f<QT>(q_out, o + i + HALF, y2);
      } else if (slot[u] >= 0) {
        kv_store(kc, dst + i, y1);
        kv_store(kc, dst + i + HALF, y2);
      }
    }
    if (!is_q && slot[u] >= 0) {
#pragma unroll
      for (int k = 0; k < VPL; k++) {
        int i = lane + 32 * k;
        if (i < HD) kv_store(vc, dst + i, vrow[u][k]);
      }
    }
  }
}
