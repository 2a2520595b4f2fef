// gemv.cu: decode-shaped products y = x . W^T for a few rows of x (n <= 8*NT)
// against a large BF16 weight, on the tensor cores.
// Specialised with -DNT=<8-row tiles of x> -DNW=<warps per block>
// -DUR=<32-wide k spans whose loads are issued together> -DOT=<y dtype>.
//
// Why not a CUDA-core GEMV: at batch 4 a CUDA-core dot product spends ~50
// instructions (bf16 unpacking, FMAs, shuffles) per 16 bytes of weight,
// close to what an SM can issue while HBM delivers ~18 bytes a clock to
// it. mma.sync m16n8k16 does 16x8x16 multiply-adds in one instruction,
// with W as A (16 output features) and x^T as B (n <= 8 token rows), and
// needs no unpacking: fragments are raw bf16 pairs.
//
// The k order inside a fragment is free (a dot product does not care), so
// each thread loads 16 contiguous bytes of a W row and of the matching x
// row and feeds them to two mmas. Thread (gid = lane/4, tq = lane%4) of a
// warp, for the 32-wide k span starting at k0:
//   wa = W[r0 + gid    ][k0 + tq*8 .. +8]   (uint4: elements e0..e7)
//   wb = W[r0 + gid + 8][k0 + tq*8 .. +8]
//   xa = x[t0 + gid    ][k0 + tq*8 .. +8]   (B fragment source, n = gid)
// mma 0 takes e0..e3 and mma 1 e4..e7:
//   A: a0 = wa.x (logical k tq*2, tq*2+1), a1 = wb.x, a2 = wa.y (k tq*2+8,+9), a3 = wb.y
//   B: b0 = xa.x (logical k tq*2, tq*2+1 at column gid), b1 = xa.y
// (mma 1 uses .z/.w), so logical k position tq*2+j always means actual
// k0 + tq*8 + j in both operands. The C fragment holds
//   c0, c1 = y-partial[feature r0 + gid][rows t0 + tq*2, +1], c2, c3 = feature r0 + gid + 8.
// A block owns 16 output features; its NW warps split k (span w, w+NW,
// ...) and add their C fragments through shared memory. Each warp load
// instruction reads 8 rows x 64 contiguous bytes: whole 32-byte sectors.
#include "mma.cuh"

// Weights are read once per product: keep them out of L1.
__device__ __forceinline__ uint4 ld_stream(const u16* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// gemv_bf16: y[t, o] = sum_k x[t, k] * w[o, k] for t < n <= 8*NT.
//   y [n, m] OT;  x [n, k] bf16;  w [m, k] bf16; k % 8 == 0, x and w 16-byte aligned
// grid (ceil(m/16)), block NW*32.
//
// The weight loads of step i+1 are issued before the mmas of step i (two
// steps of loads in flight per warp). With early_w set the first step's
// weights are loaded before grid_dep_wait: under programmatic dependent
// launch that streaming overlaps the previous kernel's tail. Only the
// weight is read early, and only when the host knows no kernel of the
// step writes it (early_w is 0 for a weight converted just before).
extern "C" __global__ void __launch_bounds__(NW * 32) gemv_bf16(void* y, const u16* x, const u16* w, int n, int m, int k,
                                                              int early_w) {
  if (!early_w) grid_dep_wait();
  __shared__ float red[NW][NT][32][4];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int gid = lane >> 2, tq = lane & 3;
  int r0 = blockIdx.x * 16;
  int ra = r0 + gid, rb = ra + 8;
  bool oka = ra < m, okb = rb < m;
  const u16* wa_p = w + (i64)(oka ? ra : 0) * k + tq * 8;
  const u16* wb_p = w + (i64)(okb ? rb : 0) * k + tq * 8;
  int spans = (k + 31) >> 5;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  uint4 wa[UR], wb[UR];
  // load_w fills wa/wb with the weights of the UR spans of step s0.
#define LOAD_W(s0)                                      \
  _Pragma("unroll") for (int u = 0; u < UR; u++) {      \
    int s = (s0) + u * NW;                              \
    int kk = s * 32;                                    \
    bool in = s < spans && kk + tq * 8 < k;             \
    wa[u] = in && oka ? ld_stream(wa_p + kk) : zero;    \
    wb[u] = in && okb ? ld_stream(wb_p + kk) : zero;    \
  }
  LOAD_W(warp);
  if (early_w) grid_dep_wait();

  const u16* x_p[NT];
  bool okx[NT];
#pragma unroll
  for (int t = 0; t < NT; t++) {
    int row = t * 8 + gid;
    okx[t] = row < n;
    x_p[t] = x + (i64)(okx[t] ? row : 0) * k + tq * 8;
  }
  float c[NT][4];
#pragma unroll
  for (int t = 0; t < NT; t++) c[t][0] = c[t][1] = c[t][2] = c[t][3] = 0.f;

  for (int s0 = warp; s0 < spans; s0 += NW * UR) {
    uint4 xv[UR][NT];
#pragma unroll
    for (int u = 0; u < UR; u++) {
      int s = s0 + u * NW;
      int kk = s * 32;
      bool in = s < spans && kk + tq * 8 < k;
#pragma unroll
      for (int t = 0; t < NT; t++) xv[u][t] = in && okx[t] ? *(const uint4*)(x_p[t] + kk) : zero;
    }
    uint4 ca[UR], cb[UR];
#pragma unroll
    for (int u = 0; u < UR; u++) {
      ca[u] = wa[u];
      cb[u] = wb[u];
    }
    LOAD_W(s0 + NW * UR);  // the next step's weights, in flight during this step's mmas
#pragma unroll
    for (int u = 0; u < UR; u++) {
#pragma unroll
      for (int t = 0; t < NT; t++) {
        mma16816(c[t], ca[u].x, cb[u].x, ca[u].y, cb[u].y, xv[u][t].x, xv[u][t].y);
        mma16816(c[t], ca[u].z, cb[u].z, ca[u].w, cb[u].w, xv[u][t].z, xv[u][t].w);
      }
    }
  }
#undef LOAD_W
  grid_dep_launch();  // every weight is read: the next kernel may launch during the reduction
#pragma unroll
  for (int t = 0; t < NT; t++) {
#pragma unroll
    for (int e = 0; e < 4; e++) red[warp][t][lane][e] = c[t][e];
  }
  __syncthreads();
  // One thread per C element: (tile t, lane l, element e).
  for (int idx = threadIdx.x; idx < NT * 32 * 4; idx += NW * 32) {
    int t = idx >> 7, l = (idx >> 2) & 31, e = idx & 3;
    float v = 0.f;
#pragma unroll
    for (int ww = 0; ww < NW; ww++) v += red[ww][t][l][e];
    int row = t * 8 + (l & 3) * 2 + (e & 1);  // token row of x / y
    int feat = r0 + (l >> 2) + (e >> 1) * 8;  // output feature
    if (row < n && feat < m) store_f<OT>(y, (i64)row * m + feat, v);
  }
}
