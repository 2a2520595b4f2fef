// attn_decode.cu: paged decode attention (one query row per sequence) on
// the tensor cores, over BF16, FP8, INT8 or INT4 (KIVI) KV caches in
// kv.cuh's format. Specialised with -DHD=<head dim> -DBS=<cache block
// size> -DKV_DT=<cache dtype> -DKV_G=<int8 or int4 V channel group>
// -DST=<cp.async pipeline stages per warp>.
//
// A quantized cache's tiles travel through the ring as stored (bytes and
// their scales, half the bytes of BF16, int4 about a third). An FP8 or
// INT8 tile is dequantized by each warp into its own staging tiles, which
// the mma code below reads as it reads a BF16 slot. FP8's per-head scales
// are not applied there: K's multiplies the score scale, V's the output.
//
// An int4 (KIVI) tile is not staged: each lane decodes the codes of its
// own mma B fragments straight from the slot into registers (the layout
// is chosen so that a lane's elements of a token are contiguous bytes of
// the stored row; see "int4 operand layout" below). Its rows that are
// read in bf16 (the sequence's window and its last, partial block: kv.cuh's
// kivi_first_bf16) do not travel through the ring: issue asks L2 for
// their window rows, and each lane loads its fragments' elements of them
// from there (a window of W tokens is W/16 tiles of a sequence's
// thousands, at its end).
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
// which integer tricks make cheaper than bf16 (kv_dequant16_f16,
// kivi_pair_f16) and which is the more precise of the two; Q and P are
// converted to f16 for them, which assumes |Q| < 65504 (attention
// activations are far smaller).
#define KV_STAGED KV_QUANT  // tiles dequantized into staging tiles
#if KV_QUANT || KV_KIVI
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
// of a K and a V tile [TT][KSTR]. FP8, INT8: the staging K and V tiles
// (f16, as a BF16 slot) then ST slots of QSLOT bytes: the tile's K and V
// rows as stored [TT][HD] and, for INT8, their scales [TT][HD/KV_G] f16.
// INT4: ST slots of the K and V codes [TT][HD/2] bytes each (16-byte
// chunks moved within their row: kivi_kx, kivi_vx), the tile's block's K
// scales and zero points [2][HD] f16 (chunks moved: kivi_sx), the rows' V
// ones [TT][HD/KV_G][2] f16; no staging tiles, but at least the f32
// output [16][HD] the merge leaves there.
#if KV_KIVI
#define KIVI_CB (TT * HD / 2)           // bytes of one tile's K (or V) codes
#define KIVI_KSCB (4 * HD)              // bytes of the block's K scales and zero points
#define KIVI_VSCB (TT * (HD / KV_G) * 4)  // bytes of the tile's V scales and zero points
#define QSLOT (2 * KIVI_CB + KIVI_KSCB + KIVI_VSCB)
#define WREG (ST * QSLOT > 64 * HD ? ST * QSLOT : 64 * HD)
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
// INT4 keeps no staging tiles, so its blocks are small enough for one
// more an SM (its registers: the f32 accumulators, a tile's fragments).
#if KV_KIVI && HD <= 64
#define MIN_BLOCKS 4
#elif KV_KIVI && HD <= 128
#define MIN_BLOCKS 3
#elif HD <= 64
#define MIN_BLOCKS 3
#elif HD <= 128
#define MIN_BLOCKS 2
#else
#define MIN_BLOCKS 1
#endif

// Shared memory (dynamic, (HD+8)*32 + NW*WREG bytes):
//   qs    [16][KSTR] bf16        the group's query rows, zero past G
//   ring  [NW][WREG]             per warp, ST slots of a K tile then a V tile
//                                (FP8, INT8: staging tiles, then the slots)
// A row is HD+8 elements, (HD+8)*2 bytes: consecutive rows start 16 bytes
// apart modulo 128, so the 8 row addresses of each ldmatrix phase hit
// distinct bank quads (no conflicts) for every HD that is a multiple of 8.
// After the main loop a warp's first slot holds its f32 output [16][HD]
// (64*HD bytes <= one slot's 64*(HD+8); INT4: WREG is at least that) for
// the cross-warp merge.

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

