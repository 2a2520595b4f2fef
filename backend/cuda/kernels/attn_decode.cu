// attn_decode.cu: paged decode attention (one query row per sequence) on
// the tensor cores, over BF16, FP8, INT8 or INT4 (KIVI) KV caches in
// kv.cuh's format. Specialised with -DHD=<head dim> -DBS=<cache block
// size> -DKV_DT=<cache dtype> -DKV_G=<int8 or int4 V channel group>
// -DST=<cp.async pipeline stages per warp>.
//
// A quantized cache's tiles travel through the ring as stored (bytes and
// their scales, half the bytes of BF16, int4 about a third) and each warp
// dequantizes a landed tile into its own staging tiles, which the mma
// code below reads as it reads a BF16 slot. FP8's per-head scales are not
// applied there: K's multiplies the score scale, V's the output.
//
// An int4 tile's rows that are read in bf16 (the sequence's window and
// its last, partial block: kv.cuh's kivi_first_bf16) do not travel
// through the ring: issue asks L2 for their window rows, and the warp
// loads them from there when it dequantizes the tile (a window of W
// tokens is W/16 tiles of a sequence's thousands, at its end).
//
// Why tensor cores for a memory-bound op: the CUDA-core kernel
// (attention.cu's attn_decode) spends about one instruction per KV byte
// on shuffles, bf16 unpacking and f32 FMAs, and at small batches that,
// not HBM, bounds it. Here a block owns one (sequence, KV head, split) and
// up to 16 query heads of the GQA group as the 16 rows of the mma A
// operand (rows past the group are zero padding); S = Q.K^T and O += P.V
// are mma.sync m16n8k16 (bf16 in, f32 accumulate) fed by ldmatrix, so a
// 16-token tile costs ~250 warp instructions for 8 KB of K/V at HD 128.
// What is left is keeping HBM busy: each warp streams its own tiles
// through an ST-deep cp.async ring (no block barrier in the main loop),
// so ST-1 tiles per warp are always in flight.
//
// Scores are kept in the log2 domain: scale_log2 is scale * log2(e), so
// exp becomes one ex2. Splits write (o, m, l) partials that
// attn_decode_combine merges; the split count depends only on the batch
// shape, so a captured graph stays valid as contexts grow.
#include "mma.cuh"
#define KV_BF16_OR_QUANT  // the mma operands are bf16 tiles: the cache rows, or dequantized ones
#include "kv.cuh"

#if (KV_QUANT || KV_KIVI) && BS % 16 != 0
#error "quantized caches need blocks of a multiple of 16 tokens here"
#endif

// The tensor-core operands: bf16 for a BF16 cache, whose rows are the
// operands. A quantized cache's tiles are dequantized to f16 instead,
// which integer tricks make cheaper than bf16 (kv_dequant16_f16) and which
// is the more precise of the two; Q and P are converted to f16 for them,
// which assumes |Q| < 65504 (attention activations are far smaller).
#define KV_STAGED (KV_QUANT || KV_KIVI)  // tiles dequantized into staging tiles
#if KV_STAGED
#define MMA mma16816_f16
#define PACK_P pack_f16x2
#else
#define MMA mma16816
#define PACK_P pack_bf16x2
#endif

#define NW 4                    // warps per block
#define TT 16                   // tokens per tile: the k of one P.V mma
#define KSTR (HD + 8)           // smem row stride in elements (see below)
#define TILE (TT * KSTR)        // elements of one K (or V) tile in smem
#define MAX_SPLITS 32           // most splits attn_decode_combine merges

// WREG is the bytes of one warp's region of shared memory. BF16: ST slots
// of a K and a V tile [TT][KSTR]. Quantized: the staging K and V tiles
// (bf16, as a BF16 slot) then ST slots of QSLOT bytes: the tile's K and V
// rows as stored [TT][HD] and, for INT8, their scales [TT][HD/KV_G] f16.
// INT4: the K and V codes [TT][HD/2] bytes each, the tile's block's K
// scales and zero points [2][HD] f16, the rows' V ones [TT][HD/KV_G][2].
#if KV_KIVI
#define KIVI_CB (TT * HD / 2)           // bytes of one tile's K (or V) codes
#define KIVI_KSCB (4 * HD)              // bytes of the block's K scales and zero points
#define KIVI_VSCB (TT * (HD / KV_G) * 4)  // bytes of the tile's V scales and zero points
#define QSLOT (2 * KIVI_CB + KIVI_KSCB + KIVI_VSCB)
#define WREG (2 * TILE * 2 + ST * QSLOT)
#elif KV_QUANT
#if KV_DT == DT_I8
#define KV_SCB (TT * (HD / KV_G) * 2)  // bytes of one tile's K (or V) scales
#else
#define KV_SCB 0
#endif
#define QSLOT (2 * TT * HD + 2 * KV_SCB)
#define WREG (2 * TILE * 2 + ST * QSLOT)
#else
#define WREG (ST * 2 * TILE * 2)
#endif

// Blocks per SM the register allocation must allow; the host's
// decodeMMAPerSM assumes the same (shared memory limits it to about this).
#if HD <= 64
#define MIN_BLOCKS 3
#elif HD <= 128
#define MIN_BLOCKS 2
#else
#define MIN_BLOCKS 1
#endif

// Shared memory (dynamic, (HD+8)*32 + NW*WREG bytes):
//   qs    [16][KSTR] bf16        the group's query rows, zero past G
//   ring  [NW][WREG]             per warp, ST slots of a K tile then a V tile
//                                (quantized: staging tiles, then the slots)
// A row is HD+8 elements, (HD+8)*2 bytes: consecutive rows start 16 bytes
// apart modulo 128, so the 8 row addresses of each ldmatrix phase hit
// distinct bank quads (no conflicts) for every HD that is a multiple of 8.
// After the main loop a warp's first slot holds its f32 output [16][HD]
// (64*HD bytes <= one slot's 64*(HD+8)) for the cross-warp merge.

