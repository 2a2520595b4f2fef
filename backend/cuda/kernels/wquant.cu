// wquant.cu: products against the weight-quantized dtypes of
// backend/wquant.go (AWQ4_G32/G64/G128 and F8_E4M3_ROW), and the FP8
// activation quantizer. Specialised with -DWT=<weight dtype> -DOT=<out
// dtype> -DNT=<8-row tiles of x: awq_mma, f8_mma, awq_dec, f8_dec; 1
// elsewhere>; x is bf16. The FP8 kernels (f8_*) do not depend on WT.
//
// Device layout of AWQ4 (the CUDA backend permutes each row at upload and
// back at read, wquant_layout.go; backend/wquant.go's blocks stay the
// format). A row of k inputs in groups of g keeps its byte count, k/2 +
// 4*(k/g), and is two planes:
//
//	[ nibbles: k/2 bytes, 64 a 128-input chunk | headers: k/g u32 ]
//
// Header j is group j's {f16 scale (low half); f16 zero (high half)}, as
// in the format. Word W_i of chunk c (i = 0..15, inputs 128c + 8i ..
// +7, nibbles in the format's order: nibble p and p+4 are inputs 2p and
// 2p+1 of the word) sits at byte 64c + 4*(tq*Q + q) of the row, where i =
// tq + 4q and Q = min(4, inputs left from 128c / 32): a full chunk stores
// W0 W4 W8 W12 | W1 W5 W9 W13 | W2 .. | W3 .., so the mma lane of
// quad tq reads its four words (inputs 128c + 8tq + 32q) as one 16-byte
// load, and the four lanes of a quad read 64 contiguous bytes of the row
// and of each x row. A last chunk of 32, 64 or 96 inputs (Q = 1..3)
// stores the same words Q to a lane, 4-byte aligned. Rows are 16-byte
// aligned when k/g is a multiple of 4 (a row is 4*(k/g)*(g+8)/8 bytes);
// the kernels fall back to 4-byte loads of the same layout otherwise.
// F8_E4M3_ROW is read in the format's own layout: its rows are 16-byte
// aligned and its values a matrix cuBLASLt reads in place.
#include "mma.cuh"

// Dtype codes of backend/wquant.go (kept equal by TestWQuantCodes).
#define DT_AWQ4_G32 40
#define DT_AWQ4_G64 41
#define DT_AWQ4_G128 42
#define DT_F8ROW 43

#define MAXN 8  // token rows per blockIdx.y of the GEMVs

// AWQ4 values: value = (q - zero) * scale, q the 4-bit code; g = AWQ_G.
#define AWQ_G (WT == DT_AWQ4_G64 ? 64 : (WT == DT_AWQ4_G128 ? 128 : 32))

// awq_row_bytes is the bytes of a row of k inputs (both layouts).
__device__ __forceinline__ i64 awq_row_bytes(int k) { return (i64)(k >> 1) + 4 * (i64)(k / AWQ_G); }

// awq_wofs is the byte offset, in a device row of k inputs, of word w
// (inputs 8w..8w+7): chunk c = w/16, i = w%16 = tq + 4q at 64c +
// 4*(tq*Q + q) (the header comment's layout).
__device__ __forceinline__ int awq_wofs(int w, int k) {
  int c = w >> 4, i = w & 15, Q = min(4, (k >> 5) - 4 * c);
  return 64 * c + 4 * ((i & 3) * Q + (i >> 2));
}

// awq_word decodes word c (inputs 8c..8c+7) of a device row into f32.
// Every word and header is 4-byte aligned on a 4-byte aligned row.
__device__ __forceinline__ void awq_word(const unsigned char* row, int c, int k, float* wv) {
  u32 hdr = *(const u32*)(row + (k >> 1) + 4 * ((8 * c) / AWQ_G));
  float s = f16_to_f32((u16)(hdr & 0xffffu)), z = f16_to_f32((u16)(hdr >> 16));
  u32 q = *(const u32*)(row + awq_wofs(c, k));
#pragma unroll
  for (int p = 0; p < 4; p++) {
    wv[2 * p] = ((float)((q >> (4 * p)) & 15u) - z) * s;
    wv[2 * p + 1] = ((float)((q >> (4 * p + 16)) & 15u) - z) * s;
  }
}

// AWQ_HQ is the groups of a 128-input chunk (1, 2 or 4); the four words a
// lane quad takes of a chunk (awq_quad: word q at inputs 128c + 32q +
// 8tq ..) fall in group q * AWQ_HQ / 4 of it.
#define AWQ_HQ (128 / AWQ_G)

// awq_quadh loads what lane quad tq takes of chunk c (inputs 128c ..) of
// device row `row` (k inputs): wd[q] = word tq + 4q of the chunk (inputs
// 128c + 8tq + 32q .. +7) and hd[j] the header of the chunk's group j
// (word q's is hd[q * AWQ_HQ / 4]). Words past the row's end, their
// headers, and everything when !ok, are zero (they widen to zero).
// v16: the row is 16-byte aligned (a full chunk is then one 16-byte load).
// FULL: every chunk of the row is full and v16 holds (k a multiple of 128
// on a 16-byte aligned row), and chunk c is one of the row's: everything
// is loaded, ok unread (no tests, no zeros).
template <bool FULL>
__device__ __forceinline__ void awq_quadh(const unsigned char* row, int k, int c, int tq, bool ok, bool v16, u32* wd, u32* hd) {
  if (!FULL) {
#pragma unroll
    for (int q = 0; q < 4; q++) wd[q] = 0u;
#pragma unroll
    for (int j = 0; j < AWQ_HQ; j++) hd[j] = 0u;
    if (!ok) return;
  }
  int Q = FULL ? 4 : min(4, (k >> 5) - 4 * c);  // >= 1 for a chunk of the row
  const unsigned char* cp = row + 64 * c + 4 * tq * Q;
  if (FULL || (Q == 4 && v16)) {
    uint4 v = ld_stream16(cp);
    wd[0] = v.x;
    wd[1] = v.y;
    wd[2] = v.z;
    wd[3] = v.w;
  } else {
#pragma unroll
    for (int q = 0; q < 4; q++)
      if (q < Q) wd[q] = ld_stream4(cp + 4 * q);
  }
  // Group j of the chunk covers its inputs from 32 * j * 4 / AWQ_HQ: it
  // exists when Q (the chunk's 32-input quads) exceeds j * 4 / AWQ_HQ.
  const unsigned char* hp = row + (k >> 1) + 4 * AWQ_HQ * c;
#pragma unroll
  for (int j = 0; j < AWQ_HQ; j++)
    if (FULL || j * (4 / AWQ_HQ) < Q) hd[j] = ld_stream4(hp + 4 * j);
}

