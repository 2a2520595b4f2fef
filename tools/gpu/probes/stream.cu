// stream.cu: how fast can a decode product stream its weight on this GPU,
// and by which transport? A standalone probe (nvcc on the GPU machine; the
// backend compiles its kernels with NVRTC instead), timing with CUDA
// events, weights cycled through enough copies to defeat the L2.
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -I backend/cuda/kernels \
//     -DNT=1 -DNW=8 -DUR=2 -DOT=DT_BF16 -DNP=0 \
//     -o /tmp/stream tools/gpu/probes/stream.cu -lcuda && /tmp/stream
//
// Variants:
//   flat      every thread loads 16-byte words, grid-stride (LSU, no pattern)
//   bulkflat  one thread per block keeps S contiguous bulk copies in flight
//   bulkrows  a block owns 16 weight rows; each stage is one bulk copy per row
//   tma2d     the same stage as one 2D tensor copy (box 16 rows x CK cols)
//   gemv      kernels/gemv.cu's gemv_bf16 (the backend's decode GEMV)
//   gemvtma   16 rows a block, TMA 2D stages, consumer warps multiplying
//   gemvtma2  the same, persistent (grid = what fits at once)
//   gemvbulk  gemvtma2 with one 1D bulk copy per row and stage: the design
//             of backend/cuda/kernels/gemv_bulk.cu
// (Call 3 of the eighth session also ran gemvtma2 releasing each stage
// before its mmas, with two accumulator chains: no faster; that variant
// is in this file as of commit facceac.)
// Products: O [4096 x 4096], down [4096 x 14336], gate/up [28672 x 4096].
#include <cuda.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <vector>

#include "gemv.cu"

#define CK(x)                                                                  \
  do {                                                                         \
    CUresult r_ = (x);                                                         \
    if (r_ != CUDA_SUCCESS) {                                                  \
      const char* s_;                                                          \
      cuGetErrorString(r_, &s_);                                               \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, s_);          \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)