// ld_cg loads 16 bytes through L2 only (never a line L1 may hold from
// before the predecessor kernel wrote it).
__device__ __forceinline__ uint4 ld_cg(const kv_t* p) {
  uint4 v;
  asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

#if KV_KIVI
// ld_cg16 is ld_cg of 8 bf16 (a window row's chunk).
__device__ __forceinline__ uint4 ld_cg16(const u16* p) {
  uint4 v;
  asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// KIVI_NB is how many of its chunks a lane dequantizes at a time: their
// window loads are issued together (rows read in bf16 cost one L2 round
// trip a group), in registers the f32 accumulators of HD 256 leave.
#if HD <= 128
#define KIVI_NB 8
#else
#define KIVI_NB 4
#endif
#endif

// Waits until at most N of this thread's committed groups are pending.
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ldmatrix x4: lanes 8i..8i+7 give the row addresses of 8x8 matrix i;
// register i of lane l receives matrix i's row l/4, columns 2*(l%4) and
// 2*(l%4)+1 (low half = lower column). With .trans, it receives column
// l/4, rows 2*(l%4) and 2*(l%4)+1 (low half = lower row).
__device__ __forceinline__ void ldsm_x4(u32& r0, u32& r1, u32& r2, u32& r3, u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr)
               : "memory");
}

__device__ __forceinline__ void ldsm_x4_trans(u32& r0, u32& r1, u32& r2, u32& r3, u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr)
               : "memory");
}

// merge_parts folds N partial softmax results of one output element,
// each an unnormalised sum ov[j] with its row's running max mv[j] (log2
// domain; NEG_INF: the part saw no key) and sum of exponentials lv[j],
// into one: it returns the merged unnormalised sum and sets M and lsum to
// the merged max and sum. Parts are taken in index order, so every merge
// of the same parts (the block's cross-warp merge, the combine kernel)
// gives the same float.
template <int N>
__device__ __forceinline__ float merge_parts(const float (&ov)[N], const float (&mv)[N], const float (&lv)[N],
                                             float& M, float& lsum) {
  M = NEG_INF;
#pragma unroll
  for (int j = 0; j < N; j++) M = fmaxf(M, mv[j]);
  float acc = 0.f;
  lsum = 0.f;
#pragma unroll
  for (int j = 0; j < N; j++) {
    if (mv[j] != NEG_INF) {
      const float f = fast_exp2(mv[j] - M);
      lsum += lv[j] * f;
      acc += ov[j] * f;
    }
  }
  return acc;
}

// warp_merge is merge_parts over the block's NW warps for output element
// (query row g, dim d): each warp left its row maxima and sums in sm_m,
// sm_l and its f32 output [16][HD] at the start of its region (warp w's
// at obase + w*WREG/4 floats).
__device__ __forceinline__ float warp_merge(const float* obase, const float (&sm_m)[NW][16], const float (&sm_l)[NW][16],
                                            int g, int d, float& M, float& lsum) {
  float ov[NW], mv[NW], lv[NW];
#pragma unroll
  for (int w = 0; w < NW; w++) {
    mv[w] = sm_m[w][g];
    lv[w] = sm_l[w][g];
    ov[w] = obase[w * (WREG / 4) + g * HD + d];
  }
  return merge_parts<NW>(ov, mv, lv, M, lsum);
}

// tile_rows looks up the cache block of the 16-token tile that starts at
// sequence position p0, which lies inside one block (BS a multiple of
// TT), and returns the mask of its rows in [lo, L). A block id outside
// the cache is reported and read as block 0 with no valid row.
__device__ __forceinline__ u32 tile_rows(int p0, int lo, int L, const int* bt, int max_blocks, int num_blocks,
                                         int* err, int& bi, int& blk) {
  bi = kv_index(p0, BS);
  const int rlo = max(0, lo - p0), rhi = min(TT, L - p0);  // 0 <= rlo < rhi <= 16
  u32 mask = ((1u << rhi) - 1u) & ~((1u << rlo) - 1u);
  blk = bi < max_blocks ? bt[bi] : -1;
  if (blk < 0 || blk >= num_blocks) {
    report(err, ERR_BLOCK_ID);
    mask = 0;
    blk = 0;
  }
  return mask;
}

