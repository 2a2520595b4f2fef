// Package cuda is the NVIDIA GPU implementation of backend.Backend, in
// pure Go: the driver API, NVRTC and cuBLASLt are loaded at run time
// through purego (CGO_ENABLED=0 builds work; a machine without CUDA gets a
// clear error from Available and the CPU backend).
//
// Layout of the package:
//
//	lib.go, driver.go, nvrtc.go, cublaslt.go   library loading and bindings
//	backend.go                                 the CUDA thread, New, Sync, Close
//	memory.go                                  device memory pool, tensors, copies
//	kernels.go, kcache.go                      kernel JIT and the on-disk cache
//	ops.go, matmul.go, attn.go                 op launchers
//	qkv_rope.go                                the QKV projection fused with RoPEStoreKV (backend.QKVRoPEFuser)
//	fuse_norm.go                               products that add into the residual or normalise their input (backend.NormFuser)
//	sample_async.go                            sampling into a device tensor, asynchronous reads (backend.DeviceSampler)
//	attn_decode.go                             the decode attention kernel's plan (splits, stages)
//	launch.go                                  kernel launch, programmatic dependent launch, clusters
//	stepclock.go                               CUDA-event timestamps of decode steps (bench.StepClock)
//	kernels/*.cu                               the kernels, one file per op family
//
// Threading: every CUDA call runs on one goroutine locked to its OS thread,
// since the context is current per thread. Ops validate on the caller's
// goroutine and queue a closure; ops that return nothing do not wait, so
// their CUDA errors (and failed device-side index checks) come back from
// the next Sync (a failed launch also from the next Read). The waits for a
// step's sampled ids (Sample, ReadAsync's wait) poll for their result
// rather than sleep on the reply channel, keeping a thread wake-up off the
// decode step's critical path. Copies of at most a ring slot (256 KiB)
// between pinned host memory and the device, such as a step's inputs and
// its sampled ids, are kernels over host-mapped memory (copy_words) rather
// than copy-engine operations, each of which cost microseconds of
// switching between the engine and the SMs between a step's kernels.
//
// Kernels are CUDA C embedded in the binary, specialised with -D constants
// (head dim, block size, dtypes) and compiled by NVRTC for the device (SASS
// for sm_90a on Hopper). Compiled modules are cached under
// os.UserCacheDir()/trigon/kernels keyed by sha256 of the sources, options,
// target and NVRTC version; a damaged entry is recompiled.
//
// GEMMs of at most 64 rows (decode) are tuned once per shape: cuBLASLt's
// first eight algorithms are timed from DRAM (L2 flushed) on the first
// eager call, and one replaces the heuristic's pick only if 3% faster; up
// to 16 rows, the own tensor-core GEMV (kernels/gemv.cu) competes too, by
// the same rule (TRIGON_CUDA_GEMV_MARGIN). Where the GEMV takes a decode
// step's QKV product, FusedQKVRoPE runs its variant that rotates Q and K
// and writes the paged caches in the epilogue, adding a QKV bias (Qwen2's)
// there too (one kernel instead of two, or three with a bias; bit for bit
// the same result). Up to 8 rows it does not follow the
// tuner: it runs the GEMV variant qkvGEMV pins (8 warps, 2 spans;
// TRIGON_CUDA_QKV_GEMV=tuner|NWxUR), since the tuner's near-tied timings
// picked a variant, or cuBLASLt and a separate RoPE kernel, that made one
// batch-4 process in eight 1-3% slower. With Qwen3's per-head Q/K norms
// (whose sums span a head's hd/16 GEMV blocks) it queues that pinned
// variant into the QKV buffer and then rope_store_kv, both launched with
// PDL at this site only (launchPDL; TRIGON_CUDA_QK_NORM_PAIR=off): PDL by
// kernel name on those two slowed Llama's batch-16 step, and sharing the
// sums inside one kernel through thread-block clusters measured slower
// (the cluster launch itself cost ~3.3 us a layer). MatMulAdd puts the residual add of the
// O and down projections in the GEMV's epilogue (gemv_add_bf16), so the
// norm after them only normalises; for prefill batches it runs cuBLASLt
// with beta = 1 and the residual as C and D (TRIGON_CUDA_BLAS_ADD=off
// turns that off). The GEMVs that would normalise their
// own input (NormQKVRoPE, NormGateUpSiLU) are built and tested but off by
// default (TRIGON_CUDA_FUSE_NORM=on|off|add,qkv,mlp;
// TRIGON_CUDA_FUSE_NORM_SCALE=pre|post): every block redoes the row's
// transform, which cost more than the norm kernel it saves. The norms of
// a decode step prefetch the first MiBs of the next product's weight
// into L2 (AddRMSNormPrefetch, TRIGON_CUDA_NORM_PREFETCH_MB).
//
// On sm_90 a second decode GEMV streams the weight with the TMA unit
// (kernels/gemv_bulk.cu, gemv_bulk.go): a producer thread per block keeps
// a ring of 16-row stages in flight as 1D bulk copies on mbarriers, and
// consumer warps multiply each stage (gemv.cu's mma layout). The register
// GEMV's bytes in flight are capped by the register file; this one's by
// shared memory. MatMulAdd and GateUpSiLU (the gate/up product with SiLU x
// mul in its epilogue) run it with bulkPick's variant for up to 8 rows of
// x (with more its registers allow one block an SM, measured slower),
// plain products where the tuner times it 3% faster;
// TRIGON_CUDA_GEMV_BULK=off|on|always; TRIGON_CUDA_BULK_PICK replaces
// bulkPick's variant per weight, for in-step comparisons.
// Its QKV variant with qkv_rope_bf16's epilogue (gemvb_qkv_rope_bf16) is
// off (TRIGON_CUDA_GEMV_BULK_QKV=on): the decode step measured slower
// with it, and, since the norm launches it early, faster on one machine
// and slower on another.
// Prefill attention on sm_90a at head dims 64 and 128 runs on the
// warpgroup multiply (kernels/attn_prefill_wg.cu, wgmma.cuh: S and P.V as
// wgmma over swizzled shared-memory tiles, 285 against 224 TFLOP/s at
// 4 x 2048 on the H200); elsewhere, or with TRIGON_CUDA_PREFILL_WGMMA=off,
// FA2-style on mma.sync (kernels/attn_prefill.cu). Both issue a tile's
// block-table loads before its copies.
// Decode attention is split-KV flash decoding on the tensor cores
// (mma.sync, a per-warp cp.async pipeline over 16-token tiles; a CUDA-core
// kernel before sm_80), with a split count fixed per batch shape, so
// captured graphs stay valid as contexts grow. A combine kernel merges
// the splits; TRIGON_CUDA_ATTN_CLUSTER=on has the splits of a row merge
// themselves as one thread-block cluster instead (sm_90, launchCluster;
// off: slower on the H200, docs/benchmarks.md). Its K/V reads carry an
// evict_first L2 policy (TRIGON_CUDA_KV_EVICT_FIRST=off reverts), and it
// can prefetch the next product's weight (AttentionArgs.Prefetch,
// TRIGON_CUDA_ATTN_PREFETCH_MB, default 0: slower at batch 4).
//
// Every kernel starts by waiting for its predecessor (grid_dep_sync,
// grid_dep_wait or grid_dep_launch_wait, kernels/common.cuh) so launches
// may use programmatic dependent launch (launch.go). Three are
// exceptions: decode attention's prologue reads the step's metadata and
// the cache rows earlier steps wrote, then waits before it reads Q and
// the newest row; the bulk GEMV's producer streams a pristine weight
// (uploaded, or made by a completed FillNormal, and only ever a product's
// weight; TRIGON_CUDA_EARLY_WEIGHTS=off turns this and the register
// GEMV's early loads off) before it waits, its consumers wait before
// reading x; the norm's
// prefetching blocks ask L2 for a weight without waiting. The norm and the
// split combine let the next kernel launch before they wait, so the
// product after them starts its early weight loads during the tail of the
// product before them. The decode QKV product (qkv_rope_bf16) and the
// bulk gate/up product (gemvb_silu_bf16) let theirs launch at their start
// (launchEarly, TRIGON_CUDA_EARLY_LAUNCH=on|off|name,...): attention's
// blocks fit beside the QKV product's and issue their first K/V tiles
// under its stream; the down product's producers stream as gate/up's
// blocks leave. By default only the QKV projection, decode attention,
// the split combine, the bulk GEMVs and the norms launch with
// PDL (measured faster on the H200); TRIGON_CUDA_PDL=on|off|name,...
// chooses others. PDL on every launch measured 1-2% slower.
//
// Dtypes: activations BF16 with f32 accumulation; weights BF16 (cuBLASLt or the GEMV),
// F32/F16 (a BF16 copy made on first use), Q8_0/Q4_0 (own kernels); KV
// caches BF16 for Attention (RoPEStoreKV also writes F32/F16 caches).
//
// Usage:
//
//	if err := cuda.Available(); err != nil {
//		log.Printf("GPU unavailable, using the CPU: %v", err)
//		return cpu.New(cpu.Options{}), nil
//	}
//	b, err := cuda.New(cuda.Options{Device: 0})
//	if err != nil { ... }
//	defer b.Close()
package cuda
