// mma.cuh: tensor-core and asynchronous-copy helpers shared by the
// attention and GEMV kernels (sm_80 and newer).
#pragma once
#include "common.cuh"

// smem_u32 is p's shared-memory address, as cp.async and ldmatrix take it.
__device__ __forceinline__ u32 smem_u32(const void* p) {
  u32 a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}

// cp_async16 copies 16 bytes global -> shared, bypassing L1; with
// ok == false it reads nothing and writes 16 zero bytes (src-size 0), so
// masked rows hold finite values.
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0) : "memory");
}

// cp_async16_hint is cp_async16 with an L2 cache policy (createpolicy):
// evict_first for data read once per step (the KV cache), so it does not
// push out lines other kernels will read (a prefetched weight).
__device__ __forceinline__ void cp_async16_hint(u32 dst, const void* src, bool ok, u64 policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;" ::"r"(dst), "l"(src),
               "r"(ok ? 16 : 0), "l"(policy)
               : "memory");
}

// evict_first_policy is an L2 cache policy marking every access it
// covers evict_first.
__device__ __forceinline__ u64 evict_first_policy() {
  u64 p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  return p;
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

// c += A.B, mma.sync m16n8k16: A row-major bf16, B column-major bf16, C f32.
// With gid = lane/4 and tq = lane%4 (each register pair's lower index in
// the low 16 bits):
//   A: a0 (row gid,   k 2tq..2tq+1)   a1 (row gid+8, k 2tq..2tq+1)
//      a2 (row gid,   k 2tq+8..+9)    a3 (row gid+8, k 2tq+8..+9)
//   B: b0 (k 2tq..2tq+1, col gid)     b1 (k 2tq+8..+9, col gid)
//   C: c0, c1 (row gid, cols 2tq, 2tq+1)  c2, c3 (row gid+8, same cols)
__device__ __forceinline__ void mma16816(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// mma16816_f16 is mma16816 with f16 A and B.
__device__ __forceinline__ void mma16816_f16(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// pack_f16x2 is two floats as packed f16x2, lo in the low half.
__device__ __forceinline__ u32 pack_f16x2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