// attn_decode_mma: for each sequence with exactly one query row,
// attention of up to 16 query heads of a GQA group over the split's share
// of the context.
//   out   [T, H*HD] bf16 (written when nsplit == 1)
//   part  [S, H, nsplit, HD+2] f32: unnormalised o, then max m, then sum l
//   q     [T, H*HD] bf16
//   kc, vc [num_blocks, KV, BS, HD] (kv.cuh); ksc, vsc their scales or null
//   block_tables [S, max_blocks]; seq_lens [S]; qstart [S+1]
// grid (S, KV * ceil(G/16), nsplit), block NW*32, dynamic shared memory as
// above. The context [lo, L) is cut into 16-token tiles aligned to
// multiples of 16 (masked at both ends); split z takes a contiguous run
// of them and warp w every NW-th tile of the run. Bad metadata raises
// ERR_QUERY_LEN, reported once per sequence, as does a sequence of
// several rows when decode_only (no prefill kernel follows); a block id
// outside the cache raises ERR_BLOCK_ID and its tokens are left out.
__device__ __forceinline__ void attn_decode_body(
    u16* out, float* part, const u16* q, const kv_t* kc, const kv_t* vc, const void* ksc, const void* vsc,
    const int* block_tables, int max_blocks, const int* seq_lens, const int* qstart, int H, int KV, int G, int nsplit,
    float scale_log2, int window, int num_blocks, int num_tokens, int max_seq_len, int decode_only, int step_keys,
    int* err, const kv_win& kw) {
#if __CUDA_ARCH__ >= 800
  extern __shared__ __align__(16) u16 dsm[];
  __shared__ float sm_m[NW][16], sm_l[NW][16];
  __shared__ u32 sm_mask[NW][ST];  // valid-token bits of the tile in each slot
#if KV_KIVI
  __shared__ u32 sm_wsel[NW][ST];  // of those, the rows read in bf16 from the window block
  __shared__ int sm_wblk[NW][ST];  // the tile's window block (when sm_wsel is not 0)
#endif
  const int s = blockIdx.x;
  const int chunks = (G + 15) / 16;
  const int kvh = blockIdx.y / chunks;
  const int g0 = (blockIdx.y - kvh * chunks) * 16;  // first query head of the group handled here
  const int rows = min(16, G - g0);                 // valid A rows
  const int split = blockIdx.z;
  const int q0 = qstart[s], qlen = qstart[s + 1] - q0;
  const int L = seq_lens[s];
  if (!rows_ok(q0, qlen, L, num_tokens, max_seq_len)) {
    if (threadIdx.x == 0 && blockIdx.y == 0 && split == 0) report(err, ERR_QUERY_LEN);
    return;
  }
  if (qlen != 1) {
    // A decode-only launch has no prefill kernel behind it to fill these rows.
    if (decode_only && qlen > 1 && threadIdx.x == 0 && blockIdx.y == 0 && split == 0) report(err, ERR_QUERY_LEN);
    return;
  }
  // Keys [lo, L): the query sits at position L-1 and sees window keys.
  const int lo = window > 0 ? max(0, L - window) : 0;
  const int tlo = lo / TT, thi = (L + TT - 1) / TT;
  const int per = (thi - tlo + nsplit - 1) / nsplit;
  const int tb = tlo + split * per, te = min(thi, tb + per);  // this block's tiles [tb, te), maybe empty

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gid = lane >> 2, tq = lane & 3;
  u16* qs = dsm;
  unsigned char* wreg = (unsigned char*)(dsm + TT * KSTR) + warp * WREG;
#if KV_STAGED
  u16* stg = (u16*)wreg;                     // [2][TT][KSTR] f16: the landed tile, dequantized
  unsigned char* qring = wreg + 2 * TILE * 2;  // [ST][QSLOT]
#else
  u16* ring = (u16*)wreg;
#endif
  const int* bt = block_tables + (i64)s * max_blocks;
  const kv_head kh = kv_head_of(KV, kvh, BS, HD);  // this KV head's tile of each cache block
  const int nj = te - tb > warp ? (te - tb - warp + NW - 1) / NW : 0;  // tiles of this warp

  // K/V rows are read once a step: they are marked evict_first in L2, so
  // they do not push out lines that are read again (the weights the norms
  // prefetch for the products after them).
  const u64 policy = evict_first_policy();
  auto kv_copy = [&](u32 dst, const kv_t* src, bool ok) { cp_async16_hint(dst, src, ok, policy); };

  // issue starts the copy of tile t (positions 16t..16t+15) into slot sl
  // and records which of its rows are valid keys. Each lane copies the
  // 16-byte chunks c = lane + 32i of the K and V tiles (row c/(HD/8),
  // chunk c%(HD/8) of the row; a slot's rows are the cache rows, so the
  // element column is the same in both). Rows outside [lo, L) or in a
  // bad block are zero-filled and masked, never read. Row skip (-1: none)
  // is valid but not copied: the caller fills it.
  auto issue = [&](int t, int sl, int skip) {
#if KV_KIVI
    // The tile's codes as stored (K's, then V's, each [TT][HD/2] bytes
    // and contiguous in the pool), its block's K scales and its rows' V
    // scales, when any valid row is read in int4; rows read in bf16 are
    // only asked of L2 (their window rows), the dequantization loads them.
    // skip is unused: the tiles of the sequence's last block are issued
    // whole, after the wait (below).
    unsigned char* ks = qring + sl * QSLOT;
    const int p0 = t * TT;
    int bi, blk;
    const u32 mask = tile_rows(p0, lo, L, bt, max_blocks, num_blocks, err, bi, blk);
    const int rhi = min(TT, L - p0);
    const int w = mask != 0 ? kivi_window(kw, blk, err) : -1;
    const u32 wsel = mask & ~((1u << kivi_first_bf16(w, p0, bi, L, kw.window, BS, TT)) - 1u);
    const bool ok = (mask & ~wsel) != 0;
    const i64 base = kv_tile(kh, blk) + kv_row(kv_offset(p0, bi, BS), HD);  // the tile's first value
    for (int c = lane; c < KIVI_CB / 16; c += 32) {
      kv_copy(smem_u32(ks + c * 16), kc + base / 2 + c * 16, ok);
      kv_copy(smem_u32(ks + KIVI_CB + c * 16), vc + base / 2 + c * 16, ok);
    }
    const unsigned char* ksrc = (const unsigned char*)ksc + ((i64)blk * KV + kvh) * KIVI_KSCB;
    for (int c = lane; c < KIVI_KSCB / 16; c += 32)
      cp_async16_hint(smem_u32(ks + 2 * KIVI_CB + c * 16), ksrc + c * 16, ok, policy);
    const unsigned char* vsrc = (const unsigned char*)vsc + (base / HD) * (HD / KV_G) * 4;
    for (int c = lane; c < KIVI_VSCB / 16; c += 32)
      cp_async16_hint(smem_u32(ks + 2 * KIVI_CB + KIVI_KSCB + c * 16), vsrc + c * 16, ok, policy);
    if (wsel != 0) {
      // The 128-byte lines of window rows [r0, rhi) of K and V.
      const int r0 = __ffs(wsel) - 1;
      const i64 wt = (kv_tile(kh, w) + kv_row(kv_offset(p0, bi, BS), HD)) * 2;  // bytes: the window tile
      const int l0 = r0 * HD * 2 / 128, l1 = (rhi * HD * 2 - 1) / 128;
      for (int c = lane; c < 2 * (l1 - l0 + 1); c += 32)
        prefetch_l2((const char*)(c & 1 ? kw.v : kw.k) + wt + (i64)(l0 + (c >> 1)) * 128);
    }
    if (lane == 0) {
      sm_mask[warp][sl] = mask;
      sm_wsel[warp][sl] = wsel;
      sm_wblk[warp][sl] = w;
    }
#elif KV_QUANT
    // Chunks c = lane + 32i of the K and V rows as stored (row c/(HD/16))
    // and, for INT8, of the rows' scales, which for the 16 tokens of the
    // tile are contiguous. A skipped row's scale chunks are left to the
    // caller too.
    unsigned char* ks = qring + sl * QSLOT;
    unsigned char* vs = ks + TT * HD;
    const int p0 = t * TT;
    int bi, blk;
    const u32 mask = tile_rows(p0, lo, L, bt, max_blocks, num_blocks, err, bi, blk);
    const i64 base = kv_tile(kh, blk) + kv_row(kv_offset(p0, bi, BS), HD);
    for (int c = lane; c < TT * HD / 16; c += 32) {
      const int r = c / (HD / 16), col = (c % (HD / 16)) * 16;
      if (r == skip) continue;
      const bool ok = (mask >> r) & 1u;
      kv_copy(smem_u32(ks + r * HD + col), kc + base + kv_row(r, HD) + col, ok);
      kv_copy(smem_u32(vs + r * HD + col), vc + base + kv_row(r, HD) + col, ok);
    }
#if KV_DT == DT_I8
    {
      unsigned char* kss = vs + TT * HD;
      const i64 sbase = (base / HD) * KV_NG(HD) * 2;  // bytes: the tile's first row of scales
      for (int c = lane; c < 2 * KV_SCB / 16; c += 32) {
        const bool isv = c >= KV_SCB / 16;
        const int cc = isv ? c - KV_SCB / 16 : c;
        const int r0 = cc * 16 / (KV_NG(HD) * 2), r1 = (cc * 16 + 15) / (KV_NG(HD) * 2);
        if (skip >= r0 && skip <= r1) continue;
        const unsigned char* src = (const unsigned char*)(isv ? vsc : ksc) + sbase + cc * 16;
        cp_async16_hint(smem_u32(kss + (isv ? KV_SCB : 0) + cc * 16), src, mask != 0, policy);
      }
    }
#endif
    if (lane == 0) sm_mask[warp][sl] = mask;
#else
    u16* ks = ring + sl * 2 * TILE;
    u16* vs = ks + TILE;
    const int p0 = t * TT;
#if BS % TT == 0
    // The tile lies inside one cache block: one lookup, contiguous rows.
    int bi, blk;
    const u32 mask = tile_rows(p0, lo, L, bt, max_blocks, num_blocks, err, bi, blk);
    const i64 base = kv_tile(kh, blk) + kv_row(kv_offset(p0, bi, BS), HD);
#pragma unroll
    for (int i = 0; i < HD / 16; i++) {
      const int c = lane + 32 * i;
      const int r = c / kv_row_chunks(HD), col = kv_chunk(c % kv_row_chunks(HD));
      const bool ok = (mask >> r) & 1u;
      const i64 off = base + kv_row(r, HD) + col;
      if (r == skip) continue;
      kv_copy(smem_u32(ks + r * KSTR + col), kc + off, ok);
      kv_copy(smem_u32(vs + r * KSTR + col), vc + off, ok);
    }
#else
    // Rows may lie in different cache blocks: lane r (and r+16) looks up
    // row r, the warp shares the ids by shuffle.
    const int p = p0 + (lane & 15);
    int myblk = 0;
    bool myok = false;
    if (p >= lo && p < L) {
      const int bi = kv_index(p, BS);
      const int b = bi < max_blocks ? bt[bi] : -1;
      if (b < 0 || b >= num_blocks) {
        report(err, ERR_BLOCK_ID);
      } else {
        myok = true;
        myblk = b;
      }
    }
    const u32 mask = __ballot_sync(0xffffffffu, myok) & 0xffffu;
#pragma unroll
    for (int i = 0; i < HD / 16; i++) {
      const int c = lane + 32 * i;
      const int r = c / kv_row_chunks(HD), col = kv_chunk(c % kv_row_chunks(HD));
      const int b = __shfl_sync(0xffffffffu, myblk, r);
      const bool ok = (mask >> r) & 1u;
      const int pr = p0 + r;
      const i64 off = kv_tile(kh, b) + kv_row(kv_offset(pr, BS), HD) + col;
      if (r == skip) continue;
      kv_copy(smem_u32(ks + r * KSTR + col), kc + off, ok);
      kv_copy(smem_u32(vs + r * KSTR + col), vc + off, ok);
    }
#endif
    if (lane == 0) sm_mask[warp][sl] = mask;
#endif  // KV_QUANT
  };

  // Prologue: the first ST-1 tiles in flight before anything else waits.
  // Every step commits a group, empty or not, so wait_group counts align.
  // It runs before grid_dep_wait: under programmatic dependent launch the
  // kernel before this one (the QKV projection writing this step's K and
  // V) may still be running. Everything read so far is the step's
  // metadata, written before the step's first kernel, and every cached
  // key but the newest, at position L-1, was written by earlier steps. Its
  // row is left out here (skip: no copy, not even a zero fill, lands in
  // its slot) and copied after the wait.
  //
  //
  // With step_keys > 1 the step wrote the sequence's last step_keys
  // positions (a verify step run as decode rows: each row's context ends
  // with the rows of its verify sequence before it). The tiles holding
  // any of them are issued after the wait, whole, in their own commit
  // group, which is waited for at once: the later waits then hold more
  // groups done than they need.
  //
  // INT4: this step also wrote the last block's V codes and scales of
  // row L-1 and, when the row filled the block, the block's K codes and
  // scales (kivi_seal_k). The tiles of the blocks holding the step's
  // positions are issued after the wait in the same way.
  const int fresh_lo = L - max(1, step_keys);  // first position this step wrote
  u32 late = 0;  // prologue slots issued after the wait, whole
#if KV_KIVI
  const int fresh_block = kv_index(fresh_lo, BS);
#pragma unroll
  for (int j = 0; j < ST - 1; j++) {
    if (j < nj) {
      const int t = tb + warp + j * NW;
      if (kv_index(t * TT, BS) >= fresh_block) late |= 1u << j;
      else issue(t, j, -1);
    }
    cp_async_commit();
  }
  grid_dep_wait();  // Q and the step's blocks come from the kernels before this one
  if (late != 0) {
#pragma unroll
    for (int j = 0; j < ST - 1; j++)
      if ((late >> j) & 1u) issue(tb + warp + j * NW, j, -1);
    cp_async_commit();
    cp_async_wait<0>();
  }
#else
  // One position (a plain decode row): its tile goes early but for that
  // row, which is copied after the wait.
  const int last_tile = (L - 1) / TT;
  const int fresh_tile = fresh_lo / TT;
  int late_slot = -1;  // prologue slot holding the tile of position L-1, when only it is the step's
#pragma unroll
  for (int j = 0; j < ST - 1; j++) {
    if (j < nj) {
      const int t = tb + warp + j * NW;
      if (fresh_lo < L - 1 && t >= fresh_tile) {
        late |= 1u << j;
      } else {
        if (t == last_tile) late_slot = j;
        issue(t, j, t == last_tile ? (L - 1) - t * TT : -1);
      }
    }
    cp_async_commit();
  }
  grid_dep_wait();  // Q and the step's K/V rows come from the kernels before this one
  if (late != 0) {
#pragma unroll
    for (int j = 0; j < ST - 1; j++)
      if ((late >> j) & 1u) issue(tb + warp + j * NW, j, -1);
    cp_async_commit();
    cp_async_wait<0>();
  }
  if (late_slot >= 0) {
    // Row (L-1) % TT of the slot: 16-byte chunks of its K then V row.
    const int p = L - 1, bi = kv_index(p, BS);
    const int b = bi < max_blocks ? bt[bi] : -1;
    if (b >= 0 && b < num_blocks) {  // else issue masked the row and reported it
      const i64 off = kv_tile(kh, b) + kv_row(kv_offset(p, BS), HD);
#if KV_QUANT
      const int r = p - last_tile * TT;
      unsigned char* ks = qring + late_slot * QSLOT;
      for (int c = lane; c < 2 * (HD / 16); c += 32) {
        const bool isv = c >= HD / 16;
        const int col = (isv ? c - HD / 16 : c) * 16;
        *(uint4*)(ks + (isv ? TT * HD : 0) + r * HD + col) = ld_cg((isv ? vc : kc) + off + col);
      }
#if KV_DT == DT_I8
      // The scale chunks issue skipped: those holding row r's scales.
      const int c0 = r * KV_NG(HD) * 2 / 16, c1 = (r * KV_NG(HD) * 2 + KV_NG(HD) * 2 - 1) / 16;
      const i64 sbase = ((off - kv_row(r, HD)) / HD) * KV_NG(HD) * 2;  // bytes: the tile's first row of scales
      for (int c = lane; c < 2 * (c1 - c0 + 1); c += 32) {
        const bool isv = c > c1 - c0;
        const int cc = c0 + (isv ? c - (c1 - c0 + 1) : c);
        *(uint4*)(ks + 2 * TT * HD + (isv ? KV_SCB : 0) + cc * 16) =
            ld_cg((const kv_t*)((const unsigned char*)(isv ? vsc : ksc) + sbase + cc * 16));
      }
#endif
#else
      u16* ks = ring + late_slot * 2 * TILE + (p - last_tile * TT) * KSTR;
      for (int c = lane; c < 2 * kv_row_chunks(HD); c += 32) {
        const int col = kv_chunk(c % kv_row_chunks(HD));
        *(uint4*)(ks + (c < kv_row_chunks(HD) ? 0 : TILE) + col) = ld_cg((c < kv_row_chunks(HD) ? kc : vc) + off + col);
      }
#endif
    }
  }
#endif  // KV_KIVI

  // The query rows, loaded while the tiles are in flight: [16][HD], rows
  // past the group zero (their scores are 0, their outputs never stored).
  for (int c = threadIdx.x; c < 16 * (HD / 8); c += NW * 32) {
    const int r = c / (HD / 8), col = (c % (HD / 8)) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < rows) v = *(const uint4*)(q + ((i64)q0 * H + (i64)kvh * G + g0 + r) * HD + col);
#if KV_STAGED
    v = bf16x8_to_f16x8(v);
#endif
    *(uint4*)(qs + r * KSTR + col) = v;
  }
  __syncthreads();

  // Per-lane ldmatrix row addresses (bytes), see ldsm_x4 and mma16816:
  //  Q (A operand, x4): matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7),
  //    (rows 0-7, k 8-15), (rows 8-15, k 8-15) = a0..a3.
  //  K (B of S = Q.K^T, x4): matrices (tokens 0-7, dims 0-7),
  //    (tokens 0-7, dims 8-15), (tokens 8-15, dims 0-7), (tokens 8-15,
  //    dims 8-15) = b0, b1 of n-tile 0 (tokens 0-7), b0, b1 of n-tile 1.
  //  V (B of O += P.V, x4.trans): matrices (tokens 0-7, dims 0-7),
  //    (tokens 8-15, dims 0-7), (tokens 0-7, dims 8-15), (tokens 8-15,
  //    dims 8-15) = b0, b1 of dim tile 0, b0, b1 of dim tile 1.
  // Each step along k (Q, K) or along the dims (V) adds 16 elements.
  const int r8 = lane & 7, lb3 = (lane >> 3) & 1, lb4 = lane >> 4;
  const u32 qaddr = smem_u32(qs + (lb3 * 8 + r8) * KSTR + lb4 * 8);
  const u32 koff = ((lb4 * 8 + r8) * KSTR + lb3 * 8) * 2;
  const u32 voff = ((lb3 * 8 + r8) * KSTR + lb4 * 8) * 2;
