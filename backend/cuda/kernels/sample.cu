// sample.cu: per-row token choice on the GPU (greedy, or temperature with
// top-k / top-p / min-p), picking exactly what backend.SampleRow
// documents for a given U.
//
// Every filter keeps a prefix of the tokens in descending-probability
// order (ties by lower id), and so does the final draw, so a row is
// handled by one primitive: find_prefix, the shortest prefix of the current
// one whose token count or probability mass reaches a target. It is a
// radix select over the logits' order-preserving 32-bit keys (four 8-bit
// digit passes with count and f64-sum histograms in shared memory) and a
// final id-ordered scan over the tokens that share the boundary key. A
// prefix is held as (tau, idcut): token i is in it when key(i) > tau, or
// key(i) == tau and i <= idcut. No specialisation constants.
#include "common.cuh"

#define NT 1024
#define NWARP (NT / 32)
#define MODE_COUNT 0   // count >= target
#define MODE_SUM_GE 1  // mass >= target
#define MODE_SUM_GT 2  // mass > target
#define INT_MAX_ 0x7fffffff

// okey maps a logit to a key whose unsigned order is the float order;
// -0 is folded into +0, which compare equal (the CPU ranks them as ties).
__device__ __forceinline__ u32 okey(float f) {
  u32 u = __float_as_uint(f + 0.f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ bool in_prefix(u32 key, int id, u32 tau, int idcut) {
  return key > tau || (key == tau && id <= idcut);
}

struct Shared {
  u32 count[256];
  double sum[256];
  double dws[NWARP];
  float fws[NWARP];
  int iws[NWARP];
  u32 digit;
  double acc;
  int found;
  int last;
};

// Unnormalised probability of a logit, as the CPU reference computes it:
// w = exp(-(max - v) * (1/T)) in f64. Tokens whose w underflows to 0 are
// never kept.
__device__ __forceinline__ double weight(float v, float m, double invT) { return exp(-(((double)m - (double)v) * invT)); }

// member: in the prefix and of positive weight at least emin.
__device__ __forceinline__ bool heavy(double w, double emin) { return w > 0.0 && w >= emin; }

__device__ double block_sum_d(double v, Shared& sh) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) sh.dws[warp] = v;
  __syncthreads();
  v = lane < NWARP ? sh.dws[lane] : 0.0;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Inclusive block scan; *total receives the block's sum.
__device__ double block_scan_d(double v, Shared& sh, double* total) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    double t = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += t;
  }
  __syncthreads();
  if (lane == 31) sh.dws[warp] = v;
  __syncthreads();
  if (warp == 0) {
    double w = sh.dws[lane];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      double t = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += t;
    }
    sh.dws[lane] = w;
  }
  __syncthreads();
  double before = warp > 0 ? sh.dws[warp - 1] : 0.0;
  *total = sh.dws[NWARP - 1];
  return v + before;
}

// Mass of the tokens in prefix (tau, idcut) with weight >= emin.
__device__ double prefix_mass(const float* L, int vocab, float m, double invT, u32 tau, int idcut, double emin, Shared& sh) {
  double s = 0.0;
  for (int i = threadIdx.x; i < vocab; i += NT) {
    float v = L[i];
    if (!in_prefix(okey(v), i, tau, idcut)) continue;
    double e = weight(v, m, invT);
    if (heavy(e, emin)) s += e;
  }
  return block_sum_d(s, sh);
}

