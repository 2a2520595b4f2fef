// Package cuda is the NVIDIA GPU implementation of backend.Backend in pure
// Go: the driver API, NVRTC and cuBLASLt (and NCCL, for tensor
// parallelism) are loaded at run time through purego, so CGO_ENABLED=0
// builds work and a machine without CUDA gets a clear error from Available
// (TRIGON_CUDA_LIB_DIR, CUDA_HOME or CUDA_PATH name where the libraries
// are when the loader does not find them). It needs compute capability 8.0
// or newer.
//
// Threading: every CUDA call runs on one goroutine locked to its OS thread
// (a context is current per thread). Ops check their operands on the
// caller's goroutine and queue a closure; ops that return nothing do not
// wait, so their CUDA errors and failed device-side index checks come back
// from the next Sync. Waits on a decode step's critical path (its sampled
// ids) poll for their result instead of sleeping.
//
// Kernels are CUDA C embedded in the binary (kernels/*.cu), specialised
// with -D constants (head dim, block size, dtypes, tiling) and compiled by
// NVRTC for the device, SASS for sm_90a on Hopper. Compiled modules are
// cached under os.UserCacheDir()/trigon/kernels, keyed by a hash of the
// sources, options, target and NVRTC version; WarmKernels fills the cache.
// Every kernel waits for its predecessor before it reads what that one may
// write, so launches may use programmatic dependent launch (launch.go).
//
// Dtypes: activations BF16 with f32 accumulation; weights BF16, F32 or F16
// (a BF16 copy made on first use), Q8_0, Q4_0, the K-quants Q4_K, Q5_K and
// Q6_K, AWQ4 and F8_E4M3_ROW (own kernels; FP8 prefill on cuBLASLt); KV
// caches in every format of backend.KVSpec (bf16, fp8, int8, int4 with
// its bf16 window), quantized on write and read inside the attention
// kernels. Decode-shaped products (at most 16 rows) may run on
// own tensor-core GEMVs, a register one and on sm_90 one fed by the TMA
// unit, where a per-shape tuner timed them faster than cuBLASLt.
//
// Fusions: Run (backend.Lowerer, lower.go) rewrites a model's program of
// unfused ops with rules - the QKV product with RoPE and the KV write
// (qkv_rope), a product added into the residual (matmul_add; cuBLASLt
// with beta 1 for prefill), gate/up with SiLU x mul (gateup_silu) - then
// marks norms that prefetch the next weight into L2 and kernels that let
// their successor launch early. A rule whose planner declines leaves the
// ops as written. Options.Tuning holds the tuned values.
//
//	if err := cuda.Available(); err != nil {
//		log.Printf("GPU unavailable, using the CPU: %v", err)
//		return cpu.New(cpu.Options{}), nil
//	}
//	b, err := cuda.New(cuda.Options{Device: 0})
package cuda
