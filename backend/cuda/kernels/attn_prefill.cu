// attn_prefill.cu: causal prefill attention (sequences with two or more
// query rows) over paged BF16, FP8, INT8 or INT4 (KIVI) KV caches in
// kv.cuh's format,
// FlashAttention-2 style on the tensor cores (mma.sync m16n8k16, bf16 in,
// f32 accumulate).
//
// Specialised with -DHD=<head dim> -DBS=<cache block size> -DKV_DT=<cache
// dtype> -DKV_G=<int8 or int4 V channel group> -DBM=<query rows per block> -DBN=<keys per tile>
// -DNW=<warps per block, BM/16> -DQR=<1: Q fragments live in registers,
// 0: re-read from shared memory every tile>.
// The host (prefillTiling in attn.go) picks them per head dim and sizes the
// dynamic shared memory with the same layout formula as below.
//
// Design:
//   - A block owns BM query rows of one head of one sequence; each warp owns
//     16 rows (one mma row tile) for the whole key range, so the online
//     softmax needs no cross-warp exchange.
//   - K/V tiles of BN keys go to shared memory with 16-byte cp.async.cg in
//     a two-stage pipeline: tile j+1 is in flight while tile j is computed;
//     one __syncthreads per tile. A quantized cache's rows are loaded,
//     dequantized to bf16 and stored by the threads instead (the loads of
//     tile j+1 still precede tile j's arithmetic; the tile is the same; an
//     int4 cache's rows read in bf16 are its window rows, copied as a BF16
//     cache's are). Keys outside the block's range, and keys
//     of bad block ids (reported as ERR_BLOCK_ID), are zero-filled.
//   - Shared rows are padded to HD+8 elements (16 bytes): the eight row
//     addresses of every ldmatrix phase then fall in eight different 16-byte
//     bank groups, so ldmatrix and the cp.async stores are conflict-free.
//   - Q/K fragments come from ldmatrix.x4, V fragments from ldmatrix.x4.trans;
//     P is rounded to bf16 in registers and reused as the A operand of P.V.
//   - Scores are in the log2 domain (scale_log2 includes log2 e); the causal
//     and window masks are evaluated only on tiles that cross a warp's
//     diagonal or window edge, and a warp skips tiles it cannot see at all.
//   - Row tiles are counted from the END of each sequence (tile 0 holds its
//     last BM rows: the most keys) and the grid is (H, S, row tiles) with the
//     row tile outermost, so the longest tiles are dispatched first and the
//     one ragged tile of a sequence is its cheapest, first, one. Key tiles
//     are likewise counted back from the last row's position, so the
//     diagonal of the block falls on tile boundaries.
#include "mma.cuh"
#define KV_BF16_OR_QUANT  // the shared K/V tiles are bf16 mma operands: the cache rows, or dequantized
#include "kv.cuh"

#define NT (NW * 32)               // threads per block
#define KSTRIDE (HD + 8)           // shared row stride in elements (16 bytes of pad)
#define ROWB (KSTRIDE * 2)         // ... in bytes
#define CPR (HD / 8)               // 16-byte chunks per bf16 row (of Q and of the shared K/V tiles)
#define STAGE (2 * BN * KSTRIDE)   // elements of one pipeline stage: K tile, then V tile
#define Q_ALIASED (QR && BM <= 2 * BN)

// Shared memory layout (bytes; the host's prefillConfig.smem computes the
// same total):
//   [0, STAGE*2)            stage 0: K tile [BN][KSTRIDE], V tile [BN][KSTRIDE]
//   [STAGE*2, STAGE*4)      stage 1, alike
//   Q tile [BM][KSTRIDE]    at stage 1 when Q_ALIASED (it is moved into
//                           registers before stage 1 is first written),
//                           otherwise at [STAGE*4, STAGE*4 + BM*ROWB)
#if Q_ALIASED
#define Q_OFF (STAGE * 2)  // bytes
#else
#define Q_OFF (STAGE * 4)  // bytes
#endif

#if HD <= 64
#define MINB 2  // small fragments: two blocks per SM fit in the registers
#else
#define MINB 1
#endif

