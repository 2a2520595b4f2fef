package cuda

import (
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/trigon-llm/trigon/backend"
)

// Dtype codes shared with the kernels (common.cuh's DT_*).
const (
	dtF32  = int(backend.F32)
	dtF16  = int(backend.F16)
	dtBF16 = int(backend.BF16)
	dtQ8_0 = int(backend.Q8_0)
	dtQ4_0 = int(backend.Q4_0)
)

const (
	maxKernelArgs = 32
	ringSlots     = 16
	ringSlotBytes = 256 << 10 // step inputs up to this size skip the stream sync
	stageBytes    = 16 << 20  // large copies go through this pinned buffer in chunks
)

// Options configures New.
type Options struct {
	// Device is the CUDA device ordinal.
	Device int
	// CacheDir holds compiled kernels; "" means
	// os.UserCacheDir()/trigon/kernels, "off" disables the cache.
	CacheDir string
	// Tuning holds the kernels' tuning values; the zero value is the
	// default for each.
	Tuning Tuning
}

// Available reports why the CUDA backend cannot run here (no libcuda, no
// device, no NVRTC or cuBLASLt), or nil. It never panics, so the CLI can
// fall back to the CPU with one clear log line.
func Available() error {
	d, err := loadDriver()
	if err != nil {
		return fmt.Errorf("%w: %v", errNoGPU, err)
	}
	var n int32
	if err := d.check("cuDeviceGetCount", d.call(d.cuDeviceGetCount, uintptr(unsafe.Pointer(&n)))); err != nil {
		return fmt.Errorf("%w: %v", errNoGPU, err)
	}
	if n == 0 {
		return fmt.Errorf("%w: the driver sees no devices", errNoGPU)
	}
	if _, err := loadNVRTC(); err != nil {
		return fmt.Errorf("%w: %v", errNoGPU, err)
	}
	if _, err := loadLt(); err != nil {
		return fmt.Errorf("%w: %v", errNoGPU, err)
	}
	return nil
}

// pinned is page-locked host memory from cuMemHostAlloc.
type pinned struct {
	host uintptr
	b    []byte
}

type ringSlot struct {
	mem  pinned
	dev  uint64 // mem's device address (host-mapped)
	ev   uintptr
	used bool
}

type task struct {
	fn   func() error
	sync bool
	// spin, for callSpin, receives the result instead of the reply channel.
	spin *spinReply
}

// spinReply is a callSpin result: err is written before done is set.
type spinReply struct {
	done atomic.Bool
	err  error
}

// Backend is the CUDA implementation of backend.Backend.
//
// Every CUDA call runs on one goroutine locked to its OS thread (the CUDA
// context is current per thread). Methods validate their operands on the
// caller's goroutine, then hand a closure to that thread: ops that return
// nothing are queued without waiting (their CUDA errors surface at the
// next Sync), so the caller prepares the next op while the thread
// launches this one; Alloc, Read, Write and Sample wait for their result.
type Backend struct {
	opts Options
	tune tuning // opts.Tuning resolved
	// lowered is Run's lowered program, its storage reused step to step
	// (caller's goroutine).
	lowered []lop
	name    string
	devName string
	d       *driver
	comp    *compiler
	cc, sms int

	tasks  chan task
	reply  chan error
	done   chan struct{}
	closed bool
	// hostCapturing mirrors capturing on the caller's side, so calls that
	// cannot be captured fail before reaching the CUDA thread.
	hostCapturing bool

	// State below is touched only on the CUDA thread.
	dev       int32
	ctx       uintptr
	stream    uintptr
	pool      pool
	mods      map[modSpec]*module
	fns       map[fnKey]uintptr
	params    pinned
	paramVals *[maxKernelArgs]uint64
	paramPtrs uintptr
	// launchCfg is the CUlaunchConfig (in pinned host memory) of launches
	// with programmatic dependent launch; pdl says the device and driver
	// can launch so, and pdlFns holds the functions that do (pdlKernels,
	// as fn fetches them).
	launchCfg *launchConfig
	pdl       bool
	pdlFns    map[uintptr]bool
	// bulkOcc caches bulkGrid's query: blocks of a bulk GEMV function
	// resident per SM.
	bulkOcc map[uintptr]int
	marks   stepClock // MarkStep's events
	errFlag pinned
	errDev  uint64
	// fp8Scan is rope_store_kv's scan buffer for FP8 caches: 2*fp8ScanHeads
	// maxima and a block counter, zero between launches (the scan's last
	// block zeroes what it used).
	fp8Scan uint64
	// argmaxCount is argmax_rows's per-row counters ([argmaxRows] u32,
	// zero between launches; attn.go).
	argmaxCount uint64
	argmaxRows  int
	stage       pinned
	// pinnedList is every cuMemHostAlloc block, freed at teardown.
	pinnedList []uintptr
	ring       [ringSlots]ringSlot
	// reads are ReadAsync's buffers, made on first use.
	reads    [backend.MaxAsyncReads]asyncRead
	ringNext int
	blas     blas
	f8       f8State // FP8 GEMM plans (wquant.go)
	shadows  map[shadowKey]uint64
	deferred error
	// capturing is set while the stream records a graph (CUDA thread);
	// captureTemps are the temporaries the captured ops took (the graph
	// keeps them); captureFree those released again, by size class, for
	// reuse by later ops of the same capture.
	capturing    bool
	captureTemps []uint64
	captureFree  map[int][]uint64
	// tuningEnded is set by EndTuning (CUDA thread): shapes first seen
	// after it take cuBLASLt's heuristic choice untimed.
	tuningEnded bool
}