// awq_quad is awq_quadh with word q's header in hd[q].
__device__ __forceinline__ void awq_quad(const unsigned char* row, int k, int c, int tq, bool ok, bool v16, u32* wd, u32* hd) {
  u32 h[AWQ_HQ];
  awq_quadh<false>(row, k, c, tq, ok, v16, wd, h);
#pragma unroll
  for (int q = 0; q < 4; q++) hd[q] = h[q * AWQ_HQ / 4];
}

__device__ __forceinline__ u32 bf16x2_fma(u32 a, u32 b, u32 c) {
  u32 d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

#define DEC_NW 8  // warps per awq_dec / f8_dec block
#define DEC_U 4   // chunks of weights in flight per warp (awq_dec, f8_dec)

// ld_x16 reads 16 bytes of x (kept in L1: every warp on the same k reads
// them).
__device__ __forceinline__ uint4 ld_x16(const void* p) { return *(const uint4*)p; }

// dec_reduce adds the partial sums of a decode kernel's tile (awq_dec,
// f8_dec) over the kw warps of a block that split its k range (warp =
// ft + kl * fw): with kw > 1 (block-uniform), each warp writes acc to red
// and slice 0 adds the others' in slice order. It returns whether this
// warp stores the tile (slice 0). Every thread of the block calls it.
__device__ __forceinline__ bool dec_reduce(float (*acc)[4], float (*red)[NT * 4][32], int warp, int lane, int ft, int fw, int kl, int kw) {
  if (kw > 1) {
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
      for (int e = 0; e < 4; e++) red[warp][t * 4 + e][lane] = acc[t][e];
    __syncthreads();
    if (kl == 0) {
      for (int j = 1; j < kw; j++) {
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
          for (int e = 0; e < 4; e++) acc[t][e] += red[ft + j * fw][t * 4 + e][lane];
      }
    }
  }
  return kl == 0;
}

__device__ __forceinline__ u32 lop3_and_or(u32 a, u32 b, u32 c) {  // (a & b) | c
  u32 d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

__device__ __forceinline__ u32 bf16x2_of(float v) {  // v rounded to bf16, in both halves
  u32 d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %1;" : "=r"(d) : "f"(v));
  return d;
}

// awq_dec_group widens a header once for all its group's words: s, the
// scale (f32, exact), and nz2 = -(128 + zero) in both bf16 halves (exact
// for 4-bit zeros, integers 0..15).
__device__ __forceinline__ void awq_dec_group(u32 hdr, float& s, u32& nz2) {
  s = f16_to_f32((u16)(hdr & 0xffffu));
  nz2 = bf16x2_of(-(128.f + f16_to_f32((u16)(hdr >> 16))));
}

// awq_dec_word widens word q into four bf16x2 registers of q - zero,
// pair p holding elements 2p (low half) and 2p+1: one lop3 makes 128 + q
// of nibbles p and p + 4 (bf16 0x4300 is 128.0, whose last mantissa bit
// is worth 1) and one fma adds nz2, leaving the small integer q - zero
// exactly. The scale multiplies the group's sums (awq_dec).
__device__ __forceinline__ void awq_dec_word(u32 q, u32 nz2, u32* out) {
#pragma unroll
  for (int p = 0; p < 4; p++) out[p] = bf16x2_fma(lop3_and_or(q >> (4 * p), 0x000F000Fu, 0x43004300u), 0x3F803F80u, nz2);
}

// awq_dec_loop is awq_dec's main loop (the kernel's comment): it adds this
// warp's chunks first + i*kw (i < nc) of rows wa and wb into acc. The
// chunks' raw words and group headers ride a ring of DEC_U slots; a
// header is widened once a group (awq_dec_group), its words only unpacked
// (awq_dec_word, q - zero exactly), and the group's mmas sum into a fresh
// accumulator that the group's scales (rows gid and gid + 8: C elements
// 0-1 and 2-3) then add into acc in f32.
// FULL (awq_quadh's): nothing of a chunk lies past the row's end, so no
// load needs zeros: a load whose value goes unused (a slot or x chunk past
// the warp's last, an x row past n, whose sums land in C columns no one
// stores) reads a valid address instead (the warp's chunk, x row n - 1;
// weight rows past m already read row 0), with no test on the data path.
template <bool FULL>
__device__ __forceinline__ void awq_dec_loop(float (*acc)[4], const u16* x, const unsigned char* wa, const unsigned char* wb, int n, int m, int k, int ra, int rb,
                                             int gid, int tq, int first, int nc, int kw, bool v16, int early) {
  if (FULL && nc == 0) {  // warp-uniform: nothing to add, nothing to load
    if (early) grid_dep_wait();
    return;
  }
  bool oka = FULL || ra < m, okb = FULL || rb < m;
  u32 wra[DEC_U][4], hra[DEC_U][AWQ_HQ], wrb[DEC_U][4], hrb[DEC_U][AWQ_HQ];
#pragma unroll
  for (int u = 0; u < DEC_U; u++) {
    int c = first + (FULL ? min(u, nc - 1) : u) * kw;
    awq_quadh<FULL>(wa, k, c, tq, oka && u < nc, v16, wra[u], hra[u]);
    awq_quadh<FULL>(wb, k, c, tq, okb && u < nc, v16, wrb[u], hrb[u]);
  }
  if (early) grid_dep_wait();
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  // xn: chunk i's x (word q of tile t: xn[t][q]), loaded during chunk i-1.
  uint4 xn[NT][4];
#pragma unroll
  for (int t = 0; t < NT; t++) {
    int row = t * 8 + gid;
    int Q = FULL ? 4 : (nc > 0 ? min(4, (k >> 5) - 4 * first) : 0);
    const u16* xr = x + (i64)(FULL ? min(row, n - 1) : row) * k + 128 * first + 8 * tq;
#pragma unroll
    for (int q = 0; q < 4; q++) xn[t][q] = FULL || (row < n && q < Q) ? ld_x16(xr + 32 * q) : zero;
  }
  for (int i0 = 0; i0 < nc; i0 += DEC_U) {
#pragma unroll
    for (int u = 0; u < DEC_U; u++) {
      int i = i0 + u;
      if (i < nc) {  // warp-uniform
        int c = first + i * kw;
        u32 cwa[4], cha[AWQ_HQ], cwb[4], chb[AWQ_HQ];  // this chunk's raw words and headers, then the slot's next chunk, DEC_U ahead
#pragma unroll
        for (int q = 0; q < 4; q++) {
          cwa[q] = wra[u][q];
          cwb[q] = wrb[u][q];
        }
#pragma unroll
        for (int j = 0; j < AWQ_HQ; j++) {
          cha[j] = hra[u][j];
          chb[j] = hrb[u][j];
        }
        {
          bool more = i + DEC_U < nc;
          int cr = FULL && !more ? c : c + DEC_U * kw;
          awq_quadh<FULL>(wa, k, cr, tq, oka && more, v16, wra[u], hra[u]);
          awq_quadh<FULL>(wb, k, cr, tq, okb && more, v16, wrb[u], hrb[u]);
        }
        uint4 xc[NT][4];
        {
          bool more = i + 1 < nc;
          int cn = FULL && !more ? c : c + kw;
          int Qn = FULL ? 4 : (more ? min(4, (k >> 5) - 4 * cn) : 0);
#pragma unroll
          for (int t = 0; t < NT; t++) {
            int row = t * 8 + gid;
            const u16* xr = x + (i64)(FULL ? min(row, n - 1) : row) * k + 128 * cn + 8 * tq;
#pragma unroll
            for (int q = 0; q < 4; q++) {
              xc[t][q] = xn[t][q];
              xn[t][q] = FULL || (row < n && q < Qn) ? ld_x16(xr + 32 * q) : zero;
            }
          }
        }
#pragma unroll
        for (int j = 0; j < AWQ_HQ; j++) {
          float sa, sb;
          u32 nza, nzb;
          awq_dec_group(cha[j], sa, nza);
          awq_dec_group(chb[j], sb, nzb);
          float g[NT][4];
#pragma unroll
          for (int t = 0; t < NT; t++) g[t][0] = g[t][1] = g[t][2] = g[t][3] = 0.f;
#pragma unroll
          for (int q = j * (4 / AWQ_HQ); q < (j + 1) * (4 / AWQ_HQ); q++) {
            u32 pa[4], pb[4];
            awq_dec_word(cwa[q], nza, pa);
            awq_dec_word(cwb[q], nzb, pb);
#pragma unroll
            for (int t = 0; t < NT; t++) {
              mma16816(g[t], pa[0], pb[0], pa[1], pb[1], xc[t][q].x, xc[t][q].y);
              mma16816(g[t], pa[2], pb[2], pa[3], pb[3], xc[t][q].z, xc[t][q].w);
            }
          }
#pragma unroll
          for (int t = 0; t < NT; t++) {
            acc[t][0] = fmaf(sa, g[t][0], acc[t][0]);
            acc[t][1] = fmaf(sa, g[t][1], acc[t][1]);
            acc[t][2] = fmaf(sb, g[t][2], acc[t][2]);
            acc[t][3] = fmaf(sb, g[t][3], acc[t][3]);
          }
        }
      }
    }
  }
}

// awq_gemv: y[t, o] = sum_k x[t, k] * w[o, k] for the MAXN rows of
// blockIdx.y. One warp per output feature; lanes take consecutive words
// of the row (coalesced), so the packed weight is read once per row tile
// and dequantized in registers.
//   y [n, m] OT;  x [n, k] bf16 (rows 16-byte aligned);  w [m, k] WT
// grid (ceil(m/8), ceil(n/MAXN)), block 256.
extern "C" __global__ void __launch_bounds__(256) awq_gemv(void* y, const u16* x, const unsigned char* w, int n, int m, int k) {
  grid_dep_sync();
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int o = blockIdx.x * 8 + warp;
  if (o >= m) return;
  int t0 = blockIdx.y * MAXN;
  int nt = min(MAXN, n - t0);
  const unsigned char* wr = w + (i64)o * awq_row_bytes(k);
  const u16* xb = x + (i64)t0 * k;
  float acc[MAXN];
#pragma unroll
  for (int t = 0; t < MAXN; t++) acc[t] = 0.f;
  int words = k >> 3;
  for (int c = lane; c < words; c += 32) {
    float wv[8];
    awq_word(wr, c, k, wv);
#pragma unroll
    for (int t = 0; t < MAXN; t++) {
      if (t < nt) {
        uint4 v = *(const uint4*)(xb + (i64)t * k + (i64)c * 8);
        u32 wd[4] = {v.x, v.y, v.z, v.w};
        float s = 0.f;
#pragma unroll
        for (int e = 0; e < 4; e++) {
          s += wv[2 * e] * __uint_as_float(wd[e] << 16);
          s += wv[2 * e + 1] * __uint_as_float(wd[e] & 0xffff0000u);
        }
        acc[t] += s;
      }
    }
  }
#pragma unroll
  for (int t = 0; t < MAXN; t++) {
    if (t < nt) {
      float s = warp_sum(acc[t]);
      if (lane == 0) store_f<OT>(y, (i64)(t0 + t) * m + o, s);
    }
  }
}

// awq_pairs widens AWQ4 word q into four bf16x2 registers, pair p holding
// elements 2p (low half) and 2p+1: one mask makes 128 + q of nibbles p and
// p + 4 (bf16 0x4300 is 128.0, whose last mantissa bit is worth 1), adding nz2 =
// -(128 + zero) leaves q - zero exactly (a small integer), and the
// multiply by s2 (the scale, rounded to bf16) rounds once.
__device__ __forceinline__ void awq_pairs(u32 q, u32 s2, u32 nz2, u32* out) {
#pragma unroll
  for (int p = 0; p < 4; p++) {
    u32 v = ((q >> (4 * p)) & 0x000F000Fu) | 0x43004300u;
    v = bf16x2_fma(v, 0x3F803F80u, nz2);         // * 1.0 + -(128 + zero)
    out[p] = bf16x2_fma(v, s2, 0x80008000u);     // * scale + -0.0
  }
}

// awq_hdr2 turns a header into the bf16x2 pairs awq_pairs takes: the
// scale rounded to bf16 and -(128 + zero), in both halves.
__device__ __forceinline__ void awq_hdr2(u32 hdr, u32& s2, u32& nz2) {
  float s = f16_to_f32((u16)(hdr & 0xffffu)), z = f16_to_f32((u16)(hdr >> 16));
  u32 sb = f32_to_bf16(s), nb = f32_to_bf16(-(128.f + z));
  s2 = sb | (sb << 16);
  nz2 = nb | (nb << 16);
}

// awq_widen turns awq_quad's words and headers into 16 bf16x2 pairs, pair
// 4q + p holding inputs 2p and 2p+1 of word q.
__device__ __forceinline__ void awq_widen(const u32* wd, const u32* hd, u32* out) {
#pragma unroll
  for (int q = 0; q < 4; q++) {
    u32 s2, nz2;
    awq_hdr2(hd[q], s2, nz2);
    awq_pairs(wd[q], s2, nz2, out + 4 * q);
  }
}

#define AWQ_NW 4  // warps per awq_mma / f8_mma block, each owning 16 output features

// awq_mma: y = x . w^T for n <= 8*NT rows on the tensor cores (mma.sync
// m16n8k16, bf16 in, f32 accumulate), w dequantized in registers: the
// product of 17..64 rows (awq_dec takes fewer). A block owns 64 output
// features, 16 per warp (the mma's A rows gid and gid + 8 of each thread),
// and a range of 128-wide k chunks: gridDim.y blocks split k, cps chunks
// each, so that small products still fill the GPU. Each chunk of x is
// staged in shared memory once for the four warps. The k order inside an
// mma is free, so thread (gid, tq) feeds mma 2q + h (h = 0, 1) pairs 4q +
// 2h and 4q + 2h + 1 of its word q (awq_quad: inputs 128c + 8tq + 32q ..)
// in both operands (A: its two weight rows, B: x row t*8 + gid). The raw
// weights of the next chunk are loaded before this chunk's mmas.
//   y [n, m] OT (gridDim.y == 1), else part [gridDim.y][n][m] f32 for
//   wq_reduce;  x [n, k] bf16 (rows 16-byte aligned);  w [m, k] WT (device
//   layout)
// grid (ceil(m/64), splits), block 32*AWQ_NW.
extern "C" __global__ void __launch_bounds__(32 * AWQ_NW) awq_mma(void* y, float* part, const u16* x, const unsigned char* w, int n, int m, int k, int cps) {
  grid_dep_sync();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800  // mma.sync bf16 and fma.bf16x2: the host launches it on sm_80 and later only
  // A 128-wide chunk of each x row (16 uint4) and 4 of padding: the rows
  // are 320 bytes apart, so the two x rows of a quarter warp's 16-byte
  // loads (uint4 4q + tq of rows gid, gid + 1) fall in disjoint banks.
  __shared__ uint4 xs[NT * 8][20];
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, tq = lane & 3;
  int r0 = blockIdx.x * 64 + warp * 16;
  int ra = r0 + gid, rb = r0 + gid + 8;
  i64 rowb = awq_row_bytes(k);
  bool v16 = (((u64)w | (u64)rowb) & 15u) == 0;
  const unsigned char* wa = w + (i64)(ra < m ? ra : 0) * rowb;
  const unsigned char* wb = w + (i64)(rb < m ? rb : 0) * rowb;
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  float acc[NT][4];
#pragma unroll
  for (int t = 0; t < NT; t++) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
  int chunks = (k + 127) >> 7;
  int c0 = blockIdx.y * cps, c1 = min(chunks, c0 + cps);
  u32 ha[4], hb[4], wda[4], wdb[4];
  awq_quad(wa, k, c0, tq, c0 < c1 && ra < m, v16, wda, ha);
  awq_quad(wb, k, c0, tq, c0 < c1 && rb < m, v16, wdb, hb);
  for (int c = c0; c < c1; c++) {
    __syncthreads();  // the previous chunk's fragments are read
    for (int i = threadIdx.x; i < NT * 8 * 16; i += 32 * AWQ_NW) {
      int row = i >> 4, q = i & 15, kk = c * 128 + q * 8;
      xs[row][q] = row < n && kk < k ? *(const uint4*)(x + (i64)row * k + kk) : zero;
    }
    __syncthreads();
    u32 pa[16], pb[16];
    awq_widen(wda, ha, pa);
    awq_widen(wdb, hb, pb);
    awq_quad(wa, k, c + 1, tq, c + 1 < c1 && ra < m, v16, wda, ha);
    awq_quad(wb, k, c + 1, tq, c + 1 < c1 && rb < m, v16, wdb, hb);
#pragma unroll
    for (int t = 0; t < NT; t++) {
#pragma unroll
      for (int q = 0; q < 4; q++) {
        uint4 v = xs[t * 8 + gid][4 * q + tq];  // inputs 128c + 32q + 8tq ..
        mma16816(acc[t], pa[4 * q], pb[4 * q], pa[4 * q + 1], pb[4 * q + 1], v.x, v.y);
        mma16816(acc[t], pa[4 * q + 2], pb[4 * q + 2], pa[4 * q + 3], pb[4 * q + 3], v.z, v.w);
      }
    }
  }
  // C element e: feature r0 + gid + (e/2)*8, x row t*8 + tq*2 + e%2.
#pragma unroll
  for (int t = 0; t < NT; t++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      int f = r0 + gid + (e >> 1) * 8, row = t * 8 + tq * 2 + (e & 1);
      if (f < m && row < n) {
        if (gridDim.y == 1) store_f<OT>(y, (i64)row * m + f, acc[t][e]);
        else part[((i64)blockIdx.y * n + row) * m + f] = acc[t][e];
      }
    }
  }
#endif
}

// awq_dec: y = x . w^T for n <= 8*NT rows (NT 1 or 2: the decode product)
// on the tensor cores, w streamed with DEC_U chunks in flight per warp and
// no block barrier in the loop. A block is DEC_NW warps: kw of them (kw
// divides DEC_NW) split the block's k range, chunk by chunk (warp slice kl
// = warp / fw takes chunks c0 + kl, c0 + kl + kw, ..), and fw = DEC_NW/kw
// own 16 output features each (tile ft = warp % fw); the kw partial sums
// of a tile are added in shared memory at the end, in slice order
// (dec_reduce). gridDim.y blocks split k as in awq_mma (cps chunks each).
// Lane (gid, tq) of a warp holds A rows gid and gid + 8 of its tile and,
// per chunk c, awq_quadh's four words of each (one 16-byte load each on a
// 16-byte aligned row) and the chunk's group headers; word q's inputs
// 128c + 32q + 8tq .. +7 meet the same inputs of x row t*8 + gid (one
// 16-byte load, from L1 or L2), two mmas a word, so the four lanes of a
// quad read 64 contiguous bytes of each weight and x row. The mma's
// weights are q - zero (exact in bf16) and each group's sums are scaled
// in f32 (awq_dec_loop). x's loads of a chunk are issued one chunk ahead.
// early: no kernel writes w, so the first DEC_U chunks are loaded before
// griddepcontrol.wait (the kernel is launched with PDL behind the norm).
//   y [n, m] OT (gridDim.y == 1), else part [gridDim.y][n][m] f32 for
//   wq_reduce;  x [n, k] bf16 (rows 16-byte aligned);  w [m, k] WT (device
//   layout)
// grid (ceil(m/(16*fw)), splits), block 32*DEC_NW.
// Two blocks an SM where the registers allow it (one 8-row tile, groups
// of 64 or 128: group 32 keeps four headers a chunk in flight).
extern "C" __global__ void __launch_bounds__(32 * DEC_NW, NT == 1 && AWQ_G != 32 ? 2 : 1) awq_dec(void* y, float* part, const u16* x, const unsigned char* w, int n, int m, int k, int cps, int kw, int early) {
  if (!early) grid_dep_wait();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && NT <= 2  // mma.sync bf16 and fma.bf16x2: the host launches it on sm_80 and later only, NT 1 or 2
  __shared__ float red[DEC_NW][NT * 4][32];  // the slices' partial sums, lane-major (no bank conflicts)
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, tq = lane & 3;
  int fw = DEC_NW / kw, ft = warp % fw, kl = warp / fw;
  int r0 = (blockIdx.x * fw + ft) * 16;
  int ra = r0 + gid, rb = r0 + gid + 8;
  i64 rowb = awq_row_bytes(k);
  bool v16 = (((u64)w | (u64)rowb) & 15u) == 0;
  const unsigned char* wa = w + (i64)(ra < m ? ra : 0) * rowb;
  const unsigned char* wb = w + (i64)(rb < m ? rb : 0) * rowb;
  int chunks = (k + 127) >> 7;
  int c0 = blockIdx.y * cps, c1 = min(chunks, c0 + cps);
  int first = c0 + kl;  // this warp's chunks: first + i*kw, i < nc
  int nc = first < c1 ? (c1 - first + kw - 1) / kw : 0;
  float acc[NT][4];
#pragma unroll
  for (int t = 0; t < NT; t++) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
  if (v16 && (k & 127) == 0) awq_dec_loop<true>(acc, x, wa, wb, n, m, k, ra, rb, gid, tq, first, nc, kw, v16, early);
  else awq_dec_loop<false>(acc, x, wa, wb, n, m, k, ra, rb, gid, tq, first, nc, kw, v16, early);
  grid_dep_launch();
  if (!dec_reduce(acc, red, warp, lane, ft, fw, kl, kw)) return;
  // C element e: feature r0 + gid + (e/2)*8, x row t*8 + tq*2 + e%2.
#pragma unroll
  for (int t = 0; t < NT; t++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      int f = r0 + gid + (e >> 1) * 8, row = t * 8 + tq * 2 + (e & 1);
      if (f < m && row < n) {
        if (gridDim.y == 1) store_f<OT>(y, (i64)row * m + f, acc[t][e]);
        else part[((i64)blockIdx.y * n + row) * m + f] = acc[t][e];
      }
    }
  }
#else
  if (early) grid_dep_wait();
  grid_dep_launch();
#endif
}