// int4 operand layout. S = Q.K^T and O += P.V are sums over their k, so
// any order of the k elements gives the same products as long as both
// operands take it; the order is chosen so that a lane's elements of a
// token are contiguous bytes of the stored row (fragments as mma16816:
// lane (gid, tq), gid = lane/4, tq = lane%4):
//  - S's k (channels). In step kk the B fragment of lane (gid, tq) holds
//    k = 2tq, 2tq+1 (b0) and 2tq+8, 2tq+9 (b1): they are channels
//    tq*HD/4 + 4kk + 0, 1 (b0) and + 2, 3 (b1). A lane's channels are the
//    HD/4 from tq*HD/4 on: HD/8 bytes of a K row, as byte p holds channels
//    2p, 2p+1 (kivi_pair_f16's pair), and HD/2 bytes of each K scale row.
//    Q is stored in the same order: qs column 16kk + s holds channel
//    kivi_qch(kk, s).
//  - S's n (tokens), and so P.V's k. Position n of the tile's 16 is token
//    kivi_tok(n) (2 and 3, 6 and 7, 10 and 11, 14 and 15 swapped), so the
//    two tokens of a quarter warp's K reads (n = gid, gid even and odd)
//    lie in different halves of the 32 banks at HD 128, as do two of the
//    four tokens of a half warp's V reads (n = 2tq or 2tq+1).
//  - P.V's n (dims). Column c of n-tile nd is dim c*HD/8 + nd, so a lane's
//    dims of a token are the HD/8 from gid*HD/8 on: HD/16 bytes of a V row.
//    A C fragment's column nd*8 + c (where the merge finds it) holds dim
//    c*HD/8 + nd.
// The slot's 16-byte chunks are moved within their row so that the
// lanes of one shared-memory read hit distinct banks (at HD 128 and 256;
// an XOR of the byte offset with a multiple of 16 below the row's bytes,
// which cp.async applies to its destination; HD is a power of two).
__device__ __forceinline__ int kivi_tok(int n) { return n ^ ((n >> 1) & 1); }

// kivi_qch is the channel that Q column 16kk + s holds.
__device__ __forceinline__ int kivi_qch(int kk, int s) {
  const int t = (s & 7) >> 1, e = (s & 1) + (s >> 3) * 2;
  return t * (HD / 4) + 4 * kk + e;
}

// kivi_kx and kivi_vx are the XORs of K and V code row r: HD 256 has the
// two chunks a lane reads of a K row in different bank groups for even
// and odd rows; V rows at HD 128 (256) have the half (quarter) of a row
// that lanes gid 0-3 (0-1) read in a different bank group for each of the
// four rows of one read.
__device__ __forceinline__ int kivi_kx(int r) { return HD == 256 ? (r & 1) << 4 : 0; }
__device__ __forceinline__ int kivi_vx(int r) {
  return HD == 128 ? ((r >> 2) & 1) << 5 : HD == 256 ? (((r >> 2) & 1) << 6 | (r & 1) << 5) : 0;
}

// kivi_sx is the XOR of lane quad position tq's HD/2 bytes of a K scale
// (or zero point) row: the four positions' i-th chunks then lie in
// distinct bank groups.
__device__ __forceinline__ int kivi_sx(int tq) { return HD == 128 ? (tq >> 1) << 4 : HD == 256 ? tq << 5 : 0; }

// kivi_lds reads NB bytes (1, 2, 4, 8 or a multiple of 16) of a slot at
// logical offset b0 (a multiple of min(NB, 16)), whose 16-byte pieces lie
// at (b0 + 16i) ^ x, into w: byte j of the run is byte j%4 of w[j/4].
template <int NB>
__device__ __forceinline__ void kivi_lds(const unsigned char* base, int b0, int x, u32 (&w)[NB < 4 ? 1 : NB / 4]) {
  if constexpr (NB >= 16) {
#pragma unroll
    for (int i = 0; i < NB / 16; i++) {
      const uint4 v = *(const uint4*)(base + ((b0 + 16 * i) ^ x));
      w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
    }
  } else if constexpr (NB == 8) {
    const uint2 v = *(const uint2*)(base + (b0 ^ x));
    w[0] = v.x, w[1] = v.y;
  } else if constexpr (NB == 4) {
    w[0] = *(const u32*)(base + (b0 ^ x));
  } else if constexpr (NB == 2) {
    w[0] = *(const u16*)(base + (b0 ^ x));
  } else {
    w[0] = base[b0 ^ x];
  }
}

