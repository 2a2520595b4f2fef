package cuda

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"
)

var (
	gpuOnce sync.Once
	gpu     *Backend
	gpuErr  error
	// gpuBroken: a device answered but the backend or its kernels failed.
	gpuBroken bool
)

// sharedBackend returns the package's one CUDA backend, made on first use.
// Without a usable GPU it skips the test when require is set and returns
// nil otherwise. With a GPU present, a backend that fails to start or a
// kernel that fails to compile fails the test.
func sharedBackend(t testing.TB, require bool) *Backend {
	t.Helper()
	gpuOnce.Do(func() {
		if err := Available(); err != nil {
			gpuErr = err
			return
		}
		// A device is there: from here on a failure is the code's, not the
		// machine's, and fails the tests instead of skipping them.
		gpuBroken = true
		gpu, gpuErr = New(Options{CacheDir: os.Getenv("TRIGON_TEST_KERNEL_CACHE")})
		if gpuErr != nil {
			return
		}
		// Compile every common module up front, in parallel.
		start := time.Now()
		reps, err := gpu.WarmKernels(context.Background())
		if err != nil {
			gpuErr = err
			gpu.Close()
			gpu = nil
			return
		}
		cached := 0
		for _, r := range reps {
			if r.Cached {
				cached++
			}
		}
		fmt.Fprintf(os.Stderr, "cuda: %s, %d kernel modules (%d cached) in %v\n", gpu.Device(), len(reps), cached, time.Since(start))
		gpuBroken = false
	})
	if gpu == nil {
		if gpuBroken {
			// A kernel that does not compile must not pass as "no GPU".
			t.Fatalf("CUDA device present but the backend failed: %v", gpuErr)
		}
		if require {
			t.Skipf("CUDA backend unavailable, GPU test skipped: %v", gpuErr)
		}
		return nil
	}
	return gpu
}

// backendKey names one of backendWith's backends.
type backendKey struct {
	tune Tuning
	arch string
}

var (
	othersMu sync.Mutex
	others   = map[backendKey]*Backend{}
)

// backendWith returns a backend on the shared backend's device with
// tuning tune whose kernels are compiled for arch ("": the device's own
// target), made on first use and kept until the tests end; the shared
// backend itself for the defaults. A plain sm_90 target on an sm_90a
// device runs the kernels every Hopper-class target but sm_90a runs
// (attn_prefill's mma.sync kernel instead of the wgmma one). It skips as
// sharedBackend does.
func backendWith(t testing.TB, tune Tuning, arch string) *Backend {
	t.Helper()
	g := sharedBackend(t, true)
	k := backendKey{tune: tune, arch: arch}
	if k == (backendKey{}) {
		return g
	}
	othersMu.Lock()
	defer othersMu.Unlock()
	if b, ok := others[k]; ok {
		return b
	}
	opts := g.opts
	opts.Tuning = tune
	b, err := New(opts)
	if err != nil {
		t.Fatalf("backend for %+v: %v", k, err)
	}
	if arch != "" {
		// Before the backend's first op: only the CUDA thread reads comp
		// from then on, and prefillWGSpec on the caller's goroutine.
		b.comp = &compiler{nv: b.comp.nv, arch: arch, cubin: true, cache: b.comp.cache}
	}
	others[k] = b
	return b
}

func TestMain(m *testing.M) {
	code := m.Run()
	for k, b := range others {
		if err := b.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "close backend %+v: %v\n", k, err)
			code = 1
		}
	}
	if gpu != nil {
		if err := gpu.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "close:", err)
			code = 1
		}
	}
	os.Exit(code)
}
