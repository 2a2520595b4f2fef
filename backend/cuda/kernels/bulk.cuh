// bulk.cuh: the TMA unit's bulk copies and the mbarriers they complete
// on (sm_90), shared by the kernels that stream weights into shared
// memory (gemv_bulk.cu).
#pragma once
#include "mma.cuh"

// PTX80: the toolkit compiling this emits PTX ISA 8.0 (CUDA 12), which the
// TMA bulk copy and mbarrier transaction counts need. An older NVRTC (the
// development machine's 11.8) still compiles the files, with those
// statements trapping, so the rest of them is checked there.
#if defined(__CUDACC_VER_MAJOR__) && __CUDACC_VER_MAJOR__ >= 12
#define PTX80 1
#else
#define PTX80 0
#endif

__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ bool mbar_try(u32 bar, u32 parity) {
  u32 ok;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(ok)
      : "r"(bar), "r"(parity)
      : "memory");
  return ok != 0;
}

__device__ __forceinline__ void mbar_arrive(u32 bar) {
  asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
#if !PTX80
  __trap();
#else
  asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(bar), "r"(bytes)
               : "memory");
#endif
}

// bulk_copy: bytes (a multiple of 16) from global src to shared dst by the
// TMA unit, counted against bar's transaction bytes. Weights are read once.
__device__ __forceinline__ void bulk_copy(u32 dst, const void* src, u32 bytes, u32 bar) {
#if !PTX80
  __trap();
#else
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
#endif
}

// mbar_init_fence makes the barriers this thread initialised visible to
// the TMA unit (the async proxy); a __syncthreads must follow before
// other threads use them.
__device__ __forceinline__ void mbar_init_fence() {
#if PTX80
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// mbar_spin waits for the phase of parity parity of bar to complete.
__device__ __forceinline__ void mbar_spin(u32 bar, u32 parity) {
  while (!mbar_try(bar, parity)) {
  }
}
