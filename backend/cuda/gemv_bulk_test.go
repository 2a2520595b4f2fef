package cuda

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/trigon-llm/trigon/backend"
)

// bulkShapes are the products the bulk GEMV tests run: one and two 8-row
// x tiles with partial ones, feature counts that are not a multiple of
// the 16-row tile, a long k (the down projection's), and more tiles than
// blocks resident at once (the persistent loop). k is a multiple of 1024
// so every variant takes every shape, but for the 1536-column one.
var bulkShapes = []struct{ n, in, out int }{
	{1, 4096, 1000}, {4, 4096, 4096}, {8, 2048, 520}, {9, 3072, 1000}, {16, 4096, 1000},
	{4, 14336, 272}, {3, 1024, 16384}, {5, 1536, 600},
}

// needBulk returns the shared backend, skipping where the bulk kernels
// cannot run (no GPU, or one older than sm_90).
func needBulk(t *testing.T) *Backend {
	t.Helper()
	b := sharedBackend(t, true)
	if b.cc < 90 {
		t.Skipf("bulk-copy GEMV needs sm_90, device is sm_%d", b.cc)
	}
	if bulkMode == bulkOff {
		t.Skipf("%s=off", bulkEnv)
	}
	return b
}

// TestGEMVBulk runs every bulk GEMV variant directly (the tuner keeps one
// only where it is faster) against the CPU backend, BF16 and F32 out, and
// checks a second launch writes the same bytes.
func TestGEMVBulk(t *testing.T) {
	needBulk(t)
	for _, s := range bulkShapes {
		for _, c := range bulkConfigs {
			if s.in%c.ck != 0 {
				continue
			}
			for _, out := range []backend.DType{backend.BF16, backend.F32} {
				if out == backend.F32 && s.n != 9 {
					continue // one F32 shape is enough
				}
				t.Run(fmt.Sprintf("n%d_%dx%d_w%d_c%d_s%d_out%v", s.n, s.in, s.out, c.cw, c.ck, c.st, out), func(t *testing.T) {
					p := newPair(t)
					cx, gx := p.act(backend.BF16, []int{s.n, s.in}, p.normal(s.n*s.in, 1))
					wv := p.normal(s.out*s.in, float32(1/math.Sqrt(float64(s.in))))
					cw, gw := p.same(backend.BF16, []int{s.out, s.in}, encode(backend.BF16, wv))
					co, gout := p.cpuOut(s.n, s.out), p.poisoned(out, s.n, s.out)
					p.must("cpu", p.c.MatMul(co, cx, cw, nil))
					g := p.g
					ot := int(dtBF16)
					if out == backend.F32 {
						ot = int(dtF32)
					}
					run := func() error {
						return g.call(func() error {
							o, _ := g.tensorOf("gemv", "out", gout)
							x, _ := g.tensorOf("gemv", "x", gx)
							w, _ := g.tensorOf("gemv", "w", gw)
							if !g.bulkFits(c, s.n, s.in, x.ptr, w.ptr) {
								return fmt.Errorf("bulkFits false for n %d k %d", s.n, s.in)
							}
							return g.bulkCall(c, "gemvb_bf16", o.ptr, ot, x.ptr, w.ptr, s.n, s.out, s.in, s.n%2 == 1)
						})
					}
					p.must("bulk", run())
					p.must("sync", g.Sync())
					first := readBytes(t, g, gout)
					p.expectClose("gemv_bulk", decode(out, first), read(t, p.c, co), bf16Tol)
					p.must("bulk again", run())
					p.must("sync", g.Sync())
					if !bytes.Equal(first, readBytes(t, g, gout)) {
						t.Fatal("a second launch wrote other bytes")
					}
				})
			}
		}
	}
}

// TestGEMVBulkAdd checks gemvb_add_bf16 (the O and down projections adding
// into the residual) against the CPU's product plus the residual.
func TestGEMVBulkAdd(t *testing.T) {
	needBulk(t)
	for _, s := range bulkShapes {
		c := bulkConfigs[len(bulkConfigs)-1]
		if s.in%c.ck != 0 {
			c = bulkConfigs[0]
		}
		t.Run(fmt.Sprintf("n%d_%dx%d_w%d_c%d_s%d", s.n, s.in, s.out, c.cw, c.ck, c.st), func(t *testing.T) {
			p := newPair(t)
			cx, gx := p.act(backend.BF16, []int{s.n, s.in}, p.normal(s.n*s.in, 1))
			cw, gw := p.same(backend.BF16, []int{s.out, s.in}, encode(backend.BF16, p.normal(s.out*s.in, float32(1/math.Sqrt(float64(s.in))))))
			rv := decode(backend.BF16, encode(backend.BF16, p.normal(s.n*s.out, 2)))
			_, gr := p.same(backend.BF16, []int{s.n, s.out}, encode(backend.BF16, rv))
			co := p.cpuOut(s.n, s.out)
			p.must("cpu", p.c.MatMul(co, cx, cw, nil))
			want := read(t, p.c, co)
			for i := range want {
				want[i] += rv[i]
			}
			g := p.g
			p.must("bulk add", g.call(func() error {
				r, _ := g.tensorOf("gemv", "resid", gr)
				x, _ := g.tensorOf("gemv", "x", gx)
				w, _ := g.tensorOf("gemv", "w", gw)
				return g.bulkCall(c, "gemvb_add_bf16", r.ptr, int(dtBF16), x.ptr, w.ptr, s.n, s.out, s.in, true)
			}))
			p.must("sync", g.Sync())
			p.expectClose("gemv_bulk add", read(t, g, gr), want, bf16Tol)
		})
	}
}