// wq_reduce: y = the sum of the splits' partial products, in split order.
//   y [n, m] OT;  part [splits][n][m] f32
extern "C" __global__ void wq_reduce(void* y, const float* part, int splits, int n, int m) {
  grid_dep_sync();
  i64 total = (i64)n * m;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
    float v = 0.f;
    for (int s = 0; s < splits; s++) v += part[s * total + i];
    store_f<OT>(y, i, v);
  }
}

// awq_dequant: dst = bf16(dequant(w)), for products of more rows, which
// then run through cuBLASLt. One thread per 8-value word.
//   dst [m, k] bf16 (16-byte aligned);  w [m, k] WT
extern "C" __global__ void awq_dequant(u16* dst, const unsigned char* w, int m, int k) {
  grid_dep_sync();
  int words = k >> 3;
  i64 total = (i64)m * words;
  i64 rb = awq_row_bytes(k);
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
    i64 r = i / words;
    int c = (int)(i - r * words);
    float wv[8];
    awq_word(w + r * rb, c, k, wv);
    uint4 v;
    v.x = pack_bf16x2(wv[0], wv[1]);
    v.y = pack_bf16x2(wv[2], wv[3]);
    v.z = pack_bf16x2(wv[4], wv[5]);
    v.w = pack_bf16x2(wv[6], wv[7]);
    *(uint4*)(dst + r * k + (i64)c * 8) = v;
  }
}

