package cuda

import (
	"fmt"
	"math"
	"testing"

	"github.com/trigon-llm/trigon/backend"
)

// TestMatMulAddRefusals checks, without a GPU, what MatMulAdd decides on
// the caller's goroutine: operands it fuses queue one task, operands it
// does not fuse give false with nothing queued, and operands MatMul or
// AddRMSNorm would refuse give ErrShape with nothing queued.
func TestMatMulAddRefusals(t *testing.T) {
	h := newHostOnly()
	bf, f32, i32 := backend.BF16, backend.F32, backend.I32
	const n, k, m = 4, 512, 256
	resid, x, w := h.t(bf, n, m), h.t(bf, n, k), h.t(bf, m, k)
	for _, tc := range []struct {
		name string
		op   func() (bool, error)
		want int
	}{
		{"add", func() (bool, error) { return h.b.matMulAdd(resid, x, w) }, fused},
		{"add 16 rows", func() (bool, error) { return h.b.matMulAdd(h.t(bf, 16, m), h.t(bf, 16, k), w) }, fused},
		// Past the GEMV's rows: cuBLASLt with beta = 1 (prefill).
		{"add 17 rows", func() (bool, error) { return h.b.matMulAdd(h.t(bf, 17, m), h.t(bf, 17, k), w) }, fused},
		{"add 17 rows F32 x", func() (bool, error) { return h.b.matMulAdd(h.t(bf, 17, m), h.t(f32, 17, k), w) }, refused},
		{"add 17 rows k not a multiple of 8", func() (bool, error) {
			return h.b.matMulAdd(h.t(bf, 17, m), h.t(bf, 17, k+4), h.t(bf, m, k+4))
		}, refused},
		{"add F32 resid", func() (bool, error) { return h.b.matMulAdd(h.t(f32, n, m), x, w) }, refused},
		{"add F32 x", func() (bool, error) { return h.b.matMulAdd(resid, h.t(f32, n, k), w) }, refused},
		{"add Q8_0 w", func() (bool, error) { return h.b.matMulAdd(resid, x, h.t(backend.Q8_0, m, k)) }, refused},
		{"add k not a multiple of 8", func() (bool, error) { return h.b.matMulAdd(resid, h.t(bf, n, k+4), h.t(bf, m, k+4)) }, refused},
		{"add resid width", func() (bool, error) { return h.b.matMulAdd(h.t(bf, n, m+1), x, w) }, bad},
		{"add resid rows", func() (bool, error) { return h.b.matMulAdd(h.t(bf, n+1, m), x, w) }, bad},
		{"add x width", func() (bool, error) { return h.b.matMulAdd(resid, h.t(bf, n, k+8), w) }, bad},
		{"add resid is x", func() (bool, error) { return h.b.matMulAdd(resid, resid, h.t(bf, m, m)) }, bad},
		{"add nil w", func() (bool, error) { return h.b.matMulAdd(resid, x, nil) }, bad},
		{"add I32 resid", func() (bool, error) { return h.b.matMulAdd(h.t(i32, n, m), x, w) }, bad},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ok, err := tc.op()
			checkFuseOutcome(t, tc.want, ok, err, h.queued())
		})
	}
}

// forcePlan makes the plan of the product [n,k] x [m,k]^T (BF16 out) run
// GEMV variant v, both as the plain product's choice and as the fused
// products' (gemvBest), and returns the two it had. The plan must exist.
// A bulk-copy GEMV the tuner kept for the plain product is dropped: the
// tests compare the register GEMV's bytes.
func forcePlan(p *pair, n, m, k int, v, best gemvConfig) (oldV, oldBest gemvConfig) {
	p.t.Helper()
	p.must("force GEMV variant", p.g.call(func() error {
		pl, ok := p.g.blas.plans[gemmKey{m: m, n: n, k: k, wt: cudaR16BF, xt: cudaR16BF, yt: cudaR16BF}]
		if !ok {
			return fmt.Errorf("no plan for [%d,%d]x[%d,%d]^T", n, k, m, k)
		}
		oldV, oldBest = pl.gemv, pl.gemvBest
		pl.gemv, pl.gemvBest, pl.bulk = v, best, bulkConfig{}
		return nil
	}))
	return oldV, oldBest
}

// normWeights returns F32 norm weights near 1, as trained models have.
func (p *pair) normWeights(k int) []float32 {
	v := p.normal(k, 0.2)
	for i := range v {
		v[i] += 1
	}
	return v
}

