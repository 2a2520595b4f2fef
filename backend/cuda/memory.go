package cuda

import (
	"fmt"
	"math/bits"
	"sync/atomic"
	"unsafe"

	"github.com/trigon-llm/trigon/backend"
)

const cudaErrorOutOfMemory = 2

// pool reuses device allocations by size class, so the per-step path
// (activations, attention partials, temporaries) never calls cuMemAlloc
// once warm. Classes are powers of two up to 1 MiB and eighths of a power
// of two above it (at most 12.5% slack). Freed blocks stay cached until an
// allocation fails, which trims the cache and retries. CUDA thread only;
// reuse is safe without events because all work runs on one stream.
type pool struct {
	d      *driver
	free   map[int][]uint64
	class  map[uint64]int // every pool pointer (live or free) -> its class size
	cached int64
	live   int64
}

func sizeClass(n int) int {
	if n <= 256 {
		return 256
	}
	p := 1 << bits.Len(uint(n-1)) // next power of two >= n
	if p <= 1<<20 {
		return p
	}
	step := p / 8
	return (n + step - 1) / step * step
}

func (p *pool) get(n int) (uint64, error) {
	c := sizeClass(n)
	if l := p.free[c]; len(l) > 0 {
		ptr := l[len(l)-1]
		p.free[c] = l[:len(l)-1]
		p.cached -= int64(c)
		p.live += int64(c)
		return ptr, nil
	}
	var ptr uint64
	res := p.d.call(p.d.cuMemAlloc, uintptr(unsafe.Pointer(&ptr)), uintptr(c))
	if res == cudaErrorOutOfMemory && p.cached > 0 {
		p.trim()
		res = p.d.call(p.d.cuMemAlloc, uintptr(unsafe.Pointer(&ptr)), uintptr(c))
	}
	if err := p.d.check("cuMemAlloc", res); err != nil {
		return 0, fmt.Errorf("allocate %d device bytes (%d live, %d cached): %w", c, p.live, p.cached, err)
	}
	p.class[ptr] = c
	p.live += int64(c)
	return ptr, nil
}

func (p *pool) put(ptr uint64) {
	c, ok := p.class[ptr]
	if !ok {
		return
	}
	p.free[c] = append(p.free[c], ptr)
	p.cached += int64(c)
	p.live -= int64(c)
}

// trim returns every cached block to the driver.
func (p *pool) trim() {
	for c, l := range p.free {
		for _, ptr := range l {
			p.d.call(p.d.cuMemFree, uintptr(ptr))
			delete(p.class, ptr)
		}
		delete(p.free, c)
	}
	p.cached = 0
}

// release frees every block, live ones included (teardown).
func (p *pool) release() {
	for ptr := range p.class {
		p.d.call(p.d.cuMemFree, uintptr(ptr))
	}
	p.class, p.free = map[uint64]int{}, map[int][]uint64{}
	p.cached, p.live = 0, 0
}

// allocation is a pool block shared by a tensor and its views.
type allocation struct {
	ptr   uint64
	freed bool
	// pristine: written only by host copies since Upload (or by a
	// FillNormal that has completed), never handed to an op except as a
	// product's weight or bias. Only then may the GEMV read it before the
	// previous kernel finishes (launch.go). Atomic: ops validate on the
	// caller's goroutine.
	pristine atomic.Bool
}

// tensor is a device tensor handle.
type tensor struct {
	b     *Backend
	dt    backend.DType
	shape []int
	ptr   uint64 // device address of the first element
	bytes int
	// alloc is the owning block; nil for views and reshapes, which share
	// their base's memory and are not freed on their own.
	alloc *allocation
	// owner is the block the memory belongs to, for views too.
	owner *allocation
}

func (t *tensor) DType() backend.DType { return t.dt }
func (t *tensor) Shape() []int         { return t.shape }

func (b *Backend) tensorOf(op, name string, t backend.Tensor) (*tensor, error) {
	if t == nil {
		return nil, backend.ShapeError("cuda: "+op, name, "nil tensor")
	}
	ct, ok := t.(*tensor)
	if !ok || ct.b != b {
		return nil, backend.ShapeError("cuda: "+op, name, "tensor %T does not belong to %s", t, b.name)
	}
	if ct.alloc != nil && ct.alloc.freed {
		return nil, backend.ShapeError("cuda: "+op, name, "tensor was freed")
	}
	if ct.owner != nil && name != "w" && name != "bias" {
		// w and bias are only ever a product's weight and bias (MatMul,
		// MatMulAdd, GateUpSiLU, the fused QKV ops), which kernels read;
		// any other role may mean a kernel writes it.
		ct.owner.pristine.Store(false)
	}
	return ct, nil
}