// e4m3fn codes. f32_to_e4m3 is backend.F32ToE4M3 exactly: round to
// nearest even, magnitudes at or past 448 saturate to 448, NaN is 0x7F.
__device__ __forceinline__ u32 f32_to_e4m3(float f) {
  u32 bits = __float_as_uint(f);
  u32 sign = (bits >> 24) & 0x80u;
  float a = fabsf(f);
  if (a != a) return 0x7Fu;
  if (a >= 448.f) return sign | 0x7Eu;
  if (a < 0.015625f) return sign | (u32)__float2int_rn(a * 512.f);  // subnormals: steps of 2^-9, exact scaling
  u32 ab = __float_as_uint(a);
  int e = (int)(ab >> 23) - 127 + 7;  // e4m3's biased exponent, 1..15
  u32 man = ab & 0x7fffffu;
  u32 q = man >> 20, rem = man & 0xfffffu;
  if (rem > 0x80000u || (rem == 0x80000u && (q & 1u))) q++;
  if (q == 8u) {
    q = 0u;
    e++;
  }
  u32 code = ((u32)e << 3) | q;
  return sign | (code > 0x7Eu ? 0x7Eu : code);
}

// e4m3_to_f32 decodes a code; 0x7F/0xFF (NaN) decode as 480, since no
// code this file or the loader writes is NaN.
__device__ __forceinline__ float e4m3_to_f32(u32 b) {
  u32 e = (b >> 3) & 15u, m = b & 7u;
  float v = e ? __uint_as_float(((e + 120u) << 23) | (m << 20)) : (float)m * (1.f / 512.f);
  return __uint_as_float(__float_as_uint(v) | ((b & 0x80u) << 24));
}

