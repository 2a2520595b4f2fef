// kv.cuh: the format of the paged KV cache (backend.KVSpec), the one place
// kernels that write or read the cache take it from: the element type, the
// head-major addresses (of an element, a head's tile in a block, a token
// row, a 16-byte chunk), the slot and position splits, and the element
// conversions. The writers (rope.cu, gemv.cu's qkv_rope_bf16) and the
// attention readers (attention.cu, attn_decode.cu, attn_prefill.cu,
// attn_prefill_wg.cu) compute cache addresses only through it.
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

// Readers whose arithmetic is BF16's (tensor-core operands taken straight
// from the cache rows, bf16 pairs unpacked by shifts, shared-memory tiles
// laid out as the cache rows are) define KV_BF16_ONLY before including
// this header: they take no other format, and a module built for one
// fails here rather than reading the cache wrongly.
#if defined(KV_BF16_ONLY) && KV_DT != DT_BF16
#error "this kernel reads BF16 KV caches only (KV_DT must be DT_BF16)"
#endif

// KV_CHUNK is the elements of one 16-byte chunk (a vector load or a
// cp.async); a row of hd elements is kv_row_chunks(hd) chunks (kernels
// that copy by chunks take head dims that are multiples of KV_CHUNK).
#define KV_CHUNK (16 / (int)sizeof(kv_t))
__host__ __device__ constexpr int kv_row_chunks(int hd) { return hd / KV_CHUNK; }

// kv_chunk is the element offset of chunk u in a row.
__device__ __forceinline__ int kv_chunk(int u) { return u * KV_CHUNK; }

// kv_index is the block-table index of sequence position p (or the block
// of a slot, block*bs + offset).
__device__ __forceinline__ int kv_index(int p, int bs) { return p / bs; }

// kv_offset is p's offset in its block. Given bi = kv_index(p, bs) (a
// reader has it already, for its block-table lookup) it is p - bi*bs.
__device__ __forceinline__ int kv_offset(int p, int bs) { return p % bs; }
__device__ __forceinline__ int kv_offset(int p, int bi, int bs) { return p - bi * bs; }

// kv_split splits a slot (block*bs + offset) into its block and offset.
__device__ __forceinline__ void kv_split(int slot, int bs, int& blk, int& off) {
  blk = kv_index(slot, bs);
  off = kv_offset(slot, blk, bs);
}

// kv_at is the element index of token offset off, element 0, of KV head
// head in block blk of a pool of kvh heads, blocks of bs tokens, hd dims.
__device__ __forceinline__ i64 kv_at(int blk, int kvh, int head, int bs, int off, int hd) {
  return (((i64)blk * kvh + head) * bs + off) * hd;
}

// kv_at_pos is kv_at for sequence position p, which lies in block blk
// (the table's entry bi = kv_index(p, bs)).
__device__ __forceinline__ i64 kv_at_pos(int blk, int kvh, int head, int bs, int p, int bi, int hd) {
  return (((i64)blk * kvh + head) * bs + kv_offset(p, bi, bs)) * hd;
}

// kv_head locates one KV head's tiles in a pool: block blk's contiguous
// [bs][hd] tile of the head starts at element blk * stride + base. A
// kernel that walks one head through many blocks computes it once
// (kv_head_of) and takes each tile with kv_tile, a row of it with kv_row.
struct kv_head {
  i64 base;    // the head's tile within a block
  i64 stride;  // elements of one block (all kvh heads)
};

// kv_head_of is head's kv_head in a pool of kvh heads, bs tokens a block,
// hd dims.
__device__ __forceinline__ kv_head kv_head_of(int kvh, int head, int bs, int hd) {
  return {(i64)head * bs * hd, (i64)kvh * bs * hd};
}

// kv_tile is the element index of h's tile in block blk (its token 0,
// element 0).
__device__ __forceinline__ i64 kv_tile(const kv_head& h, int blk) { return (i64)blk * h.stride + h.base; }

// kv_row is the element offset of token offset off within a head tile of
// hd dims.
__device__ __forceinline__ i64 kv_row(int off, int hd) { return (i64)off * hd; }

// kv_store writes element i of a pool, converted from float.
__device__ __forceinline__ void kv_store(void* pool, i64 i, float v) { store_f<KV_DT>(pool, i, v); }

// kv_load reads element i of a pool, converted to float.
__device__ __forceinline__ float kv_load(const void* pool, i64 i) { return load_f<KV_DT>(pool, i); }
