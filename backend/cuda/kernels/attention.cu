// attention.cu: paged causal attention over BF16 KV caches in kv.cuh's
// format. Specialised with -DHD=<head dim> -DBS=<cache block size>
// -DKV_DT=<cache dtype, DT_BF16> -DGC=<query heads per decode block>
// -DUR=<decode warp steps whose loads are issued together>.
//
// This is the CUDA-core decode kernel: attn_decode.cu's tensor-core one
// replaces it wherever that one's ring fits a block's shared memory
// (attn_decode.go chooses); it runs where it does not.
//
// Decode (one query row per sequence) is split-KV flash decoding: a block
// owns one (sequence, KV head, split) and the GC query heads of the GQA
// group that share each K/V load, scoring a warp step's tokens before one
// online-softmax rescale per step; attn_combine merges the splits. Prefill
// (sequences with two or more query rows) is attn_prefill.cu's. Decode
// reads the block table directly. Scores are kept in the log2 domain:
// scale_log2 is scale * log2(e), so exp becomes one ex2.
#define KV_BF16_ONLY  // unpack8 takes a 16-byte chunk as 8 bf16
#include "kv.cuh"

// ---------------------------------------------------------------- decode

#define TPT kv_row_chunks(HD)  // threads per token: each holds one 16-byte chunk (8 dims)
#define TPW (32 / TPT)         // tokens per warp step
#define NW 4                   // warps per block
#define UNROLL UR              // warp steps whose loads are issued together

__device__ __forceinline__ void unpack8(uint4 v, float* f) {
  f[0] = __uint_as_float(v.x << 16); f[1] = __uint_as_float(v.x & 0xffff0000u);
  f[2] = __uint_as_float(v.y << 16); f[3] = __uint_as_float(v.y & 0xffff0000u);
  f[4] = __uint_as_float(v.z << 16); f[5] = __uint_as_float(v.z & 0xffff0000u);
  f[6] = __uint_as_float(v.w << 16); f[7] = __uint_as_float(v.w & 0xffff0000u);
}

