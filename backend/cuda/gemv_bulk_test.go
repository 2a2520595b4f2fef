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
				t.Run(fmt.Sprintf("n%d_%dx%d_%s_out%v", s.n, s.in, s.out, c.tag(), out), func(t *testing.T) {
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
		t.Run(fmt.Sprintf("n%d_%dx%d_%s", s.n, s.in, s.out, c.tag()), func(t *testing.T) {
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

// TestGateUpSiLU checks gemvb_silu_bf16 against the CPU's MatMul then
// SiLUMul: every variant launched directly, then the public op (its
// bulkPick variant); and what the op refuses.
func TestGateUpSiLU(t *testing.T) {
	b := needBulk(t)
	for _, s := range []struct{ n, k, inter int }{{1, 4096, 1024}, {4, 4096, 14336}, {9, 2048, 520}, {16, 1024, 2048}, {3, 1536, 264}} {
		for _, c := range append([]bulkConfig{{}}, bulkConfigs...) {
			if c.cw > 0 && s.k%c.ck != 0 {
				continue
			}
			name := "op"
			if c.cw > 0 {
				name = c.tag()
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
					p.must("bulk silu", b.call(func() error {
						o, _ := b.tensorOf("t", "out", gout)
						x, _ := b.tensorOf("t", "x", gx)
						w, _ := b.tensorOf("t", "w", gw)
						return b.bulkCall(c, "gemvb_silu_bf16", o.ptr, int(dtBF16), x.ptr, w.ptr, s.n, s.inter, s.k, true)
					}))
				} else {
					ok, err := b.gateUpSiLU(gout, gx, gw)
					p.must("GateUpSiLU", err)
					if s.n > bulkFusedMaxRows {
						if ok {
							t.Fatalf("GateUpSiLU fused %d rows: the bulk GEMV takes at most %d there", s.n, bulkFusedMaxRows)
						}
						return // the caller runs MatMul and SiLUMul
					}
					if !ok {
						t.Fatal("GateUpSiLU did not fuse a decode-sized BF16 product")
					}
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
		if ok, err := b.gateUpSiLU(p.poisoned(backend.BF16, 17, 512), gx, gw); ok || err != nil {
			t.Fatalf("17 rows: fused %v, err %v; want a plain refusal", ok, err)
		}
		_, gx4 := p.act(backend.BF16, []int{4, 1024}, p.normal(4*1024, 1))
		if ok, err := b.gateUpSiLU(p.poisoned(backend.F32, 4, 512), gx4, gw); ok || err != nil {
			t.Fatalf("F32 out: fused %v, err %v; want a plain refusal", ok, err)
		}
		if _, err := b.gateUpSiLU(p.poisoned(backend.BF16, 4, 500), gx4, gw); !errors.Is(err, backend.ErrShape) {
			t.Fatalf("out of 500 features for a 1024-row w: %v, want ErrShape", err)
		}
		if _, err := b.gateUpSiLU(p.poisoned(backend.BF16, 5, 512), gx4, gw); !errors.Is(err, backend.ErrShape) {
			t.Fatalf("out of 5 rows for 4 x rows: %v, want ErrShape", err)
		}
	})
}

// TestBulkOccupancy checks that the bulk kernels the decode step runs,
// on the variants bulkPick gives Llama-3-8B's shapes, fit the blocks per
// SM bulkPick assumes: at least two, and the variant's bound where it has
// one (a compiler's register allocation can leave a variant at one block
// an SM).
func TestBulkOccupancy(t *testing.T) {
	b := needBulk(t)
	const hidden, inter, qkv = 4096, 14336, 6144
	for _, tc := range []struct {
		kernel  string
		rows, k int
	}{
		{"gemvb_add_bf16", hidden, hidden}, {"gemvb_add_bf16", hidden, inter},
		{"gemvb_silu_bf16", 2 * inter, hidden},
		// A weight of 2-3 tiles an SM: bulkPick's variant bound to three
		// blocks an SM.
		{"gemvb_add_bf16", qkv, hidden},
	} {
		c := bulkPick(tc.rows, tc.k, b.sms)
		// Batches of 1-8 (one x tile). Two x tiles need more registers:
		// 126-164 at 1024-column stages (NVRTC 11.8), one block an SM.
		for _, n := range []int{1, 4, 8} {
			var per int
			if err := b.call(func() error {
				f, err := b.fnSmem(fnKey{c.spec(n, int(dtBF16)), tc.kernel}, c.smem())
				if err != nil {
					return err
				}
				b.bulkGrid(f, c, 1)
				per = b.bulkOcc[f]
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if want := max(2, c.mb); per < want {
				t.Errorf("%s %v, %d rows of x: %d blocks an SM, want at least %d", tc.kernel, c, n, per, want)
			}
		}
	}
}

// TestGEMVBulkGraph replays the decode MLP's bulk kernels from a captured
// graph (the O product adding into the residual, the norm, gate/up with
// SiLU, the down product adding into the residual: MatMulAdd and
// GateUpSiLU as the model calls them) and expects the eager run's bytes,
// over rounds of fresh inputs. The persistent grid, the producer's early
// stream and PDL (pdlKernels launches the bulk kernels with it) all
// run inside the graph.
func TestGEMVBulkGraph(t *testing.T) {
	needBulk(t)
	p := newPair(t)
	g := p.g
	const n, hidden, inter = 4, 2048, 1536
	resid := p.poisoned(backend.BF16, n, hidden)
	x := p.poisoned(backend.BF16, n, hidden)
	normed := p.poisoned(backend.BF16, n, hidden)
	act := p.poisoned(backend.BF16, n, inter)
	_, nw := p.same(backend.F32, []int{hidden}, encode(backend.F32, p.normWeights(hidden)))
	_, wo := p.same(backend.BF16, []int{hidden, hidden}, encode(backend.BF16, p.normal(hidden*hidden, 0.02)))
	_, wgu := p.same(backend.BF16, []int{2 * inter, hidden}, encode(backend.BF16, p.normal(2*inter*hidden, 0.02)))
	_, wd := p.same(backend.BF16, []int{hidden, inter}, encode(backend.BF16, p.normal(hidden*inter, 0.02)))
	fused := func(ok bool, err error) error {
		if err == nil && !ok {
			err = errors.New("the op did not fuse")
		}
		return err
	}
	step := func() error {
		if err := fused(g.matMulAdd(resid, x, wo)); err != nil {
			return err
		}
		if err := g.AddRMSNorm(normed, resid, nil, nw, 1e-5); err != nil {
			return err
		}
		if err := fused(g.gateUpSiLU(act, normed, wgu)); err != nil {
			return err
		}
		return fused(g.matMulAdd(resid, act, wd))
	}
	var r0 []byte
	setInputs := func() {
		p.must("write x", g.Write(x, encode(backend.BF16, p.normal(n*hidden, 1))))
		r0 = encode(backend.BF16, p.normal(n*hidden, 1))
		p.must("write resid", g.Write(resid, r0))
	}
	setInputs()
	p.must("eager warm-up", step()) // loads every kernel and tunes the shapes before capture
	p.must("sync", g.Sync())
	graph, err := g.Capture(step)
	p.must("capture", err)
	defer graph.Close()
	for round := range 3 {
		setInputs()
		p.must("eager", step())
		p.must("sync", g.Sync())
		want := [][]byte{readBytes(t, g, resid), readBytes(t, g, act)}
		p.must("reset resid", g.Write(resid, r0))
		poison := make([]byte, len(want[1]))
		for i := range poison {
			poison[i] = 0xff // bf16 0xffff is a NaN
		}
		p.must("poison act", g.Write(act, poison))
		p.must("launch", graph.Launch())
		p.must("sync", g.Sync())
		if got := readBytes(t, g, resid); !bytes.Equal(got, want[0]) {
			t.Fatalf("round %d: replayed residual differs from the eager one", round)
		}
		if got := readBytes(t, g, act); !bytes.Equal(got, want[1]) {
			t.Fatalf("round %d: replayed gate/up+SiLU output differs from the eager one", round)
		}
	}
}

// BenchmarkGEMVBulk times Llama-3-8B's decode products at batch 4 with
// their epilogues (O and down adding into the residual, gate/up with SiLU
// x mul), from graphs cycling enough weight copies that none is in L2
// when its turn comes: "tuned" (MatMulAdd, GateUpSiLU and MatMul as the
// model calls them), then each bulk variant launched directly. The layer
// runs O, the post-attention norm, gate/up and down back to back: "tuned",
// "bulk" (every product on bulkPick's variant directly) and "nonorm" (the
// tuned path without the norm, whose difference to "tuned" is what the
// norm kernel costs between the products).
func BenchmarkGEMVBulk(b *testing.B) {
	g := benchBackend(b)
	if g.cc < 90 {
		b.Skipf("bulk-copy GEMV needs sm_90, device is sm_%d", g.cc)
	}
	const n, hidden, inter = 4, 4096, 14336
	type prod struct {
		name      string
		in, out   int // x columns, output features
		rows      int // weight rows
		kernel    string
		copies    int
		ws        []backend.Tensor
		x, y, tmp backend.Tensor
	}
	prods := []*prod{
		{name: "o_add", in: hidden, out: hidden, rows: hidden, kernel: "gemvb_add_bf16"},
		{name: "gate_up_silu", in: hidden, out: inter, rows: 2 * inter, kernel: "gemvb_silu_bf16"},
		{name: "down_add", in: inter, out: hidden, rows: hidden, kernel: "gemvb_add_bf16"},
		// The QKV projection's shape as a plain product (no RoPE epilogue):
		// 384 tiles, more than two blocks an SM hold.
		{name: "qkv", in: hidden, out: 6144, rows: 6144, kernel: "gemvb_bf16"},
	}
	const copies = 3 // per product: the layer's 386 MB a copy, three times the L2 and more
	for _, p := range prods {
		for range copies {
			p.ws = append(p.ws, randomBF16(b, g, 0.02, p.rows, p.in))
		}
		p.x = randomBF16(b, g, 1, n, p.in)
		p.y = randomBF16(b, g, 1, n, p.out)
		p.tmp, _ = g.Alloc(backend.BF16, n, p.rows)
	}
	normW := randomBF16(b, g, 0.1, hidden)
	normed, _ := g.Alloc(backend.BF16, n, hidden)
	defer func() {
		for _, p := range prods {
			for _, w := range p.ws {
				g.Free(w)
			}
			g.Free(p.x)
			g.Free(p.y)
			g.Free(p.tmp)
		}
		g.Free(normW)
		g.Free(normed)
	}()
	// tuned runs product p as the model does, bulk with variant c.
	tuned := func(p *prod, w backend.Tensor) error {
		if p.kernel == "gemvb_bf16" {
			return g.MatMul(p.y, p.x, w, nil)
		}
		if p.kernel == "gemvb_silu_bf16" {
			if ok, err := g.gateUpSiLU(p.y, p.x, w); err != nil || ok {
				return err
			}
			return errors.New("GateUpSiLU did not fuse")
		}
		_, err := g.matMulAdd(p.y, p.x, w)
		return err
	}
	bulk := func(p *prod, w backend.Tensor, c bulkConfig) error {
		// post, not call: call is refused while a graph is captured; an
		// error shows at the capture's end.
		return g.post(func() error {
			y, _ := g.tensorOf("bench", "y", p.y)
			x, _ := g.tensorOf("bench", "x", p.x)
			wt, _ := g.tensorOf("bench", "w", w)
			return g.bulkCall(c, p.kernel, y.ptr, int(dtBF16), x.ptr, wt.ptr, n, p.out, p.in, true)
		})
	}
	for _, p := range prods {
		// Tune every shape outside the captures.
		if err := tuned(p, p.ws[0]); err != nil {
			b.Fatal(err)
		}
	}
	for _, p := range prods {
		bytes := float64(p.rows * p.in * 2)
		next := 0
		cycle := func() backend.Tensor { next = (next + 1) % copies; return p.ws[next] }
		b.Run(p.name+"_tuned", func(b *testing.B) {
			timeGraphOps(b, g, bytes, 4*copies, func() error { return tuned(p, cycle()) })
		})
		for _, c := range bulkConfigs {
			if p.in%c.ck != 0 {
				continue
			}
			b.Run(fmt.Sprintf("%s_bulk_%s", p.name, c.tag()), func(b *testing.B) {
				timeGraphOps(b, g, bytes, 4*copies, func() error { return bulk(p, cycle(), c) })
			})
		}
	}
	// The layer: the O projection's input and output are the residual's
	// neighbours here, not the real chain's, but every kernel reads and
	// writes what it would.
	o, gu, down := prods[0], prods[1], prods[2]
	layerBytes := float64((o.rows*o.in + gu.rows*gu.in + down.rows*down.in) * 2)
	// "nonorm": the tuned path without the norm at all (gate/up reads a
	// stale input), so that tuned - nonorm is what the norm kernel costs in
	// the chain.
	for _, mode := range []string{"tuned", "bulk", "nonorm"} {
		next := 0
		b.Run("layer_"+mode, func(b *testing.B) {
			timeGraphOps(b, g, layerBytes, 2*copies, func() error {
				next = (next + 1) % copies
				run := func(p *prod) error {
					if mode == "bulk" {
						return bulk(p, p.ws[next], bulkPick(p.rows, p.in, g.sms))
					}
					return tuned(p, p.ws[next])
				}
				if err := run(o); err != nil {
					return err
				}
				if mode != "nonorm" {
					if err := g.AddRMSNorm(gu.x, o.y, nil, normW, 1e-5); err != nil {
						return err
					}
				}
				if err := run(gu); err != nil {
					return err
				}
				return run(down)
			})
		})
	}
	for _, c := range g.GEMMChoices() {
		b.Log(c)
	}
}

// TestBulkFusedRows checks the fused products' row limit (no GPU needed):
// the bulk GEMV takes 1-8 rows of x there, as bulkFits allows, and
// leaves 9-16 (two x tiles, one block an SM) to the register GEMV.
func TestBulkFusedRows(t *testing.T) {
	b := &Backend{cc: 90, sms: 132}
	c := bulkPick(2*14336, 4096, b.sms)
	for n := 1; n <= gemvMaxRows; n++ {
		if got, want := b.bulkFused(c, n, 4096, 0, 0), n <= 8; got != want {
			t.Errorf("%d rows: bulkFused %v, want %v", n, got, want)
		}
		if !b.bulkFits(c, n, 4096, 0, 0) {
			t.Errorf("%d rows: bulkFits refused a plain product", n)
		}
	}
	if b.bulkFused(c, 4, 1000, 0, 0) {
		t.Error("k 1000, not a multiple of the stage's columns, fused")
	}
}
