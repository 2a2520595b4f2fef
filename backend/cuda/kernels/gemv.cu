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
//
// gemv_bf16 is the plain product; qkv_rope_bf16 is the same product of a
// fused QKV projection with RoPE and the paged KV-cache write in its
// epilogue. Both share the code below up to the reduction, so a feature's
// sum is the same float in both.
#include "mma.cuh"
// qkv_rope_bf16 writes a bf16 cache only (the host fuses for a BF16 KV
// spec alone), so the module's KV format is fixed rather than a -D constant.
#define KV_DT DT_BF16
#include "kv.cuh"

// WRows is one thread's share of a block's 16 weight rows: A rows gid
// (a) and gid + 8 (b) of the mma, from column tq*8 on, and the UR spans of
// them a step multiplies. Which output features the rows are is the
// kernel's choice: the products do not care.
struct WRows {
  const u16* pa;
  const u16* pb;
  bool oka, okb;       // the row exists (a partial last block has fewer)
  uint4 a[UR], b[UR];  // the UR spans of the current step

  // load fills a and b with the weights of the UR spans of step s0.
  __device__ __forceinline__ void load(int s0, int spans, int k, int tq) {
    const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < UR; u++) {
      int s = s0 + u * NW;
      int kk = s * 32;
      bool in = s < spans && kk + tq * 8 < k;
      a[u] = in && oka ? ld_stream16(pa + kk) : zero;
      b[u] = in && okb ? ld_stream16(pb + kk) : zero;
    }
  }
};

// wrows points a thread at weight rows ra and rb of w [m, k].
__device__ __forceinline__ WRows wrows(const u16* w, int ra, int rb, int m, int k, int tq) {
  WRows r;
  r.oka = ra < m;
  r.okb = rb < m;
  r.pa = w + (i64)(r.oka ? ra : 0) * k + tq * 8;
  r.pb = w + (i64)(r.okb ? rb : 0) * k + tq * 8;
  return r;
}

// gemv_steps accumulates into acc the warp's share of x . W^T for the rows
// of r: spans warp, warp + NW, ..., UR of them per step. On entry r holds
// step warp's weights (loaded before grid_dep_wait where allowed). The
// weight loads of step i+1 are issued before the mmas of step i (two steps
// of loads in flight per warp).
//   acc[t]: C fragment of x rows t*8 .. t*8+7
__device__ __forceinline__ void gemv_steps(WRows& r, float (&acc)[NT][4], const u16* x, int n, int k, int warp, int gid,
                                           int tq) {
  int spans = (k + 31) >> 5;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  const u16* x_p[NT];
  bool okx[NT];
#pragma unroll
  for (int t = 0; t < NT; t++) {
    int row = t * 8 + gid;
    okx[t] = row < n;
    x_p[t] = x + (i64)(okx[t] ? row : 0) * k + tq * 8;
  }
#pragma unroll
  for (int t = 0; t < NT; t++) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;

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
      ca[u] = r.a[u];
      cb[u] = r.b[u];
    }
    r.load(s0 + NW * UR, spans, k, tq);  // the next step's weights, in flight during this step's mmas
#pragma unroll
    for (int u = 0; u < UR; u++) {
#pragma unroll
      for (int t = 0; t < NT; t++) {
        mma16816(acc[t], ca[u].x, cb[u].x, ca[u].y, cb[u].y, xv[u][t].x, xv[u][t].y);
        mma16816(acc[t], ca[u].z, cb[u].z, ca[u].w, cb[u].w, xv[u][t].z, xv[u][t].w);
      }
    }
  }
}

// gemv_share puts each warp's C fragments where gemv_sum adds them
// (__syncthreads between the two).
__device__ __forceinline__ void gemv_share(float (&red)[NW][NT][32][4], const float (&acc)[NT][4], int warp, int lane) {
#pragma unroll
  for (int t = 0; t < NT; t++) {
#pragma unroll
    for (int e = 0; e < 4; e++) red[warp][t][lane][e] = acc[t][e];
  }
}

// gemv_sum is C element e of lane l of tile t summed over the block's
// warps, always in warp order, so a feature's sum is the same float in
// every kernel of this file: x row t*8 + (l%4)*2 + e%2, A row l/4 + (e/2)*8.
__device__ __forceinline__ float gemv_sum(const float (&red)[NW][NT][32][4], int t, int l, int e) {
  float v = 0.f;
#pragma unroll
  for (int ww = 0; ww < NW; ww++) v += red[ww][t][l][e];
  return v;
}