// attn_decode: for each sequence with exactly one query row, attention of
// GC query heads over the split's share of the context.
//   out   [T, H*HD] bf16 (written when nsplit == 1)
//   part  [S, H, nsplit, HD+2] f32: unnormalised o, then max m, then sum l
//   q     [T, H*HD] bf16; ksc, vsc: attn_decode_mma's arguments, null here
//   block_tables [S, max_blocks]; seq_lens [S]; qstart [S+1]
// grid (S, KV * (G/GC), nsplit), block 128. Bad metadata raises
// ERR_QUERY_LEN, reported once per sequence by this kernel, as does a
// sequence of several rows when decode_only (no prefill kernel follows).
// step_keys is attn_decode_mma's; this kernel reads the cache only after
// its predecessor is done, so every position is safe to read.
extern "C" __global__ void __launch_bounds__(128) attn_decode(
    u16* out, float* part, const u16* q, const kv_t* kc, const kv_t* vc, const void* ksc, const void* vsc,
    const int* block_tables, int max_blocks, const int* seq_lens, const int* qstart,
    int H, int KV, int G, int nsplit, float scale_log2, int window, int num_blocks, int num_tokens,
    int max_seq_len, int decode_only, int step_keys, int* err) {
  grid_dep_sync();  // Q and the KV cache come from the kernels before this one
  __shared__ float sm_m[NW][GC], sm_l[NW][GC];
  __shared__ float sm_o[NW][GC][HD];
  int s = blockIdx.x;
  int chunks = G / GC;
  int kvh = blockIdx.y / chunks;
  int g0 = (blockIdx.y - kvh * chunks) * GC;
  int split = blockIdx.z;
  int q0 = qstart[s], qlen = qstart[s + 1] - q0;
  int L = seq_lens[s];
  if (!rows_ok(q0, qlen, L, num_tokens, max_seq_len)) {
    if (threadIdx.x == 0 && blockIdx.y == 0 && split == 0) report(err, ERR_QUERY_LEN);
    return;
  }
  if (qlen != 1) {
    // A decode-only launch has no prefill kernel behind it to fill these rows.
    if (decode_only && qlen > 1 && threadIdx.x == 0 && blockIdx.y == 0 && split == 0) report(err, ERR_QUERY_LEN);
    return;
  }
  int qpos = L - 1;
  int lo = window > 0 ? max(0, qpos - window + 1) : 0;
  int chunk = (L - lo + nsplit - 1) / nsplit;
  chunk = (chunk + BS - 1) / BS * BS;
  int c0 = lo + split * chunk, c1 = min(L, c0 + chunk);

  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int grp = lane / TPT, sub = lane % TPT, d0 = kv_chunk(sub);  // this lane's 8 dims of Q, K, V and O

  float qf[GC][8];
#pragma unroll
  for (int g = 0; g < GC; g++) {
    int h = kvh * G + g0 + g;
    uint4 v = *(const uint4*)(q + ((i64)q0 * H + h) * HD + d0);
    unpack8(v, qf[g]);
#pragma unroll
    for (int e = 0; e < 8; e++) qf[g][e] *= scale_log2;
  }
  float m[GC], l[GC], acc[GC][8];
#pragma unroll
  for (int g = 0; g < GC; g++) {
    m[g] = NEG_INF;
    l[g] = 0.f;
#pragma unroll
    for (int e = 0; e < 8; e++) acc[g][e] = 0.f;
  }
  const int* bt = block_tables + (i64)s * max_blocks;
  for (int base = c0 + warp * TPW * UNROLL; base < c1; base += NW * TPW * UNROLL) {
    uint4 kv[UNROLL], vv[UNROLL];
    bool valid[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
      int p = base + u * TPW + grp;
      valid[u] = p < c1;
      kv[u] = make_uint4(0, 0, 0, 0);
      vv[u] = make_uint4(0, 0, 0, 0);
      if (valid[u]) {
        int bi = kv_index(p, BS);
        int blk = bi < max_blocks ? bt[bi] : -1;
        if (blk < 0 || blk >= num_blocks) {
          report(err, ERR_BLOCK_ID);
          valid[u] = false;
        } else {
          i64 off = kv_at_pos(blk, KV, kvh, BS, p, bi, HD) + d0;
          kv[u] = *(const uint4*)(kc + off);
          vv[u] = *(const uint4*)(vc + off);
        }
      }
    }
    // The step's UNROLL x GC scores first, all independent (their shuffle
    // reductions overlap), then one online-softmax rescale per head for the
    // whole step instead of one per token: per token this saves a rescale
    // of the accumulators (8 FMA per head) and an exp2, and it breaks the
    // token-to-token dependency through m, l and acc.
    float sc[UNROLL][GC];
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
      float kf[8];
      unpack8(kv[u], kf);
#pragma unroll
      for (int g = 0; g < GC; g++) {
        float dot = 0.f;
#pragma unroll
        for (int e = 0; e < 8; e++) dot += qf[g][e] * kf[e];
        sc[u][g] = dot;
      }
    }
#pragma unroll
    for (int o = 1; o < TPT; o <<= 1) {
#pragma unroll
      for (int u = 0; u < UNROLL; u++) {
#pragma unroll
        for (int g = 0; g < GC; g++) sc[u][g] += __shfl_xor_sync(0xffffffffu, sc[u][g], o);
      }
    }
    float pe[UNROLL][GC];
#pragma unroll
    for (int g = 0; g < GC; g++) {
      float tm = NEG_INF;
#pragma unroll
      for (int u = 0; u < UNROLL; u++) tm = fmaxf(tm, valid[u] ? sc[u][g] : NEG_INF);
      float mn = fmaxf(m[g], tm);
      // mn is -inf only while this lane group has seen no valid token:
      // then nothing is added (and exp2(-inf - -inf) would be NaN).
      float alpha = mn == NEG_INF ? 1.f : fast_exp2(m[g] - mn);
      l[g] *= alpha;
#pragma unroll
      for (int e = 0; e < 8; e++) acc[g][e] *= alpha;
      m[g] = mn;
#pragma unroll
      for (int u = 0; u < UNROLL; u++) {
        pe[u][g] = (valid[u] && mn != NEG_INF) ? fast_exp2(sc[u][g] - mn) : 0.f;
        l[g] += pe[u][g];
      }
    }
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
      float vf[8];
      unpack8(vv[u], vf);
#pragma unroll
      for (int g = 0; g < GC; g++) {
#pragma unroll
        for (int e = 0; e < 8; e++) acc[g][e] += pe[u][g] * vf[e];
      }
    }
  }
  // Merge the token groups of the warp (lanes sub, sub+TPT, ...).