#if KV_STAGED
  const u32 stg_addr = smem_u32(stg);
#if KV_DT == DT_F8E4M3
  // The per-head scales: K's folds into the score scale, V's into the
  // output (read after grid_dep_wait: a scan may have set them this step).
  scale_log2 *= ((const float*)ksc)[kvh];
  const float vmul = ((const float*)vsc)[kvh];
#endif
#else
  const u32 ring_addr = smem_u32(ring);
#endif

  // Output rows gid (o[n][0..1]) and gid+8 (o[n][2..3]), dims 8n+2tq, +1.
  float o[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  // Running max (log2 domain, the same in the lane's quad) and this lane's
  // share of the sum, for rows gid and gid+8.
  float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.f, l1 = 0.f;

  for (int j = 0; j < nj; j++) {
    {
      const int jn = j + ST - 1;
      // Slot jn % ST was last read in step j-1, which ended in __syncwarp.
      if (jn < nj) issue(tb + warp + jn * NW, jn % ST, -1);
      cp_async_commit();
    }
    cp_async_wait<ST - 1>();  // this lane's copies of tile j have landed
    __syncwarp();             // and every other lane's
    const int sl = j % ST;
    const u32 mask = sm_mask[warp][sl];
#if KV_KIVI
    {
      // Dequantize the slot into the staging tiles, chunk c of 16
      // elements (K's, then V's) a step, KIVI_NB chunks of a lane at a
      // time: rows read in bf16 are loaded from the window block first
      // (L2 holds them since issue) and converted, int4 rows decoded with
      // their block's per-channel K or their own per-group V scales, rows
      // that are not keys become zeros.
      const unsigned char* ks = qring + sl * QSLOT;
      const u32 wsel = sm_wsel[warp][sl];
      const int p0 = (tb + warp + j * NW) * TT;
      const i64 wt = wsel != 0 ? kv_tile(kh, sm_wblk[warp][sl]) + kv_row(kv_offset(p0, BS), HD) : 0;
      constexpr int NCH = (2 * TT * HD / 16 + 31) / 32;  // chunks of a lane
#pragma unroll
      for (int i0 = 0; i0 < NCH; i0 += KIVI_NB) {
        uint4 wv[KIVI_NB][2];  // read only where the row's wsel bit is set, which loads it
        if (wsel != 0) {        // the same for the whole warp; most tiles have no bf16 row
#pragma unroll
          for (int i = 0; i < KIVI_NB; i++) {
            const int c = lane + 32 * (i0 + i);
            if (i0 + i >= NCH || ((2 * TT * HD / 16) % 32 != 0 && c >= 2 * TT * HD / 16)) continue;
            const bool isv = c >= TT * HD / 16;
            const int cc = isv ? c - TT * HD / 16 : c;
            const int r = cc / (HD / 16), col = (cc % (HD / 16)) * 16;
            if ((wsel >> r) & 1u) {
              const u16* src = (isv ? kw.v : kw.k) + wt + kv_row(r, HD) + col;
              wv[i][0] = ld_cg16(src);
              wv[i][1] = ld_cg16(src + 8);
            }
          }
        }
#pragma unroll
        for (int i = 0; i < KIVI_NB; i++) {
          const int c = lane + 32 * (i0 + i);
          if (i0 + i >= NCH || ((2 * TT * HD / 16) % 32 != 0 && c >= 2 * TT * HD / 16)) continue;
          const bool isv = c >= TT * HD / 16;
          const int cc = isv ? c - TT * HD / 16 : c;
          const int r = cc / (HD / 16), col = (cc % (HD / 16)) * 16;
          uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
          if ((wsel >> r) & 1u) {
            lo = bf16x8_to_f16x8(wv[i][0]);
            hi = bf16x8_to_f16x8(wv[i][1]);
          } else if ((mask >> r) & 1u) {
            const uint2 qv = *(const uint2*)(ks + (isv ? KIVI_CB : 0) + r * (HD / 2) + col / 2);
            u32 s2[8], z2[8];
            if (!isv) {
              // The channels' scales and zero points: f16 pairs.
              const uint4* sp = (const uint4*)(ks + 2 * KIVI_CB + col * 2);
              const uint4 sa = sp[0], sb = sp[1], za = sp[HD / 8], zb = sp[HD / 8 + 1];
              s2[0] = sa.x, s2[1] = sa.y, s2[2] = sa.z, s2[3] = sa.w, s2[4] = sb.x, s2[5] = sb.y, s2[6] = sb.z, s2[7] = sb.w;
              z2[0] = za.x, z2[1] = za.y, z2[2] = za.z, z2[3] = za.w, z2[4] = zb.x, z2[5] = zb.y, z2[6] = zb.z, z2[7] = zb.w;
            } else {
              // The row's (scale, zero point) of the chunk's group, or of
              // its two groups of 8.
              const u32* vp = (const u32*)(ks + 2 * KIVI_CB + KIVI_KSCB) + r * (HD / KV_G) + col / KV_G;
              const u32 pa = vp[0], pb = KV_G < 16 ? vp[1] : pa;
#pragma unroll
              for (int e = 0; e < 8; e++) {
                const u32 pe = e < 4 ? pa : pb;
                s2[e] = __byte_perm(pe, 0, 0x1010);
                z2[e] = __byte_perm(pe, 0, 0x3232);
              }
            }
            kivi_dequant16_f16(qv, s2, z2, lo, hi);
          }
          u16* dst = stg + (isv ? TILE : 0) + r * KSTR + col;
          *(uint4*)dst = lo;
          *(uint4*)(dst + 8) = hi;
        }
      }
      __syncwarp();
    }
    const u32 kaddr = stg_addr + koff;
    const u32 vaddr = stg_addr + TILE * 2 + voff;
#elif KV_QUANT
    {
      // Dequantize the slot into the staging tiles: chunk c of 16 stored
      // elements (K's, then V's) to two 16-byte f16 chunks; rows that
      // are not keys become zeros (their scales may be anything).
      const unsigned char* ks = qring + sl * QSLOT;
#pragma unroll
      for (int i = 0; i < (2 * TT * HD / 16 + 31) / 32; i++) {
        const int c = lane + 32 * i;
        if ((2 * TT * HD / 16) % 32 != 0 && c >= 2 * TT * HD / 16) break;
        const bool isv = c >= TT * HD / 16;
        const int cc = isv ? c - TT * HD / 16 : c;
        const int r = cc / (HD / 16), col = (cc % (HD / 16)) * 16;
        uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
        if ((mask >> r) & 1u) {
          const uint4 qv = *(const uint4*)(ks + (isv ? TT * HD : 0) + r * HD + col);
          u32 s2a = 0, s2b = 0;
#if KV_DT == DT_I8
          const u16* sc = (const u16*)(ks + 2 * TT * HD + (isv ? KV_SCB : 0)) + r * KV_NG(HD);
          s2a = sc[col / KV_G] * 0x10001u;
          s2b = sc[(col + 8) / KV_G] * 0x10001u;
#endif
          kv_dequant16_f16(qv, s2a, s2b, lo, hi);
        }
        u16* dst = stg + (isv ? TILE : 0) + r * KSTR + col;
        *(uint4*)dst = lo;
        *(uint4*)(dst + 8) = hi;
      }
      __syncwarp();
    }
    const u32 kaddr = stg_addr + koff;
    const u32 vaddr = stg_addr + TILE * 2 + voff;
#else
    const u32 kaddr = ring_addr + sl * (2 * TILE * 2) + koff;
    const u32 vaddr = ring_addr + sl * (2 * TILE * 2) + TILE * 2 + voff;
#endif

    // S = Q.K^T: sc[j2] is the C fragment of tokens 8*j2..8*j2+7.
    float sc[2][4];
#pragma unroll
    for (int j2 = 0; j2 < 2; j2++) sc[j2][0] = sc[j2][1] = sc[j2][2] = sc[j2][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
      u32 a0, a1, a2, a3, b0, b1, b2, b3;
      ldsm_x4(a0, a1, a2, a3, qaddr + kk * 32);
      ldsm_x4(b0, b1, b2, b3, kaddr + kk * 32);
      MMA(sc[0], a0, a1, a2, a3, b0, b1);
      MMA(sc[1], a0, a1, a2, a3, b2, b3);
    }

    // Online softmax over the tile. Element e of sc[j2] is row gid (e<2)
    // or gid+8, token 8*j2 + 2tq + (e&1).
    float mx0 = NEG_INF, mx1 = NEG_INF;
#pragma unroll
    for (int j2 = 0; j2 < 2; j2++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int tok = j2 * 8 + tq * 2 + (e & 1);
        const float v = ((mask >> tok) & 1u) ? sc[j2][e] * scale_log2 : NEG_INF;
        sc[j2][e] = v;
        if (e < 2) mx0 = fmaxf(mx0, v);
        else mx1 = fmaxf(mx1, v);
      }
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    // While a row has seen no valid key its max is -inf: subtract 0 then
    // (exp2(-inf) = 0 for the masked scores and the empty history).
    const float ref0 = mn0 == NEG_INF ? 0.f : mn0, ref1 = mn1 == NEG_INF ? 0.f : mn1;
    const float al0 = fast_exp2(m0 - ref0), al1 = fast_exp2(m1 - ref1);
    m0 = mn0;
    m1 = mn1;
    float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
    for (int j2 = 0; j2 < 2; j2++) {
      sc[j2][0] = fast_exp2(sc[j2][0] - ref0);
      sc[j2][1] = fast_exp2(sc[j2][1] - ref0);
      sc[j2][2] = fast_exp2(sc[j2][2] - ref1);
      sc[j2][3] = fast_exp2(sc[j2][3] - ref1);
      rs0 += sc[j2][0] + sc[j2][1];
      rs1 += sc[j2][2] + sc[j2][3];
    }
    l0 = l0 * al0 + rs0;
    l1 = l1 * al1 + rs1;
#if KV_KIVI
    // Past the first tiles a row's maximum rarely moves: the warp skips
    // the rescale (by 1) when no row's did. An int4 tile's dequantization
    // leaves fewer instructions than other formats to hide these in.
    if (__any_sync(0xffffffffu, al0 != 1.f || al1 != 1.f)) {
#endif
#pragma unroll
      for (int n = 0; n < HD / 8; n++) {
        o[n][0] *= al0;
        o[n][1] *= al0;
        o[n][2] *= al1;
        o[n][3] *= al1;
      }
#if KV_KIVI
    }
#endif
    // P as the A operand (k = the 16 tokens): the C layout of S is
    // already A's layout, packed to bf16 (quantized caches: f16) pairs.
    const u32 pa0 = PACK_P(sc[0][0], sc[0][1]);
    const u32 pa1 = PACK_P(sc[0][2], sc[0][3]);
    const u32 pa2 = PACK_P(sc[1][0], sc[1][1]);
    const u32 pa3 = PACK_P(sc[1][2], sc[1][3]);
#pragma unroll
    for (int nb = 0; nb < HD / 16; nb++) {
      u32 b0, b1, b2, b3;
      ldsm_x4_trans(b0, b1, b2, b3, vaddr + nb * 32);
      MMA(o[2 * nb], pa0, pa1, pa2, pa3, b0, b1);
      MMA(o[2 * nb + 1], pa0, pa1, pa2, pa3, b2, b3);
    }
    __syncwarp();  // every lane is done with slot sl before it is refilled
  }
  cp_async_wait<0>();  // only empty groups can remain; the ring is reused below
  __syncwarp();
  grid_dep_launch();  // the K/V stream is done: the next kernel may launch during the merge

  // Cross-warp merge: each warp leaves (m, l) per row and its o [16][HD]
  // f32 in its first ring slot.
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  float* wo = (float*)wreg;
  if (tq == 0) {
    sm_m[warp][gid] = m0;
    sm_l[warp][gid] = l0;
    sm_m[warp][gid + 8] = m1;
    sm_l[warp][gid + 8] = l1;
  }
#pragma unroll
  for (int n = 0; n < HD / 8; n++) {
    const int col = n * 8 + tq * 2;
    *(float2*)(wo + gid * HD + col) = make_float2(o[n][0], o[n][1]);
    *(float2*)(wo + (gid + 8) * HD + col) = make_float2(o[n][2], o[n][3]);
  }
  __syncthreads();
  const float* obase = (const float*)(dsm + TT * KSTR);  // warp w's output at obase + w*WREG/4 floats
  for (int idx = threadIdx.x; idx < rows * HD; idx += NW * 32) {
    const int g = idx / HD, d = idx - g * HD;
    float M, lsum;
    float acc = warp_merge(obase, sm_m, sm_l, g, d, M, lsum);
#if KV_DT == DT_F8E4M3
    acc *= vmul;
#endif
    const int h = kvh * G + g0 + g;
    if (nsplit == 1) {
      out[((i64)q0 * H + h) * HD + d] = f32_to_bf16(lsum > 0.f ? acc / lsum : 0.f);
    } else {
      float* pp = part + (((i64)s * H + h) * nsplit + split) * (HD + 2);
      pp[d] = acc;
      if (d == 0) {
        pp[HD] = M;
        pp[HD + 1] = lsum;
      }
    }
  }
#endif
}

