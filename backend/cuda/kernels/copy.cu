// copy.cu: small copies between host-mapped pinned memory and the device,
// as kernels. A step's input upload and its sampled ids' read-back are a
// few KB; as copy-engine operations each would cost its own setup plus a
// switch between the engines and the SMs on either side, several times
// the gap between two kernels.
#include "common.cuh"

// copy_words: dst[i] = src[i] for n 32-bit words; either side may be
// host-mapped memory. grid (any), block 256.
extern "C" __global__ void __launch_bounds__(256) copy_words(u32* dst, const u32* src, int n) {
  grid_dep_sync();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) dst[i] = src[i];
}
