// Package cpu is the pure-Go implementation of backend.Backend: the fallback
// that runs everywhere (CI, laptops, machines without a GPU) and the oracle
// every CUDA kernel is checked against.
//
// Correctness and clarity come before speed, but the hot ops use every core:
// MatMul partitions output features across goroutines and keeps weights in
// their stored dtype (quantized rows are dequantized tile by tile as they are
// read), so weights are never expanded in memory. Large weights are copied
// once, at Upload, onto transparent huge pages (weights.go).
//
// Activations, logits and Q are F32. Weights may be F32, F16, BF16, Q8_0,
// Q4_0 or the K-quants Q4_K, Q5_K and Q6_K; KV caches F32, BF16 or F16. The dtype conversions it uses live with
// the dtypes in package backend.
//
// The package assumes a little-endian host (amd64, arm64): tensor bytes are
// the dtype's little-endian encoding and are viewed in place.
package cpu

import (
	"fmt"
	"runtime"
	"unsafe"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/samplerule"
)

// Options configures a Backend.
type Options struct {
	// Threads is the number of goroutines an op may use; 0 or negative
	// means runtime.GOMAXPROCS(0).
	Threads int
}

// Backend is the CPU implementation of backend.Backend. Like every backend
// it is not safe for concurrent use; its per-worker scratch buffers rely on
// that.
type Backend struct {
	threads int
	// scratch[w] is worker w's reusable f32 buffer (weight tiles, gathered
	// K/V); grown on demand and kept between ops.
	scratch [][]float32
	// samplers[w] is worker w's reusable sampling scratch.
	samplers []samplerule.Scratch
	// pool runs the parallel parts of ops on threads-1 persistent
	// goroutines beside the caller.
	pool *pool
	// k holds the vector kernels chosen for this CPU.
	k kernels
	// xq and xs hold x quantized to int8 blocks for the quantized decode
	// products (grown on demand).
	xq []int8
	xs []float32
	// xm holds, per x row and block, the scale and offset correction of
	// the quantized prefill products (quantizeRows).
	xm []uint32
	// xk holds the per-16 sums of x quantized for the K-quant products
	// (quantizeQ8K; xq and xs hold its values and scales).
	xk []int16
	// kMins and kSums are gemmK's scratch: the weight's sub-block mins,
	// x's scaled block sums and their product.
	kMins, kSums []float32
	// xf8 holds x rows quantized to e4m3 and decoded back, the activations
	// of the F8E4M3Row products (wquant.go; grown on demand).
	xf8 []float32
	// weights holds the copies Upload makes of large weights (weights.go).
	weights weightArena
}

var _ backend.Backend = (*Backend)(nil)

// New returns a CPU backend that runs the best vector kernels this CPU
// has.
func New(opts Options) *Backend { return newWithKernels(opts, kernelSets()[0]) }

// newWithKernels returns a CPU backend that runs kernel set k (tests run
// every set the CPU has against the pure-Go one).
func newWithKernels(opts Options, k kernels) *Backend {
	n := opts.Threads
	if n <= 0 {
		n = runtime.GOMAXPROCS(0)
	}
	b := &Backend{
		threads:  n,
		scratch:  make([][]float32, n),
		samplers: make([]samplerule.Scratch, n),
		pool:     newPool(n),
		k:        k,
	}
	stopPoolWhenUnreachable(b)
	return b
}

// Name implements backend.Backend.
func (b *Backend) Name() string { return "cpu" }

// ActDType implements backend.Backend: the CPU computes activations in F32.
func (b *Backend) ActDType() backend.DType { return backend.F32 }

// Kernels names the vector kernel set the backend runs (avx512, avx2,
// neon-dotprod, neon, or go for the pure-Go code).
func (b *Backend) Kernels() string { return b.k.name }

// Threads reports the number of goroutines ops may use.
func (b *Backend) Threads() int { return b.threads }

// tensor is the CPU tensor: a dtype, a shape and the bytes of its row-major
// encoding. Views and reshapes share data.
type tensor struct {
	dt    backend.DType
	shape []int
	data  []byte // exactly dt.Bytes(shape) bytes
	freed bool
}

func (t *tensor) DType() backend.DType { return t.dt }
func (t *tensor) Shape() []int         { return t.shape }

// f32 views t's bytes as float32s. Alloc and Upload guarantee alignment.
func (t *tensor) f32() []float32 { return bytesAs[float32](t.data) }

// i32 views t's bytes as int32s.
func (t *tensor) i32() []int32 { return bytesAs[int32](t.data) }

func bytesAs[T float32 | int32 | uint16 | int8](b []byte) []T {
	var zero T
	size := int(unsafe.Sizeof(zero))
	if len(b) < size {
		return nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/size)
}

