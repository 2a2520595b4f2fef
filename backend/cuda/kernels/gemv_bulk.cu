// gemv_bulk.cu: decode-shaped products y = x . W^T (n <= 8*NT rows of x)
// with the weight streamed into shared memory by the TMA unit (sm_90).
//
// Why a second GEMV: gemv.cu's warps load the weight into registers, so
// the bytes in flight per SM are capped by the register file, and its
// products stream the weight below what a pure read reaches
// (tools/gpu/probes/stream.cu). Here one producer
// thread per block keeps ST stages of the block's weight rows in flight
// as 1D bulk copies (one per row and stage) completing on mbarriers, and
// CW consumer warps multiply each stage once it lands (mma.sync, the
// fragment layout of gemv.cu) and release it.
//
//   block = CW consumer warps + 1 producer warp
//   grid  = min(tiles, blocks resident at once): persistent, block b takes
//           tiles b, b + gridDim.x, ...; its producer streams every stage
//           of every tile without a break
//   tile  = 16 weight rows (the mma's A rows) x all of k, in stages of CK
//           columns: stage buffer [16][CK + 32] bf16 (rows 64 bytes apart
//           mod 128, so the 8 lanes of a quarter warp, two rows, hit
//           distinct banks)
//
// Which 16 rows a tile holds is the kernel's choice: gemvb_bf16 and
// gemvb_add_bf16 take rows 16t..16t+15; gemvb_silu_bf16 takes gate rows
// 8t..8t+7 as A rows 0..7 and the matching up rows as A rows 8..15, so a
// thread's C fragment holds a feature's gate and up sums and SiLU x mul
// happens in the epilogue.
//
// Under programmatic dependent launch the producer starts streaming
// before griddepcontrol.wait when early_w says no kernel of the step
// writes the weight (gemv.cu's rule, early_w's bit 0); the consumers wait
// before reading x. early_w's bit 1 (the host's lowering sets it for
// gemvb_silu_bf16 before the down product) lets the dependent kernel
// launch at this one's start instead of after each block's last tile: its
// blocks take SM room as this kernel's leave, sooner, and its producers
// start streaming.
// Rounding is gemv.cu's (products rounded to bf16 before the residual add
// or SiLU); the k split differs, so sums match gemv.cu's to f32 rounding,
// not bit for bit.
//
// Specialised with -DNT=<8-row tiles of x> -DCW=<consumer warps>
// -DCK=<columns a stage, a multiple of 32*CW> -DST=<stages> -DOT=<y dtype
// of gemvb_bf16> -DMB=<blocks per SM the registers must allow, 0 or 1:
// no bound>. k must be a multiple of CK; x and w 16-byte aligned.
#include "bulk.cuh"

#if defined(MB) && MB > 1
#define GEMVB_MINB MB
#else
#define GEMVB_MINB 1
#endif

#define RSTR (CK + 32)            // stage row stride (elements)
#define STAGE_BYTES (16 * RSTR * 2)
#define PW (CK / 32 / CW)         // spans per consumer warp per stage
#define GEMVB_THREADS ((CW + 1) * 32)
#define MODE_PLAIN 0
#define MODE_ADD 1
#define MODE_SILU 2

static_assert(CK % (32 * CW) == 0, "CK must be a multiple of 32*CW");

// The consumer warps' barrier (named barrier 1; the producer never joins).
__device__ __forceinline__ void gemvb_consumers_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(CW * 32) : "memory");
}

// gemvb_row is the weight row that A row r of tile t multiplies, or -1
// past the end of w (a partial last tile of a plain product).
template <int MODE>
__device__ __forceinline__ int gemvb_row(int t, int r, int m) {
  if (MODE == MODE_SILU) return r < 8 ? t * 8 + r : m + t * 8 + (r - 8);  // m = inter here
  int row = t * 16 + r;
  return row < m ? row : -1;
}

