package cuda

import (
	"math"
	"os"
	"testing"

	"github.com/trigon-llm/trigon/backend"
)

// TestEndTuning checks the tuner's two promises to a serving engine on a
// backend of its own (EndTuning lasts for the backend's life): a decode
// shape run before EndTuning is tuned and one first run after it is not,
// both products matching the CPU; and when many prefill shapes fill the
// plan cache, the tuned decode plan survives the eviction, its choice and
// algorithm slot unchanged, and still computes the product.
func TestEndTuning(t *testing.T) {
	sharedBackend(t, true)
	g, err := New(Options{CacheDir: os.Getenv("TRIGON_TEST_KERNEL_CACHE")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	p := newPairOn(t, g)
	const in, out = 1024, 1024
	wv := p.normal(out*in, float32(1/math.Sqrt(in)))
	cw, gw := p.same(backend.BF16, []int{out, in}, encode(backend.BF16, wv))
	// matmul runs x[n,in] . w^T on both backends, compares, and returns
	// the GPU's plan of the shape.
	matmul := func(n int) gemmPlan {
		t.Helper()
		cx, gx := p.act(backend.BF16, []int{n, in}, p.normal(n*in, 1))
		co, gout := p.cpuOut(n, out), p.poisoned(backend.BF16, n, out)
		p.must("cpu", p.c.MatMul(co, cx, cw, nil))
		p.must("gpu", g.MatMul(gout, gx, gw, nil))
		p.must("sync", g.Sync())
		p.expectClose("matmul", read(t, g, gout), read(t, p.c, co), bf16Tol)
		var plan gemmPlan
		p.must("plan", g.call(func() error {
			key := gemmKey{m: out, n: n, k: in, wt: cudaR16BF, xt: cudaR16BF, yt: cudaR16BF}
			q, ok := g.blas.plans[key]
			if !ok {
				t.Fatalf("no plan for %+v after MatMul", key)
			}
			plan = *q
			return nil
		}))
		return plan
	}

	before := matmul(3)
	if before.tunedMs == 0 || before.candidates != nil {
		t.Fatalf("n=3 before EndTuning: tunedMs %v, %d candidate bytes left; want tuned", before.tunedMs, len(before.candidates))
	}
	if tuned := g.EndTuning(); tuned < 1 {
		t.Fatalf("EndTuning reports %d tuned shapes, want at least the n=3 product's", tuned)
	}
	after := matmul(5)
	if after.tunedMs != 0 || after.candidates != nil || after.gemv.nw != 0 || after.bulk.cw != 0 {
		t.Fatalf("n=5 after EndTuning: tunedMs %v, %d candidate bytes, gemv %+v, bulk %+v; want the heuristic's choice untimed",
			after.tunedMs, len(after.candidates), after.gemv, after.bulk)
	}

	// More prefill-sized shapes than the pinned slots hold.
	slots := len(g.blas.scalars)/64 - 1
	p.must("fill", g.call(func() error {
		for n := g.tune.tuneMaxRows + 1; n <= g.tune.tuneMaxRows+slots+50; n++ {
			if _, err := g.gemmPlanFor(0, cudaR16BF, 0, 0, n, 64, 64); err != nil {
				return err
			}
		}
		if g.blas.used > slots || len(g.blas.plans) > slots {
			t.Errorf("%d slots used, %d plans, for %d slots", g.blas.used, len(g.blas.plans), slots)
		}
		return nil
	}))
	kept := matmul(3)
	if kept.slot != before.slot || kept.tunedMs != before.tunedMs || kept.gemv != before.gemv || kept.bulk != before.bulk {
		t.Fatalf("n=3 plan after the cache filled: slot %d tuned %v gemv %+v bulk %+v; before: slot %d tuned %v gemv %+v bulk %+v",
			kept.slot, kept.tunedMs, kept.gemv, kept.bulk, before.slot, before.tunedMs, before.gemv, before.bulk)
	}
}
