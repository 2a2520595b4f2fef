// chain.cu: a run of a decode step's products (at most 8 token rows) as
// one persistent kernel whose weight stream never stops between them.
//
// Why: run as separate kernels, each product of a layer ramps up from an
// idle HBM and drains to one, and the small kernels between them (norms,
// SiLU) keep it idle meanwhile: on the H200 a Llama-3-8B layer at batch 4
// took ~123 us for the ~102 us its weights take at the copy ceiling. The
// products' weights do not depend on the activations, only the arithmetic
// does, so here one producer warp per block streams the block's share of
// every weight of the chain, op after op, into a ring of shared-memory
// tiles (TMA bulk copies completing on mbarriers), while the consumer warps
// wait for each op's input (a grid-wide counter), multiply, and release
// the tiles. The ring holds several microseconds of stream, which covers
// the wait between ops.
//
//   block = 1 producer warp + NCW consumer warps; grid = one block per SM,
//   all resident (a block that waits past a timeout for the others reports
//   ERR_CHAIN instead of hanging).
//
//   op i (i = 0..nops-1), all with the same n token rows:
//     OP_ADD       y[n, m] += x[n, k] . w[m, k]^T    (O and down projections into the residual)
//     OP_NORM_SILU y[n, m] = silu(G) * U, [G | U] = (RMSNorm(x) * g) . w[2m, k]^T
//     OP_NORM_QKV  RMSNorm(x) * g through the fused QKV weight, RoPE, Q into y,
//                  K and V into the paged caches (qkv_rope_bf16's epilogue)
//   Op i+1 starts its arithmetic once every block has finished op i.
//
// Each op is cut into groups of 16 weight rows, the A rows of mma.sync
// m16n8k16 (gemv.cu's layout: W as A, x^T as B; the rows of a group are
// the kernel's choice, e.g. a gate row and its up row 8 apart), and the
// groups into contiguous runs, one per block. A ring tile is one group's
// 16 rows x KC columns; consumer warp w multiplies the tile's 32-wide
// spans w, w+NCW, ... and the warps' partial sums meet in shared memory
// for the group's epilogue. x is staged in shared memory once per op (and
// normalised there for the NORM ops) where it fits, else read from L2 two
// tiles ahead.
//
// Rounding is the unfused ops': a product is rounded to bf16 before the
// residual add, SiLU or RoPE, and the norm is add_rmsnorm's
// bf16((x * rs) * g).
//
// Measured on the H200 (docs/benchmarks.md, fifth session): slower than the
// separate kernels, because the ring, even with nothing multiplied, streams
// no faster than they do; off by default (chain.go).
//
// Specialised with -DKC=<k columns of a ring tile> (a multiple of 32*NC),
// -DNC=<consumer warps> and -DNOMATH=<1: consumers wait for and release
// tiles without multiplying, a diagnostic of the stream alone; its results
// are wrong>.
#include "bulk.cuh"

#define NCW NC                     // consumer warps
#define CHAIN_THREADS ((NCW + 1) * 32)  // and the producer warp
#define RSTR (KC + 32)             // tile row stride (elements): rows 64 bytes apart mod 128
#define TILE_ELEMS (16 * RSTR)     // elements of one ring tile
#define SPW (KC / 32 / NCW)        // spans per consumer warp per tile
#define MAX_OPS 4
#define MAX_STAGES 16
#define ERR_CHAIN 64
#define TIMEOUT_NS 2000000000ull   // 2 s: a block waiting longer reports ERR_CHAIN

#define OP_ADD 1
#define OP_NORM_SILU 2
#define OP_NORM_QKV 3

// ChainOp and ChainArgs mirror chainOp and chainArgs in chain.go: every
// field 8 bytes.
struct ChainOp {
  i64 kind;    // OP_*
  i64 m;       // ADD: rows of w; NORM_SILU: features (w has 2m rows); NORM_QKV: rows of w
  i64 k;       // columns of w and x
  i64 staged;  // 1: x is copied (and normalised) into shared memory first
  const u16* w;
  const u16* x;  // ADD: the product's input; NORM_*: the residual stream
  u16* y;        // ADD: the residual [n, m]; NORM_SILU: out [n, m]; NORM_QKV: Q [n, H*hd]
  const float* g;
  const int* pos;
  const int* slots;
  u16* kc;
  u16* vc;
  const float* invf;
  i64 H, KV, hd, bs, nslots;
};

