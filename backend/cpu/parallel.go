package cpu

import (
	"sync"
	"sync/atomic"
)

// parallel runs fn over the items [0, n) on up to b.threads goroutines (the
// calling one included). Workers take chunks of grain items from a shared
// counter, so uneven items (sequences of different lengths) still balance.
// Each worker has a distinct index in [0, b.threads) for its scratch buffers.
//
// Goroutines are started per call: a started goroutine costs about a
// microsecond, well below the smallest op worth splitting (callers pick
// grain so that tiny ops run inline on the caller).
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
	var next atomic.Int64
	run := func(w int) {
		for {
			c := int(next.Add(1) - 1)
			if c >= chunks {
				return
			}
			lo := c * grain
			fn(w, lo, min(n, lo+grain))
		}
	}
	var wg sync.WaitGroup
	for w := 1; w < workers; w++ {
		wg.Go(func() { run(w) })
	}
	run(0)
	wg.Wait()
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
