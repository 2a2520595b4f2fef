package backend

import (
	"errors"
	"fmt"
)

// Tensor is a handle to memory owned by a Backend. Handles are only valid
// with the backend that made them.
type Tensor interface {
	DType() DType
	// Shape returns the dimensions, outermost first. Callers must not
	// modify the returned slice.
	Shape() []int
}

// Backend runs the model's ops. Implementations are not safe for concurrent
// use: the engine drives one backend from one goroutine.
//
// Ops write into caller-allocated outputs, so the per-step path can reuse
// buffers (and CUDA graphs can capture fixed addresses).
type Backend interface {
	// Name is a short identifier such as "cpu" or "cuda:0".
	Name() string

	// ActDType is the dtype the backend wants for activations (F32 on the
	// CPU, BF16 on CUDA). Logits are always F32.
	ActDType() DType

	// Alloc returns an uninitialised tensor.
	Alloc(dt DType, shape ...int) (Tensor, error)
	// Upload makes a tensor holding data, laid out as dt's row-major
	// encoding (quantized types in their GGML block layout). The backend
	// may keep a reference to data instead of copying it (the CPU backend
	// does for small tensors): the caller must keep data alive and
	// unchanged for the tensor's lifetime.
	Upload(dt DType, shape []int, data []byte) (Tensor, error)
	// Write copies host bytes (dt's encoding, whole tensor) into t. data may
	// be reused as soon as Write returns.
	Write(t Tensor, data []byte) error
	// Read copies t's bytes to dst, which must be exactly t's byte size,
	// after the work queued before it has finished. A deferred error of
	// that work is reported (and cleared) as Sync reports it.
	Read(t Tensor, dst []byte) error
	// View returns the rows [start, start+n) of t's outermost dimension,
	// sharing t's memory.
	View(t Tensor, start, n int) (Tensor, error)
	// Reshape returns t with a new shape of the same element count,
	// sharing t's memory.
	Reshape(t Tensor, shape ...int) (Tensor, error)
	// Free releases t. Views must not be used after their base is freed.
	Free(t Tensor)
	// Sync waits for queued work to finish and reports any deferred error.
	Sync() error

	// Embed gathers rows: out[i] = table[ids[i]], converted to out's dtype.
	// It also serves to gather activation rows (table = activations).
	//   out   [n, dim]
	//   table [rows, dim] any dtype
	//   ids   [n] I32
	Embed(out, table, ids Tensor) error

	// AddRMSNorm is the fused residual add and RMS norm of a pre-norm
	// block. With residual nil: out = rmsnorm(x) * weight. Otherwise first
	// residual += x (in place), then out = rmsnorm(residual) * weight.
	//   out, x, residual [rows, dim]
	//   weight           [dim]
	AddRMSNorm(out, x, residual, weight Tensor, eps float32) error

	// MatMul computes out = x . w^T (+ bias), accumulating in f32.
	//   out  [n, outFeatures]
	//   x    [n, inFeatures]
	//   w    [outFeatures, inFeatures], any weight dtype (F32, F16, BF16, Q8_0, Q4_0,
	//        Q4_K, Q5_K, Q6_K, AWQ4_G*, F8_E4M3_ROW)
	//   bias [outFeatures] or nil
	MatMul(out, x, w, bias Tensor) error

	// RoPEStoreKV splits a fused QKV projection, applies the optional
	// per-head Q/K RMS norms, rotates Q and K (rotate-half / NeoX layout),
	// writes rotated Q to args.Q and K, V into the paged caches.
	RoPEStoreKV(args RoPEArgs) error

	// Attention is paged causal attention over the KV caches for a varlen
	// batch (prefill chunks and decodes mixed).
	Attention(args AttentionArgs) error

	// SiLUMul computes out = silu(gateUp[:, :inter]) * gateUp[:, inter:].
	//   out    [n, inter]
	//   gateUp [n, 2*inter]
	SiLUMul(out, gateUp Tensor) error

	// Sample picks one token per row of logits.
	Sample(args SampleArgs) ([]int32, error)
}