// kivi_ldg loads NB bytes (4, 8 or a multiple of 16) of window rows
// through L2 (as ld_cg16), as kivi_lds lays them out.
template <int NB>
__device__ __forceinline__ void kivi_ldg(const u16* p, u32 (&w)[NB / 4]) {
  if constexpr (NB >= 16) {
#pragma unroll
    for (int i = 0; i < NB / 16; i++) {
      const uint4 v = ld_cg16(p + 8 * i);
      w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
    }
  } else if constexpr (NB == 8) {
    asm volatile("ld.global.cg.v2.u32 {%0,%1}, [%2];" : "=r"(w[0]), "=r"(w[1]) : "l"(p));
  } else {
    asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(w[0]) : "l"(p));
  }
}

// kivi_f16x2 packs the f16 of two bf16, the low half from a's, the high
// from b's (round to nearest, as bf16x8_to_f16x8).
__device__ __forceinline__ u32 kivi_f16x2(u32 a, u32 b) {
  u32 o;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(o) : "f"(__uint_as_float(b)), "f"(__uint_as_float(a)));
  return o;
}

// kivi_opaque is c, computed so that the compiler cannot fold it into an
// immediate operand (blockDim.x is NW*32 in every launch): K's decode
// then keeps kivi_pair_f16's exponent bytes in one register, and each
// selector is an immediate instead of a register reloaded for every pair.
__device__ __forceinline__ u32 kivi_opaque(u32 c) { return c ^ (blockDim.x ^ (NW * 32)); }

// kivi_vpair decodes the two codes t holds under an f16 exponent (halves
// 0x64XX & 0x000F: 1024 + code, or 0x54XX & 0x00F0: 64 + code; bias is
// that exponent's f16x2 pair) with the f16x2 scales s2 and zero points z2
// of the halves' tokens, as kivi_pair_f16 does.
__device__ __forceinline__ u32 kivi_vpair(u32 t, u32 bias, u32 s2, u32 z2) {
  u32 h;
  asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(h) : "r"(t), "r"(bias));
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(h) : "r"(h), "r"(s2), "r"(z2));
  return h;
}
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
#elif KV_KIVI
  unsigned char* qring = wreg;  // [ST][QSLOT]
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
#if KV_KIVI
  // The block ids and window blocks of the warp's tiles, looked up 32
  // tiles at a time: lane l holds those of the warp's tile mb + l (its
  // jj-th tile is tb + warp + jj*NW), block id -1 where tile_rows found it
  // bad. issue takes them by shuffle, so a tile's copies do not wait on
  // two dependent loads of their own (the block table, then the window
  // map): an int4 tile is a third of a BF16 one, and that latency would
  // be spent three times as often. issue is called for tiles in order of
  // jj but for the prologue's late ones (a lookup for an earlier batch
  // than the one held is looked up again).
  int mblk = -1, mwin = -1, mb = -32;
  auto meta = [&](int jj, int& blk, int& w) {
    if (jj >= mb + 32 || jj < mb) {  // the same for the whole warp
      mb = jj & ~31;
      const int jl = mb + lane;
      mblk = -1;
      mwin = -1;
      if (jl < nj) {
        int bi, b;
        if (tile_rows((tb + warp + jl * NW) * TT, lo, L, bt, max_blocks, num_blocks, err, bi, b) != 0) {
          mblk = b;
          mwin = kivi_window(kw, b, err);
        }
      }
    }
    blk = __shfl_sync(0xffffffffu, mblk, jj & 31);
    w = __shfl_sync(0xffffffffu, mwin, jj & 31);
  };
