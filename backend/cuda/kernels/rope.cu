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
//   ksc, vsc the pools' scales (kv.cuh; null for unquantized caches)
//   inv_freq [HD/2] f32; qn, kn [HD] or null
//   scan   null, or (FP8 caches) [2*KV + 1] u32 of zeros: see below
//   int4 (KIVI) caches also take the window pools and map (kv_win,
//   KV_WIN_PARAMS; its window unused here)
// grid (ceil(T/TPW), ceil((H+KV)/HPB)), block HPB*32.
//
// An int4 cache's K and V rows go in bf16 to the window block of their
// block, and V is quantized into the pool at once; K is not: kivi_seal_k,
// launched after this kernel, quantizes the blocks whose last token this
// launch wrote, from their window copies (in a prefill launch the other
// tokens of such a block are written by other blocks of this grid). A
// token whose block has no window block is reported (ERR_WINDOW) and not
// written.
//
// With scan set the launch stores nothing: it is the pass before the
// store that sets an FP8 cache's dynamic scales (backend.KVSpec). If every
// head's K and V scale is set it returns at once; otherwise it takes the
// largest |K| (normed and rotated) and |V| of each head over the tokens
// with a slot into scan[j] and scan[KV + j] (as f32 bits, atomicMax: they
// are not negative), and the launch's last block sets each unset scale
// to that maximum / KV_FP8_TARGET and zeroes scan for the next layer.
#define KV_FP8_TARGET 112.f  // backend.KVFP8DynamicTarget
__device__ __forceinline__ void rope_rows(void* q_out, void* kc, void* vc, void* ksc, void* vsc, const void* qn,
                                          const void* kn, float eps, int H, int KV, int T, u32* scan, bool is_q,
                                          int head, int lane, const int (&tk)[TPW], const int (&slot)[TPW],
                                          float (&vrow)[TPW][VPL], float (&x1)[TPW][PAIRS], float (&x2)[TPW][PAIRS],
                                          const float (&sn)[TPW][HALF], const float (&cs)[TPW][HALF], const kv_win& kw);
extern "C" __global__ void __launch_bounds__(HPB * 32) rope_store_kv(
    void* q_out, const void* qkv, const int* pos, const int* slots, void* kc, void* vc, void* ksc, void* vsc,
    const float* inv_freq, const void* qn, const void* kn, float eps, int H, int KV,
    int num_slots, int* err, int T, u32* scan KV_WIN_PARAMS) {
  grid_dep_sync();
  const kv_win kw = KV_WIN_ARGS;
#if KV_DT == DT_F8E4M3
  if (scan != 0) {
    bool unset = false;
    for (int j = 0; j < KV; j++) unset |= ((const float*)ksc)[j] == 0.f || ((const float*)vsc)[j] == 0.f;
    if (!unset) return;  // the same answer in every block: no scale changes before the last one
  }
#endif
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
#if KV_KIVI
      if (sl >= 0) {
        const int w = kw.map[kv_index(sl, BS)];
        if (w < 0 || w >= kw.n) {
          if (lane == 0) report(err, ERR_WINDOW);
          sl = -1;
        }
      }
#endif
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
  if (live && !(scan != 0 && is_q)) rope_rows(q_out, kc, vc, ksc, vsc, qn, kn, eps, H, KV, T, scan, is_q, head, lane, tk, slot, vrow, x1, x2, sn, cs, kw);
#if KV_DT == DT_F8E4M3
  if (scan != 0) {
    // The last block to finish sets the unset scales from the maxima.
    __shared__ bool last;
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      last = atomicAdd(&scan[2 * KV], 1u) == gridDim.x * gridDim.y - 1;
    }
    __syncthreads();
    if (last) {
      __threadfence();
      for (int j = threadIdx.x; j < 2 * KV; j += blockDim.x) {
        float* sc = j < KV ? (float*)ksc + j : (float*)vsc + (j - KV);
        const float m = __uint_as_float(atomicExch(&scan[j], 0u));
        if (*sc == 0.f) *sc = m / KV_FP8_TARGET;
      }
      if (threadIdx.x == 0) scan[2 * KV] = 0;
    }
  }