// gemvb runs the product; MODE picks the epilogue.
//   PLAIN: y [n, m] OT = x . w^T;  w [m, k]
//   ADD:   y [n, m] bf16 += bf16(x . w^T);  w [m, k]
//   SILU:  y [n, m] bf16 = bf16(silu(G) * U), [G | U] = bf16(x . w^T);
//          w [2m, k] (gate rows, then up rows), m % 8 == 0
//   x [n, k] bf16
template <int MODE>
__device__ __forceinline__ void gemvb(void* y, const u16* x, const u16* w, int n, int m, int k, int early_w) {
#if __CUDA_ARCH__ < 900
  __trap();  // the host launches these kernels on sm_90 and newer only
#else
  if (early_w & 2) grid_dep_launch();  // the lowering's early attribute: the next kernel launches at once
  early_w &= 1;
  extern __shared__ __align__(128) unsigned char ring[];  // ST stage buffers
  __shared__ __align__(8) u64 full[ST], empty[ST];
  __shared__ float red[CW][NT][32][4];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int gid = lane >> 2, tq = lane & 3;
  int tiles = MODE == MODE_SILU ? m / 8 : (m + 15) / 16;
  int stages = k / CK;
  if (threadIdx.x == 0) {
    for (int s = 0; s < ST; s++) {
      mbar_init(smem_u32(&full[s]), 1);
      mbar_init(smem_u32(&empty[s]), CW);
    }
    mbar_init_fence();
  }
  __syncthreads();

  if (warp == CW) {  // the producer
    if (lane != 0) return;
    if (!early_w) grid_dep_wait();
    int g = 0;  // stages issued so far, over all tiles
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
      int rows[16];
      u32 bytes = 0;
#pragma unroll
      for (int r = 0; r < 16; r++) {
        rows[r] = gemvb_row<MODE>(t, r, m);
        if (rows[r] >= 0) bytes += CK * 2;
      }
      for (int i = 0; i < stages; i++, g++) {
        int s = g % ST;
        if (g >= ST) mbar_spin(smem_u32(&empty[s]), ((g / ST) - 1) & 1);
        u32 fb = smem_u32(&full[s]);
        mbar_expect_tx(fb, bytes);
        u32 dst = smem_u32(ring + s * STAGE_BYTES);
#pragma unroll
        for (int r = 0; r < 16; r++) {
          if (rows[r] >= 0) bulk_copy(dst + r * RSTR * 2, w + (i64)rows[r] * k + (i64)i * CK, CK * 2, fb);
        }
      }
    }
    return;
  }

  // The consumers. Rows of a partial last tile that w lacks hold stale
  // shared memory: they feed only their own A rows, whose sums are dropped.
  grid_dep_wait();  // x comes from the kernels before this one
  const u16* xp[NT];
  bool okx[NT];
#pragma unroll
  for (int t = 0; t < NT; t++) {
    int row = t * 8 + gid;
    okx[t] = row < n;
    xp[t] = x + (i64)(okx[t] ? row : 0) * k + tq * 8;
  }
  const uint4 zero = make_uint4(0, 0, 0, 0);
  int g = 0;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    float acc[NT][4];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
    // x for a stage is loaded one stage ahead (it comes from L2).
    uint4 xn[PW][NT];