static_assert(BM == 16 * NW, "each warp owns one 16-row mma tile");
static_assert(BN % 16 == 0 && HD % 16 == 0, "mma steps are 16 wide");
static_assert(!QR || HD <= 128, "Q fragments of HD > 128 do not fit in registers");

#include "prefill_rows.cuh"  // needs HD and BN

__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

// ldsm_x4 loads four 8x8 bf16 matrices: lanes 8i..8i+7 give the addresses
// of matrix i's eight rows (16 contiguous bytes each); register i of lane l
// then holds matrix i's elements (row l/4, cols 2(l%4), 2(l%4)+1), the lower
// column in the low half.
__device__ __forceinline__ void ldsm_x4(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
// ldsm_x4_t is ldsm_x4 transposed: register i of lane l holds matrix i's
// elements (rows 2(l%4), 2(l%4)+1; col l/4), the lower row in the low half.
__device__ __forceinline__ void ldsm_x4_t(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// load_kv starts the copy of keys [k0, k0+BN) of KV head kvh into the stage
// at shared address st; keys outside [klo, khi) and keys whose block id is
// bad (reported) are zero-filled; an int4 cache's keys are read as
// backend.KVSpec says for a sequence of length L (kv_win). Every thread
// of the block calls it. A
// thread's block-table loads are all issued before its copies: the copies'
// memory clobber would otherwise hold each load until the copy before it
// is issued, one load latency per copy.
__device__ __forceinline__ void load_kv(u32 st, const kv_t* kc, const kv_t* vc, const void* ksc, const void* vsc,
                                        const int* bt, int max_blocks, int num_blocks, int KV, int kvh, int k0, int klo,
                                        int khi, int* err, const kv_win& kw, int L) {
  constexpr int NL = (BN * CPR + NT - 1) / NT;
  int blk[NL];
#pragma unroll
  for (int i = 0; i < NL; i++) {
    int c = threadIdx.x + i * NT;
    int p = k0 + c / CPR;
    int bi = kv_index(p, BS);
    bool live = ((BN * CPR) % NT == 0 || c < BN * CPR) && p >= klo && p < khi;
    blk[i] = live && bi < max_blocks ? bt[bi] : -2;  // -2: no key of the sequence (or no unit)
  }
#if KV_KIVI
  int wb[NL];  // the keys' window blocks, also looked up before any copy
#pragma unroll
  for (int i = 0; i < NL; i++) wb[i] = blk[i] >= 0 && blk[i] < num_blocks ? kivi_window(kw, blk[i], err) : -1;
#endif
#pragma unroll
  for (int i = 0; i < NL; i++) {
    int c = threadIdx.x + i * NT;
    if ((BN * CPR) % NT != 0 && c >= BN * CPR) break;
    int r = c / CPR, col = (c - r * CPR) * 8;
    int p = k0 + r;
    const kv_t* ks = kc;
    const kv_t* vs = vc;
    bool ok = false;
    i64 off = 0;
    if (p >= klo && p < khi) {
      int bi = kv_index(p, BS);
      if (blk[i] >= 0 && blk[i] < num_blocks) {
        off = kv_at_pos(blk[i], KV, kvh, BS, p, bi, HD) + col;
        ks = kc + off;
        vs = vc + off;
        ok = true;
      } else {
        report(err, ERR_BLOCK_ID);
      }
    }
    u32 d = st + (u32)(r * ROWB + col * 2);
#if KV_KIVI
    // 8 values each of K and V: from the window block as they are, or
    // int4 codes (4 bytes) decoded with the block's channel scales (K) or
    // the row's group scale (V: a group holds at least 8 channels) to a
    // 16-byte bf16 chunk; zeros where no key.
    bool win = false;
    uint4 kd = make_uint4(0, 0, 0, 0), vd = kd;
    if (ok) {
      const int bi = kv_index(p, BS);
      const int w = wb[i];
      win = kivi_first_bf16(w, p, bi, L, kw.window, BS, 1) == 0;
      if (win) {
        const i64 wo = kv_at_pos(w, KV, kvh, BS, p, bi, HD) + col;
        cp_async16(d, kw.k + wo, true);
        cp_async16(d + BN * ROWB, kw.v + wo, true);
      } else {
        const u32 kq = *(const u32*)(kc + off / 2), vq = *(const u32*)(vc + off / 2);
        const u16* kp = (const u16*)ksc + ((i64)blk[i] * KV + kvh) * 2 * HD + col;
        const uint4 sa = *(const uint4*)kp, za = *(const uint4*)(kp + HD);
        const u32 sw[4] = {sa.x, sa.y, sa.z, sa.w}, zw[4] = {za.x, za.y, za.z, za.w};
        const u32 vp = ((const u32*)vsc)[(off - col) / HD * (HD / KV_G) + col / KV_G];
        float s[8], z[8], vs8[8], vz8[8];
#pragma unroll
        for (int e = 0; e < 8; e++) {
          s[e] = f16_to_f32((u16)(sw[e / 2] >> (16 * (e & 1))));
          z[e] = f16_to_f32((u16)(zw[e / 2] >> (16 * (e & 1))));
          vs8[e] = f16_to_f32((u16)vp);
          vz8[e] = f16_to_f32((u16)(vp >> 16));
        }
        kd = kivi_dequant8_bf16(kq, s, z);
        vd = kivi_dequant8_bf16(vq, vs8, vz8);
      }
    }
    if (!win) {
      asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(d), "r"(kd.x), "r"(kd.y), "r"(kd.z), "r"(kd.w) : "memory");
      asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(d + BN * ROWB), "r"(vd.x), "r"(vd.y), "r"(vd.z), "r"(vd.w)
                   : "memory");
    }
#elif KV_QUANT
    // 8 stored elements each of K and V (one scale each: a group holds
    // at least 8 channels), to a 16-byte bf16 chunk; zeros where no key.
    uint4 kd = make_uint4(0, 0, 0, 0), vd = kd;
    if (ok) {
#if KV_DT == DT_I8
      const i64 si = (off - col) / HD * KV_NG(HD) + col / KV_G;  // the row's scales, then the chunk's group
      const float s = f16_to_f32(((const u16*)ksc)[si]), t = f16_to_f32(((const u16*)vsc)[si]);
#else
      const float s = ((const float*)ksc)[kvh], t = ((const float*)vsc)[kvh];
#endif
      kd = kv_dequant8(*(const uint2*)ks, s);
      vd = kv_dequant8(*(const uint2*)vs, t);
    }
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(d), "r"(kd.x), "r"(kd.y), "r"(kd.z), "r"(kd.w) : "memory");
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(d + BN * ROWB), "r"(vd.x), "r"(vd.y), "r"(vd.z), "r"(vd.w)
                 : "memory");