extern "C" __global__ void __launch_bounds__(NW * 32, MIN_BLOCKS) attn_decode_mma(
    u16* out, float* part, const u16* q, const kv_t* kc, const kv_t* vc, const void* ksc, const void* vsc,
    const int* block_tables, int max_blocks, const int* seq_lens, const int* qstart, int H, int KV, int G, int nsplit,
    float scale_log2, int window, int num_blocks, int num_tokens, int max_seq_len, int decode_only, int step_keys,
    int* err KV_WIN_PARAMS) {
  const kv_win kw = KV_WIN_ARGS;
  attn_decode_body(out, part, q, kc, vc, ksc, vsc, block_tables, max_blocks, seq_lens, qstart, H, KV, G, nsplit, scale_log2,
                   window, num_blocks, num_tokens, max_seq_len, decode_only, step_keys, err, kw);
}

// attn_decode_combine merges the nsplit (<= MAX_SPLITS) partials of each
// decode row. The partials' addresses do not depend on the metadata, so
// their loads are issued together with those of qstart and seq_lens: the
// kernel is one memory latency long. (A row that is not a decode row reads
// partials nobody wrote and discards them.)
// grid (S, H), block HD.
extern "C" __global__ void attn_decode_combine(u16* out, const float* part, const int* seq_lens, const int* qstart, int H,
                                               int nsplit, int num_tokens, int max_seq_len) {
  grid_dep_launch_wait();  // the O product after it streams its weight meanwhile
  const int s = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
  if (d >= HD) return;
  const float* pp = part + ((i64)s * H + h) * nsplit * (HD + 2);
  float ov[MAX_SPLITS], mv[MAX_SPLITS], lv[MAX_SPLITS];
#pragma unroll
  for (int j = 0; j < MAX_SPLITS; j++) {
    const bool in = j < nsplit;
    ov[j] = in ? pp[j * (HD + 2) + d] : 0.f;
    mv[j] = in ? pp[j * (HD + 2) + HD] : NEG_INF;  // the same address across the block: one broadcast load
    lv[j] = in ? pp[j * (HD + 2) + HD + 1] : 0.f;
  }
  const int q0 = qstart[s], qlen = qstart[s + 1] - q0;
  if (qlen != 1 || !rows_ok(q0, qlen, seq_lens[s], num_tokens, max_seq_len)) return;
  float M, lsum;
  const float o = merge_parts<MAX_SPLITS>(ov, mv, lv, M, lsum);
  out[((i64)q0 * H + h) * HD + d] = f32_to_bf16(lsum > 0.f ? o / lsum : 0.f);
}