#endif
  auto issue = [&](int t, int sl, int skip) {
#if KV_KIVI
    // The tile's codes as stored (K's, then V's, each [TT][HD/2] bytes
    // and contiguous in the pool), its block's K scales and its rows' V
    // scales, when any valid row is read in int4; rows read in bf16 are
    // only asked of L2 (their window rows), the lanes load them. Chunks
    // land where kivi_kx, kivi_vx and kivi_sx move them. skip is unused:
    // the tiles of the sequence's last block are issued whole, after the
    // wait (below).
    const u32 ks = smem_u32(qring + sl * QSLOT);
    const int p0 = t * TT, bi = kv_index(p0, BS);
    int blk, w;
    meta((u32)(t - tb - warp) / NW, blk, w);
    const int rlo = max(0, lo - p0), rhi = min(TT, L - p0);  // as tile_rows
    const u32 mask = blk < 0 ? 0u : ((1u << rhi) - 1u) & ~((1u << rlo) - 1u);
    blk = max(blk, 0);
    const u32 wsel = mask & ~((1u << kivi_first_bf16(w, p0, bi, L, kw.window, BS, TT)) - 1u);
    const bool ok = (mask & ~wsel) != 0;
    // The tile's first row in the pool's rows of HD values (kv_tile and
    // kv_row over HD): its codes are HD/2 bytes a row, its V scales
    // HD/KV_G (scale, zero point) f16 pairs a row.
    const i64 row = (i64)blk * (KV * BS) + kvh * BS + kv_offset(p0, bi, BS);
    const unsigned char* kq = (const unsigned char*)kc + row * (HD / 2);
    const unsigned char* vq = (const unsigned char*)vc + row * (HD / 2);
#pragma unroll
    for (int i = 0; i < (KIVI_CB / 16 + 31) / 32; i++) {
      const int c = lane + 32 * i;
      if (KIVI_CB / 16 % 32 == 0 || c < KIVI_CB / 16) {
        const int r = c * 16 / (HD / 2);  // the chunk's (first) row
        kv_copy(ks + ((c * 16) ^ kivi_kx(r)), (const kv_t*)(kq + c * 16), ok);
        kv_copy(ks + KIVI_CB + ((c * 16) ^ kivi_vx(r)), (const kv_t*)(vq + c * 16), ok);
      }
    }
    const unsigned char* ksrc = (const unsigned char*)ksc + ((i64)blk * KV + kvh) * KIVI_KSCB;
#pragma unroll
    for (int i = 0; i < (KIVI_KSCB / 16 + 31) / 32; i++) {
      const int c = lane + 32 * i;
      if (KIVI_KSCB / 16 % 32 == 0 || c < KIVI_KSCB / 16) {
        const int q = (c * 16 % (2 * HD)) / (HD / 2);  // the lane quad position whose channels it holds
        cp_async16_hint(ks + 2 * KIVI_CB + ((c * 16) ^ kivi_sx(q)), ksrc + c * 16, ok, policy);
      }
    }
    const unsigned char* vsrc = (const unsigned char*)vsc + row * ((HD / KV_G) * 4);
#pragma unroll
    for (int i = 0; i < (KIVI_VSCB / 16 + 31) / 32; i++) {
      const int c = lane + 32 * i;
      if (KIVI_VSCB / 16 % 32 == 0 || c < KIVI_VSCB / 16)
        cp_async16_hint(ks + 2 * KIVI_CB + KIVI_KSCB + c * 16, vsrc + c * 16, ok, policy);
    }
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
  // issue_late issues them, in their own commit group, and waits for it.
  auto issue_late = [&]() {
    if (late != 0) {
#pragma unroll
      for (int j = 0; j < ST - 1; j++)
        if ((late >> j) & 1u) issue(tb + warp + j * NW, j, -1);
      cp_async_commit();
      cp_async_wait<0>();
    }
  };
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
  issue_late();
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
  issue_late();
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
#if KV_KIVI
  // In the int4 operand layout's channel order, as f16: item c is row r's
  // channels t*HD/4 + 4kk + 0..3, columns 16kk + 2t, +1 and 16kk + 8 + 2t, +1.
  for (int c = threadIdx.x; c < 16 * (HD / 4); c += NW * 32) {
    const int r = c / (HD / 4), kk = (c % (HD / 4)) >> 2, t = c & 3;
    uint2 v = make_uint2(0, 0);
    if (r < rows) v = *(const uint2*)(q + ((i64)q0 * H + (i64)kvh * G + g0 + r) * HD + kivi_qch(kk, 2 * t));
    u16* dst = qs + r * KSTR + 16 * kk + 2 * t;
    *(u32*)dst = kivi_f16x2(v.x << 16, v.x & 0xffff0000u);
    *(u32*)(dst + 8) = kivi_f16x2(v.y << 16, v.y & 0xffff0000u);
  }
#else
  for (int c = threadIdx.x; c < 16 * (HD / 8); c += NW * 32) {
    const int r = c / (HD / 8), col = (c % (HD / 8)) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < rows) v = *(const uint4*)(q + ((i64)q0 * H + (i64)kvh * G + g0 + r) * HD + col);
#if KV_STAGED
    v = bf16x8_to_f16x8(v);
#endif
    *(uint4*)(qs + r * KSTR + col) = v;
  }