func validDType(dt backend.DType) bool {
	switch dt {
	case backend.F32, backend.F16, backend.BF16, backend.Q8_0, backend.Q4_0, backend.I32, backend.F8E4M3, backend.I8, backend.U4:
		return true
	case backend.AWQ4G32, backend.AWQ4G64, backend.AWQ4G128, backend.F8E4M3Row:
		return true
	case backend.Q4_K, backend.Q5_K, backend.Q6_K:
		return true
	}
	return false
}

// Alloc implements backend.Backend. The memory is uninitialised.
func (b *Backend) Alloc(dt backend.DType, shape ...int) (backend.Tensor, error) {
	if !validDType(dt) {
		return nil, backend.ShapeError("cuda: alloc", "dtype", "unknown dtype %v", dt)
	}
	n, err := dt.Bytes(shape)
	if err != nil {
		return nil, fmt.Errorf("cuda: alloc %v%v: %w", dt, shape, err)
	}
	var ptr uint64
	if err := b.call(func() (err error) {
		ptr, err = b.pool.get(n)
		return err
	}); err != nil {
		return nil, fmt.Errorf("cuda: alloc %v%v: %w", dt, shape, err)
	}
	a := &allocation{ptr: ptr}
	return &tensor{b: b, dt: dt, shape: append([]int(nil), shape...), ptr: ptr, bytes: n, alloc: a, owner: a}, nil
}

// Upload implements backend.Backend. The bytes are copied to the device
// in their own dtype (quantized weights stay quantized); data is not
// retained.
func (b *Backend) Upload(dt backend.DType, shape []int, data []byte) (backend.Tensor, error) {
	t, err := b.Alloc(dt, shape...)
	if err != nil {
		return nil, err
	}
	if err := b.Write(t, data); err != nil {
		b.Free(t)
		return nil, fmt.Errorf("cuda: upload %v%v: %w", dt, shape, err)
	}
	t.(*tensor).owner.pristine.Store(true)
	return t, nil
}

// Write implements backend.Backend. Small writes (step inputs) go through
// a ring of pinned buffers and do not wait for the stream; data may be
// reused as soon as Write returns.
func (b *Backend) Write(t backend.Tensor, data []byte) error {
	ct, err := b.tensorOf("write", "t", t)
	if err != nil {
		return err
	}
	if len(data) != ct.bytes {
		return backend.ShapeError("cuda: write", "data", "%d bytes for a %v%v tensor of %d bytes", len(data), ct.dt, ct.shape, ct.bytes)
	}
	data, err = deviceBytes(ct, data) // AWQ4: the device layout (wquant_layout.go)
	if err != nil {
		return fmt.Errorf("cuda: write: %w", err)
	}
	return b.call(func() error {
		b.dropShadows(ct.ptr, ct.ptr+uint64(ct.bytes))
		return b.copyIn(ct.ptr, data)
	})
}

// copyIn copies host bytes to device address dst. CUDA thread only.
func (b *Backend) copyIn(dst uint64, data []byte) error {
	d := b.d
	if len(data) <= ringSlotBytes {
		s := &b.ring[b.ringNext]
		b.ringNext = (b.ringNext + 1) % ringSlots
		if s.used {
			if err := d.check("cuEventSynchronize", d.call(d.cuEventSynchronize, s.ev)); err != nil {
				return err
			}
		}
		copy(s.mem.b, data)
		if ok, err := b.copyKernel(dst, s.dev, len(data)); err != nil {
			return err
		} else if !ok {
			if err := d.check("cuMemcpyHtoDAsync", d.call(d.cuMemcpyHtoDAsync, uintptr(dst), s.mem.host, uintptr(len(data)), b.stream)); err != nil {
				return err
			}
		}
		s.used = true
		return d.check("cuEventRecord", d.call(d.cuEventRecord, s.ev, b.stream))
	}
	for off := 0; off < len(data); off += stageBytes {
		n := min(stageBytes, len(data)-off)
		copy(b.stage.b, data[off:off+n])
		if err := d.check("cuMemcpyHtoDAsync", d.call(d.cuMemcpyHtoDAsync, uintptr(dst+uint64(off)), b.stage.host, uintptr(n), b.stream)); err != nil {
			return err
		}
		if err := d.check("cuStreamSynchronize", d.call(d.cuStreamSynchronize, b.stream)); err != nil {
			return err
		}
	}
	return nil
}