// gemv_bf16: y[t, o] = sum_k x[t, k] * w[o, k] for t < n <= 8*NT.
//   y [n, m] OT;  x [n, k] bf16;  w [m, k] bf16; k % 8 == 0, x and w 16-byte aligned
// grid (ceil(m/16)), block NW*32: block b owns features 16b .. 16b+15.
//
// With early_w set the first step's weights are loaded before
// grid_dep_wait: under programmatic dependent launch that streaming
// overlaps the previous kernel's tail. Only the weight is read early, and
// only when the host knows no kernel of the step writes it (early_w is 0
// for a weight converted just before).
extern "C" __global__ void __launch_bounds__(NW * 32) gemv_bf16(void* y, const u16* x, const u16* w, int n, int m, int k,
                                                              int early_w) {
  if (!early_w) grid_dep_wait();
  __shared__ float red[NW][NT][32][4];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int gid = lane >> 2, tq = lane & 3;
  int r0 = blockIdx.x * 16;
  int ra = r0 + gid, rb = ra + 8;
  WRows r = wrows(w, ra, rb, m, k, tq);
  r.load(warp, (k + 31) >> 5, k, tq);
  if (early_w) grid_dep_wait();

  float acc[NT][4];
  gemv_steps(r, acc, x, n, k, warp, gid, tq);
  grid_dep_launch();  // every weight is read: the next kernel may launch during the reduction
  gemv_share(red, acc, warp, lane);
  __syncthreads();
  // One thread per C element: (tile t, lane l, element e).
  for (int idx = threadIdx.x; idx < NT * 32 * 4; idx += NW * 32) {
    int t = idx >> 7, l = (idx >> 2) & 31, e = idx & 3;
    float v = gemv_sum(red, t, l, e);
    int row = t * 8 + (l & 3) * 2 + (e & 1);  // token row of x / y
    int feat = r0 + (l >> 2) + (e >> 1) * 8;  // output feature
    if (row < n && feat < m) store_f<OT>(y, (i64)row * m + feat, v);
  }
}

// qkv_rope_bf16: a decode step's QKV projection with rope_store_kv's work
// (no Q/K norm, bf16 Q and caches) done in the epilogue, so the projection
// never goes to memory and back and one kernel launch fewer runs per layer.
//   q_out [n, H*hd] bf16;  x [n, k] bf16;  w [(H+2*KV)*hd, k] bf16: Q, K, V rows
//   pos, slots [n] int32 (slot = block*bs + offset; < 0 skips the K/V write)
//   bias [(H+2*KV)*hd] f32 or null: added to the projection as MatMul's
//     add_bias adds it (to the bf16-rounded product, rounded again)
//   kc, vc [numBlocks, KV, bs, hd] bf16 in kv.cuh's format;  inv_freq [hd/2] f32
// hd % 16 == 0, k % 8 == 0, x and w 16-byte aligned.
// grid ((H+2*KV)*hd/16), block NW*32.
//
// No weight is permuted: the block picks which 16 rows of w its mma A
// rows are. Blocks [0, (H+KV)*hd/16) each take hd/16-th of a Q or K head:
// A rows 0..7 are its features j0..j0+7 and rows 8..15 features
// j0+hd/2..j0+hd/2+7, so each thread's C fragment holds both halves of its
// rotate-half pairs (c0, c1 = x1 of x rows 2tq, 2tq+1; c2, c3 = their x2).
// The remaining blocks take 16 consecutive V features, as gemv_bf16 does.
//
// The result is bit for bit that of gemv_bf16 (same k split, same sum
// order over warps) followed by rope_store_kv: each sum is rounded to bf16
// as gemv_bf16 stores it, then rotated with the same expressions. Bad
// positions and slots are reported as rope_store_kv reports them.
//
// early_w's bit 0 as gemv_bf16's early_w. Bit 1 (the host's lowering sets
// it before decode attention) lets the dependent launch at once rather
// than after the weight stream: the product's blocks leave room on an SM,
// so decode attention's blocks become resident under its stream and issue
// their first K/V tiles (every row but the newest, which this kernel
// writes) before they wait.
// Epilogue items per thread: a V block's NT*128 C elements over its threads.
#define EPI ((NT * 128 + NW * 32 - 1) / (NW * 32))