var (
	_ backend.Backend = (*Backend)(nil)
	_ backend.Lowerer = (*Backend)(nil)
)

// New starts the CUDA thread on device opts.Device and returns the backend.
func New(opts Options) (*Backend, error) {
	tune, err := opts.Tuning.resolve()
	if err != nil {
		return nil, err
	}
	if err := Available(); err != nil {
		return nil, err
	}
	d, _ := loadDriver()
	b := &Backend{
		opts:    opts,
		tune:    tune,
		name:    fmt.Sprintf("cuda:%d", opts.Device),
		d:       d,
		tasks:   make(chan task, 256),
		reply:   make(chan error, 1),
		done:    make(chan struct{}),
		mods:    map[modSpec]*module{},
		fns:     map[fnKey]uintptr{},
		shadows: map[shadowKey]uint64{},
	}
	initErr := make(chan error, 1)
	go b.loop(initErr)
	if err := <-initErr; err != nil {
		return nil, fmt.Errorf("cuda: device %d: %w", opts.Device, err)
	}
	return b, nil
}

// loop is the CUDA thread.
func (b *Backend) loop(initErr chan<- error) {
	// Never unlocked: the thread exits with the goroutine, taking its
	// context binding with it.
	runtime.LockOSThread()
	if err := b.init(); err != nil {
		b.teardown()
		initErr <- err
		close(b.done)
		return
	}
	initErr <- nil
	for {
		t, ok := b.next()
		if !ok {
			break
		}
		b.run(t)
	}
	b.teardown()
	close(b.done)
}

// run runs one task on the CUDA thread and hands its error to whoever
// waits for it: callSpin's poller, call's reply channel, or (a queued op)
// the next Sync.
func (b *Backend) run(t task) {
	err := t.fn()
	switch {
	case t.spin != nil:
		t.spin.err = err
		t.spin.done.Store(true)
	case t.sync:
		b.reply <- err
	case err != nil && b.deferred == nil:
		b.deferred = err
	}
}