// elemSize is the byte size of one element of a plain dtype, 0 for
// block-quantized or unknown ones.
func elemSize(dt backend.DType) int {
	if dt.Quantized() {
		return 0
	}
	return dt.BlockBytes()
}

func validDType(dt backend.DType) bool {
	switch dt {
	case backend.F32, backend.F16, backend.BF16, backend.Q8_0, backend.Q4_0, backend.I32, backend.F8E4M3, backend.I8, backend.U4:
		return true
	case backend.Q4_K, backend.Q5_K, backend.Q6_K:
		return true
	case backend.AWQ4G32, backend.AWQ4G64, backend.AWQ4G128, backend.F8E4M3Row:
		return true
	}
	return false
}

// alignedBytes returns n zeroed bytes aligned to 8 bytes, so that any
// element type can be viewed in place.
func alignedBytes(n int) []byte {
	if n == 0 {
		return []byte{}
	}
	words := make([]uint64, (n+7)/8)
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(words))), n)
}

// copyInto copies src into dst (of the same length) and returns dst.
func copyInto(dst, src []byte) []byte {
	copy(dst, src)
	return dst
}

func copyShape(shape []int) []int { return append([]int(nil), shape...) }

// Alloc implements backend.Backend. The memory is zeroed Go memory; from
// a huge page up (KV pools, prefill activations) it is a huge-page run of
// its own (hugeRun), which the prefill's products and attention stream
// faster than 4 KiB pages.
func (b *Backend) Alloc(dt backend.DType, shape ...int) (backend.Tensor, error) {
	if !validDType(dt) {
		return nil, fmt.Errorf("cpu: alloc: unknown dtype %v", dt)
	}
	n, err := dt.Bytes(shape)
	if err != nil {
		return nil, fmt.Errorf("cpu: alloc %v %v: %w", dt, shape, err)
	}
	if n >= hugePageBytes {
		return &tensor{dt: dt, shape: copyShape(shape), data: hugeRun(n)[:n:n]}, nil
	}
	return &tensor{dt: dt, shape: copyShape(shape), data: alignedBytes(n)}, nil
}

// Upload implements backend.Backend. A tensor of at least hugeMinBytes is
// copied once into the weight arena (huge pages, weights.go). A smaller
// one keeps a reference to data rather than copying it, except when data
// is not aligned to the element size of a plain dtype (viewing it in place
// would be a misaligned access): then it copies once.
func (b *Backend) Upload(dt backend.DType, shape []int, data []byte) (backend.Tensor, error) {
	if !validDType(dt) {
		return nil, fmt.Errorf("cpu: upload: unknown dtype %v", dt)
	}
	n, err := dt.Bytes(shape)
	if err != nil {
		return nil, fmt.Errorf("cpu: upload %v %v: %w", dt, shape, err)
	}
	if len(data) != n {
		return nil, fmt.Errorf("cpu: upload %v %v: got %d bytes, want %d: %w", dt, shape, len(data), n, backend.ErrShape)
	}
	if n >= hugeMinBytes {
		data = copyInto(b.weights.alloc(n), data)
	} else if es := elemSize(dt); es > 1 && n > 0 && uintptr(unsafe.Pointer(unsafe.SliceData(data)))%uintptr(es) != 0 {
		data = copyInto(alignedBytes(n), data)
	}
	return &tensor{dt: dt, shape: copyShape(shape), data: data[:n:n]}, nil
}

// tensorOf checks that t is a live tensor of this backend.
func tensorOf(op, name string, t backend.Tensor) (*tensor, error) {
	if t == nil {
		return nil, fmt.Errorf("cpu: %s: %s: nil tensor", op, name)
	}
	ct, ok := t.(*tensor)
	if !ok || ct == nil {
		return nil, fmt.Errorf("cpu: %s: %s: tensor %T is not from the cpu backend", op, name, t)
	}
	if ct.freed {
		return nil, fmt.Errorf("cpu: %s: %s: use of freed tensor", op, name)
	}
	return ct, nil
}

// optTensorOf is tensorOf for optional operands: nil gives nil.
func optTensorOf(op, name string, t backend.Tensor) (*tensor, error) {
	if t == nil {
		return nil, nil
	}
	if ct, ok := t.(*tensor); ok && ct == nil {
		return nil, nil
	}
	return tensorOf(op, name, t)
}

// Write implements backend.Backend.
func (b *Backend) Write(t backend.Tensor, data []byte) error {
	ct, err := tensorOf("write", "dst", t)
	if err != nil {
		return err
	}
	if len(data) != len(ct.data) {
		return backend.ShapeError("cpu: write", "data", "got %d bytes, tensor %v %v holds %d", len(data), ct.dt, ct.shape, len(ct.data))
	}
	copy(ct.data, data)
	return nil
}