// copyKernel queues copy_words from src to dst (device addresses, either
// host-mapped) when n bytes are whole aligned words of at most
// ringSlotBytes; ok false says it queued nothing and the caller copies
// with the copy engine. Small copies between pinned host memory and the
// device (a step's inputs, its sampled ids) go through the SMs rather
// than the copy engines, which would switch between engine and SMs
// around the step's kernels. CUDA thread only.
func (b *Backend) copyKernel(dst, src uint64, n int) (ok bool, err error) {
	if n == 0 || n > ringSlotBytes || n%4 != 0 || dst%4 != 0 || src%4 != 0 {
		return false, nil
	}
	f, err := b.fn(fnKey{modSpec{file: "copy"}, "copy_words"})
	if err != nil {
		return false, err
	}
	words := n / 4
	// A word a thread: a thread's loop would wait out one latency (a PCIe
	// round trip when the source is host memory) per word.
	blocks := (words + 255) / 256
	return true, b.launch(f, [3]int{blocks, 1, 1}, 256, 0, dst, src, i32(words))
}

// Read implements backend.Backend: it waits for the queued work, then
// copies t's bytes into dst.
func (b *Backend) Read(t backend.Tensor, dst []byte) error {
	ct, err := b.tensorOf("read", "t", t)
	if err != nil {
		return err
	}
	if len(dst) != ct.bytes {
		return backend.ShapeError("cuda: read", "dst", "%d bytes for a %v%v tensor of %d bytes", len(dst), ct.dt, ct.shape, ct.bytes)
	}
	return b.call(func() error {
		if err := b.copyOut(dst, ct.ptr); err != nil {
			return err
		}
		if err := hostBytes(ct, dst); err != nil { // AWQ4: back to the format
			return err
		}
		// A queued op that failed to launch (a kernel that did not
		// compile, say) left t's bytes other than its result: report it
		// here, as Sync would, rather than hand back stale data.
		if err := b.deferred; err != nil {
			b.deferred = nil
			return err
		}
		return nil
	})
}

// copyOut copies device bytes at src into dst. CUDA thread only.
func (b *Backend) copyOut(dst []byte, src uint64) error {
	d := b.d
	for off := 0; off < len(dst); off += stageBytes {
		n := min(stageBytes, len(dst)-off)
		if err := d.check("cuMemcpyDtoHAsync", d.call(d.cuMemcpyDtoHAsync, b.stage.host, uintptr(src+uint64(off)), uintptr(n), b.stream)); err != nil {
			return err
		}
		if err := d.check("cuStreamSynchronize", d.call(d.cuStreamSynchronize, b.stream)); err != nil {
			return err
		}
		copy(dst[off:off+n], b.stage.b[:n])
	}
	return nil
}

// View implements backend.Backend.
func (b *Backend) View(t backend.Tensor, start, n int) (backend.Tensor, error) {
	ct, err := b.tensorOf("view", "t", t)
	if err != nil {
		return nil, err
	}
	if len(ct.shape) == 0 || start < 0 || n <= 0 || start > ct.shape[0]-n {
		return nil, backend.ShapeError("cuda: view", "rows", "[%d, %d+%d) of %v", start, start, n, ct.shape)
	}
	row := ct.bytes / ct.shape[0]
	shape := append([]int{n}, ct.shape[1:]...)
	return &tensor{b: b, dt: ct.dt, shape: shape, ptr: ct.ptr + uint64(start*row), bytes: n * row, owner: ct.owner}, nil
}

// Reshape implements backend.Backend.
func (b *Backend) Reshape(t backend.Tensor, shape ...int) (backend.Tensor, error) {
	ct, err := b.tensorOf("reshape", "t", t)
	if err != nil {
		return nil, err
	}
	n, err := ct.dt.Bytes(shape)
	if err != nil {
		return nil, fmt.Errorf("cuda: reshape %v to %v: %w", ct.shape, shape, err)
	}
	if n != ct.bytes {
		return nil, backend.ShapeError("cuda: reshape", "shape", "%v (%d bytes) to %v (%d bytes)", ct.shape, ct.bytes, shape, n)
	}
	if isAWQ(ct.dt) && shape[len(shape)-1] != ct.shape[len(ct.shape)-1] {
		// The device layout orders each row by its width.
		return nil, backend.ShapeError("cuda: reshape", "shape", "%v rows of %d to rows of %d: the device layout is per row", ct.dt, ct.shape[len(ct.shape)-1], shape[len(shape)-1])
	}
	return &tensor{b: b, dt: ct.dt, shape: append([]int(nil), shape...), ptr: ct.ptr, bytes: n, owner: ct.owner}, nil
}

// Free implements backend.Backend. The block returns to the pool after the
// work queued before it; freeing a view does nothing.
func (b *Backend) Free(t backend.Tensor) {
	ct, ok := t.(*tensor)
	if !ok || ct.b != b || ct.alloc == nil || ct.alloc.freed || b.closed {
		return
	}
	ct.alloc.freed = true
	ptr, size := ct.alloc.ptr, uint64(ct.bytes)
	b.post(func() error {
		b.dropShadows(ptr, ptr+size)
		b.pool.put(ptr)
		return nil
	})
}