#endif
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
#elif KV_KIVI
  // The lane's tokens of a tile (int4 operand layout): K's of n-tiles 0
  // and 1 (positions gid, 8 + gid), V's of its k (2tq, 2tq+1, 8 + 2tq,
  // 9 + 2tq); and its first V group (of dims gid*HD/8 on).
  const int kt0 = kivi_tok(gid), kt1 = 8 + kt0;
  const int vt[4] = {kivi_tok(2 * tq), kivi_tok(2 * tq + 1), 8 + kivi_tok(2 * tq), 8 + kivi_tok(2 * tq + 1)};
  constexpr int NGL = HD / 8 > KV_G ? HD / 8 / KV_G : 1;  // V groups of a lane's dims
  // K's fragments are decoded in KPARTS parts of KPP pairs a token (the
  // registers of HD 256's accumulators leave no room for all at once).
  constexpr int KPARTS = HD > 128 ? 2 : 1, KPP = HD / 8 / KPARTS;
  constexpr int VPARTS = KPARTS, NTP = HD / 8 / VPARTS;  // and V's, of NTP n-tiles
  const int vg0 = gid * (HD / 8) / KV_G;
  const u32 kex = kivi_opaque(0x00005464u);
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
    // The tile's K B fragments in registers (int4 operand layout), KPARTS
    // steps of S's HD/16 at a time: kf[i][p] is the f16 pair of channels
    // tq*HD/4 + part*HD/4/KPARTS + 2p, +1 of token kt0 (i 0) or kt1,
    // decoded with the block's channel scales and zero points; rows read
    // in bf16 are then loaded from the window block in their place (L2
    // holds them since issue). Rows that are not keys decode to anything,
    // finite or not: their scores are masked below.
    const unsigned char* ks = qring + sl * QSLOT;
    const u32 wsel = sm_wsel[warp][sl];
    const u32 qm = mask & ~wsel;  // the rows read in int4
    const i64 wt = wsel != 0 ? kv_tile(kh, sm_wblk[warp][sl]) + kv_row(kv_offset((tb + warp + j * NW) * TT, BS), HD) : 0;
    auto kfrags = [&](int part, u32 (&kf)[2][KPP]) {
      u32 kq[2][KPP < 4 ? 1 : KPP / 4], s2[KPP], z2[KPP];  // a pair's codes are a byte, its scales a word
      kivi_lds<KPP>(ks + kt0 * (HD / 2), tq * (HD / 8) + part * KPP, kivi_kx(kt0), kq[0]);
      kivi_lds<KPP>(ks + kt1 * (HD / 2), tq * (HD / 8) + part * KPP, kivi_kx(kt1), kq[1]);
      kivi_lds<4 * KPP>(ks + 2 * KIVI_CB, tq * (HD / 2) + part * 4 * KPP, kivi_sx(tq), s2);
      kivi_lds<4 * KPP>(ks + 2 * KIVI_CB + 2 * HD, tq * (HD / 2) + part * 4 * KPP, kivi_sx(tq), z2);
#pragma unroll
      for (int i = 0; i < 2; i++)
#pragma unroll
        for (int p = 0; p < KPP; p++) kf[i][p] = kivi_pair_f16(kq[i][p / 4], kex, 0x5040u + 0x0101u * (p % 4), s2[p], z2[p]);
      if (wsel != 0) {  // the same for the whole warp; most tiles have no bf16 row
#pragma unroll
        for (int i = 0; i < 2; i++) {
          const int r = i ? kt1 : kt0;
          if ((wsel >> r) & 1u) {
            u32 w[KPP];  // its channels of the part, bf16
            kivi_ldg<4 * KPP>(kw.k + wt + kv_row(r, HD) + tq * (HD / 4) + part * 2 * KPP, w);
#pragma unroll
            for (int p = 0; p < KPP; p++) kf[i][p] = kivi_f16x2(w[p] << 16, w[p] & 0xffff0000u);
          }
        }
      }
    };
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
#if KV_KIVI
#pragma unroll
    for (int part = 0; part < KPARTS; part++) {
      u32 kf[2][KPP];
      kfrags(part, kf);
#pragma unroll
      for (int k2 = 0; k2 < KPP / 2; k2++) {
        const int kk = part * (KPP / 2) + k2;
        u32 a0, a1, a2, a3;
        ldsm_x4(a0, a1, a2, a3, qaddr + kk * 32);
        MMA(sc[0], a0, a1, a2, a3, kf[0][2 * k2], kf[0][2 * k2 + 1]);
        MMA(sc[1], a0, a1, a2, a3, kf[1][2 * k2], kf[1][2 * k2 + 1]);
      }
    }

    // V's B fragments, VPARTS parts of NTP n-tiles: vf[n][h] is the f16
    // pair of dim gid*HD/8 + part*NTP + n of tokens vt[2h] (low half) and
    // vt[2h+1], decoded with the rows' group scales and zero points, taken
    // as zero for rows not read in int4: so those decode to +0 (a row that
    // is not a key has P = 0, but its bytes may be anything, infinities
    // included). Rows read in bf16 are then ORed in from the window block.
    u32 vs2[2][NGL], vz2[2][NGL];
    {
      const u32* vsp = (const u32*)(ks + 2 * KIVI_CB + KIVI_KSCB);  // (scale, zero point) f16 pairs
#pragma unroll
      for (int h = 0; h < 2; h++) {
#pragma unroll
        for (int g = 0; g < NGL; g++) {
          const u32 pa = (qm >> vt[2 * h]) & 1u ? vsp[vt[2 * h] * (HD / KV_G) + vg0 + g] : 0u;
          const u32 pb = (qm >> vt[2 * h + 1]) & 1u ? vsp[vt[2 * h + 1] * (HD / KV_G) + vg0 + g] : 0u;
          vs2[h][g] = __byte_perm(pa, pb, 0x5410);
          vz2[h][g] = __byte_perm(pa, pb, 0x7632);
        }
      }
    }
    // The codes of all parts at once: a lane's HD/16 bytes of each of its
    // four rows (one read of them is free of bank conflicts).
    u32 vq[4][HD / 16 < 4 ? 1 : HD / 64];