extern "C" __global__ void __launch_bounds__(NW * 32) qkv_rope_bf16(
    u16* q_out, const u16* x, const u16* w, const int* pos, const int* slots, u16* kc, u16* vc,
    const float* inv_freq, const float* bias, int n, int k, int H, int KV, int hd, int bs, int num_slots, int* err,
    int early_w) {
  if (early_w & 2) grid_dep_launch();  // the lowering's early attribute: attention's blocks take the room left
  early_w &= 1;
  if (!early_w) grid_dep_wait();
  __shared__ float red[NW][NT][32][4];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int gid = lane >> 2, tq = lane & 3;
  int half = hd >> 1;
  int hb = hd >> 4;            // blocks per Q or K head
  int rot = (H + KV) * hb;     // blocks of Q and K heads
  int m = (H + 2 * KV) * hd;   // rows of w
  bool rotated = blockIdx.x < rot;
  int head = 0, f0, ra, rb;
  if (rotated) {
    head = blockIdx.x / hb;
    f0 = (blockIdx.x - head * hb) * 8;  // first pair index j0 of the block
    ra = head * hd + f0 + gid;
    rb = ra + half;
  } else {
    f0 = (blockIdx.x - rot) * 16;  // first feature, counted from V's start
    ra = (H + KV) * hd + f0 + gid;
    rb = ra + 8;
  }
  WRows r = wrows(w, ra, rb, m, k, tq);
  r.load(warp, (k + 31) >> 5, k, tq);
  if (early_w) grid_dep_wait();

  // The epilogue's small inputs (position, slot, inverse frequency of each
  // of this thread's items, numbered as the loops below number them) are
  // loaded now: their latency passes under the weight stream instead of
  // adding a round trip after it. Rotated blocks have NT*64 items, V
  // blocks NT*128, dealt round-robin over the block's threads.
  // With a bias, each item's bias terms too: a rotated pair's two features
  // (b1, b2), a V element's one (b1).
  int pre_pos[EPI], pre_slot[EPI];
  float pre_invf[EPI], pre_b1[EPI], pre_b2[EPI];
#pragma unroll
  for (int it = 0; it < EPI; it++) {
    int idx = threadIdx.x + it * NW * 32;
    int row, i = 0, f1, f2 = 0;
    if (rotated) {
      int t = idx >> 6, l = (idx >> 1) & 31;
      row = t * 8 + (l & 3) * 2 + (idx & 1);
      i = f0 + (l >> 2);
      f1 = head * hd + i;
      f2 = f1 + half;
      if (idx >= NT * 64) row = n;
    } else {
      int t = idx >> 7, l = (idx >> 2) & 31;
      row = t * 8 + (l & 3) * 2 + (idx & 1);
      f1 = (H + KV) * hd + f0 + (l >> 2) + ((idx >> 1) & 1) * 8;
      if (idx >= NT * 128) row = n;
    }
    bool ok = row < n;
    pre_pos[it] = ok && rotated ? pos[row] : 0;
    pre_slot[it] = ok && (!rotated || head >= H) ? slots[row] : 0;
    pre_invf[it] = ok && rotated ? inv_freq[i] : 0.f;
    pre_b1[it] = ok && bias ? bias[f1] : 0.f;
    pre_b2[it] = ok && bias && rotated ? bias[f2] : 0.f;
  }

  float acc[NT][4];
  gemv_steps(r, acc, x, n, k, warp, gid, tq);
  grid_dep_launch();  // every weight is read: the next kernel may launch during the epilogue
  gemv_share(red, acc, warp, lane);
  __syncthreads();
  if (rotated) {
    // One thread per rotate-half pair: (tile t, lane l, x row parity e).
#pragma unroll
    for (int it = 0; it < EPI; it++) {
      int idx = threadIdx.x + it * NW * 32;
      if (idx >= NT * 32 * 2) break;
      int t = idx >> 6, l = (idx >> 1) & 31, e = idx & 1;
      int row = t * 8 + (l & 3) * 2 + e;
      if (row >= n) continue;
      float x1 = round_to<DT_BF16>(gemv_sum(red, t, l, e));
      float x2 = round_to<DT_BF16>(gemv_sum(red, t, l, e + 2));
      if (bias) {
        x1 = round_to<DT_BF16>(x1 + pre_b1[it]);
        x2 = round_to<DT_BF16>(x2 + pre_b2[it]);
      }
      int i = f0 + (l >> 2);
      int p = pre_pos[it];
      if (p < 0) {
        report(err, ERR_POSITION);
        p = 0;
      }
      u16* out = q_out;
      i64 dst = ((i64)row * H + head) * hd;
      if (head >= H) {
        int slot = pre_slot[it];
        if (slot >= num_slots) {
          report(err, ERR_SLOT);
          continue;
        }
        if (slot < 0) continue;
        int blk, off;
        kv_split(slot, bs, blk, off);
        out = kc;
        dst = kv_at(blk, KV, head - H, bs, off, hd);
      }
      float s, c;
      sincosf((float)p * pre_invf[it], &s, &c);
      float y1 = x1 * c - x2 * s;
      float y2 = x2 * c + x1 * s;
      // Q and K rows share this store: the cache is bf16 as Q is (KV_DT
      // above), so for a K row it is kv_store's.
      out[dst + i] = f32_to_bf16(y1);
      out[dst + i + half] = f32_to_bf16(y2);
    }
  } else {
    int vh = f0 / hd, v0 = f0 - vh * hd;  // V head and its first feature in this block
    // One thread per C element, as gemv_bf16; V is stored as projected.
#pragma unroll
    for (int it = 0; it < EPI; it++) {
      int idx = threadIdx.x + it * NW * 32;
      if (idx >= NT * 32 * 4) break;
      int t = idx >> 7, l = (idx >> 2) & 31, e = idx & 3;
      int row = t * 8 + (l & 3) * 2 + (e & 1);
      if (row >= n) continue;
      int slot = pre_slot[it];
      if (slot >= num_slots) {
        report(err, ERR_SLOT);
        continue;
      }
      if (slot < 0) continue;
      int blk, off;
      kv_split(slot, bs, blk, off);
      int i = v0 + (l >> 2) + (e >> 1) * 8;
      float v = gemv_sum(red, t, l, e);
      if (bias) v = round_to<DT_BF16>(v) + pre_b1[it];
      kv_store(vc, kv_at(blk, KV, vh, bs, off, hd) + i, v);
    }
  }
}