// f8_act_quant: per row t, s = max|x[t]| / 448 (1 for a row of zeros or
// with an infinity; NaN ignored), xq[t, i] = e4m3(x[t, i] * (1/s)),
// sx[t] = s: backend.QuantizeActE4M3 on the bf16 values.
// Each thread takes 8 values at a time (one 16-byte load, one 8-byte
// store): k is a multiple of 16 (F8_E4M3_ROW's rows).
//   xq [n, k] e4m3 (rows 8-byte aligned);  sx [n] f32;  x [n, k] bf16
//   (rows 16-byte aligned)
// grid (n), block 256.
extern "C" __global__ void __launch_bounds__(256) f8_act_quant(unsigned char* xq, float* sx, const u16* x, int n, int k) {
  grid_dep_sync();
  __shared__ float scratch[32];
  int t = blockIdx.x;
  const uint4* xr = (const uint4*)(x + (i64)t * k);
  int k8 = k >> 3;
  float amax = 0.f;
  for (int i = threadIdx.x; i < k8; i += blockDim.x) {
    uint4 v = xr[i];
    u32 wd[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int e = 0; e < 4; e++) {  // word e: values 2e (low half) and 2e+1
      amax = fmaxf(amax, fabsf(__uint_as_float(wd[e] << 16)));
      amax = fmaxf(amax, fabsf(__uint_as_float(wd[e] & 0xffff0000u)));
    }
  }
  amax = warp_max(amax);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = amax;
  __syncthreads();
  amax = (threadIdx.x & 31) < (blockDim.x >> 5) ? scratch[threadIdx.x & 31] : 0.f;
  amax = warp_max(amax);
  float s = (amax == 0.f || __float_as_uint(amax) == 0x7f800000u) ? 1.f : amax / 448.f;  // amax >= 0: +inf's bits
  float inv = 1.f / s;
  uint2* qr = (uint2*)(xq + (i64)t * k);
  for (int i = threadIdx.x; i < k8; i += blockDim.x) {
    uint4 v = xr[i];
    u32 wd[4] = {v.x, v.y, v.z, v.w}, c[2] = {0u, 0u};
#pragma unroll
    for (int e = 0; e < 4; e++) {  // values 2e, 2e+1: bytes 2e, 2e+1 of the 8 codes
      c[e >> 1] |= f32_to_e4m3(__uint_as_float(wd[e] << 16) * inv) << (16 * (e & 1));
      c[e >> 1] |= f32_to_e4m3(__uint_as_float(wd[e] & 0xffff0000u) * inv) << (16 * (e & 1) + 8);
    }
    qr[i] = make_uint2(c[0], c[1]);
  }
  if (threadIdx.x == 0) sx[t] = s;
}

