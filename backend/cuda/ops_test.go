package cuda

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/trigon-llm/trigon/backend"
)

func TestEmbed(t *testing.T) {
	sharedBackend(t, true)
	for _, tc := range []struct {
		table, out backend.DType
		rows, dim  int
		n          int
	}{
		{backend.BF16, backend.BF16, 1000, 4096, 7},
		{backend.BF16, backend.F32, 500, 4096, 4},   // 16-byte loads, scalar stores
		{backend.BF16, backend.BF16, 300, 20000, 3}, // more than four pieces a thread
		{backend.BF16, backend.BF16, 300, 996, 5},   // rows not of whole 16-byte pieces
		{backend.F32, backend.BF16, 700, 1000, 13},
		{backend.F16, backend.F32, 300, 4096, 1},
		{backend.Q8_0, backend.BF16, 300, 4096, 9},
		{backend.Q4_0, backend.BF16, 257, 992, 33},
		{backend.Q8_0, backend.F32, 100, 992, 5},
	} {
		t.Run(fmt.Sprintf("%v_to_%v_%dx%d_n%d", tc.table, tc.out, tc.rows, tc.dim, tc.n), func(t *testing.T) {
			p := newPair(t)
			tab := encode(tc.table, p.normal(tc.rows*tc.dim, 1))
			ct, gt := p.same(tc.table, []int{tc.rows, tc.dim}, tab)
			ids := make([]int32, tc.n)
			for i := range ids {
				ids[i] = int32(p.r.IntN(tc.rows))
			}
			ids[0] = int32(tc.rows - 1)
			ci, gi := p.same(backend.I32, []int{tc.n}, i32Bytes(ids))
			co, gout := p.cpuOut(tc.n, tc.dim), p.poisoned(tc.out, tc.n, tc.dim)
			p.must("cpu embed", p.c.Embed(co, ct, ci))
			p.must("gpu embed", p.g.Embed(gout, gt, gi))
			p.must("sync", p.g.Sync())
			p.expectClose("embed", read(t, p.g, gout), read(t, p.c, co), 4e-3)
		})
	}
}

func TestAddRMSNorm(t *testing.T) {
	sharedBackend(t, true)
	for _, tc := range []struct {
		rows, dim int
		w         backend.DType
		residual  bool
	}{
		{1, 4096, backend.BF16, true},
		{5, 1000, backend.F32, true},
		{64, 4096, backend.BF16, false},
		{3, 1000, backend.BF16, false},
		{33, 2048, backend.F32, true},
		{2, 20000, backend.BF16, true}, // past the registers of the fast path
		{3, 5120, backend.BF16, false},
		// The 16-byte path: prefill-sized, two chunks per thread, and a
		// row length that is not a multiple of 8 (scalar path).
		{300, 4096, backend.BF16, true},
		{2, 12288, backend.BF16, true},
		{4, 1004, backend.BF16, true},
		// The same path with F32 weights (the models' norms), with and
		// without the residual, one and two chunks per thread.
		{300, 4096, backend.F32, true},
		{4, 4096, backend.F32, false},
		{2, 12288, backend.F32, true},
		{7, 1000, backend.F32, false},
		// Prefill-sized batches take two chunks a thread (normThreads),
		// also on the scalar paths.
		{100, 1004, backend.BF16, true},
		{70, 20000, backend.F32, true},
	} {
		t.Run(fmt.Sprintf("%dx%d_w%v_res%v", tc.rows, tc.dim, tc.w, tc.residual), func(t *testing.T) {
			p := newPair(t)
			shape := []int{tc.rows, tc.dim}
			cx, gx := p.act(backend.BF16, shape, p.normal(tc.rows*tc.dim, 1))
			w := p.normal(tc.dim, 0.3)
			for i := range w {
				w[i] += 1
			}
			cw, gw := p.same(tc.w, []int{tc.dim}, encode(tc.w, w))
			var cr, gr backend.Tensor
			if tc.residual {
				cr, gr = p.act(backend.BF16, shape, p.normal(tc.rows*tc.dim, 2))
			}
			co, gout := p.cpuOut(shape...), p.poisoned(backend.BF16, shape...)
			const eps = 1e-5
			p.must("cpu", p.c.AddRMSNorm(co, cx, cr, cw, eps))
			p.must("gpu", p.g.AddRMSNorm(gout, gx, gr, gw, eps))
			p.must("sync", p.g.Sync())
			p.expectClose("out", read(t, p.g, gout), read(t, p.c, co), bf16Tol)
			if tc.residual {
				p.expectClose("residual", read(t, p.g, gr), read(t, p.c, cr), bf16Tol)
			}
		})
	}
}

