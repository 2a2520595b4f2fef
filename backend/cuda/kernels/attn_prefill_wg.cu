// attn_prefill_wg.cu: causal prefill attention on Hopper's warpgroup
// matrix multiply (wgmma, sm_90a), over the same paged BF16 KV caches
// (kv.cuh) and with the same arguments, grid and results contract as
// attn_prefill.cu (whose comment describes the unit loop, the row tiles
// counted from each sequence's end and the masks, all kept here).
//
// Specialised with -DHD=<head dim, 64 or 128> -DBS=<cache block size>
// -DKV_DT=<cache dtype, DT_BF16>.
//
// Design:
//   - A block owns 128 query rows (BM) of one head: two warpgroups of 64
//     rows. Keys come in tiles of 128 (BN).
//   - Q, K and V tiles live in shared memory in the 128-byte swizzle layout
//     wgmma reads (wg_desc): each tile is HD/64 column blocks of
//     [rows][64 elements], a row's 16-byte unit u stored at u ^ (row % 8).
//     cp.async writes them (16 bytes a thread at a time, zero-filled
//     outside the block's keys, as attn_prefill's load_kv); after each
//     wait the writers fence the async proxy before the barrier. A
//     thread's block-table loads for a tile are all issued before its
//     copies (tile_rows): interleaved with them, each copy would wait for
//     its own load (the asm's memory clobber orders them), a memory
//     latency per copy.
//   - S = Q.K^T: HD/16 wgmma m64n128k16 per warpgroup, both operands from
//     shared memory (K-major). The 64 f32 scores a thread holds are
//     mma16816's C layout per 8-key tile, so the online softmax is
//     attn_prefill's (four lanes a row, log2 domain).
//   - O += P.V: P rounded to bf16 in registers as the A operand (the C
//     fragments of two 8-key tiles are the A fragment of 16 keys); V from
//     shared memory as an MN-major B (the transpose flag), BN/16 steps of
//     one m64n128k16 at HD 128, one m64n64k16 at HD 64.
//   - Two slots of a K and a V tile: tile j+1's copies are in flight
//     while tile j is computed; one barrier per tile.
//   - Each tile: S_j is issued first, then tile j+1's block-table loads
//     and copies while the tensor cores run it, then the softmax and
//     O += P_j.V_j. The two warpgroups run the same steps; the tensor
//     cores idle during a group's softmax unless the other group's
//     multiplies fill it. Issuing tile j's S before tile j-1's P.V inside
//     a group, to hide the softmax under it (FA3's intra-warpgroup
//     pipelining), needs more registers than a thread has here: it
//     spills.
//     A multiply inside a branch makes ptxas serialise every wgmma
//     (C7520); TestPrefillWGCompile fails on that warning and on spills.
//
// Shared memory (bytes, from a 1024-aligned base; the host's
// prefillWGSmem computes the same total plus 1024 of alignment slack):
//   [0, QB)               Q tile, HD/64 blocks of [BM][128 B]
//   [QB, QB + 2*TB)       K slots 0 and 1, HD/64 blocks of [BN][128 B] each
//   [QB + 2*TB, QB + 4*TB) V slots 0 and 1, alike
#include "mma.cuh"
#include "wgmma.cuh"
#define KV_BF16_ONLY  // the swizzled K/V tiles are the cache rows, bf16 wgmma operands
#include "kv.cuh"

#define BM 128
#define BN 128
#define NT 256
#define HC (HD / 64)          // 128-byte column blocks per row
#define QB (BM * HD * 2)      // bytes of the Q tile
#define TB (BN * HD * 2)      // bytes of one K (or V) tile
#define SMEM_BYTES (QB + 4 * TB)

#include "prefill_rows.cuh"  // needs HD and BN

static_assert(HD == 64 || HD == 128, "the wgmma kernel takes head dims 64 and 128");

// swz is the byte offset of 16-byte unit u (of HD/8) in row r of a
// swizzled tile of `rows` rows.
__device__ __forceinline__ u32 swz(int rows, int r, int u) {
  return (u32)((u >> 3) * rows * 128 + r * 128 + (((u & 7) ^ (r & 7)) << 4));
}

// A thread copies the same 16-byte column unit of NI rows of every tile:
// rows threadIdx.x / (HD/8) + i * RS, unit threadIdx.x % (HD/8).
#define NI (BN * kv_row_chunks(HD) / NT)
#define RS (NT / kv_row_chunks(HD))

