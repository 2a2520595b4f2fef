// Package kvcache manages the paged KV cache as integers: a pool of
// fixed-size blocks with reference counts, an LRU free list, per-sequence
// block tables, and a prefix cache that lets sequences with a common start
// share the blocks of that start. It touches no device memory; the runner
// owns the pools and trusts the ids handed out here.
//
// # Device layout
//
// Per layer the runner holds a K pool and a V pool indexed by BlockID.
// Inside a block the layout is head-major, so one head's slice of a block
// is contiguous (per-head scales, per-head eviction and FP8 loads want it):
//
//	K[layer]: [NumBlocks][numKVHeads][BlockSize][headDim]   (V alike)
//
//	  block 0 (null)   block 1                     block 2
//	  +-----------+    +-----------------------+   +-----
//	  | padding   |    | head 0: t0 t1 .. t15  |   | head 0: t16 ..
//	  | garbage   |    | head 1: t0 t1 .. t15  |   | ...
//	  +-----------+    +-----------------------+   +-----
//
// Quantized KV caches (backend.KVSpec has the byte layouts) keep their
// scales and zero points in side tensors whose first dimension is the
// block id too: int8 a scale per (block, head, token, channel group),
// int4 per (block, head, channel) for K and per (block, head, token,
// group) for V. So a BlockCopy moves values and scales together, and a
// cached full block keeps its quantized form and its scales for every
// later prefix hit. FP8's scales are per (layer, head), fixed for the
// cache's life. The int4 cache's bf16 window lives in a separate, smaller
// pool that the runner assigns to blocks (a block's last, partial block
// and the newest tokens); nothing here changes for it: the ids handed out
// here stay the only names of the blocks.
//
// Token position p of a sequence lives at slot
//
//	slot(p) = table[p/BlockSize]*BlockSize + p%BlockSize
//
// and the runner derives the slot mapping of a step from the block table
// alone. The null block pads block tables of short sequences in a batch;
// it is never handed out, so writes to it are harmless and reads of it are
// never used.
//
// # Blocks and their states
//
// A block is in use (ref > 0, held by one or more tables), free and cached
// (ref 0, its contents still findable by MatchPrefix), or free and empty.
// Sequences share blocks by reference count: prefix-cache hits and Fork
// take a reference, Free drops one. Only full blocks are ever shared, and a
// full block is never written again, so there is no copy-on-write: Fork
// copies a partially filled last block up front and returns the copy as
// data (BlockCopy) for the runner.
//
// # Prefix cache
//
// Every full block of a sequence gets a chained hash of its tokens and its
// predecessor's hash, keyed with a random per-pool HMAC-SHA256 key and the
// table's salt. After the step that computed a block, CommitFull registers
// it under its hash. MatchPrefix walks the chain of a new prompt and
// returns the longest run of registered blocks; each hit is checked
// against the stored tokens, salt and parent registration, so a hash
// collision can cost a hit but never return wrong KV. Free blocks are
// evicted front first: empty ones before cached ones, cached ones in the
// order they were freed, a sequence's last block before its first.
//
// # Usage
//
// The scheduler's use, for one sequence (error handling shortened):
//
//	pool, _ := kvcache.NewPool(kvcache.Options{NumBlocks: 1024, EnablePrefixCache: true})
//	t := kvcache.NewBlockTable(salt)
//
//	// Admission: reuse what the cache holds, allocate the rest of a chunk.
//	m := pool.MatchPrefix(t, tokens)         // m.NumTokens tokens need no compute
//	err := pool.AllocatePrefix(t, m, m.NumTokens+chunk)
//	if errors.Is(err, kvcache.ErrNoBlocks) {
//		// wait, or preempt a sequence (pool.Free(its table)) and retry
//	}
//	// ... the runner computes the chunk into t.Blocks() ...
//	pool.CommitFull(t, tokens[:m.NumTokens+chunk])
//
//	// Each decode step: room for one more token, then commit.
//	err = pool.Allocate(t, numComputed+1)
//
//	// n>1 sampling: the other samples share the prompt's full blocks.
//	child, copies, err := pool.Fork(t, numComputed) // runner performs copies first
//
//	// Finish or preemption.
//	pool.Free(t)
//
// Build with -tags invariants to verify the whole pool after every
// mutation (Verify); without the tag the checks compile to nothing.
package kvcache