func TestSiLUMul(t *testing.T) {
	sharedBackend(t, true)
	// 8-aligned rows take silu_mul_v8 (one chunk a thread: 1032; a
	// second: 5632, 8200, 14336; more rows than the grid's y: 2500x16);
	// 1004 the scalar kernel.
	for _, tc := range []struct{ n, inter int }{{1, 5632}, {7, 1000}, {33, 4096}, {3, 1004}, {512, 14336},
		{2500, 16}, {9, 1032}, {2, 8200}} {
		t.Run(fmt.Sprintf("%dx%d", tc.n, tc.inter), func(t *testing.T) {
			p := newPair(t)
			cg, gg := p.act(backend.BF16, []int{tc.n, 2 * tc.inter}, p.normal(tc.n*2*tc.inter, 2))
			co, gout := p.cpuOut(tc.n, tc.inter), p.poisoned(backend.BF16, tc.n, tc.inter)
			p.must("cpu", p.c.SiLUMul(co, cg))
			p.must("gpu", p.g.SiLUMul(gout, gg))
			p.must("sync", p.g.Sync())
			p.expectClose("silumul", read(t, p.g, gout), read(t, p.c, co), bf16Tol)
		})
	}
}

func TestMatMul(t *testing.T) {
	sharedBackend(t, true)
	type shape struct{ n, in, out int }
	for _, tc := range []struct {
		w    backend.DType
		s    shape
		out  backend.DType
		bias backend.DType // 0: none
	}{
		{backend.BF16, shape{1, 4096, 1000}, backend.BF16, 0},
		{backend.BF16, shape{4, 4096, 4096}, backend.BF16, backend.BF16},
		{backend.BF16, shape{33, 1000, 4096}, backend.F32, backend.F32},
		{backend.F32, shape{3, 1000, 1000}, backend.BF16, 0},
		{backend.F16, shape{9, 4096, 1000}, backend.F32, backend.BF16},
		{backend.Q8_0, shape{1, 4096, 1000}, backend.BF16, 0},
		{backend.Q8_0, shape{8, 992, 4096}, backend.F32, backend.F32},
		{backend.Q8_0, shape{33, 4096, 1000}, backend.BF16, 0},
		{backend.Q4_0, shape{4, 4096, 1000}, backend.BF16, backend.BF16},
		{backend.Q4_0, shape{17, 992, 512}, backend.F32, 0},
	} {
		t.Run(fmt.Sprintf("%v_n%d_%dx%d_out%v_bias%v", tc.w, tc.s.n, tc.s.in, tc.s.out, tc.out, tc.bias), func(t *testing.T) {
			p := newPair(t)
			s := tc.s
			cx, gx := p.act(backend.BF16, []int{s.n, s.in}, p.normal(s.n*s.in, 1))
			wv := p.normal(s.out*s.in, float32(1/math.Sqrt(float64(s.in))))
			cw, gw := p.same(tc.w, []int{s.out, s.in}, encode(tc.w, wv))
			var cb, gb backend.Tensor
			if tc.bias != 0 {
				cb, gb = p.same(tc.bias, []int{s.out}, encode(tc.bias, p.normal(s.out, 1)))
			}
			co, gout := p.cpuOut(s.n, s.out), p.poisoned(tc.out, s.n, s.out)
			p.must("cpu", p.c.MatMul(co, cx, cw, cb))
			p.must("gpu", p.g.MatMul(gout, gx, gw, gb))
			p.must("sync", p.g.Sync())
			p.expectClose("matmul", read(t, p.g, gout), read(t, p.c, co), bf16Tol)
		})
	}
}