#pragma unroll
    for (int u = 0; u < PW; u++) {
#pragma unroll
      for (int t = 0; t < NT; t++) xn[u][t] = okx[t] ? *(const uint4*)(xp[t] + (warp + u * CW) * 32) : zero;
    }
    for (int i = 0; i < stages; i++, g++) {
      int s = g % ST;
      uint4 xv[PW][NT];
#pragma unroll
      for (int u = 0; u < PW; u++) {
#pragma unroll
        for (int t = 0; t < NT; t++) xv[u][t] = xn[u][t];
      }
      if (i + 1 < stages) {
#pragma unroll
        for (int u = 0; u < PW; u++) {
#pragma unroll
          for (int t = 0; t < NT; t++)
            xn[u][t] = okx[t] ? *(const uint4*)(xp[t] + (i + 1) * CK + (warp + u * CW) * 32) : zero;
        }
      }
      mbar_spin(smem_u32(&full[s]), (g / ST) & 1);
      const u16* st = (const u16*)(ring + s * STAGE_BYTES);
      uint4 wa[PW], wb[PW];
#pragma unroll
      for (int u = 0; u < PW; u++) {
        int c = (warp + u * CW) * 32 + tq * 8;
        wa[u] = *(const uint4*)(st + gid * RSTR + c);
        wb[u] = *(const uint4*)(st + (gid + 8) * RSTR + c);
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(smem_u32(&empty[s]));  // the stage is in registers: refill it
#pragma unroll
      for (int u = 0; u < PW; u++) {
#pragma unroll
        for (int t = 0; t < NT; t++) {
          mma16816(acc[t], wa[u].x, wb[u].x, wa[u].y, wb[u].y, xv[u][t].x, xv[u][t].y);
          mma16816(acc[t], wa[u].z, wb[u].z, wa[u].w, wb[u].w, xv[u][t].z, xv[u][t].w);
        }
      }
    }
    if (tile + (int)gridDim.x >= tiles) grid_dep_launch();  // this block's weights are read
#pragma unroll
    for (int t = 0; t < NT; t++) {
#pragma unroll
      for (int e = 0; e < 4; e++) red[warp][t][lane][e] = acc[t][e];
    }
    gemvb_consumers_sync();
    // sum is C element e of lane l of x tile t over the warps, in warp
    // order: x row t*8 + (l%4)*2 + e%2, A row l/4 + (e/2)*8.
    auto sum = [&](int t, int l, int e) {
      float v = 0.f;
#pragma unroll
      for (int ww = 0; ww < CW; ww++) v += red[ww][t][l][e];
      return v;
    };
    if (MODE == MODE_SILU) {
      // One thread per (x tile t, lane l, row parity e): a gate and its up.
      for (int idx = threadIdx.x; idx < NT * 64; idx += CW * 32) {
        int t = idx >> 6, l = (idx >> 1) & 31, e = idx & 1;
        int row = t * 8 + (l & 3) * 2 + e;
        if (row >= n) continue;
        float gt = round_to<DT_BF16>(sum(t, l, e));
        float up = round_to<DT_BF16>(sum(t, l, e + 2));
        ((u16*)y)[(i64)row * m + tile * 8 + (l >> 2)] = f32_to_bf16(silu_f(gt) * up);
      }
    } else {
      for (int idx = threadIdx.x; idx < NT * 128; idx += CW * 32) {
        int t = idx >> 7, l = (idx >> 2) & 31, e = idx & 3;
        int row = t * 8 + (l & 3) * 2 + (e & 1);
        int feat = tile * 16 + (l >> 2) + (e >> 1) * 8;
        if (row >= n || feat >= m) continue;
        i64 i = (i64)row * m + feat;
        float v = sum(t, l, e);
        if (MODE == MODE_ADD) {
          u16* yp = (u16*)y;
          yp[i] = f32_to_bf16(round_to<DT_BF16>(v) + bf16_to_f32(yp[i]));
        } else {
          store_f<OT>(y, i, v);
        }
      }
    }
    gemvb_consumers_sync();  // red is free for the next tile
  }
#endif
}

// gemvb_bf16: y[t, o] = sum_k x[t, k] * w[o, k].
//   y [n, m] OT;  x [n, k] bf16;  w [m, k] bf16
extern "C" __global__ void __launch_bounds__(GEMVB_THREADS, GEMVB_MINB) gemvb_bf16(void* y, const u16* x, const u16* w, int n,
                                                                     int m, int k, int early_w) {
  gemvb<MODE_PLAIN>(y, x, w, n, m, k, early_w);
}

// gemvb_add_bf16: y[t, o] += bf16(sum_k x[t, k] * w[o, k]), rounded as
// gemv_add_bf16 rounds it.
//   y [n, m] bf16 (read and written);  x [n, k] bf16;  w [m, k] bf16
extern "C" __global__ void __launch_bounds__(GEMVB_THREADS, GEMVB_MINB) gemvb_add_bf16(u16* y, const u16* x, const u16* w,
                                                                         int n, int m, int k, int early_w) {
  gemvb<MODE_ADD>(y, x, w, n, m, k, early_w);
}

// gemvb_silu_bf16: out[t, j] = silu(G[t, j]) * U[t, j], [G | U] = x . w^T,
// each rounded to bf16 as MatMul then silu_mul round them.
//   out [n, inter] bf16;  x [n, k] bf16;  w [2*inter, k] bf16 (gate rows,
//   then up rows);  inter % 8 == 0
extern "C" __global__ void __launch_bounds__(GEMVB_THREADS, GEMVB_MINB) gemvb_silu_bf16(u16* out, const u16* x, const u16* w,
                                                                          int n, int inter, int k, int early_w) {
  gemvb<MODE_SILU>(out, x, w, n, inter, k, early_w);
}
