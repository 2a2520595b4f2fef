// embed.cu: row gathers (token embeddings, activation rows).
// Specialised with -DTT=<table dtype> -DOT=<out dtype>.
#include "common.cuh"

// embed: out[i, :] = table[ids[i], :] converted to OT. A bad id writes a
// zero row and raises ERR_EMBED_ID (surfaced by Backend.Sync).
//   out   [n, dim]
//   table [rows, dim]
//   ids   [n] int32
// grid (n), block 256.
extern "C" __global__ void __launch_bounds__(256) embed(void* out, const void* table, const int* ids, int dim, int rows, int* err) {
  grid_dep_sync();
  int i = blockIdx.x;
  int id = ids[i];
  bool ok = id >= 0 && id < rows;
  if (!ok && threadIdx.x == 0) report(err, ERR_EMBED_ID);
  for (int j = threadIdx.x; j < dim; j += blockDim.x) {
    float v = ok ? load_row<TT>(table, id, dim, j) : 0.f;
    store_f<OT>(out, (i64)i * dim + j, v);
  }
}
