package cuda

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/trigon-llm/trigon/backend"
)

// Graph is a captured sequence of ops that replays with one launch. Decode
// steps are hundreds of small kernels: queued one by one each costs the
// CUDA thread a cuLaunchKernel, several times what a kernel launched from
// a graph costs the device.
//
// A graph reads and writes the exact tensors its ops named when it was
// captured: the runner refreshes static input tensors (Write) and replays.
// Temporaries the ops needed (attention partials, conversions) belong to
// the graph until Close.
type Graph struct {
	b      *Backend
	graph  uintptr
	exec   uintptr
	temps  []uint64
	bytes  int64 // device bytes of temps, held for the graph's lifetime
	closed bool
}

// Bytes is the device memory the graph holds beyond the tensors it was
// captured over (its temporaries), for graph caches with a memory budget.
// The driver's own graph memory is not counted.
func (g *Graph) Bytes() int64 { return g.bytes }

// errCapturing is returned by calls that cannot be recorded in a graph.
var errCapturing = errors.New("not allowed while a graph is being captured")

// tmpGet takes an op's temporary of n bytes. While capturing, it first
// reuses a temporary an earlier op of the same capture released: ops run
// in stream order, so the earlier op is done with it on every replay, and
// a capture of 32 layers then holds one split-KV buffer, not 32, and does
// not call cuMemAlloc, which would invalidate the capture. CUDA thread only.
func (b *Backend) tmpGet(n int) (uint64, error) {
	if b.capturing {
		c := sizeClass(n)
		if l := b.captureFree[c]; len(l) > 0 {
			ptr := l[len(l)-1]
			b.captureFree[c] = l[:len(l)-1]
			return ptr, nil
		}
		ptr, err := b.pool.get(n)
		if err == nil {
			b.captureTemps = append(b.captureTemps, ptr)
		}
		return ptr, err
	}
	return b.pool.get(n)
}

// tmpPut releases an op's temporary: to the pool, or while capturing to the
// capture's free list (the graph keeps every temporary it used, since its
// replays use their addresses). CUDA thread only.
func (b *Backend) tmpPut(ptr uint64) {
	if b.capturing {
		c := b.pool.class[ptr]
		if b.captureFree == nil {
			b.captureFree = map[int][]uint64{}
		}
		b.captureFree[c] = append(b.captureFree[c], ptr)
		return
	}
	b.pool.put(ptr)
}

// Capture records the ops fn queues into a Graph instead of running them.
// fn may only queue ops (Embed, AddRMSNorm, MatMul, RoPEStoreKV,
// Attention, SiLUMul, Free of nothing captured); Alloc, Upload, Write,
// Read, Sample and Sync fail while capturing. The kernels the ops need
// must already be loaded (run the sequence once eagerly, or WarmKernels):
// loading a module is not a stream operation.
func (b *Backend) Capture(fn func() error) (*Graph, error) {
	if b.closed {
		return nil, fmt.Errorf("%s: backend is closed", b.name)
	}
	if b.hostCapturing {
		return nil, fmt.Errorf("cuda: capture: %w", errCapturing)
	}
	if err := b.Sync(); err != nil {
		return nil, fmt.Errorf("cuda: capture: pending error: %w", err)
	}
	if err := b.call(func() error {
		if err := b.d.check("cuStreamBeginCapture", b.d.call(b.d.cuStreamBeginCapture, b.stream, cuStreamCaptureModeRelaxed)); err != nil {
			return err
		}
		b.capturing = true
		b.captureTemps, b.captureFree = nil, nil
		return nil
	}); err != nil {
		return nil, fmt.Errorf("cuda: capture: %w", err)
	}
	b.hostCapturing = true
	fnErr := fn()
	b.hostCapturing = false
	g := &Graph{b: b}
	err := b.call(func() error {
		b.capturing = false
		g.temps, b.captureTemps, b.captureFree = b.captureTemps, nil, nil
		for _, p := range g.temps {
			g.bytes += int64(b.pool.class[p])
		}
		err := b.d.check("cuStreamEndCapture", b.d.call(b.d.cuStreamEndCapture, b.stream, uintptr(unsafe.Pointer(&g.graph))))
		if err == nil && b.deferred != nil {
			err, b.deferred = b.deferred, nil
		}
		if err == nil && fnErr == nil {
			err = b.d.check("cuGraphInstantiateWithFlags", b.d.call(b.d.cuGraphInstantiateWithFlags, uintptr(unsafe.Pointer(&g.exec)), g.graph, 0))
		}
		if err != nil || fnErr != nil {
			g.release()
		}
		return err
	})
	if fnErr != nil {
		return nil, fmt.Errorf("cuda: capture: %w", fnErr)
	}
	if err != nil {
		return nil, fmt.Errorf("cuda: capture: %w", err)
	}
	return g, nil
}

// release frees the graph's driver objects and temporaries. CUDA thread only.
func (g *Graph) release() {
	b := g.b
	if g.exec != 0 {
		b.d.call(b.d.cuGraphExecDestroy, g.exec)
		g.exec = 0
	}
	if g.graph != 0 {
		b.d.call(b.d.cuGraphDestroy, g.graph)
		g.graph = 0
	}
	for _, p := range g.temps {
		b.pool.put(p)
	}
	g.temps = nil
}

// Launch queues one replay of the graph; like an op, it does not wait, and
// errors surface at Sync.
func (g *Graph) Launch() error {
	if g.closed {
		return errors.New("cuda: graph launch: graph is closed")
	}
	b := g.b
	if b.hostCapturing {
		return fmt.Errorf("cuda: graph launch: %w", errCapturing)
	}
	return b.post(func() error {
		return b.d.check("cuGraphLaunch", b.d.call(b.d.cuGraphLaunch, g.exec, b.stream))
	})
}

// Close releases the graph after the work queued before it.
func (g *Graph) Close() {
	if g.closed || g.b.closed {
		return
	}
	g.closed = true
	g.b.post(func() error {
		g.release()
		return nil
	})
}

// CaptureGraph implements backend.GraphCapturer.
func (b *Backend) CaptureGraph(fn func() error) (backend.Graph, error) {
	g, err := b.Capture(fn)
	if err != nil {
		return nil, err
	}
	return g, nil
}
