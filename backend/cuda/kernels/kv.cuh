// kv.cuh: the format of the paged KV cache (backend.KVSpec), the one place
// kernels that write or read the cache take it from: the element type, the
// head-major addresses, the slot split, and the element conversions.
//
// A module that includes it is specialised with -DKV_DT=<cache dtype> (a
// DT_* code of common.cuh; the spec's dtype). The layout is head-major:
// per layer a K and a V pool of
//   [numBlocks][numKVHeads][blockSize][headDim] elements,
// so one head's slice of a block is a contiguous [blockSize][headDim]
// tile, and a sequence's token p lives at offset p % blockSize of block
// table[p / blockSize]. The block size and head dim are arguments: some
// kernels have them as compile-time constants (BS, HD), others at run time.
// Every format so far is unquantized (no scales, no full-precision window).
#pragma once
#include "common.cuh"

#ifndef KV_DT
#error "kv.cuh needs -DKV_DT, the KV cache dtype"
#endif

// kv_t is the storage of one cache element.
#if KV_DT == DT_F32
typedef float kv_t;
#elif KV_DT == DT_F16 || KV_DT == DT_BF16
typedef u16 kv_t;
#else
#error "kv.cuh: KV_DT is not a KV cache dtype"
#endif

// KV_CHUNK is the elements of one 16-byte chunk (a vector load or a cp.async).
#define KV_CHUNK (16 / (int)sizeof(kv_t))

// kv_split splits a slot (block*bs + offset) into its block and offset.
__device__ __forceinline__ void kv_split(int slot, int bs, int& blk, int& off) {
  blk = slot / bs;
  off = slot - blk * bs;
}

// kv_at is the element index of token offset off, element 0, of KV head
// head in block blk of a pool of kvh heads, blocks of bs tokens, hd dims.
__device__ __forceinline__ i64 kv_at(int blk, int kvh, int head, int bs, int off, int hd) {
  return (((i64)blk * kvh + head) * bs + off) * hd;
}

// kv_store writes element i of a pool, converted from float.
__device__ __forceinline__ void kv_store(void* pool, i64 i, float v) { store_f<KV_DT>(pool, i, v); }

// kv_load reads element i of a pool, converted to float.
__device__ __forceinline__ float kv_load(const void* pool, i64 i) { return load_f<KV_DT>(pool, i); }