// tile_rows finds where this thread's NI keys of the tile [k0, k0+BN)
// live in the caches (element offsets; -1: zero-fill). Every block-table
// load is issued before the first is used, so the copies wait for one
// load latency, not NI; K and V share the offsets. Keys outside [klo,
// khi) are zero-filled, and so are bad block ids (reported).
__device__ __forceinline__ void tile_rows(i64 (&off)[NI], const int* bt, int max_blocks, int num_blocks, int KV, int kvh,
                                          int k0, int klo, int khi, int* err) {
  const int r0 = threadIdx.x / kv_row_chunks(HD), u = threadIdx.x % kv_row_chunks(HD);
  int blk[NI];
#pragma unroll
  for (int i = 0; i < NI; i++) {
    int p = k0 + r0 + i * RS;
    int bi = kv_index(p, BS);
    blk[i] = p >= klo && p < khi && bi < max_blocks ? bt[bi] : -2;  // -2: not a key of the sequence
  }
#pragma unroll
  for (int i = 0; i < NI; i++) {
    int p = k0 + r0 + i * RS;
    off[i] = -1;
    if (blk[i] >= 0 && blk[i] < num_blocks) {
      off[i] = kv_at_pos(blk[i], KV, kvh, BS, p, kv_index(p, BS), HD) + kv_chunk(u);
    } else if (blk[i] != -2 || (p >= klo && p < khi)) {
      report(err, ERR_BLOCK_ID);
    }
  }
}

// load_rows starts the copies of this thread's units of one tile from
// cache c into the tile at shared address st.
__device__ __forceinline__ void load_rows(u32 st, const kv_t* c, const i64 (&off)[NI]) {
  const int r0 = threadIdx.x / kv_row_chunks(HD), u = threadIdx.x % kv_row_chunks(HD);
#pragma unroll
  for (int i = 0; i < NI; i++) cp_async16(st + swz(BN, r0 + i * RS, u), off[i] >= 0 ? c + off[i] : c, off[i] >= 0);
}

__device__ __forceinline__ void async_proxy_fence() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

#if WGMMA_OK  // the multiplies exist on sm_90a only; elsewhere the kernel traps
// issue_s issues S = Q.K^T for this warpgroup's 64 rows (Q at qt, the
// group's first row block; K at kt) into sc, and commits it.
__device__ __forceinline__ void issue_s(float (&sc)[BN / 2], u32 qt, u32 kt) {
#pragma unroll
  for (int kk = 0; kk < HD / 16; kk++) {
    u64 da = wg_desc(qt + (u32)((kk >> 2) * BM * 128 + (kk & 3) * 32), 16, 1024);
    u64 db = wg_desc(kt + (u32)((kk >> 2) * BN * 128 + (kk & 3) * 32), 16, 1024);
    wgmma_ss_n128(sc, da, db, kk);
  }
  wgmma_commit();
}

// issue_pv issues O += P.V (P's A fragments in pa4, V at vt) and commits
// it.
__device__ __forceinline__ void issue_pv(float (&o)[HD / 2], const u32 (&pa4)[BN / 16][4], u32 vt) {
#pragma unroll
  for (int kc2 = 0; kc2 < BN / 16; kc2++) {
#if HD == 128
    wgmma_rs_n128(o, pa4[kc2][0], pa4[kc2][1], pa4[kc2][2], pa4[kc2][3], wg_desc(vt + (u32)(kc2 * 16 * 128), BN * 128, 1024));
#else
#pragma unroll
    for (int cb = 0; cb < HC; cb++)
      wgmma_rs_n64(o + cb * 32, pa4[kc2][0], pa4[kc2][1], pa4[kc2][2], pa4[kc2][3],
                   wg_desc(vt + (u32)(cb * BN * 128 + kc2 * 16 * 128), BN * 128, 1024));
#endif
  }
  wgmma_commit();
}

#endif