// Read implements backend.Backend.
func (b *Backend) Read(t backend.Tensor, dst []byte) error {
	ct, err := tensorOf("read", "src", t)
	if err != nil {
		return err
	}
	if len(dst) != len(ct.data) {
		return backend.ShapeError("cpu: read", "dst", "got %d bytes, tensor %v %v holds %d", len(dst), ct.dt, ct.shape, len(ct.data))
	}
	copy(dst, ct.data)
	return nil
}

// View implements backend.Backend.
func (b *Backend) View(t backend.Tensor, start, n int) (backend.Tensor, error) {
	ct, err := tensorOf("view", "src", t)
	if err != nil {
		return nil, err
	}
	if len(ct.shape) == 0 {
		return nil, backend.ShapeError("cpu: view", "src", "scalar tensor has no rows")
	}
	rows := ct.shape[0]
	if start < 0 || n <= 0 || start > rows || n > rows-start {
		return nil, backend.ShapeError("cpu: view", "rows", "[%d, %d) outside %d rows", start, start+n, rows)
	}
	// A 1-D quantized tensor can only be cut at block boundaries; Bytes
	// reports that.
	shape := copyShape(ct.shape)
	shape[0] = n
	size, err := ct.dt.Bytes(shape)
	if err != nil {
		return nil, backend.ShapeError("cpu: view", "rows", "%v", err)
	}
	var off int
	if start > 0 {
		prefix := copyShape(ct.shape)
		prefix[0] = start
		if off, err = ct.dt.Bytes(prefix); err != nil {
			return nil, backend.ShapeError("cpu: view", "start", "%v", err)
		}
	}
	return &tensor{dt: ct.dt, shape: shape, data: ct.data[off : off+size : off+size]}, nil
}

// Reshape implements backend.Backend.
func (b *Backend) Reshape(t backend.Tensor, shape ...int) (backend.Tensor, error) {
	ct, err := tensorOf("reshape", "src", t)
	if err != nil {
		return nil, err
	}
	n, err := backend.NumElements(shape)
	if err != nil {
		return nil, fmt.Errorf("cpu: reshape %v to %v: %w", ct.shape, shape, err)
	}
	old, _ := backend.NumElements(ct.shape)
	if n != old {
		return nil, backend.ShapeError("cpu: reshape", "shape", "%v has %d elements, %v has %d", shape, n, ct.shape, old)
	}
	size, err := ct.dt.Bytes(shape)
	if err != nil || size != len(ct.data) {
		// Only quantized rows can fail here: the new row must be whole blocks.
		return nil, backend.ShapeError("cpu: reshape", "shape", "%v rows of %v are not whole blocks", shape, ct.dt)
	}
	return &tensor{dt: ct.dt, shape: copyShape(shape), data: ct.data}, nil
}

// Free implements backend.Backend. The memory goes back to the garbage
// collector once no view references it; the handle is unusable afterwards.
func (b *Backend) Free(t backend.Tensor) {
	if ct, ok := t.(*tensor); ok && ct != nil {
		ct.freed = true
		ct.data = nil
	}
}

// Sync implements backend.Backend. CPU ops run synchronously, so there is
// never deferred work or a deferred error.
func (b *Backend) Sync() error { return nil }

// opErr prefixes an operand check's error with the backend's name.
func opErr(err error) error { return fmt.Errorf("cpu: %w", err) }

// checkF32 reports the first of ts (named by names) that is not F32: the
// CPU computes activations, Q and logits in F32 only, a subset of what the
// contract allows.
func checkF32(op string, names []string, ts ...*tensor) error {
	for i, t := range ts {
		if err := backend.CheckDType(op, names[i], t, backend.F32); err != nil {
			return opErr(err)
		}
	}
	return nil
}

// orNil turns an absent optional operand (nil, or a nil *tensor that
// optTensorOf resolved to nil) into a nil interface for the backend
// package's checks.
func orNil(t backend.Tensor, resolved *tensor) backend.Tensor {
	if resolved == nil {
		return nil
	}
	return t
}

// rowBytes returns the byte length of one innermost row of t.
func (t *tensor) rowBytes() int {
	if len(t.shape) == 0 {
		return len(t.data)
	}
	n, _ := t.dt.RowBytes(t.shape[len(t.shape)-1])
	return n
}

// floatVector returns the F32 values of a small float tensor (norm weights,
// biases, inverse frequencies), converting F16/BF16 into a new slice.
func floatVector(t *tensor) []float32 {
	if t.dt == backend.F32 {
		return t.f32()
	}
	out := make([]float32, len(t.data)/t.dt.BlockBytes())
	_ = backend.DequantizeRow(t.dt, t.data, out)
	return out
}