// TestGEMV runs every variant of the tensor-core GEMV directly (the tuner
// only keeps one where it is faster, so MatMul alone would not cover them)
// against the CPU backend: one and two 8-row tiles with partial tiles, a
// feature count that is not a multiple of the 16-feature block, k that
// is not a multiple of the 32-wide span, and a Llama-sized product.
func TestGEMV(t *testing.T) {
	sharedBackend(t, true)
	type shape struct{ n, in, out int }
	for _, s := range []shape{{1, 1000, 1000}, {3, 1000, 1000}, {4, 4096, 4096}, {8, 2056, 520}, {9, 1000, 1000}, {16, 4096, 1000}} {
		for _, c := range gemvConfigs {
			for _, out := range []backend.DType{backend.BF16, backend.F32} {
				if out == backend.F32 && s.n != 3 {
					continue // one F32 shape is enough
				}
				t.Run(fmt.Sprintf("n%d_%dx%d_w%d_s%d_out%v", s.n, s.in, s.out, c.nw, c.ur, out), func(t *testing.T) {
					p := newPair(t)
					cx, gx := p.act(backend.BF16, []int{s.n, s.in}, p.normal(s.n*s.in, 1))
					wv := p.normal(s.out*s.in, float32(1/math.Sqrt(float64(s.in))))
					cw, gw := p.same(backend.BF16, []int{s.out, s.in}, encode(backend.BF16, wv))
					co, gout := p.cpuOut(s.n, s.out), p.poisoned(out, s.n, s.out)
					p.must("cpu", p.c.MatMul(co, cx, cw, nil))
					g := p.g
					yt := cudaR16BF
					if out == backend.F32 {
						yt = cudaR32F
					}
					p.must("gemv", g.call(func() error {
						o, _ := g.tensorOf("gemv", "out", gout)
						x, _ := g.tensorOf("gemv", "x", gx)
						w, _ := g.tensorOf("gemv", "w", gw)
						if !gemvFits(s.n, s.in, x.ptr, w.ptr) {
							return fmt.Errorf("gemvFits false for n %d k %d", s.n, s.in)
						}
						return g.gemvCall(c, o.ptr, yt, x.ptr, w.ptr, s.n, s.out, s.in, s.n%2 == 1)
					}))
					p.must("sync", g.Sync())
					p.expectClose("gemv", read(t, g, gout), read(t, p.c, co), bf16Tol)
				})
			}
		}
	}
}

// TestDeviceChecks feeds indices only the device can check and expects
// Sync to report them, then to be clean again.
func TestDeviceChecks(t *testing.T) {
	p := newPair(t)
	g := p.g
	_, tab := p.same(backend.BF16, []int{10, 64}, encode(backend.BF16, p.normal(640, 1)))
	_, ids := p.same(backend.I32, []int{3}, i32Bytes([]int32{1, 10, 2}))
	out := p.poisoned(backend.BF16, 3, 64)
	p.must("embed", g.Embed(out, tab, ids))
	if err := g.Sync(); !errors.Is(err, backend.ErrShape) {
		t.Fatalf("Sync after an out-of-range id: %v, want ErrShape", err)
	} else {
		t.Logf("reported: %v", err)
	}
	p.must("second sync", g.Sync())

	lv := p.normal(200, 1)
	lv[150] = float32(math.NaN())
	_, logits := p.same(backend.F32, []int{2, 100}, encode(backend.F32, lv))
	_, err := g.Sample(backend.SampleArgs{Logits: logits, Rows: []backend.SampleRow{{}, {Temperature: 1, U: 0.5}}})
	if !errors.Is(err, backend.ErrShape) {
		t.Fatalf("Sample of a NaN logit: %v, want ErrShape", err)
	}
	p.must("sync after sample", g.Sync())

	// Host-checkable mistakes fail at the call.
	if err := g.Embed(out, tab, out); !errors.Is(err, backend.ErrShape) {
		t.Fatalf("Embed with BF16 ids: %v", err)
	}
}