#pragma unroll
    for (int i = 0; i < 4; i++) kivi_lds<HD / 16>(ks + KIVI_CB + vt[i] * (HD / 2), gid * (HD / 16), kivi_vx(vt[i]), vq[i]);
    auto vfrags = [&](int part, u32 (&vf)[NTP][2]) {
      // Byte m of a row's HD/16 holds dims 2m, 2m+1 (n-tiles 2m, 2m+1):
      // prmt puts the two tokens' bytes m in the halves, masks leave the
      // low or the high nibble under an exponent (kivi_pair_f16's trick).
#pragma unroll
      for (int m0 = 0; m0 < NTP / 2; m0++) {
        const int m = part * (NTP / 2) + m0;
        const int g = NGL > 1 ? 2 * m / KV_G : 0;
        const u32 sel = (m % 4) * 0x1111u + 0x4400u;
#pragma unroll
        for (int h = 0; h < 2; h++) {
          const u32 t = __byte_perm(vq[2 * h][m / 4], vq[2 * h + 1][m / 4], sel);
          vf[2 * m0][h] = kivi_vpair((t & 0x000F000Fu) | 0x64006400u, 0x64006400u, vs2[h][g], vz2[h][g]);
          vf[2 * m0 + 1][h] = kivi_vpair((t & 0x00F000F0u) | 0x54005400u, 0x54005400u, vs2[h][g], vz2[h][g]);
        }
      }
      if (wsel != 0) {
        u32 w[4][NTP / 2];  // each token's NTP dims, bf16 (zero: not read in bf16)
#pragma unroll
        for (int i = 0; i < 4; i++) {
#pragma unroll
          for (int e = 0; e < NTP / 2; e++) w[i][e] = 0;
          if ((wsel >> vt[i]) & 1u) kivi_ldg<2 * NTP>(kw.v + wt + kv_row(vt[i], HD) + gid * (HD / 8) + part * NTP, w[i]);
        }
#pragma unroll
        for (int m = 0; m < NTP / 2; m++) {
#pragma unroll
          for (int h = 0; h < 2; h++) {
            const u32 a = w[2 * h][m], b = w[2 * h + 1][m];
            vf[2 * m][h] |= kivi_f16x2(a << 16, b << 16);
            vf[2 * m + 1][h] |= kivi_f16x2(a & 0xffff0000u, b & 0xffff0000u);
          }
        }
      }
    };
    u32 vf[NTP][2];
    vfrags(0, vf);  // the first part's loads overlap the softmax