// gemv_add_bf16: y[t, o] += sum_k x[t, k] * w[o, k], rounded as gemv_bf16
// then add_rmsnorm's residual add round it (the product to bf16, then the
// sum), so a decode step's O and down projections add into the residual
// stream without a delta buffer and the kernel that would add it.
//   y [n, m] bf16 (read and written);  x [n, k] bf16;  w [m, k] bf16
// grid (ceil(m/16)), block NW*32, as gemv_bf16.
extern "C" __global__ void __launch_bounds__(NW * 32) gemv_add_bf16(u16* y, const u16* x, const u16* w, int n, int m,
                                                                  int k, int early_w) {
  if (!early_w) grid_dep_wait();
  __shared__ float red[NW][NT][32][4];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int gid = lane >> 2, tq = lane & 3;
  int r0 = blockIdx.x * 16;
  WRows r = wrows(w, r0 + gid, r0 + gid + 8, m, k, tq);
  r.load(warp, (k + 31) >> 5, k, tq);
  if (early_w) grid_dep_wait();

  float acc[NT][4];
  gemv_steps(r, acc, x, n, k, warp, gid, tq);
  grid_dep_launch();
  gemv_share(red, acc, warp, lane);
  __syncthreads();
  for (int idx = threadIdx.x; idx < NT * 32 * 4; idx += NW * 32) {
    int t = idx >> 7, l = (idx >> 2) & 31, e = idx & 3;
    int row = t * 8 + (l & 3) * 2 + (e & 1);
    int feat = r0 + (l >> 2) + (e >> 1) * 8;
    if (row < n && feat < m) {
      i64 i = (i64)row * m + feat;
      y[i] = f32_to_bf16(round_to<DT_BF16>(gemv_sum(red, t, l, e)) + bf16_to_f32(y[i]));
    }
  }
}