// RoPEArgs are the operands of Backend.RoPEStoreKV.
//
// The token at row t has position Positions[t]; its K and V go to slot
// SlotMapping[t] = block*blockSize + offset of every layer's cache (a
// negative slot skips the write: padding tokens).
type RoPEArgs struct {
	Q           Tensor  // out [numTokens, numHeads*headDim]
	QKV         Tensor  // [numTokens, (numHeads+2*numKVHeads)*headDim]: Q, then K, then V
	Positions   Tensor  // [numTokens] I32
	SlotMapping Tensor  // [numTokens] I32
	KCache      Tensor  // [numBlocks, numKVHeads, blockSize, headDim]
	VCache      Tensor  // [numBlocks, numKVHeads, blockSize, headDim]
	KV          KVSpec  // the caches' format
	KVAux       KVAux   // the caches' scales and window, as KV says
	InvFreq     Tensor  // [headDim/2] F32: per-pair inverse frequency, scaling already applied
	QNorm       Tensor  // [headDim] or nil: per-head RMS norm of Q before rotation (Qwen3)
	KNorm       Tensor  // [headDim] or nil
	NormEps     float32 // eps of QNorm/KNorm
	NumHeads    int
	NumKVHeads  int
	HeadDim     int
}

// AttentionArgs are the operands of Backend.Attention.
//
// Sequence s owns query rows [QueryStart[s], QueryStart[s+1]) and has
// SeqLens[s] tokens of context in the cache, this step's included, so its
// query row i sits at position SeqLens[s] - qLen + i and attends to cache
// positions <= that (and > that - SlidingWindow when SlidingWindow > 0).
// The context of s lives in blocks BlockTables[s][0..]: position p is at
// offset p%blockSize of block BlockTables[s][p/blockSize].
type AttentionArgs struct {
	Out         Tensor // [numTokens, numHeads*headDim]
	Q           Tensor // [numTokens, numHeads*headDim], rotated
	KCache      Tensor // [numBlocks, numKVHeads, blockSize, headDim]
	VCache      Tensor // [numBlocks, numKVHeads, blockSize, headDim]
	KV          KVSpec // the caches' format
	KVAux       KVAux  // the caches' scales and window, as KV says
	BlockTables Tensor // [numSeqs, maxBlocksPerSeq] I32
	SeqLens     Tensor // [numSeqs] I32
	QueryStart  Tensor // [numSeqs+1] I32, QueryStart[0] = 0
	NumSeqs     int
	MaxSeqLen   int // upper bound of SeqLens, for tiling decisions
	// MaxQueryLen bounds the query rows of any one sequence (0: unknown,
	// up to the token count). 1 promises a decode-only batch: backends may
	// then skip their prefill path, and must report a sequence with more
	// rows as an error rather than leave its output unwritten.
	MaxQueryLen int
	// StepKeys bounds how many of each sequence's last cache positions
	// the ops before this one in the step wrote (0: as many as its query
	// rows, as in any step that writes only its own rows). A step whose
	// one-row sequences read rows that other sequences of the step wrote
	// (a verify step run as decode rows: row j of a sequence is a
	// sequence of one row whose context ends with rows 0..j-1 of the
	// same step) sets it to those rows' count; backends that start
	// reading older positions while the previous op still runs must read
	// the last StepKeys positions after it.
	StepKeys      int
	NumHeads      int
	NumKVHeads    int
	HeadDim       int
	Scale         float32 // usually 1/sqrt(headDim)
	SlidingWindow int     // 0: unlimited
}

// SampleArgs are the operands of Backend.Sample.
type SampleArgs struct {
	Logits Tensor // [n, vocab] F32
	// Rows holds one entry per logits row.
	Rows []SampleRow
}

// SampleRow is the sampling rule of one logits row. With Temperature <= 0
// the row is greedy (argmax, lowest id on ties). Otherwise logits are
// divided by Temperature, filtered by TopK (0: off), TopP (>= 1: off) and
// MinP (0: off), renormalised, and the token whose cumulative probability
// (in descending probability order, ties by lower id) first exceeds U is
// chosen. U in [0,1) comes from the request's seeded RNG on the host, so
// every backend picks the same token for the same inputs.
type SampleRow struct {
	Temperature float32
	TopK        int
	TopP        float32
	MinP        float32
	U           float32
}

// ErrShape is wrapped by errors about operand shapes.
var ErrShape = errors.New("shape mismatch")

// ShapeError reports an operand whose shape or dtype the op cannot take.
func ShapeError(op, operand string, format string, args ...any) error {
	return fmt.Errorf("%s: %s: %s: %w", op, operand, fmt.Sprintf(format, args...), ErrShape)
}

