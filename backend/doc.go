// Package backend defines the small contract between the model code and the
// devices that run it: unfused ops on opaque tensor handles, and a model's
// forward as a program of them (Program) that a backend may rewrite into
// its own fused kernels (Lowerer).
//
// Every op has a pure-Go implementation in backend/cpu (the fallback and the
// oracle) and a CUDA implementation in backend/cuda, and a test comparing
// them. The contract grows by optional interfaces checked with a type
// assertion (as io.WriterTo), never by capability flags.
//
// Shapes are written outermost first: [numTokens, hidden] is numTokens rows
// of hidden contiguous elements. All tensors are dense and row-major.
//
// Example: one RMS norm on the CPU backend.
//
//	b := cpu.New(cpu.Options{})
//	x, _ := b.Upload(backend.F32, []int{2, 4}, xBytes)     // [2, 4]
//	w, _ := b.Upload(backend.F32, []int{4}, wBytes)        // [4]
//	out, _ := b.Alloc(backend.F32, 2, 4)                   // [2, 4]
//	err := b.AddRMSNorm(out, x, nil, w, 1e-5)
//	err = b.Read(out, dst)
//
// Optional interfaces: GraphCapturer (record and replay op sequences),
// Lowerer (run a program, fused by the backend's rules), MemoryReporter
// (device memory, for sizing the KV cache), DeviceSampler (sampled ids left
// on the device for the next step), RandomFiller (synthetic weights made
// in place), KVSpecChecker (the KV formats a backend runs), Communicator
// and ShardEmbedder (tensor parallelism).
//
// Besides the contract, the package holds what every side of it shares:
// the dtypes and their host conversions (F32ToBF16, F16ToF32, QuantizeQ8_0,
// DequantizeRow, ...), used by weight loading, GGUF conversion, benchmarks
// and the CPU backend alike, and the operand checks of each op
// (CheckEmbed, CheckAddRMSNorm, CheckMatMul, CheckRoPEStoreKV,
// CheckAttention, CheckSiLUMul, CheckSample), which every backend runs
// before adding its own constraints.
package backend