func (b *Backend) init() error {
	d := b.d
	if err := d.check("cuDeviceGet", d.call(d.cuDeviceGet, uintptr(unsafe.Pointer(&b.dev)), uintptr(b.opts.Device))); err != nil {
		return err
	}
	major, err := d.deviceAttr(b.dev, cuDevAttrComputeCapMajor)
	if err != nil {
		return err
	}
	minor, err := d.deviceAttr(b.dev, cuDevAttrComputeCapMinor)
	if err != nil {
		return err
	}
	b.cc = major*10 + minor
	if b.cc < 80 {
		return fmt.Errorf("compute capability %d.%d: the kernels need 8.0 (Ampere) or newer", major, minor)
	}
	if b.sms, err = d.deviceAttr(b.dev, cuDevAttrMultiprocessorCount); err != nil {
		return err
	}
	b.devName = d.deviceName(b.dev)
	if err := d.check("cuDevicePrimaryCtxRetain", d.call(d.cuDevicePrimaryCtxRetain, uintptr(unsafe.Pointer(&b.ctx)), uintptr(b.dev))); err != nil {
		return err
	}
	if err := d.check("cuCtxSetCurrent", d.call(d.cuCtxSetCurrent, b.ctx)); err != nil {
		return err
	}
	if err := d.check("cuStreamCreate", d.call(d.cuStreamCreate, uintptr(unsafe.Pointer(&b.stream)), cuStreamNonBlocking)); err != nil {
		return err
	}
	b.pool = pool{d: d, free: map[int][]uint64{}, class: map[uint64]int{}}
	if b.params, err = b.hostAlloc(2*maxKernelArgs*8+launchConfigBytes, 0); err != nil {
		return err
	}
	b.initLaunchConfig(b.params.host + 2*maxKernelArgs*8)
	// kernelParams: values in the first half, the array of pointers to
	// them in the second; the pointers never change.
	b.paramVals = (*[maxKernelArgs]uint64)(cptr(b.params.host))
	ptrs := (*[maxKernelArgs]uint64)(cptr(b.params.host + maxKernelArgs*8))
	for i := range ptrs {
		ptrs[i] = uint64(b.params.host) + uint64(i)*8
	}
	b.paramPtrs = b.params.host + maxKernelArgs*8
	if b.errFlag, err = b.hostAlloc(64, cuMemHostAllocDeviceMap|cuMemHostAllocPortable); err != nil {
		return err
	}
	if err := d.check("cuMemHostGetDevicePointer", d.call(d.cuMemHostGetDevicePointer, uintptr(unsafe.Pointer(&b.errDev)), b.errFlag.host, 0)); err != nil {
		return err
	}
	if b.stage, err = b.hostAlloc(stageBytes, 0); err != nil {
		return err
	}
	const scanBytes = (2*fp8ScanHeads + 1) * 4
	if b.fp8Scan, err = b.pool.get(scanBytes); err != nil {
		return err
	}
	if err := d.check("cuMemsetD8Async", d.call(d.cuMemsetD8Async, uintptr(b.fp8Scan), 0, scanBytes, b.stream)); err != nil {
		return err
	}
	for i := range b.ring {
		if b.ring[i].mem, err = b.hostAlloc(ringSlotBytes, cuMemHostAllocDeviceMap|cuMemHostAllocPortable); err != nil {
			return err
		}
		if err := d.check("cuMemHostGetDevicePointer", d.call(d.cuMemHostGetDevicePointer, uintptr(unsafe.Pointer(&b.ring[i].dev)), b.ring[i].mem.host, 0)); err != nil {
			return err
		}
		if err := d.check("cuEventCreate", d.call(d.cuEventCreate, uintptr(unsafe.Pointer(&b.ring[i].ev)), cuEventDisableTiming)); err != nil {
			return err
		}
	}
	nv, err := loadNVRTC()
	if err != nil {
		return err
	}
	dir := b.opts.CacheDir
	switch dir {
	case "":
		dir = defaultCacheDir()
	case "off":
		dir = ""
	}
	if b.comp, err = newCompiler(nv, b.cc, dir); err != nil {
		return err
	}
	return b.initBlas()
}

func (b *Backend) initBlas() error {
	l, err := loadLt()
	if err != nil {
		return err
	}
	g := &b.blas
	g.lib = l
	if err := b.initBlasHandles(); err != nil {
		return err
	}
	if g.workspace, err = b.pool.get(ltWorkspaceBytes); err != nil {
		return err
	}
	// alpha = 1, beta = 0 at the start; 64-byte algo structs after them.
	if g.scalars, err = b.hostAllocBytes(64 * 1024); err != nil {
		return err
	}
	*(*float32)(unsafe.Pointer(&g.scalars[0])) = 1
	*(*float32)(unsafe.Pointer(&g.scalars[4])) = 0
	return nil
}

// initBlasHandles creates the cuBLASLt handle and matmul preference and
// empties the plan cache.
func (b *Backend) initBlasHandles() error {
	g := &b.blas
	l := g.lib
	g.plans = map[gemmKey]*gemmPlan{}
	if err := l.check("cublasLtCreate", l.call(l.create, uintptr(unsafe.Pointer(&g.handle)))); err != nil {
		return err
	}
	if err := l.check("cublasLtMatmulPreferenceCreate", l.call(l.prefCreate, uintptr(unsafe.Pointer(&g.pref)))); err != nil {
		return err
	}
	ws := uint64(ltWorkspaceBytes)
	return l.check("cublasLtMatmulPreferenceSetAttribute", l.call(l.prefSetAttr, g.pref, ltPrefMaxWorkspaceBytes, uintptr(unsafe.Pointer(&ws)), 8))
}