#pragma unroll
  for (int o = TPT; o < 32; o <<= 1) {
#pragma unroll
    for (int g = 0; g < GC; g++) {
      float mo = __shfl_xor_sync(0xffffffffu, m[g], o);
      float lo2 = __shfl_xor_sync(0xffffffffu, l[g], o);
      float mn = fmaxf(m[g], mo);
      float a = m[g] == NEG_INF ? 0.f : fast_exp2(m[g] - mn);
      float b = mo == NEG_INF ? 0.f : fast_exp2(mo - mn);
      l[g] = l[g] * a + lo2 * b;
#pragma unroll
      for (int e = 0; e < 8; e++) {
        float ao = __shfl_xor_sync(0xffffffffu, acc[g][e], o);
        acc[g][e] = acc[g][e] * a + ao * b;
      }
      m[g] = mn;
    }
  }
  if (grp == 0) {
#pragma unroll
    for (int g = 0; g < GC; g++) {
      if (sub == 0) {
        sm_m[warp][g] = m[g];
        sm_l[warp][g] = l[g];
      }
#pragma unroll
      for (int e = 0; e < 8; e++) sm_o[warp][g][d0 + e] = acc[g][e];
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < GC * HD; idx += blockDim.x) {
    int g = idx / HD, d = idx - g * HD;
    float M = NEG_INF;
#pragma unroll
    for (int w = 0; w < NW; w++) M = fmaxf(M, sm_m[w][g]);
    float lsum = 0.f, o = 0.f;
#pragma unroll
    for (int w = 0; w < NW; w++) {
      float mw = sm_m[w][g];
      if (mw == NEG_INF) continue;
      float f = fast_exp2(mw - M);
      lsum += sm_l[w][g] * f;
      o += sm_o[w][g][d] * f;
    }
    int h = kvh * G + g0 + g;
    if (nsplit == 1) {
      out[((i64)q0 * H + h) * HD + d] = f32_to_bf16(lsum > 0.f ? o / lsum : 0.f);
    } else {
      float* pp = part + (((i64)s * H + h) * nsplit + split) * (HD + 2);
      pp[d] = o;
      if (d == 0) {
        pp[HD] = M;
        pp[HD + 1] = lsum;
      }
    }
  }
}

// attn_combine merges the nsplit (<= MAX_SPLITS) partial results of each
// decode row. Every load (each split's max, sum and this thread's output
// dim) is issued before any is used: the kernel is one memory latency long.
// grid (S, H), block HD.
#define MAX_SPLITS 32
extern "C" __global__ void attn_combine(u16* out, const float* part, const int* seq_lens, const int* qstart, int H, int nsplit,
                                        int num_tokens, int max_seq_len) {
  grid_dep_sync();
  __shared__ float sm_m[MAX_SPLITS], sm_l[MAX_SPLITS];
  int s = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
  int q0 = qstart[s], qlen = qstart[s + 1] - q0;
  if (qlen != 1 || !rows_ok(q0, qlen, seq_lens[s], num_tokens, max_seq_len) || d >= HD) return;
  const float* pp = part + ((i64)s * H + h) * nsplit * (HD + 2);
  float ov[MAX_SPLITS];
#pragma unroll
  for (int j = 0; j < MAX_SPLITS; j++) ov[j] = j < nsplit ? pp[j * (HD + 2) + d] : 0.f;
  for (int j = d; j < nsplit; j += HD) {
    sm_m[j] = pp[j * (HD + 2) + HD];
    sm_l[j] = pp[j * (HD + 2) + HD + 1];
  }
  __syncthreads();
  float M = NEG_INF;
#pragma unroll
  for (int j = 0; j < MAX_SPLITS; j++)
    if (j < nsplit) M = fmaxf(M, sm_m[j]);
  float lsum = 0.f, o = 0.f;
#pragma unroll
  for (int j = 0; j < MAX_SPLITS; j++) {
    if (j < nsplit && sm_m[j] != NEG_INF) {
      float f = fast_exp2(sm_m[j] - M);
      lsum += sm_l[j] * f;
      o += ov[j] * f;
    }
  }
  out[((i64)q0 * H + h) * HD + d] = f32_to_bf16(lsum > 0.f ? o / lsum : 0.f);
}