#endif
}

// rope_rows is rope_store_kv's work for one live warp (one head and TPW
// tokens) once the rows are loaded and the angles are in shared memory.
__device__ __forceinline__ void rope_rows(void* q_out, void* kc, void* vc, void* ksc, void* vsc, const void* qn,
                                          const void* kn, float eps, int H, int KV, int T, u32* scan, bool is_q,
                                          int head, int lane, const int (&tk)[TPW], const int (&slot)[TPW],
                                          float (&vrow)[TPW][VPL], float (&x1)[TPW][PAIRS], float (&x2)[TPW][PAIRS],
                                          const float (&sn)[TPW][HALF], const float (&cs)[TPW][HALF], const kv_win& kw) {
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
    i64 dst = 0, srow = 0;
    if (!is_q && slot[u] >= 0) {
      int blk, off;
      kv_split(slot[u], BS, blk, off);
      dst = kv_at(blk, KV, head - H, BS, off, HD);
      srow = KV_DT == DT_F8E4M3 ? head - H : ((i64)blk * KV + (head - H)) * BS + off;  // kv_store_row's row of scales
    }
    float y1[PAIRS], y2[PAIRS];
#pragma unroll
    for (int k = 0; k < PAIRS; k++) {
      int i = lane + 32 * k;
      y1[k] = y2[k] = 0.f;
      if (i >= HALF) continue;
      const float s = sn[u][i], c = cs[u][i];
      y1[k] = x1[u][k] * c - x2[u][k] * s;
      y2[k] = x2[u][k] * c + x1[u][k] * s;
      if (is_q) {
        i64 o = ((i64)t * H + head) * HD;
        store_f<QT>(q_out, o + i, y1[k]);
        store_f<QT>(q_out, o + i + HALF, y2[k]);
      }
#if !KV_QUANT && !KV_KIVI
      else if (slot[u] >= 0) {
        kv_store(kc, dst + i, y1[k]);
        kv_store(kc, dst + i + HALF, y2[k]);
      }
#endif
    }
    if (is_q || slot[u] < 0) continue;  // the same for the whole warp
#if KV_QUANT || KV_KIVI
    // The K row as element lane + 32k (kv_store_row's layout): with
    // HALF a multiple of 32 it is y1 then y2 of the same lane; below, lane
    // l >= HALF takes y2 of lane l - HALF.
    float kr[VPL];
#pragma unroll
    for (int k = 0; k < VPL; k++) {
      if (HALF % 32 == 0) {
        kr[k] = k < PAIRS ? y1[k] : y2[k - PAIRS];
      } else {
        const float t2 = __shfl_sync(0xffffffffu, y2[0], (lane - HALF) & 31);
        kr[k] = lane < HALF ? y1[0] : t2;
      }
    }
#if KV_KIVI
    {
      // Both rows to the block's window block in bf16 (the slot check
      // made sure it has one), V to int4 now; K waits for kivi_seal_k.
      int blk, off;
      kv_split(slot[u], BS, blk, off);
      const i64 wrow = kv_at(kw.map[blk], KV, head - H, BS, off, HD);
#pragma unroll
      for (int k = 0; k < VPL; k++) {
        const int i = lane + 32 * k;
        if (i < HD) {
          kw.k[wrow + i] = f32_to_bf16(kr[k]);
          kw.v[wrow + i] = f32_to_bf16(vrow[u][k]);
        }
      }
      kivi_store_v<VPL>((kv_t*)vc, vsc, dst, srow, vrow[u], HD, lane);
    }
#else
#if KV_DT == DT_F8E4M3
    if (scan != 0) {
      float km = 0.f, vm = 0.f;
#pragma unroll
      for (int k = 0; k < VPL; k++) {
        if (lane + 32 * k < HD) {
          km = fmaxf(km, fabsf(kr[k]));
          vm = fmaxf(vm, fabsf(vrow[u][k]));
        }
      }
      km = warp_max(km);
      vm = warp_max(vm);
      if (lane == 0) {
        atomicMax(&scan[head - H], __float_as_uint(km));
        atomicMax(&scan[KV + head - H], __float_as_uint(vm));
      }
      continue;
    }
#endif
    kv_store_row<VPL>((kv_t*)kc, ksc, dst, srow, kr, HD, lane);
    kv_store_row<VPL>((kv_t*)vc, vsc, dst, srow, vrow[u], HD, lane);
#endif  // KV_KIVI
#else
#pragma unroll
    for (int k = 0; k < VPL; k++) {
      int i = lane + 32 * k;
      if (i < HD) kv_store(vc, dst + i, vrow[u][k]);
    }
#endif
  }
}