// TestAddRMSNormPrefetch checks that add_rmsnorm's prefetching blocks
// change nothing: the same rows with and without 8 MB (and a size that is
// not a whole number of lines) prefetched give the same bytes.
func TestAddRMSNormPrefetch(t *testing.T) {
	sharedBackend(t, true)
	for _, tc := range []struct{ rows, dim, pfBytes int }{{4, 4096, 8 << 20}, {1, 4096, 1000}, {7, 2048, 3 << 20}} {
		t.Run(fmt.Sprintf("%dx%d_pf%d", tc.rows, tc.dim, tc.pfBytes), func(t *testing.T) {
			p := newPair(t)
			shape := []int{tc.rows, tc.dim}
			_, gx := p.act(backend.BF16, shape, p.normal(tc.rows*tc.dim, 1))
			resVals := encode(backend.BF16, p.normal(tc.rows*tc.dim, 2))
			_, gr1 := p.same(backend.BF16, shape, resVals)
			_, gr2 := p.same(backend.BF16, shape, resVals)
			_, gw := p.same(backend.BF16, []int{tc.dim}, encode(backend.BF16, p.normal(tc.dim, 0.3)))
			_, pf := p.same(backend.BF16, []int{tc.pfBytes/2 + 1}, encode(backend.BF16, p.normal(tc.pfBytes/2+1, 1)))
			// (gr1 and gr2 now hold res + x: the next pair starts afresh.)
			_, gr3 := p.same(backend.BF16, shape, resVals)
			_, gr4 := p.same(backend.BF16, shape, resVals)
			_, gw32 := p.same(backend.F32, []int{tc.dim}, encode(backend.F32, p.normal(tc.dim, 0.3)))
			o1, o2 := p.poisoned(backend.BF16, shape...), p.poisoned(backend.BF16, shape...)
			p.must("plain", p.g.AddRMSNorm(o1, gx, gr1, gw, 1e-5))
			p.must("prefetching", normPrefetch(p.g, o2, gx, gr2, gw, pf, tc.pfBytes))
			p.must("sync", p.g.Sync())
			if !bytes.Equal(readBytes(t, p.g, o1), readBytes(t, p.g, o2)) || !bytes.Equal(readBytes(t, p.g, gr1), readBytes(t, p.g, gr2)) {
				t.Fatal("outputs differ with prefetching blocks")
			}
			// The NormPrefetcher op the model calls (F32 norm weight, as
			// the model's), with and without a residual.
			o3, o4 := p.poisoned(backend.BF16, shape...), p.poisoned(backend.BF16, shape...)
			p.must("plain F32 weight", p.g.AddRMSNorm(o3, gx, gr4, gw32, 1e-5))
			p.must("AddRMSNormPrefetch", p.g.addRMSNormPrefetch(o4, gx, gr3, gw32, 1e-5, pf))
			if !bytes.Equal(readBytes(t, p.g, o3), readBytes(t, p.g, o4)) || !bytes.Equal(readBytes(t, p.g, gr4), readBytes(t, p.g, gr3)) {
				t.Fatal("AddRMSNormPrefetch differs from AddRMSNorm")
			}
			p.must("plain, no residual", p.g.AddRMSNorm(o3, gx, nil, gw32, 1e-5))
			p.must("AddRMSNormPrefetch, no residual", p.g.addRMSNormPrefetch(o4, gx, nil, gw32, 1e-5, pf))
			if !bytes.Equal(readBytes(t, p.g, o3), readBytes(t, p.g, o4)) {
				t.Fatal("AddRMSNormPrefetch without a residual differs from AddRMSNorm")
			}
		})
	}
}