// TestGateUpSiLU checks the public op against the CPU's MatMul then
// SiLUMul, every variant (forced through the shape's plan) and the tuned
// choice, and what it refuses.
func TestGateUpSiLU(t *testing.T) {
	b := needBulk(t)
	for _, s := range []struct{ n, k, inter int }{{1, 4096, 1024}, {4, 4096, 14336}, {9, 2048, 520}, {16, 1024, 2048}} {
		for _, c := range append([]bulkConfig{{}}, bulkConfigs...) {
			if c.cw > 0 && s.k%c.ck != 0 {
				continue
			}
			name := "tuned"
			if c.cw > 0 {
				name = fmt.Sprintf("w%d_c%d_s%d", c.cw, c.ck, c.st)
			}
			t.Run(fmt.Sprintf("n%d_k%d_inter%d_%s", s.n, s.k, s.inter, name), func(t *testing.T) {
				p := newPair(t)
				cx, gx := p.act(backend.BF16, []int{s.n, s.k}, p.normal(s.n*s.k, 1))
				cw, gw := p.same(backend.BF16, []int{2 * s.inter, s.k},
					encode(backend.BF16, p.normal(2*s.inter*s.k, float32(2/math.Sqrt(float64(s.k))))))
				cgu, cact := p.cpuOut(s.n, 2*s.inter), p.cpuOut(s.n, s.inter)
				p.must("cpu matmul", p.c.MatMul(cgu, cx, cw, nil))
				p.must("cpu silu", p.c.SiLUMul(cact, cgu))
				gout := p.poisoned(backend.BF16, s.n, s.inter)
				if c.cw > 0 {
					// Tune the shape first, then make c its kept variant.
					p.must("tune", b.call(func() error {
						x, _ := b.tensorOf("t", "x", gx)
						w, _ := b.tensorOf("t", "w", gw)
						_, _, err := b.bulkFor(s.n, 2*s.inter, s.k, x.ptr, w.ptr, true)
						return err
					}))
					key := gemmKey{m: 2 * s.inter, n: s.n, k: s.k, wt: cudaR16BF, xt: cudaR16BF, yt: cudaR16BF}
					var old bulkConfig
					p.must("force", b.call(func() error {
						pl := b.blas.plans[key]
						if pl == nil {
							return errors.New("no plan after tuning")
						}
						old, pl.bulk = pl.bulk, c
						return nil
					}))
					defer b.call(func() error { b.blas.plans[key].bulk = old; return nil })
				}
				ok, err := b.GateUpSiLU(gout, gx, gw)
				p.must("GateUpSiLU", err)
				if !ok {
					t.Fatal("GateUpSiLU did not fuse a decode-sized BF16 product")
				}
				p.must("sync", b.Sync())
				p.expectClose("gate/up+silu", read(t, b, gout), read(t, p.c, cact), bf16Tol)
			})
		}
	}
	t.Run("refusals", func(t *testing.T) {
		p := newPair(t)
		_, gx := p.act(backend.BF16, []int{17, 1024}, p.normal(17*1024, 1))
		_, gw := p.same(backend.BF16, []int{2 * 512, 1024}, encode(backend.BF16, p.normal(1024*1024, 0.03)))
		if ok, err := b.GateUpSiLU(p.poisoned(backend.BF16, 17, 512), gx, gw); ok || err != nil {
			t.Fatalf("17 rows: fused %v, err %v; want a plain refusal", ok, err)
		}
		_, gx4 := p.act(backend.BF16, []int{4, 1024}, p.normal(4*1024, 1))
		if ok, err := b.GateUpSiLU(p.poisoned(backend.F32, 4, 512), gx4, gw); ok || err != nil {
			t.Fatalf("F32 out: fused %v, err %v; want a plain refusal", ok, err)
		}
		if _, err := b.GateUpSiLU(p.poisoned(backend.BF16, 4, 500), gx4, gw); !errors.Is(err, backend.ErrShape) {
			t.Fatalf("out of 500 features for a 1024-row w: %v, want ErrShape", err)
		}
		if _, err := b.GateUpSiLU(p.poisoned(backend.BF16, 5, 512), gx4, gw); !errors.Is(err, backend.ErrShape) {
			t.Fatalf("out of 5 rows for 4 x rows: %v, want ErrShape", err)
		}
	})
}
