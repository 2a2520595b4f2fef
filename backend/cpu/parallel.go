package cpu

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// pool is a Backend's persistent set of worker goroutines: ops hand them
// work instead of starting goroutines per call. Worker w (1..threads-1)
// waits on its own channel; the calling goroutine is worker 0. The pool
// holds no reference to the Backend, so a cleanup on the Backend can stop
// it once the Backend is unreachable.
type pool struct {
	wake []chan *job // wake[w-1] starts worker w on a job
	once sync.Once
}

// job is one parallel call: workers take chunks of grain items from next.
type job struct {
	fn       func(worker, lo, hi int)
	n, grain int
	chunks   int
	next     atomic.Int64
	wg       sync.WaitGroup
	panicked atomic.Pointer[any]
}

func newPool(threads int) *pool {
	p := &pool{wake: make([]chan *job, threads-1)}
	for i := range p.wake {
		p.wake[i] = make(chan *job, 1)
	}
	return p
}

// start launches the worker goroutines (on first use, so that a Backend
// that never runs a parallel op owns none).
func (p *pool) start() {
	p.once.Do(func() {
		for i, c := range p.wake {
			go func(w int, c chan *job) {
				for j := range c {
					j.run(w)
					j.wg.Done()
				}
			}(i+1, c)
		}
	})
}

// stop ends the worker goroutines; the pool must not be used afterwards.
func (p *pool) stop() {
	for _, c := range p.wake {
		close(c)
	}
}

// run takes chunks until none is left. A panic in fn is recorded and
// re-raised on the calling goroutine, as it would have been had fn run
// there.
func (j *job) run(w int) {
	defer func() {
		if r := recover(); r != nil {
			j.panicked.CompareAndSwap(nil, &r)
		}
	}()
	for {
		c := int(j.next.Add(1) - 1)
		if c >= j.chunks {
			return
		}
		lo := c * j.grain
		j.fn(w, lo, min(j.n, lo+j.grain))
	}
}

// parallel runs fn over the items [0, n) on up to b.threads workers (the
// calling goroutine included). Workers take chunks of grain items from a
// shared counter, so uneven items (sequences of different lengths) still
// balance. Each worker has a distinct index in [0, b.threads) for its
// scratch buffers. Callers pick grain so that tiny ops run inline on the
// caller.
func (b *Backend) parallel(n, grain int, fn func(worker, lo, hi int)) {
	if n <= 0 {
		return
	}
	grain = max(grain, 1)
	chunks := (n + grain - 1) / grain
	workers := min(b.threads, chunks)
	if workers <= 1 {
		fn(0, 0, n)
		return
	}
	b.pool.start()
	j := &job{fn: fn, n: n, grain: grain, chunks: chunks}
	j.wg.Add(workers - 1)
	for w := 1; w < workers; w++ {
		b.pool.wake[w-1] <- j
	}
	j.run(0)
	j.wg.Wait()
	if r := j.panicked.Load(); r != nil {
		panic(*r)
	}
}

// grainFor picks a chunk size for n items that gives each worker a few
// chunks (for balance) without going below minGrain items per chunk.
func (b *Backend) grainFor(n, minGrain int) int {
	g := (n + 4*b.threads - 1) / (4 * b.threads)
	return max(g, minGrain, 1)
}

// floatScratch returns worker w's scratch buffer with at least n floats.
// Contents are unspecified.
func (b *Backend) floatScratch(w, n int) []float32 {
	if cap(b.scratch[w]) < n {
		b.scratch[w] = make([]float32, n)
	}
	return b.scratch[w][:n]
}

// stopPoolWhenUnreachable stops b's workers once b can no longer be used.
func stopPoolWhenUnreachable(b *Backend) {
	runtime.AddCleanup(b, func(p *pool) { p.stop() }, b.pool)
}