// attn_prefill_wg: attn_prefill's contract (see attn_prefill.cu), grid
// (H, S, Z), NT threads, SMEM_BYTES + 1024 of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(NT, 1) attn_prefill_wg(
    u16* out, const u16* q, const kv_t* kc, const kv_t* vc, const void* ksc, const void* vsc, const int* block_tables,
    int max_blocks, const int* seq_lens, const int* qstart, int H, int KV, float scale_log2, int window, int num_blocks,
    int num_tokens, int max_seq_len, int* err) {
  grid_dep_sync();  // ksc, vsc: attn_prefill's arguments, null here (BF16 caches only)
#if !WGMMA_OK
  __trap();  // the host launches this kernel only on sm_90a
#else
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int s = blockIdx.y;
  const int q0 = qstart[s], qlen = qstart[s + 1] - q0;
  const int L = seq_lens[s];
  if (qlen < 2 || !rows_ok(q0, qlen, L, num_tokens, max_seq_len)) return;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wg = warp >> 2;
  const int gid = lane >> 2, tq = lane & 3;
  const int first = L - qlen;  // position of query row 0
  const int* bt = block_tables + (i64)s * max_blocks;
  const u32 qbase = (smem_u32(smem_raw) + 1023u) & ~1023u;
  // K tiles alternate between two slots, V tiles between two more.
  auto kslot = [&](int t) { return qbase + QB + (u32)(t & 1) * TB; };
  auto vslot = [&](int t) { return qbase + QB + 2 * TB + (u32)(t & 1) * TB; };

  const i64 units = (i64)((qlen + BM - 1) / BM) * H;
  for (i64 unit = (i64)blockIdx.z * gridDim.x + blockIdx.x; unit < units; unit += (i64)gridDim.x * gridDim.z) {
    const int h = (int)(unit % H);
    const int zt = (int)(unit / H);
    const int kvh = h / (H / KV);
    const int r_hi = qlen - zt * BM, r_lo = r_hi - BM;
    const int kend = first + r_hi;
    const int kstart = window > 0 ? max(0, first + max(r_lo, 0) - window + 1) : 0;
    const int ntiles = (kend - kstart + BN - 1) / BN;

    // This warpgroup's rows are at positions [gp_lo, gp_lo+63]; this
    // lane's rows are ra (C elements 0, 1) and rb = ra + 8 (2, 3).
    const int gp_lo = first + r_lo + wg * 64, gp_hi = gp_lo + 63;
    const int glo_hi = window > 0 ? max(0, gp_hi - window + 1) : 0;  // lowest key all rows of the group see
    const int ra = r_lo + warp * 16 + gid, rb = ra + 8;

    __syncthreads();  // the previous unit's warps are done with shared memory
    const u16* qsrc = q + (i64)h * HD;
#pragma unroll
    for (int ci = 0; ci < BM * (HD / 8) / NT; ci++) {
      int c = threadIdx.x + ci * NT;
      int r = c / (HD / 8), u = c % (HD / 8);
      int i = r_lo + r;
      bool ok = i >= 0;
      cp_async16(qbase + swz(BM, r, u), ok ? qsrc + (i64)(q0 + i) * H * HD + u * 8 : q, ok);
    }
    i64 off[NI];  // this thread's cache offsets in the tile loaded last
    tile_rows(off, bt, max_blocks, num_blocks, KV, kvh, kend - BN, kstart, kend, err);
    load_rows(kslot(0), kc, off);
    load_rows(vslot(0), vc, off);
    cp_async_commit();

    float o[HD / 2];
#pragma unroll
    for (int n = 0; n < HD / 2; n++) o[n] = 0.f;
    rows2 rw = rows_at(first + ra, first + rb, window);
    float sc[BN / 2];     // S of the tile being computed, then its exponents
    u32 pa4[BN / 16][4];  // P of the tile, the A operand of its P.V
    float ala, alb;
    const u32 qt = qbase + (u32)(wg * 64 * 128);
    // Tile j: keys [k0, k0+BN), k0 = kend - (j+1)*BN. A tile the group's
    // rows cannot see at all (past a window's edge, or rows of a ragged
    // tile's missing part) is computed anyway and masked to nothing: the
    // multiplies stay outside branches, which ptxas would otherwise
    // serialise.
    auto masked = [&](int k0) { return k0 + BN - 1 > gp_lo || k0 < glo_hi; };

    // Tile j (keys [kend - (j+1)*BN, kend - j*BN)): wait for its copies,
    // issue S_j, start tile j+1's copies while the tensor cores run it,
    // then the softmax and O += P_j.V_j. One barrier per tile.
    for (int j = 0; j < ntiles; j++) {
      asm volatile("cp.async.wait_group 0;" ::: "memory");
      async_proxy_fence();  // this thread's copies, visible to the tensor cores' reads
      __syncthreads();      // tile j is visible, and every warp is done with tile j-1's slots
      const int k0 = kend - (j + 1) * BN;
      wgmma_fence();
      issue_s(sc, qt, kslot(j));
      if (j + 1 < ntiles) {
        tile_rows(off, bt, max_blocks, num_blocks, KV, kvh, kend - (j + 2) * BN, kstart, kend, err);
        load_rows(kslot(j + 1), kc, off);
        load_rows(vslot(j + 1), vc, off);
      }
      cp_async_commit();
      wgmma_wait0();
      fence_regs<BN / 2>(sc);
      softmax_tile(sc, rw, k0, masked(k0), tq, scale_log2, ala, alb);
      scale_o(o, ala, alb);
#pragma unroll
      for (int kc2 = 0; kc2 < BN / 16; kc2++) p_frag(pa4[kc2], sc, kc2);
      wgmma_fence();
      issue_pv(o, pa4, vslot(j));
      wgmma_wait0();
      fence_regs<HD / 2>(o);
    }
    store_rows(out, o, rw, q0, ra, rb, h, H, tq);
  }
#endif
}