// NumElements returns the product of shape, or an error on a non-positive
// dimension or overflow.
func NumElements(shape []int) (int, error) {
	n := 1
	for _, d := range shape {
		if d <= 0 {
			return 0, fmt.Errorf("dimension %d in %v: %w", d, shape, ErrShape)
		}
		if n > (1<<62)/d {
			return 0, fmt.Errorf("element count of %v overflows", shape)
		}
		n *= d
	}
	return n, nil
}

// GraphCapturer is implemented by backends that can record the ops a
// function queues and replay them with one launch (CUDA graphs). While
// capturing, fn may only queue ops: calls that wait for the device (Alloc,
// Write, Read, Sample, Sync) fail. Replays read and write the same
// addresses as the captured ops, so inputs are refreshed by writing into
// the captured tensors before Launch. Kernels must have run once eagerly
// before capture.
type GraphCapturer interface {
	CaptureGraph(fn func() error) (Graph, error)
}

// Graph is a captured op sequence.
type Graph interface {
	// Launch queues one replay.
	Launch() error
	// Close releases the graph and the temporaries it holds.
	Close()
}

// MemoryReporter is implemented by backends with their own memory (GPUs),
// so the KV cache can be sized to what is left after the weights.
type MemoryReporter interface {
	// MemoryInfo returns the bytes free for new allocations and the total.
	MemoryInfo() (free, total int64, err error)
}

// DeviceSampler is an optional Backend interface that keeps the host out
// of a decode step's critical path: SampleTo leaves the sampled ids on the
// device (where the next step's embedding can read them), and ReadAsync
// queues their copy to the host, to be waited for after the next step is
// queued. Both only queue work and return; ops run in queue order.
type DeviceSampler interface {
	// SampleTo queues Sample(args) with the picks written to ids [n] I32.
	SampleTo(ids Tensor, args SampleArgs) error
	// ReadAsync queues a copy of t (at most MaxAsyncRead bytes) to the
	// host and returns wait, which blocks until the copy is done, fills dst
	// and reports any error of the ops queued before it (as Sync would).
	// At most MaxAsyncReads reads may be pending (queued, not yet waited
	// for); each wait must be called once.
	ReadAsync(t Tensor, dst []byte) (wait func() error, err error)
}

// Limits of DeviceSampler.ReadAsync.
const (
	MaxAsyncRead  = 64 << 10
	MaxAsyncReads = 4
)

// RandomFiller is an optional Backend interface: FillNormal writes
// synthetic values into t where it lives, so benchmarks can make a model's
// weights on the device instead of generating and copying gigabytes from
// the host. Element i (row-major) becomes mean + std*SyntheticNormal(seed,
// i), rounded to t's dtype (F32 or BF16; others are an ErrShape error).
// Every backend computes the same bits.
type RandomFiller interface {
	FillNormal(t Tensor, seed uint64, mean, std float32) error
}

// SyntheticNormal is FillNormal's value for element i before scaling: an
// Irwin-Hall sum of four 16-bit uniforms from a splitmix64 hash of (seed,
// i), centred and scaled to unit variance (support +-3.46). Integer
// arithmetic and one float32 multiply, so a GPU kernel reproduces it bit
// for bit.
func SyntheticNormal(seed uint64, i int64) float32 {
	z := seed + uint64(i)*0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	z ^= z >> 31
	s := int32(z&0xffff) + int32(z>>16&0xffff) + int32(z>>32&0xffff) + int32(z>>48)
	// Four uniforms (k+0.5)/65536 sum to (s+2)/65536, of mean 2 and
	// variance 1/3: z = ((s+2)/65536 - 2) * sqrt(3).
	return float32(float32(s+2-131072) * SyntheticScale)
}

// SyntheticScale is sqrt(3)/65536 in float32 (kernels take it as an
// argument rather than re-deriving the constant).
const SyntheticScale = float32(1.7320508075688772 / 65536)

// SyntheticValue is mean + std*SyntheticNormal(seed, i) with FillNormal's
// rounding (before the store's conversion to the tensor's dtype).
func SyntheticValue(seed uint64, i int64, mean, std float32) float32 {
	t := float32(std * SyntheticNormal(seed, i))
	return float32(mean + t)
}