func (b *Backend) hostAllocBytes(n int) ([]byte, error) {
	p, err := b.hostAlloc(n, 0)
	return p.b, err
}

func (b *Backend) hostAlloc(n int, flags int) (pinned, error) {
	var p uintptr
	if err := b.d.check("cuMemHostAlloc", b.d.call(b.d.cuMemHostAlloc, uintptr(unsafe.Pointer(&p)), uintptr(n), uintptr(flags))); err != nil {
		return pinned{}, fmt.Errorf("pin %d host bytes: %w", n, err)
	}
	b.pinnedList = append(b.pinnedList, p)
	return pinned{host: p, b: unsafe.Slice((*byte)(cptr(p)), n)}, nil
}

// teardown releases everything init made. CUDA thread only.
func (b *Backend) teardown() {
	d := b.d
	if b.ctx == 0 {
		return
	}
	if b.stream != 0 {
		d.call(d.cuStreamSynchronize, b.stream)
	}
	if b.blas.lib != nil {
		b.f8.close(b.blas.lib)
		b.blas.close()
	}
	for _, m := range b.mods {
		d.call(d.cuModuleUnload, m.handle)
	}
	b.mods, b.fns = nil, nil
	b.pool.release()
	b.destroyMarks()
	for i := range b.reads {
		if b.reads[i].ev != 0 {
			d.call(d.cuEventDestroy, b.reads[i].ev)
		}
	}
	for i := range b.ring {
		if b.ring[i].ev != 0 {
			d.call(d.cuEventDestroy, b.ring[i].ev)
		}
	}
	for _, p := range b.pinnedList {
		d.call(d.cuMemFreeHost, p)
	}
	b.pinnedList = nil
	if b.stream != 0 {
		d.call(d.cuStreamDestroy, b.stream)
	}
	d.call(d.cuDevicePrimaryCtxRelease, uintptr(b.dev))
	b.ctx = 0
}

// next returns the next task, blocking: the callers on a step's critical
// path poll for their result instead (callSpin), and a CUDA thread that
// polled the channel too would compete with them for the cores.
func (b *Backend) next() (task, bool) {
	t, ok := <-b.tasks
	return t, ok
}

// post queues f on the CUDA thread without waiting; its error, if any, is
// reported by the next Sync.
func (b *Backend) post(f func() error) error {
	if b.closed {
		return fmt.Errorf("%s: backend is closed", b.name)
	}
	b.tasks <- task{fn: f}
	return nil
}

// callSpin is call for a wait on a decode step's critical path (its
// sampled ids): the caller polls for the result instead of sleeping on
// the reply channel, so no thread wake-up (tens of microseconds, at times
// hundreds) lies between the CUDA thread finishing f and the caller going
// on. It yields between polls, and after spinWait it sleeps between them
// (a long prefill's wait need not hold a core).
func (b *Backend) callSpin(f func() error) error {
	if b.closed {
		return fmt.Errorf("%s: backend is closed", b.name)
	}
	if b.hostCapturing {
		return errCapturing
	}
	r := &spinReply{}
	b.tasks <- task{fn: f, spin: r}
	start, spinning := time.Now(), true
	for i := 1; !r.done.Load(); i++ {
		if !spinning {
			time.Sleep(20 * time.Microsecond)
			continue
		}
		runtime.Gosched()
		if i%256 == 0 && time.Since(start) > spinWait {
			spinning = false
		}
	}
	return r.err
}

// spinWait is how long callSpin polls without sleeping: longer than a
// decode step.
const spinWait = 20 * time.Millisecond

// call runs f on the CUDA thread and waits for its result. It is refused
// while a graph is being captured: whatever waits for a result cannot be
// recorded.
func (b *Backend) call(f func() error) error {
	if b.closed {
		return fmt.Errorf("%s: backend is closed", b.name)
	}
	if b.hostCapturing {
		return errCapturing
	}
	b.tasks <- task{fn: f, sync: true}
	return <-b.reply
}