// f8_row_scale is the f32 scale in the trailer of F8_E4M3_ROW row o.
__device__ __forceinline__ float f8_row_scale(const unsigned char* w, int o, int k) {
  return *(const float*)(w + (i64)o * (k + 16) + k);
}

// f8_gemv: y[t, o] = (sum_k e4m3(xq[t, k]) * e4m3(w[o, k])) * sx[t] *
// scale[o] for the MAXN rows of blockIdx.y. One warp per output feature,
// lanes over 16-byte chunks of the row.
//   y [n, m] OT;  xq [n, k] e4m3, sx [n] f32;  w [m, k] F8_E4M3_ROW (k % 16 == 0)
// grid (ceil(m/8), ceil(n/MAXN)), block 256.
extern "C" __global__ void __launch_bounds__(256) f8_gemv(void* y, const unsigned char* xq, const float* sx, const unsigned char* w, int n, int m, int k) {
  grid_dep_sync();
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int o = blockIdx.x * 8 + warp;
  if (o >= m) return;
  int t0 = blockIdx.y * MAXN;
  int nt = min(MAXN, n - t0);
  const unsigned char* wr = w + (i64)o * (k + 16);
  float acc[MAXN];
#pragma unroll
  for (int t = 0; t < MAXN; t++) acc[t] = 0.f;
  int chunks = k >> 4;
  for (int c = lane; c < chunks; c += 32) {
    uint4 wq = *(const uint4*)(wr + (i64)c * 16);
    u32 wd[4] = {wq.x, wq.y, wq.z, wq.w};
    float wv[16];
#pragma unroll
    for (int e = 0; e < 16; e++) wv[e] = e4m3_to_f32((wd[e >> 2] >> (8 * (e & 3))) & 0xffu);
#pragma unroll
    for (int t = 0; t < MAXN; t++) {
      if (t < nt) {
        uint4 xv = *(const uint4*)(xq + (i64)(t0 + t) * k + (i64)c * 16);
        u32 xd[4] = {xv.x, xv.y, xv.z, xv.w};
        float s = 0.f;
#pragma unroll
        for (int e = 0; e < 16; e++) s += wv[e] * e4m3_to_f32((xd[e >> 2] >> (8 * (e & 3))) & 0xffu);
        acc[t] += s;
      }
    }
  }
  float sw = f8_row_scale(w, o, k);
#pragma unroll
  for (int t = 0; t < MAXN; t++) {
    if (t < nt) {
      float s = warp_sum(acc[t]);
      if (lane == 0) store_f<OT>(y, (i64)(t0 + t) * m + o, s * sx[t0 + t] * sw);
    }
  }
}