// TestMatMulAdd compares MatMulAdd on fresh random operands with the CPU
// backend's MatMul and residual add (bf16 tolerance). Where it runs the
// register GEMV (gemv_add_bf16: more than bulkFusedMaxRows rows, a k the
// bulk GEMV's stages do not divide, or a device before sm_90) it does so
// with every GEMV variant forced in turn, and must match the GPU's MatMul
// on the same variant followed by AddRMSNorm's add byte for byte; where it
// runs the bulk GEMV, which splits k otherwise (TestGEMVBulkAdd checks
// every variant), the CPU comparison is the test.
func TestMatMulAdd(t *testing.T) {
	sharedBackend(t, true)
	const eps = 1e-5
	for _, s := range []struct{ k, m int }{{4096, 4096}, {14336, 4096}, {1024, 768}, {1000, 520}} {
		for _, n := range []int{1, 3, 4, 9, 16} {
			if s.m == 4096 && n != 4 && n != 9 {
				continue // the Llama-3-8B shapes at two batch sizes; the CPU reference is slow
			}
			t.Run(fmt.Sprintf("k%d_m%d_n%d", s.k, s.m, n), func(t *testing.T) {
				p := newPair(t)
				g, c := p.g, p.c
				bf := backend.BF16
				wscale := float32(1 / math.Sqrt(float64(s.k)))
				// A residual r [n,m], x [n,k], w [m,k], and a norm weight [m]
				// only to drive AddRMSNorm's add.
				cr, gr := p.act(bf, []int{n, s.m}, p.normal(n*s.m, 1))
				cx, gx := p.act(bf, []int{n, s.k}, p.normal(n*s.k, 1))
				cw, gw := p.same(bf, []int{s.m, s.k}, encode(bf, p.normal(s.m*s.k, wscale)))
				cgm, ggm := p.same(backend.F32, []int{s.m}, encode(backend.F32, p.normWeights(s.m)))
				rBytes := readBytes(t, g, gr)

				cDelta, cNormedM := p.cpuOut(n, s.m), p.cpuOut(n, s.m)
				p.must("cpu matmul", c.MatMul(cDelta, cx, cw, nil))
				p.must("cpu add", c.AddRMSNorm(cNormedM, cDelta, cr, cgm, eps))
				wantResid := read(t, c, cr)

				gDelta, gNormedM := p.poisoned(bf, n, s.m), p.poisoned(bf, n, s.m)
				unfusedAdd := func() []byte {
					p.must("reset r", g.Write(gr, rBytes))
					p.must("matmul", g.MatMul(gDelta, gx, gw, nil))
					p.must("add", g.AddRMSNorm(gNormedM, gDelta, gr, ggm, eps))
					return readBytes(t, g, gr)
				}
				fusedAdd := func() []byte {
					p.must("reset r", g.Write(gr, rBytes))
					ok, err := g.matMulAdd(gr, gx, gw)
					p.must("MatMulAdd", err)
					if !ok {
						t.Fatal("MatMulAdd returned false for operands it fuses")
					}
					return readBytes(t, g, gr)
				}
				// The first eager call makes and tunes the shape's plan.
				unfusedAdd()
				if g.bulkFused(bulkPick(s.m, s.k, g.sms), n, s.k, 0, 0) {
					p.expectClose("bulk GEMV: MatMulAdd vs cpu", decode(bf, fusedAdd()), wantResid, bf16Tol)
					return
				}
				oldV, oldBest := forcePlan(p, n, s.m, s.k, gemvConfig{}, gemvConfig{})
				t.Cleanup(func() { forcePlan(p, n, s.m, s.k, oldV, oldBest) })
				t.Logf("tuner's variant %+v (best %+v)", oldV, oldBest)
				for _, v := range gemvConfigs {
					forcePlan(p, n, s.m, s.k, v, v)
					want, got := unfusedAdd(), fusedAdd()
					if string(got) != string(want) {
						t.Fatalf("GEMV %+v: MatMulAdd differs from MatMul + AddRMSNorm's add", v)
					}
					p.expectClose(fmt.Sprintf("GEMV %+v: MatMulAdd vs cpu", v), decode(bf, got), wantResid, bf16Tol)
				}
			})
		}
	}
}

// TestMatMulAddPrefill checks MatMulAdd on prefill-sized batches (cuBLASLt
// with beta = 1, the residual as C and D) against the CPU's MatMul and
// residual add, twice in a row: the first call of a shape tunes its plan,
// which must not write into the residual, and the second accumulates onto
// the first's sum.
func TestMatMulAddPrefill(t *testing.T) {
	sharedBackend(t, true)
	for _, s := range []struct{ n, k, m int }{{17, 1000, 520}, {300, 4096, 4096}, {64, 14336, 4096}} {
		t.Run(fmt.Sprintf("n%d_k%d_m%d", s.n, s.k, s.m), func(t *testing.T) {
			p := newPair(t)
			g, c := p.g, p.c
			bf := backend.BF16
			cr, gr := p.act(bf, []int{s.n, s.m}, p.normal(s.n*s.m, 1))
			cx, gx := p.act(bf, []int{s.n, s.k}, p.normal(s.n*s.k, 1))
			cw, gw := p.same(bf, []int{s.m, s.k}, encode(bf, p.normal(s.m*s.k, float32(1/math.Sqrt(float64(s.k))))))
			cgm, _ := p.same(backend.F32, []int{s.m}, encode(backend.F32, p.normWeights(s.m)))
			cDelta, cNormed := p.cpuOut(s.n, s.m), p.cpuOut(s.n, s.m)
			p.must("cpu matmul", c.MatMul(cDelta, cx, cw, nil))
			for i := range 2 {
				p.must("cpu add", c.AddRMSNorm(cNormed, cDelta, cr, cgm, 1e-5))
				ok, err := g.matMulAdd(gr, gx, gw)
				p.must("MatMulAdd", err)
				if !ok {
					t.Fatal("MatMulAdd returned false for a BF16 prefill batch")
				}
				p.must("sync", g.Sync())
				p.expectClose(fmt.Sprintf("residual after call %d", i+1), read(t, g, gr), read(t, c, cr), bf16Tol)
			}
		})
	}
}