// find_prefix narrows (tau, idcut) to the shortest prefix of its members
// (those with weight >= emin) whose count or mass reaches target. If
// rounding leaves the target unreached, the whole prefix is kept.
__device__ void find_prefix(const float* L, int vocab, float m, double invT, u32* tau, int* idcut, double emin,
                            int mode, double target, Shared& sh) {
  int tid = threadIdx.x;
  u32 t0 = *tau;
  int c0 = *idcut;
  u32 hi = 0;
  double acc = 0.0;
  for (int level = 0; level < 4; level++) {
    int shift = 24 - 8 * level;
    for (int d = tid; d < 256; d += NT) {
      sh.count[d] = 0;
      sh.sum[d] = 0.0;
    }
    __syncthreads();
    for (int i = tid; i < vocab; i += NT) {
      float v = L[i];
      u32 k = okey(v);
      if (!in_prefix(k, i, t0, c0)) continue;
      if (level > 0 && (k >> (shift + 8)) != (hi >> (shift + 8))) continue;
      double e = weight(v, m, invT);
      if (!heavy(e, emin)) continue;
      u32 d = (k >> shift) & 255u;
      atomicAdd(&sh.count[d], 1u);
      if (mode != MODE_COUNT) atomicAdd(&sh.sum[d], e);
    }
    __syncthreads();
    if (tid == 0) {
      int chosen = -1, last = -1;
      double a = acc, lastF = 0.0;
      for (int d = 255; d >= 0; d--) {
        if (sh.count[d] == 0) continue;
        double f = mode == MODE_COUNT ? (double)sh.count[d] : sh.sum[d];
        bool reach = mode == MODE_SUM_GT ? (a + f > target) : (a + f >= target);
        if (reach) {
          chosen = d;
          break;
        }
        a += f;
        last = d;
        lastF = f;
      }
      if (chosen < 0) {
        chosen = last < 0 ? 0 : last;
        a -= lastF;
      }
      sh.digit = (u32)chosen;
      sh.acc = a;
    }
    __syncthreads();
    hi |= sh.digit << shift;
    acc = sh.acc;
    __syncthreads();
  }
  if (tid == 0) {
    sh.found = INT_MAX_;
    sh.last = -1;
  }
  __syncthreads();
  int cut = -1;
  for (int base = 0; base < vocab; base += NT) {
    int i = base + tid;
    double f = 0.0;
    bool tie = false;
    if (i < vocab) {
      float v = L[i];
      u32 k = okey(v);
      if (k == hi && in_prefix(k, i, t0, c0)) {
        double e = weight(v, m, invT);
        if (heavy(e, emin)) {
          tie = true;
          f = mode == MODE_COUNT ? 1.0 : e;
        }
      }
    }
    double total;
    double incl = block_scan_d(f, sh, &total);
    if (tie) {
      bool reach = mode == MODE_SUM_GT ? (acc + incl > target) : (acc + incl >= target);
      if (reach) atomicMin(&sh.found, i);
      atomicMax(&sh.last, i);
    }
    __syncthreads();
    if (sh.found != INT_MAX_) {
      cut = sh.found;
      break;
    }
    acc += total;
    __syncthreads();
  }
  if (cut < 0) cut = sh.last >= 0 ? sh.last : c0;
  __syncthreads();
  *tau = hi;
  *idcut = cut;
}

// sample_rows picks one token per row.
//   logits [n, vocab] f32
//   params [n, 5]: temperature, top_k (int bits), top_p, min_p, u
//   out    [n] int32
// grid (n), block 1024.
// A row holding NaN or +Inf, or nothing but -Inf, raises ERR_LOGITS and
// writes -1, as the CPU reference rejects it.
extern "C" __global__ void __launch_bounds__(NT) sample_rows(const float* logits, int vocab, const float* params, int* out, int* err) {
  grid_dep_sync();
  __shared__ Shared sh;
  int row = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const float* L = logits + (i64)row * vocab;
  const float* pr = params + (i64)row * 5;
  float temp = pr[0];
  int bad = 0;
  int topk = __float_as_int(pr[1]);
  float topp = pr[2], minp = pr[3], u = pr[4];

  // Argmax, lowest id on ties.
  float best = NEG_INF;
  int bid = INT_MAX_;
  for (int i = tid; i < vocab; i += NT) {
    float v = L[i];
    if (v != v || v > 3.402823466e38f) bad = 1;
    if (v > best || (v == best && i < bid)) {
      best = v;
      bid = i;
    }
  }
  bad = __syncthreads_or(bad);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    float ov = __shfl_xor_sync(0xffffffffu, best, o);
    int oi = __shfl_xor_sync(0xffffffffu, bid, o);
    if (ov > best || (ov == best && oi < bid)) {
      best = ov;
      bid = oi;
    }
  }
  if (lane == 0) {
    sh.fws[warp] = best;
    sh.iws[warp] = bid;
  }
  __syncthreads();
  if (warp == 0) {
    best = sh.fws[lane];
    bid = sh.iws[lane];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      float ov = __shfl_xor_sync(0xffffffffu, best, o);
      int oi = __shfl_xor_sync(0xffffffffu, bid, o);
      if (ov > best || (ov == best && oi < bid)) {
        best = ov;
        bid = oi;
      }
    }
    if (lane == 0) {
      sh.fws[0] = best;
      sh.iws[0] = bid;
    }
  }
  __syncthreads();
  float m = sh.fws[0];
  int arg = sh.iws[0];
  if (bad || m == NEG_INF) {
    if (tid == 0) {
      report(err, ERR_LOGITS);
      out[row] = -1;
    }
    return;
  }
  // Greedy; and min-p above 1 keeps only the top token.
  if (!(temp > 0.f) || minp > 1.f) {
    if (tid == 0) out[row] = arg;
    return;
  }
  double invT = 1.0 / (double)temp;
  u32 tau = 0;
  int idcut = INT_MAX_;
  double emin = 0.0;
  if (topk > 0 && topk < vocab) find_prefix(L, vocab, m, invT, &tau, &idcut, emin, MODE_COUNT, (double)topk, sh);
  if (topp > 0.f && topp < 1.f) {
    double z = prefix_mass(L, vocab, m, invT, tau, idcut, emin, sh);
    find_prefix(L, vocab, m, invT, &tau, &idcut, emin, MODE_SUM_GE, (double)topp * z, sh);
  }
  if (minp > 0.f) emin = (double)minp;  // p >= minp * pmax: the top token has weight 1
  double z = prefix_mass(L, vocab, m, invT, tau, idcut, emin, sh);
  find_prefix(L, vocab, m, invT, &tau, &idcut, emin, MODE_SUM_GT, (double)u * z, sh);
  if (tid == 0) out[row] = idcut;
}