__device__ __forceinline__ void mma16832_e4m3(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// f8_mma: f8_gemv's product for n <= 8*NT rows on the FP8 tensor cores
// (mma.sync m16n8k32 e4m3, f32 accumulate; sm_89 and later): the codes go
// into the mma as stored and the scales multiply the sums. Blocks, k
// splits and the shared x chunk as in awq_mma; thread (gid, tq) loads 32
// contiguous codes 32tq .. of the chunk of its two weight rows and of x
// row t*8 + gid, and mma j takes their words 2j (logical k 4tq..4tq+3) and
// 2j + 1 (logical 4tq+16..+19), alike in A and B. m16n8k32's fragments:
// A a0 (row gid, k 4tq..+3), a1 (row gid+8, same), a2/a3 (k 4tq+16..+19);
// B b0 (k 4tq..+3, col gid), b1 (k 4tq+16..+19); C as m16n8k16's.
//   y [n, m] OT (gridDim.y == 1; scaled), else part [gridDim.y][n][m] f32
//   (unscaled, for f8_epilogue_parts);  xq [n, k] e4m3, sx [n] f32;
//   w [m, k] F8_E4M3_ROW
// grid (ceil(m/64), splits), block 32*AWQ_NW.
extern "C" __global__ void __launch_bounds__(32 * AWQ_NW) f8_mma(void* y, float* part, const unsigned char* xq, const float* sx, const unsigned char* w, int n, int m, int k, int cps) {
  grid_dep_sync();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890  // e4m3 mma.sync: the host launches it on sm_89 and later only
  __shared__ uint4 xs[NT * 8][9];  // a 128-code chunk of each x row (8 uint4) and one of padding
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, tq = lane & 3;
  int r0 = blockIdx.x * 64 + warp * 16;
  int ra = r0 + gid, rb = r0 + gid + 8;
  const unsigned char* wa = w + (i64)(ra < m ? ra : 0) * (k + 16);
  const unsigned char* wb = w + (i64)(rb < m ? rb : 0) * (k + 16);
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  float acc[NT][4];
#pragma unroll
  for (int t = 0; t < NT; t++) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
  int chunks = (k + 127) >> 7;
  int c0 = blockIdx.y * cps, c1 = min(chunks, c0 + cps);
  // k is a multiple of 16: each 16-code half of a thread's 32 is wholly
  // in or out.
  uint4 a0, a1, b0, b1;
  {
    int kk = c0 * 128 + tq * 32;
    bool in0 = c0 < c1 && kk < k, in1 = c0 < c1 && kk + 16 < k;
    a0 = in0 && ra < m ? *(const uint4*)(wa + kk) : zero;
    a1 = in1 && ra < m ? *(const uint4*)(wa + kk + 16) : zero;
    b0 = in0 && rb < m ? *(const uint4*)(wb + kk) : zero;
    b1 = in1 && rb < m ? *(const uint4*)(wb + kk + 16) : zero;
  }
  for (int c = c0; c < c1; c++) {
    __syncthreads();  // the previous chunk's fragments are read
    for (int i = threadIdx.x; i < NT * 8 * 8; i += 32 * AWQ_NW) {
      int row = i >> 3, q = i & 7, kk = c * 128 + q * 16;
      xs[row][q] = row < n && kk < k ? *(const uint4*)(xq + (i64)row * k + kk) : zero;
    }
    __syncthreads();
    u32 pa[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
    u32 pb[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
    {
      int kk = (c + 1) * 128 + tq * 32;
      bool n0 = c + 1 < c1 && kk < k, n1 = c + 1 < c1 && kk + 16 < k;
      a0 = n0 && ra < m ? *(const uint4*)(wa + kk) : zero;
      a1 = n1 && ra < m ? *(const uint4*)(wa + kk + 16) : zero;
      b0 = n0 && rb < m ? *(const uint4*)(wb + kk) : zero;
      b1 = n1 && rb < m ? *(const uint4*)(wb + kk + 16) : zero;
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
      uint4 x0 = xs[t * 8 + gid][tq * 2], x1 = xs[t * 8 + gid][tq * 2 + 1];
      u32 xp[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
      for (int j = 0; j < 4; j++) mma16832_e4m3(acc[t], pa[2 * j], pb[2 * j], pa[2 * j + 1], pb[2 * j + 1], xp[2 * j], xp[2 * j + 1]);
    }
  }
#pragma unroll
  for (int t = 0; t < NT; t++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      int f = r0 + gid + (e >> 1) * 8, row = t * 8 + tq * 2 + (e & 1);
      if (f < m && row < n) {
        if (gridDim.y == 1) store_f<OT>(y, (i64)row * m + f, acc[t][e] * sx[row] * f8_row_scale(w, f, k));
        else part[((i64)blockIdx.y * n + row) * m + f] = acc[t][e];
      }
    }
  }
#endif
}

// f8_dec: f8_mma's product for n <= 8*NT rows (NT 1 or 2: the decode
// product), structured as awq_dec: DEC_NW warps a block, kw of them
// splitting the block's k range chunk by chunk and fw = DEC_NW/kw owning
// 16 output features each, partial sums added in shared memory at the end
// (dec_reduce);
// gridDim.y blocks split k (cps chunks each). A chunk is 64 codes: lane
// (gid, tq) loads the 16 codes 64c + 16tq .. of its two weight rows (one
// 16-byte load each, DEC_U chunks in flight, rows 16-byte aligned: k + 16
// bytes apart) and of x row t*8 + gid (one chunk ahead, from L1 or L2);
// mma h (0, 1) takes their words 2h (logical k 4tq..4tq+3) and 2h + 1
// (logical 4tq+16..+19), alike in A and B (f8_mma's fragments). k is a
// multiple of 16: each lane's 16 codes are wholly in or out.
// early: as awq_dec's.
//   y [n, m] OT (gridDim.y == 1; scaled), else part [gridDim.y][n][m] f32
//   (unscaled, for f8_epilogue_parts);  xq [n, k] e4m3, sx [n] f32;
//   w [m, k] F8_E4M3_ROW
// grid (ceil(m/(16*fw)), splits), block 32*DEC_NW.
extern "C" __global__ void __launch_bounds__(32 * DEC_NW, 2) f8_dec(void* y, float* part, const unsigned char* xq, const float* sx, const unsigned char* w, int n, int m, int k, int cps, int kw, int early) {
  if (!early) grid_dep_wait();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890 && NT <= 2  // e4m3 mma.sync: the host launches it on sm_89 and later only, NT 1 or 2
  __shared__ float red[DEC_NW][NT * 4][32];
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, tq = lane & 3;
  int fw = DEC_NW / kw, ft = warp % fw, kl = warp / fw;
  int r0 = (blockIdx.x * fw + ft) * 16;
  int ra = r0 + gid, rb = r0 + gid + 8;
  const unsigned char* wa = w + (i64)(ra < m ? ra : 0) * (k + 16) + 16 * tq;
  const unsigned char* wb = w + (i64)(rb < m ? rb : 0) * (k + 16) + 16 * tq;
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  int chunks = (k + 63) >> 6;
  int c0 = blockIdx.y * cps, c1 = min(chunks, c0 + cps);
  int first = c0 + kl;
  int nc = first < c1 ? (c1 - first + kw - 1) / kw : 0;
  uint4 ra_[DEC_U], rb_[DEC_U];
#pragma unroll
  for (int u = 0; u < DEC_U; u++) {
    int kk = 64 * (first + u * kw) + 16 * tq;
    bool in = u < nc && kk < k;
    ra_[u] = in && ra < m ? ld_stream16(wa + 64 * (first + u * kw)) : zero;
    rb_[u] = in && rb < m ? ld_stream16(wb + 64 * (first + u * kw)) : zero;
  }
  if (early) grid_dep_wait();
  float acc[NT][4];
#pragma unroll
  for (int t = 0; t < NT; t++) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
  uint4 xn[NT];
#pragma unroll
  for (int t = 0; t < NT; t++) {
    int row = t * 8 + gid, kk = 64 * first + 16 * tq;
    xn[t] = row < n && nc > 0 && kk < k ? ld_x16(xq + (i64)row * k + kk) : zero;
  }
  for (int i0 = 0; i0 < nc; i0 += DEC_U) {
#pragma unroll
    for (int u = 0; u < DEC_U; u++) {
      int i = i0 + u;
      if (i < nc) {  // warp-uniform
        int c = first + i * kw;
        uint4 a = ra_[u], b = rb_[u];
        {
          int cn = c + DEC_U * kw, kk = 64 * cn + 16 * tq;
          bool in = i + DEC_U < nc && kk < k;
          ra_[u] = in && ra < m ? ld_stream16(wa + 64 * cn) : zero;
          rb_[u] = in && rb < m ? ld_stream16(wb + 64 * cn) : zero;
        }
        uint4 xc[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) {
          int row = t * 8 + gid, kk = 64 * (c + kw) + 16 * tq;
          xc[t] = xn[t];
          xn[t] = row < n && i + 1 < nc && kk < k ? ld_x16(xq + (i64)row * k + kk) : zero;
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
          mma16832_e4m3(acc[t], a.x, b.x, a.y, b.y, xc[t].x, xc[t].y);
          mma16832_e4m3(acc[t], a.z, b.z, a.w, b.w, xc[t].z, xc[t].w);
        }
      }
    }
  }
  grid_dep_launch();
  if (!dec_reduce(acc, red, warp, lane, ft, fw, kl, kw)) return;
#pragma unroll
  for (int t = 0; t < NT; t++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      int f = r0 + gid + (e >> 1) * 8, row = t * 8 + tq * 2 + (e & 1);
      if (f < m && row < n) {
        if (gridDim.y == 1) store_f<OT>(y, (i64)row * m + f, acc[t][e] * sx[row] * f8_row_scale(w, f, k));
        else part[((i64)blockIdx.y * n + row) * m + f] = acc[t][e];
      }
    }
  }
#else
  if (early) grid_dep_wait();
  grid_dep_launch();
#endif
}

// f8_epilogue_parts: y[t, o] = (the sum of the splits' partial sums, in
// split order) * sx[t] * scale[o].
//   y [n, m] OT;  part [splits][n][m] f32;  sx [n] f32;  w [m, k] F8_E4M3_ROW
extern "C" __global__ void f8_epilogue_parts(void* y, const float* part, int splits, const float* sx, const unsigned char* w, int n, int m, int k) {
  grid_dep_sync();
  i64 total = (i64)n * m;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
    i64 t = i / m;
    int o = (int)(i - t * m);
    float v = 0.f;
    for (int s = 0; s < splits; s++) v += part[s * total + i];
    store_f<OT>(y, i, v * sx[t] * f8_row_scale(w, o, k));
  }
}

// F8_EPI_ROWS is how many rows of acc one f8_epilogue thread scales.
#define F8_EPI_ROWS 16

// f8_epilogue: y[t, o] = acc[t, o] * sx[t] * scale[o], the scales of an
// FP8 GEMM whose product of codes (acc, f32) ran without them. Thread o
// of the grid's x owns output feature o: it reads its weight row's scale
// (a trailer k + 16 bytes from the next row's) once, then F8_EPI_ROWS
// rows of blockIdx.y, so a warp's loads and stores are consecutive
// features of one row.
//   y [n, m] OT;  acc [n, m] f32;  sx [n] f32;  w [m, k] F8_E4M3_ROW
// grid (ceil(m/256), ceil(n/F8_EPI_ROWS)), block 256.
extern "C" __global__ void __launch_bounds__(256) f8_epilogue(void* y, const float* acc, const float* sx, const unsigned char* w, int n, int m, int k) {
  grid_dep_sync();
  int o = blockIdx.x * blockDim.x + threadIdx.x;
  if (o >= m) return;
  float sw = f8_row_scale(w, o, k);
  int t0 = blockIdx.y * F8_EPI_ROWS, t1 = min(n, t0 + F8_EPI_ROWS);
  for (int t = t0; t < t1; t++) {
    i64 i = (i64)t * m + o;
    store_f<OT>(y, i, acc[i] * sx[t] * sw);
  }
}

// f8_row_scales: sw[o] = the scale in the trailer of row o, the weight's
// scales as one vector (cuBLASLt's outer-vector scale of the weight's
// rows, which it cannot read k + 16 bytes apart).
//   sw [m] f32;  w [m, k] F8_E4M3_ROW
extern "C" __global__ void f8_row_scales(float* sw, const unsigned char* w, int m, int k) {
  grid_dep_sync();
  for (int o = blockIdx.x * blockDim.x + threadIdx.x; o < m; o += gridDim.x * blockDim.x) sw[o] = f8_row_scale(w, o, k);
}

// f8_codes: dst[r, i] = bf16(e4m3(src[r * ld + i])), the codes without
// their scales (exact in bf16: 4 significant bits), for devices without
// FP8 GEMMs, whose BF16 GEMM of codes then equals the FP8 one.
//   dst [rows, k] bf16;  src rows of ld bytes
extern "C" __global__ void f8_codes(u16* dst, const unsigned char* src, int rows, int k, int ld) {
  grid_dep_sync();
  i64 total = (i64)rows * k;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
    i64 r = i / k;
    int j = (int)(i - r * k);
    dst[i] = f32_to_bf16(e4m3_to_f32(src[r * ld + j]));
  }
}