#else
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
      u32 a0, a1, a2, a3, b0, b1, b2, b3;
      ldsm_x4(a0, a1, a2, a3, qaddr + kk * 32);
      ldsm_x4(b0, b1, b2, b3, kaddr + kk * 32);
      MMA(sc[0], a0, a1, a2, a3, b0, b1);
      MMA(sc[1], a0, a1, a2, a3, b2, b3);
    }
#endif

    // Online softmax over the tile. Element e of sc[j2] is row gid (e<2)
    // or gid+8, token 8*j2 + 2tq + (e&1).
    float mx0 = NEG_INF, mx1 = NEG_INF;
#pragma unroll
    for (int j2 = 0; j2 < 2; j2++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
#if KV_KIVI
        const int tok = j2 * 8 + ((tq * 2 + (e & 1)) ^ (tq & 1));  // kivi_tok of the position
#else
        const int tok = j2 * 8 + tq * 2 + (e & 1);
#endif
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
#if KV_KIVI
#pragma unroll
    for (int part = 0; part < VPARTS; part++) {
      if (part > 0) vfrags(part, vf);
#pragma unroll
      for (int n = 0; n < NTP; n++) MMA(o[part * NTP + n], pa0, pa1, pa2, pa3, vf[n][0], vf[n][1]);
    }
#else
#pragma unroll
    for (int nb = 0; nb < HD / 16; nb++) {
      u32 b0, b1, b2, b3;
      ldsm_x4_trans(b0, b1, b2, b3, vaddr + nb * 32);
      MMA(o[2 * nb], pa0, pa1, pa2, pa3, b0, b1);
      MMA(o[2 * nb + 1], pa0, pa1, pa2, pa3, b2, b3);
    }
#endif
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
#if KV_KIVI
    // Column pos of the stored output holds dim d (int4 operand layout).
    const int g = idx / HD, pos = idx - g * HD, d = (pos % 8) * (HD / 8) + pos / 8;
    float M, lsum;
    float acc = warp_merge(obase, sm_m, sm_l, g, pos, M, lsum);
#else
    const int g = idx / HD, d = idx - g * HD;
    float M, lsum;
    float acc = warp_merge(obase, sm_m, sm_l, g, d, M, lsum);
#endif
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