// argmax_rows is sample_rows for rows that are all greedy, split over
// many blocks: sample_rows gives a row one block, which reads its 128k
// logits at one SM's bandwidth (a long time in a decode step), while here
// every block takes a chunk of a row and the last block of
// the row to finish reduces the chunks' results.
//   logits [n, vocab] f32
//   part   [n, S] u64 scratch (S = gridDim.x)
//   count  [n] u32, zero on entry and left zero
//   out    [n] int32
// grid (S, n), block AM_NT. The pick is the CPU's: the highest logit,
// lowest id on ties; a row holding NaN or +Inf, or nothing but -Inf,
// raises ERR_LOGITS and writes -1, as sample_rows does.
#define AM_NT 256
#define AM_BAD 0xffffffffffffffffull

// A candidate as one u64 whose unsigned order is the pick's order: the
// logit's order-preserving key above, the complemented id below (lower
// ids win ties). AM_BAD, above every candidate, marks NaN or +Inf.
__device__ __forceinline__ u64 am_key(float v, int i) {
  if (v != v || v > 3.402823466e38f) return AM_BAD;
  return ((u64)okey(v) << 32) | (u64)(~(u32)i);
}

__device__ __forceinline__ u64 am_block_max(u64 k, u64* ws) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    u64 t = __shfl_xor_sync(0xffffffffu, k, o);
    k = t > k ? t : k;
  }
  if (lane == 0) ws[warp] = k;
  __syncthreads();
  k = lane < AM_NT / 32 ? ws[lane] : 0ull;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    u64 t = __shfl_xor_sync(0xffffffffu, k, o);
    k = t > k ? t : k;
  }
  return k;  // warp 0 holds the block's maximum
}

extern "C" __global__ void __launch_bounds__(AM_NT) argmax_rows(const float* logits, int vocab, int chunk, u64* part,
                                                                 u32* count, int* out, int* err) {
  grid_dep_sync();
  __shared__ u64 ws[AM_NT / 32];
  __shared__ bool last;
  int row = blockIdx.y, s = blockIdx.x, S = gridDim.x;
  const float* L = logits + (i64)row * vocab;
  int lo = s * chunk, hi = min(vocab, lo + chunk);
  u64 k = 0ull;
  if ((vocab & 3) == 0 && (chunk & 3) == 0 && ((u64)logits & 15) == 0) {
    // Whole float4s (rows and chunks start 16-byte aligned): a thread's
    // loads of a chunk (4 at 4096) are all in flight before its first
    // compare, where the loop below waits out one load per logit.
    const float4* L4 = (const float4*)(L + lo);
    const int n4 = (hi - lo) / 4;
#pragma unroll 4
    for (int j = threadIdx.x; j < n4; j += AM_NT) {
      const float4 v = L4[j];
      const int i = lo + 4 * j;
      u64 c = am_key(v.x, i);
      k = c > k ? c : k;
      c = am_key(v.y, i + 1);
      k = c > k ? c : k;
      c = am_key(v.z, i + 2);
      k = c > k ? c : k;
      c = am_key(v.w, i + 3);
      k = c > k ? c : k;
    }
  } else {
    for (int i = lo + threadIdx.x; i < hi; i += AM_NT) {
      u64 c = am_key(L[i], i);
      k = c > k ? c : k;
    }
  }
  k = am_block_max(k, ws);
  if (threadIdx.x == 0) {
    part[(i64)row * S + s] = k;
    __threadfence();
    last = atomicAdd(&count[row], 1u) == (u32)(S - 1);
  }
  __syncthreads();
  if (!last) return;
  // The row's last block: every other block's part is written (each
  // fenced its store before counting).
  __threadfence();
  k = 0ull;
  for (int j = threadIdx.x; j < S; j += AM_NT) {
    u64 c;  // through L2: this SM's L1 never held the other blocks' stores
    asm volatile("ld.global.cg.u64 %0, [%1];" : "=l"(c) : "l"(part + (i64)row * S + j));
    k = c > k ? c : k;
  }
  __syncthreads();  // ws is reused
  k = am_block_max(k, ws);
  if (threadIdx.x == 0) {
    count[row] = 0u;
    // Below every finite logit's key: the row was nothing but -Inf.
    if (k == AM_BAD || (u32)(k >> 32) <= okey(NEG_INF)) {
      report(err, ERR_LOGITS);
      out[row] = -1;
    } else {
      out[row] = (int)~(u32)k;
    }
  }
}