#else
    cp_async16(d, ks, ok);
    cp_async16(d + BN * ROWB, vs, ok);
#endif
  }
}

// attn_prefill: for each sequence with two or more query rows, causal
// (optionally sliding-window) attention of every query row over the
// sequence's context, earlier cached tokens included.
//   out  [T, H*HD] bf16; q [T, H*HD] bf16
//   kc, vc [num_blocks, KV, BS, HD] (kv.cuh); ksc, vsc their scales or null
//   block_tables [S, max_blocks]; seq_lens [S]; qstart [S+1]
// grid (H, S, Z), block NT, dynamic shared memory per the layout above.
// Block (x, y, z) takes units x + H*z, x + H*(z + Z), ... of sequence y,
// unit u being head u % H and row tile u / H counted from the sequence's
// end, so any grid covers every tile (the host sizes Z for the longest
// sequence it expects; (1, S, 1) makes one block loop over all).
// Sequences of fewer than two rows are attn_decode's, which also reports
// bad metadata.
extern "C" __global__ void __launch_bounds__(NT, MINB) attn_prefill(
    u16* out, const u16* q, const kv_t* kc, const kv_t* vc, const void* ksc, const void* vsc, const int* block_tables,
    int max_blocks, const int* seq_lens, const int* qstart, int H, int KV, float scale_log2, int window, int num_blocks,
    int num_tokens, int max_seq_len, int* err KV_WIN_PARAMS) {
  grid_dep_sync();
  const kv_win kw = KV_WIN_ARGS;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int s = blockIdx.y;
  const int q0 = qstart[s], qlen = qstart[s + 1] - q0;
  const int L = seq_lens[s];
  if (qlen < 2 || !rows_ok(q0, qlen, L, num_tokens, max_seq_len)) return;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gid = lane >> 2, tq = lane & 3;
  const int first = L - qlen;  // position of query row 0
  const int* bt = block_tables + (i64)s * max_blocks;
  const u32 sbase = smem_u32(smem_raw);
  const u32 qbase = sbase + Q_OFF;
  // Lane offsets (bytes) of the ldmatrix row addresses, per the fragment
  // layouts of mma16816:
  //  Q (A, non-trans): matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7),
  //    (rows 0-7, k 8-15), (rows 8-15, k 8-15) -> a0..a3. Lane l: row l%16,
  //    k (l/16)*8.
  //  K (B of Q.K^T, stored [key][dim], non-trans): (keys 0-7, dims 0-7),
  //    (keys 0-7, dims 8-15), (keys 8-15, dims 0-7), (keys 8-15, dims 8-15)
  //    -> b0, b1 of key tile n, b0, b1 of key tile n+8. Lane l: key
  //    (l/16)*8 + l%8, dim ((l/8)%2)*8.
  //  V (B of P.V, stored [key][dim], trans): (keys 0-7, dims 0-7),
  //    (keys 8-15, dims 0-7), (keys 0-7, dims 8-15), (keys 8-15, dims 8-15)
  //    -> b0, b1 of dim tile n, b0, b1 of dim tile n+8. Lane l: key l%16,
  //    dim (l/16)*8.
  const u32 q_lane = (u32)((warp * 16 + (lane & 15)) * ROWB + (lane >> 4) * 16);
  const u32 k_lane = (u32)(((lane >> 4) * 8 + (lane & 7)) * ROWB + ((lane >> 3) & 1) * 16);
  const u32 v_lane = (u32)(BN * ROWB + (lane & 15) * ROWB + (lane >> 4) * 16);

  const i64 units = (i64)((qlen + BM - 1) / BM) * H;
  for (i64 unit = (i64)blockIdx.z * gridDim.x + blockIdx.x; unit < units; unit += (i64)gridDim.x * gridDim.z) {
    const int h = (int)(unit % H);
    const int zt = (int)(unit / H);
    const int kvh = h / (H / KV);
    // This block: rows [r_lo, r_hi), r_lo < 0 for the first (ragged) tile,
    // whose rows below 0 do not exist (zero Q, never stored).
    const int r_hi = qlen - zt * BM, r_lo = r_hi - BM;
    const int kend = first + r_hi;  // keys < kend: the last row's position + 1
    const int kstart = window > 0 ? max(0, first + max(r_lo, 0) - window + 1) : 0;
    const int ntiles = (kend - kstart + BN - 1) / BN;  // key tile j: [kend - (j+1)*BN, kend - j*BN)

    // This warp's rows [w0, w0+16) at positions [wp_lo, wp_lo+15]; this
    // lane's rows ra (C elements 0, 1) and rb = ra + 8 (elements 2, 3).
    const int w0 = r_lo + warp * 16;
    const bool warp_live = w0 + 15 >= 0;
    const int wp_lo = first + w0, wp_hi = wp_lo + 15;
    const int wlo_lo = window > 0 ? max(0, wp_lo - window + 1) : 0;  // lowest key any row of the warp sees
    const int wlo_hi = window > 0 ? max(0, wp_hi - window + 1) : 0;  // lowest key all rows of the warp see
    const int ra = w0 + gid, rb = ra + 8;
    rows2 rw = rows_at(first + ra, first + rb, window);

    __syncthreads();  // the previous unit's warps are done with shared memory
    const u16* qsrc = q + (i64)h * HD;
#pragma unroll
    for (int ci = 0; ci < (BM * CPR + NT - 1) / NT; ci++) {
      int c = threadIdx.x + ci * NT;
      if ((BM * CPR) % NT != 0 && c >= BM * CPR) break;
      int r = c / CPR, col = (c - r * CPR) * 8;
      int i = r_lo + r;
      bool ok = i >= 0;
      cp_async16(qbase + (u32)(r * ROWB + col * 2), ok ? qsrc + (i64)(q0 + i) * H * HD + col : q, ok);
    }
    load_kv(sbase, kc, vc, ksc, vsc, bt, max_blocks, num_blocks, KV, kvh, kend - BN, kstart, kend, err, kw, L);
    cp_async_commit();

#if QR
    u32 qa[HD / 16][4];
#endif
    float o[HD / 2];  // O of rows ra and rb, as prefill_rows.cuh lays it out
#pragma unroll
    for (int n = 0; n < HD / 2; n++) o[n] = 0.f;

    for (int j = 0; j < ntiles; j++) {
      cp_async_wait_all();
      __syncthreads();  // tile j is visible, and every warp is done with tile j-1's stage
      if (j == 0) {
#if QR
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) ldsm_x4(qbase + q_lane + kk * 32, qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3]);
#endif
#if Q_ALIASED
        __syncthreads();  // stage 1 held Q until every warp had it in registers
#endif
      }
      if (j + 1 < ntiles) {
        load_kv(sbase + (u32)(((j + 1) & 1) * STAGE * 2), kc, vc, ksc, vsc, bt, max_blocks, num_blocks, KV, kvh,
                kend - (j + 2) * BN, kstart, kend, err, kw, L);
        cp_async_commit();
      }
      const int k0 = kend - (j + 1) * BN;
      // Keys [k0, k0+BN) against this warp's rows: none visible -> skip
      // (scores would all be -inf: nothing changes); some hidden -> mask.
      if (!warp_live || k0 > wp_hi || k0 + BN - 1 < wlo_lo) continue;
      const bool masked = k0 + BN - 1 > wp_lo || k0 < wlo_hi;
      const u32 st = sbase + (u32)((j & 1) * STAGE * 2);

      // S = Q K^T: sc[4jn + e] is key k0 + 8jn + 2tq + (e&1) of row ra
      // (e < 2) or rb.
      float sc[BN / 2];
#pragma unroll
      for (int i = 0; i < BN / 2; i++) sc[i] = 0.f;
#pragma unroll
      for (int kk = 0; kk < HD / 16; kk++) {
        u32 a0, a1, a2, a3;
#if QR
        a0 = qa[kk][0];
        a1 = qa[kk][1];
        a2 = qa[kk][2];
        a3 = qa[kk][3];
#else
        ldsm_x4(qbase + q_lane + kk * 32, a0, a1, a2, a3);
#endif
#pragma unroll
        for (int jp = 0; jp < BN / 16; jp++) {
          u32 b0, b1, b2, b3;
          ldsm_x4(st + k_lane + jp * 16 * ROWB + kk * 32, b0, b1, b2, b3);
          mma16816(sc + 8 * jp, a0, a1, a2, a3, b0, b1);
          mma16816(sc + 8 * jp + 4, a0, a1, a2, a3, b2, b3);
        }
      }

      float ala, alb;
      softmax_tile(sc, rw, k0, masked, tq, scale_log2, ala, alb);
      scale_o(o, ala, alb);

      // O += P V, keys [16kc, 16kc+16) a step.
#pragma unroll
      for (int kc2 = 0; kc2 < BN / 16; kc2++) {
        u32 a[4];  // P of the keys, the A operand
        p_frag(a, sc, kc2);
#pragma unroll
        for (int dp = 0; dp < HD / 16; dp++) {
          u32 b0, b1, b2, b3;
          ldsm_x4_t(st + v_lane + kc2 * 16 * ROWB + dp * 32, b0, b1, b2, b3);
          mma16816(o + 8 * dp, a[0], a[1], a[2], a[3], b0, b1);
          mma16816(o + 8 * dp + 4, a[0], a[1], a[2], a[3], b2, b3);
        }
      }
    }

    store_rows(out, o, rw, q0, ra, rb, h, H, tq);
  }
}