#if KV_KIVI
// kivi_seal_k quantizes the K of every block whose last token (offset
// BS-1) a rope_store_kv launch just wrote, from the block's bf16 window
// copy, per channel over the block's BS tokens (backend.QuantizeAsym4 on
// the window's values, so the bytes and scales are the CPU's for the same
// window rows). It runs after that launch, as the next kernel of the
// stream: a block's other tokens may come from other blocks of that grid.
//   slots [T]; kc [numBlocks, KV, BS, HD] int4; ksc [numBlocks][KV][2][HD] f16
//   kw.k, kw.map: the window pool and map (kv_win)
// grid (ceil(T/4), KV), block 128: warp w of block x takes token 4x + w
// and KV head y; lane l channels 2l + 64i and the next. Tokens without a
// slot, outside the cache or without a window block (which rope_store_kv
// reported) are skipped.
extern "C" __global__ void __launch_bounds__(128) kivi_seal_k(const int* slots, void* kc, void* ksc, int KV, int T,
                                                              int num_slots KV_WIN_PARAMS) {
  grid_dep_sync();
  const kv_win kw = KV_WIN_ARGS;
  const int lane = threadIdx.x & 31;
  const int t = blockIdx.x * 4 + (threadIdx.x >> 5), j = blockIdx.y;
  if (t >= T) return;
  const int sl = slots[t];
  if (sl < 0 || sl >= num_slots || kv_offset(sl, BS) != BS - 1) return;
  const int blk = kv_index(sl, BS), w = kw.map[blk];
  if (w < 0 || w >= kw.n) return;
  const u16* src = kw.k + kv_at(w, KV, j, BS, 0, HD);
  unsigned char* dst = (unsigned char*)kc + kv_at(blk, KV, j, BS, 0, HD) / 2;
  u32* sc = (u32*)((u16*)ksc + ((i64)blk * KV + j) * 2 * HD);  // channel pairs: scales, then zero points at + HD/2
#pragma unroll
  for (int i = 0; i < (HD + 63) / 64; i++) {
    const int c = 2 * lane + 64 * i;  // channels c, c+1
    if (c >= HD) break;
    float x0[BS], x1[BS];
    float lo0 = __int_as_float(0x7f800000), hi0 = -lo0, lo1 = lo0, hi1 = hi0;
#pragma unroll
    for (int r = 0; r < BS; r++) {
      const u32 p = *(const u32*)(src + kv_row(r, HD) + c);
      x0[r] = __uint_as_float(p << 16);
      x1[r] = __uint_as_float(p & 0xffff0000u);
      lo0 = fminf(lo0, x0[r]);
      hi0 = fmaxf(hi0, x0[r]);
      lo1 = fminf(lo1, x1[r]);
      hi1 = fmaxf(hi1, x1[r]);
    }
    u16 sb0, zb0, sb1, zb1;
    float s0, z0, s1, z1;
    kivi_params(lo0, hi0, sb0, zb0, s0, z0);
    kivi_params(lo1, hi1, sb1, zb1, s1, z1);
#pragma unroll
    for (int r = 0; r < BS; r++)
      dst[(kv_row(r, HD) + c) >> 1] = (unsigned char)(kivi_code(x0[r], z0, s0) | kivi_code(x1[r], z1, s1) << 4);
    sc[c / 2] = (u32)sb0 | (u32)sb1 << 16;
    sc[HD / 2 + c / 2] = (u32)zb0 | (u32)zb1 << 16;
  }
}
#endif