#define RT(x)                                                                  \
  do {                                                                         \
    cudaError_t e_ = (x);                                                      \
    if (e_ != cudaSuccess) {                                                   \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_expect(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
  asm volatile(
      "{ .reg .pred p; W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1; @!p bra W; }" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void bulk_g2s(u32 dst, const void* src, u32 bytes, u32 bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void tma2d_g2s(u32 dst, const CUtensorMap* map, int c0, int c1, u32 bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          dst),
      "l"(map), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

// flat: grid-stride 16-byte loads, 8 in flight per thread.
__global__ void flat(const uint4* p, long long n16, unsigned* out) {
  unsigned acc = 0;
  long long stride = (long long)gridDim.x * blockDim.x;
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 7 * stride < n16; i += 8 * stride) {
    uint4 v[8];
#pragma unroll
    for (int u = 0; u < 8; u++) v[u] = ld_stream((const u16*)(p + i + u * stride));
#pragma unroll
    for (int u = 0; u < 8; u++) acc ^= v[u].x + v[u].y + v[u].z + v[u].w;
  }
  if (acc == 0x9e3779b9u) out[0] = acc;
}

// bulkflat: block b streams bytes [b*per, (b+1)*per) in chunks of C bytes,
// S in flight, one thread, nothing read from shared memory.
template <int S>
__global__ void bulkflat(const char* p, long long per, int C, unsigned* out) {
  extern __shared__ __align__(128) char sm[];
  __shared__ __align__(8) unsigned long long bar[S];
  if (threadIdx.x != 0) return;
  for (int s = 0; s < S; s++) mbar_init(smem_u32(&bar[s]), 1);
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  const char* base = p + (long long)blockIdx.x * per;
  int chunks = (int)(per / C);
  for (int i = 0; i < chunks + S; i++) {
    int s = i % S;
    if (i >= S) mbar_wait(smem_u32(&bar[s]), ((i - S) / S) & 1);
    if (i < chunks) {
      mbar_expect(smem_u32(&bar[s]), C);
      bulk_g2s(smem_u32(sm + s * C), base + (long long)i * C, C, smem_u32(&bar[s]));
    }
  }
  if (sm[0] == 123 && sm[1] == 45) out[0] = 1;
}

// bulkrows: block b owns rows 16b..16b+15 of w [m, k]; stage i is columns
// [i*CKC, (i+1)*CKC) of each row, one bulk copy per row; producer only.
template <int S>
__global__ void bulkrows(const u16* w, int m, int k, int CKC, unsigned* out) {
  extern __shared__ __align__(128) char sm[];
  __shared__ __align__(8) unsigned long long bar[S];
  if (threadIdx.x != 0) return;
  for (int s = 0; s < S; s++) mbar_init(smem_u32(&bar[s]), 1);
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  int r0 = blockIdx.x * 16;
  int stages = k / CKC;
  u32 bytes = CKC * 2;
  for (int i = 0; i < stages + S; i++) {
    int s = i % S;
    if (i >= S) mbar_wait(smem_u32(&bar[s]), ((i - S) / S) & 1);
    if (i < stages) {
      mbar_expect(smem_u32(&bar[s]), 16 * bytes);
      for (int r = 0; r < 16; r++)
        bulk_g2s(smem_u32(sm + (s * 16 + r) * bytes), w + (long long)(r0 + r) * k + (long long)i * CKC, bytes,
                 smem_u32(&bar[s]));
    }
  }
  if (sm[0] == 123 && sm[1] == 45) out[0] = 1;
}

// tma2d: as bulkrows, each stage one 2D box {box cols, 16 rows} per box
// (CKC / boxc boxes).
template <int S>
__global__ void tma2d(const __grid_constant__ CUtensorMap map, int m, int k, int CKC, int boxc, unsigned* out) {
  extern __shared__ __align__(1024) char sm[];
  __shared__ __align__(8) unsigned long long bar[S];
  if (threadIdx.x != 0) return;
  for (int s = 0; s < S; s++) mbar_init(smem_u32(&bar[s]), 1);
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  int r0 = blockIdx.x * 16;
  int stages = k / CKC;
  u32 bytes = CKC * 2 * 16;
  for (int i = 0; i < stages + S; i++) {
    int s = i % S;
    if (i >= S) mbar_wait(smem_u32(&bar[s]), ((i - S) / S) & 1);
    if (i < stages) {
      mbar_expect(smem_u32(&bar[s]), bytes);
      for (int c = 0; c < CKC; c += boxc)
        tma2d_g2s(smem_u32(sm + s * bytes + c * 2 * 16), &map, i * CKC + c, r0, smem_u32(&bar[s]));
    }
  }
  if (sm[0] == 123 && sm[1] == 45) out[0] = 1;
}

// gemvtma: y = x . w^T for n <= 8 rows of x, 16 weight rows a block, the
// weight streamed by a producer warp as 2D boxes {boxc cols, 16 rows}
// (CKC columns a stage) into an S-stage ring; CW consumer warps multiply
// (mma.sync, the k split of gemv.cu: warp c takes spans c, c+CW, ... of a
// stage) and release the stage. Shared layout of a box: 16 rows of boxc
// bf16, row-major (no swizzle).
template <int S, int CW, int CKC>
__global__ void __launch_bounds__((CW + 1) * 32) gemvtma(const __grid_constant__ CUtensorMap map, u16* y,
                                                         const u16* x, int n, int m, int k, int boxc) {
  extern __shared__ __align__(1024) char sm[];
  __shared__ __align__(8) unsigned long long full[S], empty[S];
  __shared__ float red[CW][32][4];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int gid = lane >> 2, tq = lane & 3;
  int r0 = blockIdx.x * 16;
  int stages = k / CKC;
  u32 bytes = CKC * 2 * 16;
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; s++) {
      mbar_init(smem_u32(&full[s]), 1);
      mbar_init(smem_u32(&empty[s]), CW);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (warp == CW) {
    if (lane == 0) {
      for (int i = 0; i < stages; i++) {
        int s = i % S;
        if (i >= S) mbar_wait(smem_u32(&empty[s]), ((i - S) / S) & 1);
        mbar_expect(smem_u32(&full[s]), bytes);
        for (int c = 0; c < CKC; c += boxc)
          tma2d_g2s(smem_u32(sm + s * bytes + c * 2 * 16), &map, i * CKC + c, r0, smem_u32(&full[s]));
      }
    }
    return;
  }
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  const u16* xp = x + (long long)(gid < n ? gid : 0) * k + tq * 8;
  constexpr int PW = CKC / 32 / CW;  // spans per warp per stage
  for (int i = 0; i < stages; i++) {
    int s = i % S;
    // x for this stage's spans first: its latency (L2) overlaps the wait.
    uint4 xv[PW];
#pragma unroll
    for (int u = 0; u < PW; u++) {
      int kk = i * CKC + (warp + u * CW) * 32;
      xv[u] = gid < n ? *(const uint4*)(xp + kk) : make_uint4(0, 0, 0, 0);
    }
    mbar_wait(smem_u32(&full[s]), (i / S) & 1);
    const char* st = sm + s * bytes;
#pragma unroll
    for (int ns = 0; ns < PW; ns++) {
      int sp = warp + ns * CW;
      int c = sp * 32 + tq * 8;        // column inside the stage
      int bx = c / boxc, cc = c - bx * boxc;
      const char* box = st + bx * boxc * 2 * 16;
      uint4 wa = *(const uint4*)(box + (gid * boxc + cc) * 2);
      uint4 wb = *(const uint4*)(box + ((gid + 8) * boxc + cc) * 2);
      mma16816(acc, wa.x, wb.x, wa.y, wb.y, xv[ns].x, xv[ns].y);
      mma16816(acc, wa.z, wb.z, wa.w, wb.w, xv[ns].z, xv[ns].w);
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(smem_u32(&empty[s]));
  }
#pragma unroll
  for (int e = 0; e < 4; e++) red[warp][lane][e] = acc[e];
  asm volatile("bar.sync 1, %0;" ::"r"(CW * 32));
  for (int idx = threadIdx.x; idx < 128; idx += CW * 32) {
    int l = idx >> 2, e = idx & 3;
    float v = 0.f;
    for (int ww = 0; ww < CW; ww++) v += red[ww][l][e];
    int row = (l & 3) * 2 + (e & 1), feat = r0 + (l >> 2) + (e >> 1) * 8;
    if (row < n && feat < m) y[(long long)row * m + feat] = f32_to_bf16(v);
  }
}

static float bf2f(u16 v) {
  u32 u = (u32)v << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// gemvpers: gemvtma made persistent: grid = what fits at once, each block
// takes tiles blockIdx.x, +gridDim.x, ..., and its producer streams every
// stage of every tile without a break; consumers load x one stage ahead.
// BOX: the stages arrive as 2D boxes through map (gemvtma2); else as one
// 1D bulk copy per row from w, row-major [16][CKC] (gemvbulk, the design
// of backend/cuda/kernels/gemv_bulk.cu).
template <int S, int CW, int CKC, bool BOX>
__global__ void __launch_bounds__((CW + 1) * 32) gemvpers(const __grid_constant__ CUtensorMap map, const u16* w,
                                                          u16* y, const u16* x, int n, int m, int k, int boxc) {
  extern __shared__ __align__(1024) char sm[];
  __shared__ __align__(8) unsigned long long full[S], empty[S];
  __shared__ float red[CW][32][4];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int gid = lane >> 2, tq = lane & 3;
  int tiles = (m + 15) / 16;
  int stages = k / CKC;
  u32 bytes = CKC * 2 * 16;
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; s++) {
      mbar_init(smem_u32(&full[s]), 1);
      mbar_init(smem_u32(&empty[s]), CW);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (warp == CW) {
    if (lane == 0) {
      int g = 0;
      for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
        for (int i = 0; i < stages; i++, g++) {
          int s = g % S;
          if (g >= S) mbar_wait(smem_u32(&empty[s]), ((g - S) / S) & 1);
          mbar_expect(smem_u32(&full[s]), bytes);
          if (BOX) {
            for (int c = 0; c < CKC; c += boxc)
              tma2d_g2s(smem_u32(sm + s * bytes + c * 2 * 16), &map, i * CKC + c, t * 16, smem_u32(&full[s]));
          } else {
            for (int r = 0; r < 16; r++)
              bulk_g2s(smem_u32(sm + s * bytes + r * CKC * 2), w + (long long)(t * 16 + r) * k + (long long)i * CKC,
                       CKC * 2, smem_u32(&full[s]));
          }
        }
      }
    }
    return;
  }
  constexpr int PW = CKC / 32 / CW;
  const u16* xp = x + (long long)(gid < n ? gid : 0) * k + tq * 8;
  int g = 0;
  for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    uint4 xn[PW];
#pragma unroll
    for (int u = 0; u < PW; u++) xn[u] = gid < n ? *(const uint4*)(xp + (warp + u * CW) * 32) : make_uint4(0, 0, 0, 0);
    for (int i = 0; i < stages; i++, g++) {
      int s = g % S;
      uint4 xv[PW];
#pragma unroll
      for (int u = 0; u < PW; u++) xv[u] = xn[u];
      if (i + 1 < stages) {
#pragma unroll
        for (int u = 0; u < PW; u++)
          xn[u] = gid < n ? *(const uint4*)(xp + (i + 1) * CKC + (warp + u * CW) * 32) : make_uint4(0, 0, 0, 0);
      }
      mbar_wait(smem_u32(&full[s]), (g / S) & 1);
      const char* st = sm + s * bytes;
#pragma unroll
      for (int u = 0; u < PW; u++) {
        int c = (warp + u * CW) * 32 + tq * 8;
        int bw = BOX ? boxc : CKC;  // row length of the stage's layout
        int bx = c / bw, cc = c - bx * bw;
        const char* box = st + bx * bw * 2 * 16;
        uint4 wa = *(const uint4*)(box + (gid * bw + cc) * 2);
        uint4 wb = *(const uint4*)(box + ((gid + 8) * bw + cc) * 2);
        mma16816(acc, wa.x, wb.x, wa.y, wb.y, xv[u].x, xv[u].y);
        mma16816(acc, wa.z, wb.z, wa.w, wb.w, xv[u].z, xv[u].w);
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(smem_u32(&empty[s]));
    }
#pragma unroll
    for (int e = 0; e < 4; e++) red[warp][lane][e] = acc[e];
    asm volatile("bar.sync 1, %0;" ::"r"(CW * 32));
    for (int idx = threadIdx.x; idx < 128; idx += CW * 32) {
      int l = idx >> 2, e = idx & 3;
      float v = 0.f;
      for (int ww = 0; ww < CW; ww++) v += red[ww][l][e];
      int row = (l & 3) * 2 + (e & 1), feat = t * 16 + (l >> 2) + (e >> 1) * 8;
      if (row < n && feat < m) y[(long long)row * m + feat] = f32_to_bf16(v);
    }
    asm volatile("bar.sync 1, %0;" ::"r"(CW * 32));
  }
}

struct Shape {
  const char* name;
  int m, k;
};

static float elapsed(cudaEvent_t a, cudaEvent_t b) {
  float ms;
  RT(cudaEventElapsedTime(&ms, a, b));
  return ms;
}

typedef void (*LaunchFn)(int copy, cudaStream_t st);

// timeit runs launch over copies (round robin) reps times, best of 3, and
// returns microseconds per launch.
template <class F>
static double timeit(F launch, int copies, int reps, cudaStream_t st) {
  cudaEvent_t a, b;
  RT(cudaEventCreate(&a));
  RT(cudaEventCreate(&b));
  for (int c = 0; c < copies; c++) launch(c, st);
  RT(cudaStreamSynchronize(st));
  double best = 1e30;
  for (int t = 0; t < 3; t++) {
    RT(cudaEventRecord(a, st));
    for (int r = 0; r < reps; r++)
      for (int c = 0; c < copies; c++) launch(c, st);
    RT(cudaEventRecord(b, st));
    RT(cudaEventSynchronize(b));
    double us = elapsed(a, b) * 1000.0 / (reps * copies);
    if (us < best) best = us;
  }
  RT(cudaGetLastError());
  return best;
}

static CUtensorMap makeMap(const u16* w, int m, int k, int boxc) {
  CUtensorMap map;
  cuuint64_t dims[2] = {(cuuint64_t)k, (cuuint64_t)m};
  cuuint64_t strides[1] = {(cuuint64_t)k * 2};
  cuuint32_t box[2] = {(cuuint32_t)boxc, 16};
  cuuint32_t es[2] = {1, 1};
  CK(cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void*)w, dims, strides, box, es,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  return map;
}

__global__ void fillk(u16* p, long long n, unsigned seed) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i < n; i += (long long)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    p[i] = f32_to_bf16(((float)(h & 0xffff) / 65536.f - 0.5f) * 0.1f);
  }
}

int main(int argc, char** argv) {
  RT(cudaSetDevice(0));
  cudaStream_t st;
  RT(cudaStreamCreate(&st));
  unsigned* out;
  RT(cudaMalloc(&out, 64));
  int sms;
  RT(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  bool only_gemv = argc > 1 && strcmp(argv[1], "gemv") == 0;
  bool skip_transport = argc > 1 && strcmp(argv[1], "tma") == 0;
  if (!only_gemv && !skip_transport)

  // Copy ceiling, as bench latency measures it (read + write).
  {
    size_t n = 1ull << 30;
    char *s, *d;
    RT(cudaMalloc(&s, n));
    RT(cudaMalloc(&d, n));
    auto cp = [&](int, cudaStream_t st) { RT(cudaMemcpyAsync(d, s, n, cudaMemcpyDeviceToDevice, st)); };
    double us = timeit(cp, 1, 10, st);
    printf("copy ceiling: %.3f TB/s (read+write)\n", 2.0 * n / us / 1e6);
    // flat read.
    for (int bps : {4, 8, 16}) {
      auto f = [&](int, cudaStream_t st) { flat<<<sms * bps, 256, 0, st>>>((const uint4*)s, n / 16, out); };
      us = timeit(f, 1, 10, st);
      printf("flat read, %d blocks/SM x 256: %.3f TB/s\n", bps, n / us / 1e6);
    }
    for (int C : {8192, 16384, 32768}) {
      for (int S : {2, 4}) {
        int smem = C * S;
        if (smem > 200 * 1024) continue;
        int bps = (220 * 1024) / (smem + 1024);
        if (bps > 8) bps = 8;
        int blocks = sms * bps;
        long long per = (long long)(n / blocks) / C * C;
        double usb;
        if (S == 2) {
          RT(cudaFuncSetAttribute(bulkflat<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
          auto f = [&](int, cudaStream_t st) { bulkflat<2><<<blocks, 32, smem, st>>>(s, per, C, out); };
          usb = timeit(f, 1, 10, st);
        } else {
          RT(cudaFuncSetAttribute(bulkflat<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
          auto f = [&](int, cudaStream_t st) { bulkflat<4><<<blocks, 32, smem, st>>>(s, per, C, out); };
          usb = timeit(f, 1, 10, st);
        }
        printf("bulk flat, %d-byte chunks, %d stages, %d blocks/SM: %.3f TB/s\n", C, S, bps,
               (double)per * blocks / usb / 1e6);
      }
    }
    RT(cudaFree(s));
    RT(cudaFree(d));
  }

  Shape shapes[] = {{"O", 4096, 4096}, {"down", 4096, 14336}, {"gate/up", 28672, 4096}};
  const int n = 4;
  for (Shape sh : shapes) {
    size_t elems = (size_t)sh.m * sh.k, bytes = elems * 2;
    int copies = (int)((600ull << 20) / bytes) + 1;
    std::vector<u16*> ws(copies);
    for (int c = 0; c < copies; c++) {
      RT(cudaMalloc(&ws[c], bytes));
      fillk<<<1024, 256, 0, st>>>(ws[c], (long long)elems, 1234u + c);
    }
    u16 *x, *y, *y2;
    RT(cudaMalloc(&x, (size_t)n * sh.k * 2));
    RT(cudaMalloc(&y, (size_t)n * sh.m * 2));
    RT(cudaMalloc(&y2, (size_t)n * sh.m * 2));
    fillk<<<64, 256, 0, st>>>(x, (long long)n * sh.k, 99u);
    RT(cudaStreamSynchronize(st));
    double mb = bytes / 1e6;
    printf("\n%s [%d x %d], %.1f MB, %d copies\n", sh.name, sh.m, sh.k, mb, copies);
    int blocks = (sh.m + 15) / 16;
    {
      auto f = [&](int c, cudaStream_t st) { gemv_bf16<<<blocks, NW * 32, 0, st>>>(y, x, ws[c], n, sh.m, sh.k, 1); };
      double us = timeit(f, copies, 20, st);
      printf("  gemv (NW=%d UR=%d): %.2f us, %.3f TB/s\n", NW, UR, us, bytes / us / 1e6);
    }
    if (only_gemv) {
      for (int c = 0; c < copies; c++) RT(cudaFree(ws[c]));
      continue;
    }
    for (int CKC : {256, 512, 1024}) {
      for (int S : {2, 4}) {
        int smem = CKC * 2 * 16 * S;
        if (smem > 200 * 1024 || skip_transport) continue;
        double us;
        if (S == 2) {
          RT(cudaFuncSetAttribute(bulkrows<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
          auto f = [&](int c, cudaStream_t st) { bulkrows<2><<<blocks, 32, smem, st>>>(ws[c], sh.m, sh.k, CKC, out); };
          us = timeit(f, copies, 20, st);
        } else {
          RT(cudaFuncSetAttribute(bulkrows<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
          auto f = [&](int c, cudaStream_t st) { bulkrows<4><<<blocks, 32, smem, st>>>(ws[c], sh.m, sh.k, CKC, out); };
          us = timeit(f, copies, 20, st);
        }
        printf("  bulkrows CK=%d S=%d (no math): %.2f us, %.3f TB/s\n", CKC, S, us, bytes / us / 1e6);
      }
    }
    int boxc = 256;
    std::vector<CUtensorMap> maps(copies);
    for (int c = 0; c < copies; c++) maps[c] = makeMap(ws[c], sh.m, sh.k, boxc);
    for (int CKC : {256, 512, 1024}) {
      for (int S : {2, 4}) {
        int smem = CKC * 2 * 16 * S;
        if (smem > 200 * 1024 || skip_transport) continue;
        double us;
        if (S == 2) {
          RT(cudaFuncSetAttribute(tma2d<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
          auto f = [&](int c, cudaStream_t st) { tma2d<2><<<blocks, 32, smem, st>>>(maps[c], sh.m, sh.k, CKC, boxc, out); };
          us = timeit(f, copies, 20, st);
        } else {
          RT(cudaFuncSetAttribute(tma2d<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
          auto f = [&](int c, cudaStream_t st) { tma2d<4><<<blocks, 32, smem, st>>>(maps[c], sh.m, sh.k, CKC, boxc, out); };
          us = timeit(f, copies, 20, st);
        }
        printf("  tma2d CK=%d S=%d (no math): %.2f us, %.3f TB/s\n", CKC, S, us, bytes / us / 1e6);
      }
    }
    // gemvtma, checked against gemv_bf16 (same sums in another order).
    std::vector<u16> ha((size_t)n * sh.m), hb((size_t)n * sh.m);
    gemv_bf16<<<blocks, NW * 32, 0, st>>>(y, x, ws[0], n, sh.m, sh.k, 1);
    RT(cudaMemcpyAsync(ha.data(), y, ha.size() * 2, cudaMemcpyDeviceToHost, st));
    // worst_diff is the largest relative difference of y2 from ha.
    auto worst_diff = [&]() {
      RT(cudaMemcpyAsync(hb.data(), y2, hb.size() * 2, cudaMemcpyDeviceToHost, st));
      RT(cudaStreamSynchronize(st));
      double worst = 0;
      for (size_t i = 0; i < ha.size(); i++) {
        float a = bf2f(ha[i]), b = bf2f(hb[i]);
        double d = fabs(a - b) / (fabs(a) + 1e-3);
        if (d > worst) worst = d;
      }
      return worst;
    };
    for (int CKC : {512, 1024}) {
      for (int S : {3, 4, 6}) {
        int smem = CKC * 2 * 16 * S;
        if (smem > 200 * 1024) continue;
        double us;
#define RUN(SS, CWW, CKK)                                                                             \
  if (CKC == CKK) {                                                                                   \
    RT(cudaFuncSetAttribute(gemvtma<SS, CWW, CKK>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem)); \
    auto f = [&](int c, cudaStream_t st) {                                                            \
      gemvtma<SS, CWW, CKK><<<blocks, (CWW + 1) * 32, smem, st>>>(maps[c], y2, x, n, sh.m, sh.k, boxc); \
    };                                                                                                \
    f(0, st);                                                                                         \
    double worst = worst_diff();                                                                      \
    us = timeit(f, copies, 20, st);                                                                   \
    printf("  gemvtma CK=%d S=%d CW=%d: %.2f us, %.3f TB/s (worst rel diff vs gemv %.4f)\n", CKC, SS, CWW, us, \
           bytes / us / 1e6, worst);                                                                  \
  }
        if (S == 3) { RUN(3, 8, 512) }
      }
    }
// RUNP times gemvpers (BOX: 2D boxes, else 1D bulk copies; NAME for the
// report) after checking its output against gemv_bf16's.
#define RUNP(NAME, SS, CWW, CKK, BOX)                                                                 \
  {                                                                                                   \
    int smem = CKK * 2 * 16 * SS;                                                                     \
    auto kern = gemvpers<SS, CWW, CKK, BOX>;                                                          \
    RT(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));                 \
    int bps = 0;                                                                                      \
    RT(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bps, kern, (CWW + 1) * 32, smem));              \
    int grid = blocks < sms * bps ? blocks : sms * bps;                                               \
    auto f = [&](int c, cudaStream_t st) {                                                            \
      kern<<<grid, (CWW + 1) * 32, smem, st>>>(maps[c], ws[c], y2, x, n, sh.m, sh.k, boxc);            \
    };                                                                                                \
    RT(cudaMemsetAsync(y2, 0, (size_t)n * sh.m * 2, st));                                             \
    f(0, st);                                                                                         \
    double worst = worst_diff();                                                                      \
    double us = timeit(f, copies, 20, st);                                                            \
    printf("  %s CK=%d S=%d CW=%d grid=%d (%d/SM): %.2f us, %.3f TB/s (worst rel diff %.4f)\n", #NAME, CKK, SS, \
           CWW, grid, bps, us, bytes / us / 1e6, worst);                                              \
  }
#define RUN2(SS, CWW, CKK) RUNP(gemvtma2, SS, CWW, CKK, true)
#define RUNB(SS, CWW, CKK) RUNP(gemvbulk, SS, CWW, CKK, false)
    RUN2(3, 8, 512)
    RUNB(2, 4, 512) RUNB(3, 4, 512) RUNB(4, 4, 512) RUNB(2, 8, 512) RUNB(3, 8, 512) RUNB(4, 8, 512)
    RUNB(2, 8, 1024) RUNB(3, 8, 1024) RUNB(2, 4, 1024) RUNB(4, 4, 256) RUNB(6, 4, 256) RUNB(4, 8, 256) RUNB(2, 16, 1024) RUNB(3, 16, 512)
    for (int c = 0; c < copies; c++) RT(cudaFree(ws[c]));
    RT(cudaFree(x));
    RT(cudaFree(y));
    RT(cudaFree(y2));
  }
  return 0;
}
