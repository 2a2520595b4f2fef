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

func TestMain(m *testing.M) {
	code := m.Run()
	if gpu != nil {
		if err := gpu.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "close:", err)
			code = 1
		}
	}
	os.Exit(code)
}
