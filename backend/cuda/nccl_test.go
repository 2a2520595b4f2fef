package cuda

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/collective"
)

// ncclRanks returns a backend on each of up to 4 GPUs (at least 2) and
// their NCCL communicators, or skips the test.
func ncclRanks(t testing.TB) ([]*Backend, []*NCCLComm) {
	t.Helper()
	if err := Available(); err != nil {
		t.Skipf("CUDA backend unavailable, multi-GPU test skipped: %v", err)
	}
	n, err := DeviceCount()
	if err != nil {
		t.Fatal(err)
	}
	if n < 2 {
		t.Skipf("%d GPU: the NCCL tests need at least 2", n)
	}
	if err := NCCLAvailable(); err != nil {
		t.Fatalf("%d GPUs but no NCCL: %v", n, err)
	}
	var bs []*Backend
	for r := range min(n, 4) {
		b, err := New(Options{Device: r})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		bs = append(bs, b)
	}
	comms, err := NewNCCLGroup(bs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, c := range comms {
			c.Close()
		}
	})
	return bs, comms
}

// oracle is the in-process group over the same backends.
func oracle(t *testing.T, bs []*Backend) []*collective.Comm {
	t.Helper()
	var gb []backend.Backend
	for _, b := range bs {
		gb = append(gb, b)
	}
	cs, err := collective.New(gb)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// onEach runs fn for every rank at once.
func onEach(t *testing.T, n int, fn func(r int) error) {
	t.Helper()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() { defer wg.Done(); errs[r] = fn(r) }()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

func upload(t *testing.T, b *Backend, dt backend.DType, shape []int, v []float32) backend.Tensor {
	t.Helper()
	x, err := b.Upload(dt, shape, encode(dt, v))
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// TestNCCLAllReduce: NCCL's sum over the GPUs against the in-process one,
// for the dtypes activations take; in place, eagerly and replayed from a
// captured graph.
func TestNCCLAllReduce(t *testing.T) {
	bs, comms := ncclRanks(t)
	ref := oracle(t, bs)
	n := len(bs)
	rng := rand.New(rand.NewPCG(1, uint64(n)))
	for _, dt := range []backend.DType{backend.F32, backend.BF16} {
		for _, graph := range []bool{false, true} {
			shape := []int{7, 4096}
			ins := make([][]float32, n)
			got, want := make([]backend.Tensor, n), make([]backend.Tensor, n)
			for r := range n {
				ins[r] = make([]float32, shape[0]*shape[1])
				for i := range ins[r] {
					ins[r][i] = float32(rng.NormFloat64())
				}
				got[r], want[r] = upload(t, bs[r], dt, shape, ins[r]), upload(t, bs[r], dt, shape, ins[r])
			}
			if graph {
				graphs := make([]backend.Graph, n)
				for r := range n {
					g, err := bs[r].CaptureGraph(func() error { return comms[r].AllReduce(got[r]) })
					if err != nil {
						t.Fatalf("capture rank %d: %v", r, err)
					}
					defer g.Close()
					graphs[r] = g
				}
				for r := range n {
					if err := graphs[r].Launch(); err != nil {
						t.Fatal(err)
					}
				}
			} else {
				for r := range n {
					if err := comms[r].AllReduce(got[r]); err != nil {
						t.Fatal(err)
					}
				}
			}
			onEach(t, n, func(r int) error { return bs[r].Sync() })
			onEach(t, n, func(r int) error { return ref[r].AllReduce(want[r]) })
			tol := 1e-6
			if dt == backend.BF16 {
				tol = 8e-3 // NCCL may round the bf16 partial sums of its ring
			}
			for r := range n {
				e, err := relErr(read(t, bs[r], got[r]), read(t, bs[r], want[r]))
				if err != nil || e > tol {
					t.Errorf("%v graph=%v rank %d: relative error %.3g (%v), want <= %.0e", dt, graph, r, e, err, tol)
				}
			}
		}
	}
}

// TestNCCLAllGather: the logits' gather over uneven vocabulary widths
// equals the in-process one exactly.
func TestNCCLAllGather(t *testing.T) {
	bs, comms := ncclRanks(t)
	ref := oracle(t, bs)
	n := len(bs)
	widths := make([]int, n)
	total := 0
	for r := range widths {
		widths[r] = 1000 + 3*r // uneven, like a vocabulary that does not divide
		total += widths[r]
	}
	const rows = 5
	rng := rand.New(rand.NewPCG(2, uint64(n)))
	xs, got, want := make([]backend.Tensor, n), make([]backend.Tensor, n), make([]backend.Tensor, n)
	for r := range n {
		v := make([]float32, rows*widths[r])
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		xs[r] = upload(t, bs[r], backend.F32, []int{rows, widths[r]}, v)
		var err error
		if got[r], err = bs[r].Alloc(backend.F32, rows, total); err != nil {
			t.Fatal(err)
		}
		if want[r], err = bs[r].Alloc(backend.F32, rows, total); err != nil {
			t.Fatal(err)
		}
		if err := comms[r].AllGather(got[r], xs[r], widths); err != nil {
			t.Fatal(err)
		}
	}
	onEach(t, n, func(r int) error { return bs[r].Sync() })
	onEach(t, n, func(r int) error { return ref[r].AllGather(want[r], xs[r], widths) })
	for r := range n {
		g, w := read(t, bs[r], got[r]), read(t, bs[r], want[r])
		for i := range w {
			if g[i] != w[i] {
				t.Fatalf("rank %d element %d: %v, want %v", r, i, g[i], w[i])
			}
		}
	}
}

// TestNCCLOneRank: a communicator of one rank on one GPU: the all-reduce
// leaves its tensor as it was, the all-gather copies x into out. Runs on
// one GPU where NCCL is installed.
func TestNCCLOneRank(t *testing.T) {
	g := sharedBackend(t, true)
	if err := NCCLAvailable(); err != nil {
		t.Skipf("no NCCL: %v", err)
	}
	comms, err := NewNCCLGroup([]*Backend{g})
	if err != nil {
		t.Fatal(err)
	}
	defer comms[0].Close()
	rng := rand.New(rand.NewPCG(3, 4))
	v := make([]float32, 3*256)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	x := upload(t, g, backend.F32, []int{3, 256}, v)
	out, err := g.Alloc(backend.F32, 3, 256)
	if err != nil {
		t.Fatal(err)
	}
	if err := comms[0].AllReduce(x); err != nil {
		t.Fatal(err)
	}
	if err := comms[0].AllGather(out, x, []int{256}); err != nil {
		t.Fatal(err)
	}
	for name, tt := range map[string]backend.Tensor{"all_reduce": x, "all_gather": out} {
		for i, got := range read(t, g, tt) {
			if got != v[i] {
				t.Fatalf("%s: element %d = %v, want %v", name, i, got, v[i])
			}
		}
	}
}

// BenchmarkNCCLAllReduce times the all-reduce over the GPUs (up to 4) at
// the shapes tensor parallelism sums after each row-parallel product of a
// decode step (batch x hidden, bf16) and at a large size, reporting NCCL's
// bus bandwidth (algorithm bandwidth x 2(n-1)/n, as nccl-tests does).
// Iterations are queued back to back and the ranks synced once.
func BenchmarkNCCLAllReduce(b *testing.B) {
	bs, comms := ncclRanks(b)
	n := len(bs)
	for _, sh := range [][2]int{{1, 4096}, {4, 4096}, {64, 4096}, {4, 8192}, {2048, 4096}, {8192, 4096}} {
		b.Run(fmt.Sprintf("bf16_%dx%d_ranks%d", sh[0], sh[1], n), func(b *testing.B) {
			ts := make([]backend.Tensor, n)
			for r := range n {
				var err error
				if ts[r], err = bs[r].Alloc(backend.BF16, sh[0], sh[1]); err != nil {
					b.Fatal(err)
				}
				if err := bs[r].FillNormal(ts[r], uint64(r), 0, 1e-3); err != nil {
					b.Fatal(err)
				}
			}
			syncAll := func() {
				for r := range n {
					if err := bs[r].Sync(); err != nil {
						b.Fatal(err)
					}
				}
			}
			for r := range n { // NCCL's first call sets up its channels
				if err := comms[r].AllReduce(ts[r]); err != nil {
					b.Fatal(err)
				}
			}
			syncAll()
			b.ResetTimer()
			start := time.Now()
			for b.Loop() {
				for r := range n {
					if err := comms[r].AllReduce(ts[r]); err != nil {
						b.Fatal(err)
					}
				}
			}
			syncAll()
			per := time.Since(start).Seconds() / float64(b.N)
			bytes := float64(2 * sh[0] * sh[1])
			b.ReportMetric(per*1e6, "us/allreduce")
			b.ReportMetric(bytes/per*2*float64(n-1)/float64(n)/1e9, "busGB/s")
		})
	}
}