// Close waits for queued work, releases the device memory, modules and
// context, and stops the CUDA thread. The backend is unusable afterwards.
func (b *Backend) Close() error {
	if b.closed {
		return nil
	}
	err := b.Sync()
	b.closed = true
	close(b.tasks)
	<-b.done
	return err
}

// Name implements backend.Backend.
func (b *Backend) Name() string { return b.name }

// Device describes the GPU: its name, the kernels' target and its SMs, as
// "NVIDIA H100 80GB HBM3 (sm_90a, 132 SMs)".
func (b *Backend) Device() string {
	return fmt.Sprintf("%s (%s, %d SMs)", b.devName, b.comp.arch, b.sms)
}

// ActDType implements backend.Backend: activations are BF16.
func (b *Backend) ActDType() backend.DType { return backend.BF16 }

// launch starts kernel f with the given arguments, each widened to 8
// bytes (pointers, int32 and float32 bits alike: the driver reads each
// parameter's own size from the start of its slot). CUDA thread only.
func (b *Backend) launch(f uintptr, grid [3]int, block, smem int, args ...uint64) error {
	return b.launchArgs(f, grid, block, smem, b.pdlFns[f], args)
}

// launchPDL is launch with programmatic dependent launch wherever the
// device and driver allow it, whatever the kernel: for a launch site
// where it pays though other launches of the same kernel do not gain
// from it (FusedQKVRoPE's Q/K-norm pair). CUDA thread only.
func (b *Backend) launchPDL(f uintptr, grid [3]int, block, smem int, args ...uint64) error {
	return b.launchArgs(f, grid, block, smem, b.pdl, args)
}

// launchArgs copies args into the pinned parameter values and starts f,
// with PDL when pdl. CUDA thread only.
func (b *Backend) launchArgs(f uintptr, grid [3]int, block, smem int, pdl bool, args []uint64) error {
	if len(args) > maxKernelArgs {
		return fmt.Errorf("launch: %d arguments, at most %d", len(args), maxKernelArgs)
	}
	copy(b.paramVals[:], args)
	if pdl {
		c := b.launchCfg
		c.grid = [3]uint32{uint32(grid[0]), uint32(grid[1]), uint32(grid[2])}
		c.block = [3]uint32{uint32(block), 1, 1}
		c.smem = uint32(smem)
		c.stream = b.stream
		return b.d.check("cuLaunchKernelEx", b.d.call(b.d.cuLaunchKernelEx, uintptr(unsafe.Pointer(c)), f, b.paramPtrs, 0))
	}
	return b.d.check("cuLaunchKernel", b.d.call(b.d.cuLaunchKernel, f,
		uintptr(grid[0]), uintptr(grid[1]), uintptr(grid[2]), uintptr(block), 1, 1,
		uintptr(smem), b.stream, b.paramPtrs, 0))
}

// Sync implements backend.Backend: it waits for the stream, then reports
// the first error of the queued ops, or a failed device-side input check
// (an id, slot, block id or query count out of range).
func (b *Backend) Sync() error {
	return b.call(func() error {
		err := b.d.check("cuStreamSynchronize", b.d.call(b.d.cuStreamSynchronize, b.stream))
		if err == nil {
			err = b.deviceCheck()
		}
		if err == nil {
			err = b.deferred
		}
		b.deferred = nil
		return err
	})
}

// deviceCheck reads and clears the flag kernels raise on bad indices.
// Call after a stream sync. CUDA thread only.
func (b *Backend) deviceCheck() error {
	flag := (*int32)(unsafe.Pointer(&b.errFlag.b[0]))
	code := *flag
	if code == 0 {
		return nil
	}
	*flag = 0
	var what []string
	for bit, s := range map[int32]string{
		1:  "Embed id outside the table",
		2:  "RoPEStoreKV slot outside the cache",
		4:  "Attention block id outside the cache or block table",
		8:  "Attention query count inconsistent with QueryStart/SeqLens",
		16: "RoPEStoreKV negative position",
		32: "Sample logits row holds NaN or +Inf, or only -Inf",
		64: "int4 KV cache block without a window block, or one outside the window pool",
	} {
		if code&bit != 0 {
			what = append(what, s)
		}
	}
	return backend.ShapeError("cuda", "device-side check", "%s (code %d)", strings.Join(what, "; "), code)
}