// TestFillNormal checks that the device makes FillNormal's values bit for
// bit as the CPU backend does (the same integer hash, no FMA contraction,
// the same BF16 rounding), into a row view, over more elements than one
// grid-stride pass.
func TestFillNormal(t *testing.T) {
	sharedBackend(t, true)
	for _, tc := range []struct {
		dt         backend.DType
		rows, cols int
	}{{backend.BF16, 1, 1}, {backend.F32, 3, 1000}, {backend.BF16, 4097, 1031}, {backend.F32, 1, 5}} {
		t.Run(fmt.Sprintf("%v_%dx%d", tc.dt, tc.rows, tc.cols), func(t *testing.T) {
			p := newPair(t)
			fill := func(b backend.Backend) []byte {
				full, err := b.Alloc(tc.dt, tc.rows+2, tc.cols)
				p.must("alloc", err)
				zero := make([]byte, (tc.rows+2)*tc.cols*tc.dt.BlockBytes())
				p.must("zero", b.Write(full, zero))
				view, err := b.View(full, 1, tc.rows)
				p.must("view", err)
				p.must("fill", b.(backend.RandomFiller).FillNormal(view, 0xfeed, -0.25, 3))
				p.must("sync", b.Sync())
				defer b.Free(full)
				return readBytes(t, b, full)
			}
			if !bytes.Equal(fill(p.g), fill(p.c)) {
				t.Fatal("device and CPU FillNormal bytes differ")
			}
		})
	}
	g := sharedBackend(t, true)
	f16, err := g.Alloc(backend.F16, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Free(f16)
	if err := g.FillNormal(f16, 1, 0, 1); !errors.Is(err, backend.ErrShape) {
		t.Errorf("FillNormal of an F16 tensor: %v, want ErrShape", err)
	}
}

// TestPristine checks which tensors count as pristine (never written by a
// kernel since their bytes arrived: the products may read them before
// they wait under PDL): uploaded ones, and ones FillNormal made once it
// returns; handed to a product as its weight they stay so, handed to any
// op in another role they stop being so.
func TestPristine(t *testing.T) {
	p := newPair(t)
	g := p.g
	const n, k, m = 4, 1024, 512
	pristine := func(x backend.Tensor) bool {
		ct := x.(*tensor)
		return ct.owner != nil && ct.owner.pristine.Load()
	}
	_, x := p.act(backend.BF16, []int{n, k}, p.normal(n*k, 1))
	_, w := p.same(backend.BF16, []int{m, k}, encode(backend.BF16, p.normal(m*k, 0.03)))
	_, wo := p.same(backend.BF16, []int{k, k}, encode(backend.BF16, p.normal(k*k, 0.03)))
	if !pristine(w) || !pristine(wo) {
		t.Fatal("an uploaded weight is not pristine")
	}
	filled, err := g.Alloc(backend.BF16, m, k)
	p.must("alloc", err)
	defer g.Free(filled)
	if pristine(filled) {
		t.Fatal("an allocated tensor is pristine before anything wrote it")
	}
	p.must("fill", g.FillNormal(filled, 7, 0, 0.03))
	if !pristine(filled) {
		t.Fatal("a tensor FillNormal made is not pristine after it returns")
	}
	out := p.poisoned(backend.BF16, n, m)
	p.must("matmul", g.MatMul(out, x, w, nil))
	_, resid := p.same(backend.BF16, []int{n, k}, encode(backend.BF16, p.normal(n*k, 1)))
	_, err = g.matMulAdd(resid, x, wo)
	p.must("matmuladd", err)
	act := p.poisoned(backend.BF16, n, m/2)
	_, err = g.gateUpSiLU(act, x, filled)
	p.must("gateupsilu", err)
	p.must("sync", g.Sync())
	for name, w := range map[string]backend.Tensor{"MatMul's": w, "MatMulAdd's": wo, "GateUpSiLU's": filled} {
		if !pristine(w) {
			t.Errorf("%s weight stopped being pristine", name)
		}
	}
	if pristine(out) || pristine(resid) {
		t.Error("an output is pristine")
	}
	// A weight handed to an op as an operand it may write is no longer
	// pristine.
	_, up := p.same(backend.BF16, []int{n, m}, encode(backend.BF16, p.normal(n*m, 1)))
	if !pristine(up) {
		t.Fatal("an uploaded tensor is not pristine")
	}
	p.must("matmul into it", g.MatMul(up, x, filled, nil))
	p.must("sync", g.Sync())
	if pristine(up) {
		t.Error("a tensor a MatMul wrote into is still pristine")
	}
}
