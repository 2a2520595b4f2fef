// embed.cu: row gathers (token embeddings, activation rows).
// Specialised with -DTT=<table dtype> -DOT=<out dtype>.
#include "common.cuh"

// embed: out[i, :] = table[ids[i] - base, :] converted to OT. An id
// outside the table writes a zero row; it raises ERR_EMBED_ID (surfaced by
// Backend.Sync) unless shard is set (the table is a vocabulary shard whose
// first row is id base: the id is another rank's) and the id is not
// negative. Embed passes base 0, shard 0.
//   out   [n, dim]
//   table [rows, dim]
//   ids   [n] int32
// grid (n), block 256.
extern "C" __global__ void __launch_bounds__(256) embed(void* out, const void* table, const int* ids, int dim, int rows, int* err, int base, int shard) {
  grid_dep_sync();
  int i = blockIdx.x;
  const int raw = ids[i];
  // raw - base is taken only where it cannot overflow (raw >= base >= 0).
  bool ok = raw >= base && raw - base < rows;
  int id = ok ? raw - base : 0;
  if (!ok && (!shard || raw < 0) && threadIdx.x == 0) report(err, ERR_EMBED_ID);
#if TT == DT_BF16
  // BF16 rows of whole 16-byte pieces: every thread's loads are issued
  // before its first store. (The loop below waits out one load per
  // element a thread: at 4096 elements and 256 threads, 16 memory
  // latencies in a row, for the first kernel of a decode step.)
  if ((dim & 7) == 0 && ((u64)table & 15) == 0 && (OT != DT_BF16 || ((u64)out & 15) == 0)) {
    const uint4* src = (const uint4*)((const u16*)table + (i64)(ok ? id : 0) * dim);
    const int nv = dim / 8;
    for (int j0 = threadIdx.x; j0 < nv; j0 += 4 * blockDim.x) {
      uint4 v[4];
#pragma unroll
      for (int u = 0; u < 4; u++) {
        const int j = j0 + u * blockDim.x;
        v[u] = ok && j < nv ? src[j] : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < 4; u++) {
        const int j = j0 + u * blockDim.x;
        if (j >= nv) break;
#if OT == DT_BF16
        ((uint4*)((u16*)out + (i64)i * dim))[j] = v[u];
#else
        const u32* p = (const u32*)&v[u];
#pragma unroll
        for (int e = 0; e < 4; e++) {
          store_f<OT>(out, (i64)i * dim + j * 8 + 2 * e, __uint_as_float(p[e] << 16));
          store_f<OT>(out, (i64)i * dim + j * 8 + 2 * e + 1, __uint_as_float(p[e] & 0xffff0000u));
        }
#endif
      }
    }
    return;
  }
#endif
  for (int j = threadIdx.x; j < dim; j += blockDim.x) {
    float v = ok ? load_row<TT>(table, id, dim, j) : 0.f;
    store_f<OT>(out, (i64)i * dim + j, v);
  }
}