struct ChainArgs {
  ChainOp ops[MAX_OPS];
  i64 nops, n, stages;
  float eps;
  int pad;
  int* err;
  int* sync;  // MAX_OPS + 1 counters, zero between launches (the last block out resets them)
};

__device__ __forceinline__ u64 global_ns() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// mbar_wait waits for the phase of parity parity to complete; past the
// timeout it reports and returns (a bug, not a condition of the inputs).
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity, int* err) {
  if (mbar_try(bar, parity)) return;
  u64 t0 = global_ns();
  while (!mbar_try(bar, parity)) {
    if (global_ns() - t0 > TIMEOUT_NS) {
      report(err, ERR_CHAIN);
      return;
    }
  }
}

// Loads of what other blocks of this kernel wrote go to L2 (.cg): L1 is
// not coherent across SMs.
__device__ __forceinline__ uint4 ld_cg4(const void* p) {
  uint4 v;
  asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ u16 ld_cg1(const u16* p) {
  u16 v;
  asm volatile("ld.global.cg.u16 %0, [%1];" : "=h"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ int ld_cg_i32(const int* p) {
  int v;
  asm volatile("ld.global.cg.s32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}

__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// The consumer warps' barrier (named barrier 1; the producer never joins).
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;" ::"n"(NCW * 32) : "memory"); }

__device__ __forceinline__ i64 op_groups(const ChainOp& o) {
  switch (o.kind) {
    case OP_ADD:
      return o.m / 16;
    case OP_NORM_SILU:
      return o.m / 8;
    default:
      return (o.H + 2 * o.KV) * o.hd / 16;
  }
}

// op_row is the weight row that A row r (0..15) of group g multiplies.
// NORM_SILU pairs gate row j with up row j (rows 8 apart in the group), so
// a thread's C fragment holds both; NORM_QKV pairs each Q/K feature with
// the one half a head away (RoPE's rotate-half partner), as qkv_rope_bf16.
__device__ __forceinline__ i64 op_row(const ChainOp& o, i64 g, int r) {
  switch (o.kind) {
    case OP_ADD:
      return g * 16 + r;
    case OP_NORM_SILU:
      return r < 8 ? g * 8 + r : o.m + g * 8 + (r - 8);
    default: {
      i64 hb = o.hd / 16, rot = (o.H + o.KV) * hb;
      if (g < rot) {
        i64 head = g / hb, f0 = (g - head * hb) * 8;
        return head * o.hd + f0 + (r & 7) + (r >= 8 ? o.hd / 2 : 0);
      }
      return (o.H + o.KV) * o.hd + (g - rot) * 16 + r;
    }
  }
}

// The block's run of an op's groups: [g0, g1).
__device__ __forceinline__ void my_groups(const ChainOp& o, i64& g0, i64& g1) {
  i64 ng = op_groups(o);
  g0 = ng * blockIdx.x / gridDim.x;
  g1 = ng * (blockIdx.x + 1) / gridDim.x;
}


// stage copies x [n, k] into xs (row stride k + 32) and, for the NORM ops,
// replaces it by RMSNorm(x) * g. Consumer threads only (ct = 0..NCW*32-1).
__device__ __forceinline__ void stage(const ChainOp& o, int n, float eps, u16* xs, float (&ssq)[NCW][8], int ct) {
  const int k = (int)o.k, xstr = k + 32;
  const bool norm = o.kind != OP_ADD;
  float ss[8];
#pragma unroll
  for (int r = 0; r < 8; r++) ss[r] = 0.f;
  for (int c = ct * 8; c < k; c += NCW * 32 * 8) {
#pragma unroll
    for (int r = 0; r < 8; r++) {
      if (r >= n) break;
      uint4 v = ld_cg4(o.x + (i64)r * k + c);
      *(uint4*)(xs + r * xstr + c) = v;
      if (norm) {
        const u32* p = (const u32*)&v;
#pragma unroll
        for (int j = 0; j < 4; j++) {
          float a0 = __uint_as_float(p[j] << 16), a1 = __uint_as_float(p[j] & 0xffff0000u);
          ss[r] += a0 * a0 + a1 * a1;
        }
      }
    }
  }
  if (norm) {
    const int lane = ct & 31, cw = ct >> 5;
#pragma unroll
    for (int r = 0; r < 8; r++) {
      float v = warp_sum(ss[r]);
      if (lane == 0) ssq[cw][r] = v;
    }
    consumers_sync();
    float rs[8];
#pragma unroll
    for (int r = 0; r < 8; r++) {
      float s = 0.f;
#pragma unroll
      for (int w = 0; w < NCW; w++) s += ssq[w][r];
      rs[r] = rsqrtf(s / (float)k + eps);
    }
    for (int c = ct * 8; c < k; c += NCW * 32 * 8) {
      float4 g0 = *(const float4*)(o.g + c), g1 = *(const float4*)(o.g + c + 4);
#pragma unroll
      for (int r = 0; r < 8; r++) {
        if (r >= n) break;
        uint4* p = (uint4*)(xs + r * xstr + c);
        *p = norm8(*p, g0, g1, rs[r]);
      }
    }
  }
  consumers_sync();
}

// xload is this thread's x fragment for span s of the tile at k0: row gid
// of x (zero past n), columns k0 + s*32 + tq*8 .. +8.
__device__ __forceinline__ uint4 xload(const ChainOp& o, const u16* xs, int n, int k0, int s, int gid, int tq) {
  if (gid >= n) return make_uint4(0, 0, 0, 0);
  int col = k0 + s * 32 + tq * 8;
  if (o.staged) return *(const uint4*)(xs + gid * ((int)o.k + 32) + col);
  return ld_cg4(o.x + (i64)gid * o.k + col);
}

// epilogue writes group g's results from the warps' partial sums red
// (C element e of lane l: feature (l>>2) + (e>>1)*8 of the group, token
// row (l&3)*2 + (e&1)). Consumer threads only.
__device__ __forceinline__ void epilogue(const ChainOp& o, i64 g, int n, const float (&red)[NCW][32][4],
                                         const int* spos, const int* sslot, int* err, int ct) {
  auto sum = [&](int l, int e) {
    float v = 0.f;
#pragma unroll
    for (int w = 0; w < NCW; w++) v += red[w][l][e];
    return v;
  };
  if (o.kind == OP_ADD) {
    if (ct >= 128) return;
    int l = ct >> 2, e = ct & 3;
    int row = (l & 3) * 2 + (e & 1);
    if (row >= n) return;
    i64 i = (i64)row * o.m + g * 16 + (l >> 2) + (e >> 1) * 8;
    o.y[i] = f32_to_bf16(round_to<DT_BF16>(sum(l, e)) + bf16_to_f32(ld_cg1(o.y + i)));
    return;
  }
  if (o.kind == OP_NORM_SILU) {
    if (ct >= 64) return;
    int l = ct >> 1, e = ct & 1;
    int row = (l & 3) * 2 + e;
    if (row >= n) return;
    float gt = round_to<DT_BF16>(sum(l, e));
    float up = round_to<DT_BF16>(sum(l, e + 2));
    o.y[(i64)row * o.m + g * 8 + (l >> 2)] = f32_to_bf16(silu_f(gt) * up);
    return;
  }
  // OP_NORM_QKV
  const int hd = (int)o.hd, half = hd >> 1, H = (int)o.H, KV = (int)o.KV, bs = (int)o.bs;
  const i64 hb = hd / 16, rot = (o.H + o.KV) * hb;
  if (g < rot) {
    if (ct >= 64) return;
    int l = ct >> 1, e = ct & 1;
    int row = (l & 3) * 2 + e;
    if (row >= n) return;
    int head = (int)(g / hb);
    int i = (int)(g - head * hb) * 8 + (l >> 2);
    float x1 = round_to<DT_BF16>(sum(l, e));
    float x2 = round_to<DT_BF16>(sum(l, e + 2));
    int p = spos[row];
    if (p < 0) {
      report(err, ERR_POSITION);
      p = 0;
    }
    u16* out = o.y;
    i64 dst = ((i64)row * H + head) * hd;
    if (head >= H) {
      int slot = sslot[row];
      if (slot >= o.nslots) {
        report(err, ERR_SLOT);
        return;
      }
      if (slot < 0) return;
      int blk = slot / bs, off = slot - blk * bs;
      out = o.kc;
      dst = (((i64)blk * KV + (head - H)) * bs + off) * hd;
    }
    float sn, cs;
    sincosf((float)p * o.invf[i], &sn, &cs);
    out[dst + i] = f32_to_bf16(x1 * cs - x2 * sn);
    out[dst + i + half] = f32_to_bf16(x2 * cs + x1 * sn);
    return;
  }
  if (ct >= 128) return;
  int l = ct >> 2, e = ct & 3;
  int row = (l & 3) * 2 + (e & 1);
  if (row >= n) return;
  int slot = sslot[row];
  if (slot >= o.nslots) {
    report(err, ERR_SLOT);
    return;
  }
  if (slot < 0) return;
  int f = (int)(g - rot) * 16 + (l >> 2) + (e >> 1) * 8;  // feature counted from V's start
  int vh = f / hd, i = f - vh * hd;
  int blk = slot / bs, off = slot - blk * bs;
  o.vc[(((i64)blk * KV + vh) * bs + off) * hd + i] = f32_to_bf16(sum(l, e));
}

// chain_bf16 runs a.ops[0..nops) as described at the top of the file.
// Dynamic shared memory: a.stages ring tiles (TILE_ELEMS bf16 each), then
// the staged x (n rows of k + 32 elements, for the largest staged op).
// grid (SMs), block CHAIN_THREADS.
extern "C" __global__ void __launch_bounds__(CHAIN_THREADS, 1) chain_bf16(const ChainArgs a) {
  grid_dep_wait();
#if __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char dsm[];
  __shared__ __align__(8) u64 full[MAX_STAGES], empty[MAX_STAGES];
  __shared__ float red[NCW][32][4];
  __shared__ float ssq[NCW][8];
  __shared__ int spos[8], sslot[8];
  u16* ring = (u16*)dsm;
  const int ST = (int)a.stages, n = (int)a.n, nops = (int)a.nops;
  u16* xs = ring + (i64)ST * TILE_ELEMS;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  if (threadIdx.x == 0) {
    for (int s = 0; s < ST; s++) {
      mbar_init(smem_u32(&full[s]), 1);
      mbar_init(smem_u32(&empty[s]), NCW);
    }
#if PTX80
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
  }
  __syncthreads();

  if (warp == 0) {
    // Producer: every tile of the block's groups, op after op; it waits
    // only for free slots, never for the ops' inputs. Lane r < 16 copies
    // tile row r with one TMA bulk copy (one warp of TMA measured faster
    // than four warps of 16-byte cp.async copies, docs/benchmarks.md).
    u32 it = 0;
    for (int oi = 0; oi < nops; oi++) {
      const ChainOp& o = a.ops[oi];
      i64 g0, g1;
      my_groups(o, g0, g1);
      const int k = (int)o.k, nt = (k + KC - 1) / KC;
      for (i64 g = g0; g < g1; g++) {
        const u16* src = o.w + op_row(o, g, lane & 15) * o.k;
        for (int kt = 0; kt < nt; kt++, it++) {
          const int slot = it % ST;
          const u32 use = it / ST;
          if (use > 0) mbar_wait(smem_u32(&empty[slot]), (use - 1) & 1, a.err);
          const int k0 = kt * KC, kw = min(KC, k - k0);
          const u32 fb = smem_u32(&full[slot]);
          u16* dst = ring + (i64)slot * TILE_ELEMS;
          if (lane == 0) mbar_expect_tx(fb, 16u * kw * 2);
          __syncwarp();
          if (lane < 16) bulk_copy(smem_u32(dst + lane * RSTR), src + k0, kw * 2, fb);
        }
      }
    }
    return;
  }

  // Consumers.
  const int ct = threadIdx.x - 32, cw = warp - 1;
  const int gid = lane >> 2, tq = lane & 3;
  u32 it = 0;
  for (int oi = 0; oi < nops; oi++) {
    const ChainOp& o = a.ops[oi];
    if (oi > 0) {
      // Every block's share of the op before this one is written.
      if (ct == 0) {
        const int* c = a.sync + (oi - 1);
        if (ld_acquire(c) < (int)gridDim.x) {
          u64 t0 = global_ns();
          while (ld_acquire(c) < (int)gridDim.x) {
            if (global_ns() - t0 > TIMEOUT_NS) {
              report(a.err, ERR_CHAIN);
              break;
            }
          }
        }
        __threadfence();
      }
      consumers_sync();
    }
    if (o.kind == OP_NORM_QKV && ct < 8) {
      spos[ct] = ct < n ? ld_cg_i32(o.pos + ct) : 0;
      sslot[ct] = ct < n ? ld_cg_i32(o.slots + ct) : -1;
    }
    if (o.staged) {
      stage(o, n, a.eps, xs, ssq, ct);  // ends with consumers_sync
    } else {
      consumers_sync();  // spos/sslot
    }
    i64 g0, g1;
    my_groups(o, g0, g1);
    const int k = (int)o.k, nt = (k + KC - 1) / KC;
    for (i64 g = g0; g < g1; g++) {
      // Two accumulators: the two mmas of a span do not wait on each other.
      float acc[4] = {0.f, 0.f, 0.f, 0.f}, acc2[4] = {0.f, 0.f, 0.f, 0.f};
      // x fragments of the next two tiles, in flight while one is
      // multiplied (two: an unstaged x comes from L2, ~1 us away).
      uint4 xn[SPW], xn2[SPW];
      auto xtile = [&](int kt, uint4(&xr)[SPW]) {
        const int k1 = kt < nt ? kt * KC : k, kw1 = min(KC, k - k1);
#pragma unroll
        for (int j = 0; j < SPW; j++) {
          int s = cw + j * NCW;
          xr[j] = s * 32 < kw1 ? xload(o, xs, n, k1, s, gid, tq) : make_uint4(0, 0, 0, 0);
        }
      };
      xtile(0, xn);
      xtile(1, xn2);
      for (int kt = 0; kt < nt; kt++, it++) {
        const int k0 = kt * KC, kw = min(KC, k - k0);
        uint4 xv[SPW];
#pragma unroll
        for (int j = 0; j < SPW; j++) {
          xv[j] = xn[j];
          xn[j] = xn2[j];
        }
        xtile(kt + 2, xn2);
        const int slot = it % ST;
        mbar_wait(smem_u32(&full[slot]), (it / ST) & 1, a.err);
        const u16* tb = ring + (i64)slot * TILE_ELEMS;
#if !NOMATH
#pragma unroll
        for (int j = 0; j < SPW; j++) {
          int s = cw + j * NCW;
          if (s * 32 >= kw) break;
          uint4 wa = *(const uint4*)(tb + gid * RSTR + s * 32 + tq * 8);
          uint4 wb = *(const uint4*)(tb + (gid + 8) * RSTR + s * 32 + tq * 8);
          mma16816(acc, wa.x, wb.x, wa.y, wb.y, xv[j].x, xv[j].y);
          mma16816(acc2, wa.z, wb.z, wa.w, wb.w, xv[j].z, xv[j].w);
        }
#endif
        __syncwarp();
        if (lane == 0) mbar_arrive(smem_u32(&empty[slot]));
      }
#pragma unroll
      for (int e = 0; e < 4; e++) acc[e] += acc2[e];
#pragma unroll
      for (int e = 0; e < 4; e++) red[cw][lane][e] = acc[e];
      consumers_sync();
      epilogue(o, g, n, red, spos, sslot, a.err, ct);
      consumers_sync();
    }
    // This block's share of op oi is written.
    consumers_sync();
    if (ct == 0) {
      __threadfence();
      atomicAdd(a.sync + oi, 1);
    }
  }
  // The last block out resets the counters for the next launch: every
  // block has passed all its waits by the time it counts itself out.
  if (ct == 0) {
    if (atomicAdd(a.sync + MAX_OPS, 1) == (int)gridDim.x - 1) {
      for (int i = 0; i <= MAX_OPS; i++) a.sync[i] = 0;
      __threadfence();
    }
  }
  grid_dep_launch();
#endif
}
