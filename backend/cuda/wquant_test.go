package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/backend"
)

// TestWQuantCodes checks the dtype codes kernels/wquant.cu defines against
// backend's (no GPU needed).
func TestWQuantCodes(t *testing.T) {
	src, err := kernelFS.ReadFile("kernels/wquant.cu")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]backend.DType{"DT_AWQ4_G32": backend.AWQ4G32, "DT_AWQ4_G64": backend.AWQ4G64, "DT_AWQ4_G128": backend.AWQ4G128, "DT_F8ROW": backend.F8E4M3Row}
	for name, dt := range want {
		m := regexp.MustCompile(`#define ` + name + ` (\d+)`).FindSubmatch(src)
		if m == nil {
			t.Errorf("wquant.cu does not define %s", name)
			continue
		}
		if v, _ := strconv.Atoi(string(m[1])); v != int(dt) {
			t.Errorf("%s = %d, backend.%v = %d", name, v, dt, int(dt))
		}
	}
}

// encodeWQ encodes [rows, cols] values in a weight-quantized dtype.
func encodeWQ(t testing.TB, dt backend.DType, v []float32, rows, cols int) []byte {
	t.Helper()
	var out []byte
	for r := range rows {
		var b []byte
		var err error
		if g := backend.AWQGroup(dt); g != 0 {
			b, err = backend.EncodeAWQ4(v[r*cols:(r+1)*cols], g)
		} else {
			b, err = backend.EncodeF8E4M3Row(v[r*cols:(r+1)*cols], 0)
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b...)
	}
	return out
}

// TestMatMulWQuant runs MatMul against AWQ4 and F8E4M3Row weights on the
// GPU and the CPU (the oracle: it quantizes FP8 activations per row as the
// GPU does) on fresh random inputs: the decode kernels (awq_dec, f8_dec:
// 1 to 16 rows), the GEMVs of 17 to 64 rows (awq_mma, f8_mma: partial
// 8-row tiles), the prefill paths above, BF16 and F32 outputs, biases.
// The FP8 prefill shapes run on each path (f8Path) at most what the
// device and cuBLASLt offer: the default (outer-vector scales in cuBLASLt
// where it has them), cuBLASLt's F32 product with f8_epilogue, and the
// BF16 GEMM of codes (the path of devices without FP8 GEMMs), each forced
// by lowering the shape's plan before the product.
func TestMatMulWQuant(t *testing.T) {
	g := sharedBackend(t, true)
	// 320 and 336 leave partial 128-wide k chunks (336 a partial 32-code
	// piece: FP8 only); 1000, 200 and 20 partial 64-feature blocks; the
	// rest split k across blocks (mmaSplits, decSplits).
	shapes := []wqShape{{1, 4096, 1000}, {3, 1024, 512}, {8, 4096, 4096}, {17, 2048, 1000}, {64, 1024, 1000}, {65, 4096, 1000}, {200, 1024, 2048},
		{4, 320, 864}, {2, 336, 200}, {40, 864, 320}, {128, 2048, 1024},
		// One 128-wide k chunk: the tensor-core kernels' unsplit path.
		{4, 128, 1000}}
	shapes = append(shapes, wqDecodeShapes...)
	// The last chunk's tails (32, 64, 96 inputs) and rows that are not
	// 16-byte aligned in the GEMV of 17..64 rows and in the dequantizer.
	shapes = append(shapes, wqShape{24, 192, 72}, wqShape{33, 224, 40}, wqShape{70, 224, 40}, wqShape{80, 160, 100})
	for _, dt := range []backend.DType{backend.AWQ4G32, backend.AWQ4G64, backend.AWQ4G128, backend.F8E4M3Row} {
		for i, s := range shapes {
			if s.in%dt.BlockSize() != 0 {
				continue
			}
			out := []backend.DType{backend.BF16, backend.F32}[i%2]
			withBias := i%3 == 1
			for _, most := range []f8Path{f8Scaled, f8Epilogue, f8Codes} {
				if most != f8Scaled && (dt != backend.F8E4M3Row || s.n <= wqGemvMaxRows) {
					continue
				}
				name := fmt.Sprintf("%v_n%d_%dx%d_out%v_bias%v", dt, s.n, s.in, s.out, out, withBias)
				if dt == backend.F8E4M3Row && s.n > wqGemvMaxRows {
					name += []string{f8Codes: "_codes", f8Epilogue: "_epilogue", f8Scaled: "_scaled"}[most]
				}
				t.Run(name, func(t *testing.T) {
					p := newPair(t)
					key := f8Key{s.n, s.out, s.in, out}
					if most != f8Scaled {
						p.must("force the path", g.call(func() error {
							pl, err := g.f8PlanFor(s.n, s.out, s.in, out)
							if err != nil {
								return err
							}
							pl.path = min(pl.path, most)
							return nil
						}))
						t.Cleanup(func() { _ = g.call(func() error { g.f8DropPlan(key); return nil }) })
					}
					cx, gx := p.act(backend.BF16, []int{s.n, s.in}, p.normal(s.n*s.in, 1))
					wv := p.normal(s.out*s.in, float32(1/math.Sqrt(float64(s.in))))
					cw, gw := p.same(dt, []int{s.out, s.in}, encodeWQ(t, dt, wv, s.out, s.in))
					var cb, gb backend.Tensor
					if withBias {
						cb, gb = p.same(backend.BF16, []int{s.out}, encode(backend.BF16, p.normal(s.out, 1)))
					}
					co, gout := p.cpuOut(s.n, s.out), p.poisoned(out, s.n, s.out)
					p.must("cpu", p.c.MatMul(co, cx, cw, cb))
					p.must("gpu", p.g.MatMul(gout, gx, gw, gb))
					p.must("sync", p.g.Sync())
					p.expectClose("matmul", read(t, p.g, gout), read(t, p.c, co), bf16Tol)
					if dt == backend.F8E4M3Row && s.n > wqGemvMaxRows {
						var path f8Path
						var why string
						_ = g.call(func() error {
							if pl := g.f8.plans[key]; pl != nil {
								path, why = pl.path, pl.refused
							}
							return nil
						})
						t.Logf("sm_%d: %v (%s)", g.cc, path, why)
						if most >= f8Epilogue && path == f8Codes && g.cc >= 89 && s.n%16 == 0 {
							t.Errorf("sm_%d: cuBLASLt took no FP8 algorithm for [%d,%d]x[%d,%d]^T; the BF16 GEMM of codes ran: %s", g.cc, s.n, s.in, s.out, s.in, why)
						}
					}
				})
			}
		}
	}
}

// wqShape is a product of n rows against a weight of out x in.
type wqShape struct{ n, in, out int }

// wqDecodeShapes are the decode kernels' cases (1, 2, 4, 8 and 16 rows,
// and between): inputs whose last 128-wide chunk holds 32 (160, 4128),
// 64 (192), 96 (224) or 128 inputs, AWQ4 rows that are not 16-byte
// aligned (groups not a multiple of 4: 160, 192 and 224 in groups of 32,
// 192 and 640 in groups of 64, 640 in groups of 128) beside ones that are,
// output features that fill no 16- or 32-feature tile (100, 72, 300,
// 520, 1000), and k long enough for several chunks in flight per warp
// (14336).
var wqDecodeShapes = []wqShape{{1, 160, 100}, {2, 192, 72}, {4, 224, 300}, {8, 640, 300}, {16, 640, 520},
	{16, 4128, 100}, {1, 14336, 300}, {2, 4096, 1000}, {4, 14336, 520}, {5, 1024, 1000}, {9, 4096, 300}, {16, 4096, 1000}, {12, 512, 4096}}

// TestWQDecodeTunings runs the decode kernels (awq_dec, f8_dec) against
// the CPU with each k split inside a block (Tuning.WQDecodeKSplit), with
// k split across blocks where the default splits none, and with no split
// where it splits (Tuning.WQDecodeWaves).
func TestWQDecodeTunings(t *testing.T) {
	sharedBackend(t, true)
	for _, tune := range []Tuning{{WQDecodeKSplit: 1}, {WQDecodeKSplit: 2}, {WQDecodeKSplit: 8}, {WQDecodeKSplit: 4}, {WQDecodeKSplit: 8, WQDecodeWaves: 16}, {WQDecodeKSplit: 1, WQDecodeWaves: 16}, {WQDecodeWaves: 16}} {
		g := backendWith(t, tune, "")
		for _, dt := range []backend.DType{backend.AWQ4G32, backend.AWQ4G64, backend.AWQ4G128, backend.F8E4M3Row} {
			for _, s := range []wqShape{{1, 4096, 1000}, {4, 640, 300}, {16, 2048, 200}, {7, 14336, 64}, {3, 4096, 4600}} {
				if s.in%dt.BlockSize() != 0 {
					continue
				}
				t.Run(fmt.Sprintf("ksplit%d_waves%d_%v_n%d_%dx%d", tune.WQDecodeKSplit, tune.WQDecodeWaves, dt, s.n, s.in, s.out), func(t *testing.T) {
					p := newPairOn(t, g)
					cx, gx := p.act(backend.BF16, []int{s.n, s.in}, p.normal(s.n*s.in, 1))
					wv := p.normal(s.out*s.in, float32(1/math.Sqrt(float64(s.in))))
					cw, gw := p.same(dt, []int{s.out, s.in}, encodeWQ(t, dt, wv, s.out, s.in))
					co, gout := p.cpuOut(s.n, s.out), p.poisoned(backend.F32, s.n, s.out)
					p.must("cpu", p.c.MatMul(co, cx, cw, nil))
					p.must("gpu", g.MatMul(gout, gx, gw, nil))
					p.must("sync", g.Sync())
					p.expectClose("matmul", read(t, g, gout), read(t, p.c, co), bf16Tol)
				})
			}
		}
	}
}

// TestF8ActQuant checks the activation quantizer's codes against
// backend.F32ToE4M3 bit for bit, over rows that reach e4m3's subnormals,
// its ties and a row of zeros, at a row width of whole 2048-value passes of
// the block (4096) and one that ends inside a pass (336).
func TestF8ActQuant(t *testing.T) {
	for _, k := range []int{4096, 336} {
		t.Run(fmt.Sprintf("k%d", k), func(t *testing.T) { testF8ActQuant(t, k) })
	}
}

func testF8ActQuant(t *testing.T, k int) {
	g := sharedBackend(t, true)
	p := newPair(t)
	n := 5
	vals := p.normal(n*k, 1)
	for i := range k {
		vals[2*k+i] = 0 // a row of zeros: scale 1
		vals[3*k+i] = backend.BF16ToF32(backend.F32ToBF16(float32(i-k/2) / 64))
	}
	gx := p.gpuT(backend.BF16, []int{n, k}, encode(backend.BF16, vals))
	var got []byte
	p.must("quantize", g.call(func() error {
		xt, err := g.tensorOf("test", "x", gx)
		if err != nil {
			return err
		}
		buf, err := g.tmpGet(n*k + 4*n + 16)
		if err != nil {
			return err
		}
		defer g.tmpPut(buf)
		f, err := g.fn(fnKey{modSpec{file: "wquant", p: [8]int{int(backend.F8E4M3Row), int(backend.BF16), 1}}, "f8_act_quant"})
		if err != nil {
			return err
		}
		sx := buf + uint64((n*k+15)/16*16)
		if err := g.launch(f, [3]int{n, 1, 1}, 256, 0, buf, sx, xt.ptr, i32(n), i32(k)); err != nil {
			return err
		}
		got = make([]byte, (n*k+15)/16*16+4*n)
		return g.copyOut(got, buf)
	}))
	for r := range n {
		row := vals[r*k : (r+1)*k]
		s := backend.E4M3Scale(row)
		off := (n*k+15)/16*16 + 4*r
		if gs := math.Float32frombits(uint32(got[off]) | uint32(got[off+1])<<8 | uint32(got[off+2])<<16 | uint32(got[off+3])<<24); gs != s {
			t.Fatalf("row %d: scale %v, want %v", r, gs, s)
		}
		inv := 1 / s
		for i, v := range row {
			if want := backend.F32ToE4M3(v * inv); got[r*k+i] != want {
				t.Fatalf("row %d [%d] = %v: code %#x, want %#x", r, i, v, got[r*k+i], want)
			}
		}
	}
}

// TestAWQGemvCUDACores runs awq_gemv, the AWQ decode kernel of devices
// before sm_80 (MatMul takes awq_dec / awq_mma on later ones), directly
// against the CPU: one row, a partial 8-row tile, two tiles, and rows
// whose last 128-wide chunk of the device layout is short (160, 192).
func TestAWQGemvCUDACores(t *testing.T) {
	g := sharedBackend(t, true)
	for _, dt := range []backend.DType{backend.AWQ4G32, backend.AWQ4G64, backend.AWQ4G128} {
		for _, c := range []struct{ n, in, out int }{{1, 1024, 300}, {5, 1024, 300}, {16, 1024, 300}, {3, 160, 40}, {9, 192, 40}, {2, 640, 20}} {
			n, in, out := c.n, c.in, c.out
			if in%backend.AWQGroup(dt) != 0 {
				continue
			}
			t.Run(fmt.Sprintf("%v_n%d_%dx%d", dt, n, in, out), func(t *testing.T) {
				p := newPair(t)
				cx, gx := p.act(backend.BF16, []int{n, in}, p.normal(n*in, 1))
				wv := p.normal(out*in, float32(1/math.Sqrt(float64(in))))
				cw, gw := p.same(dt, []int{out, in}, encodeWQ(t, dt, wv, out, in))
				co, gout := p.cpuOut(n, out), p.poisoned(backend.F32, n, out)
				p.must("cpu", p.c.MatMul(co, cx, cw, nil))
				p.must("gpu", g.call(func() error {
					ot, err := g.tensorOf("test", "out", gout)
					if err != nil {
						return err
					}
					xt, err := g.tensorOf("test", "x", gx)
					if err != nil {
						return err
					}
					wt, err := g.tensorOf("test", "w", gw)
					if err != nil {
						return err
					}
					f, err := g.fn(fnKey{modSpec{file: "wquant", p: [8]int{int(dt), int(backend.F32), 1}}, "awq_gemv"})
					if err != nil {
						return err
					}
					return g.launch(f, [3]int{(out + 7) / 8, (n + wqMaxn - 1) / wqMaxn, 1}, 256, 0, ot.ptr, xt.ptr, wt.ptr, i32(n), i32(out), i32(in))
				}))
				p.must("sync", g.Sync())
				p.expectClose("awq_gemv", read(t, g, gout), read(t, p.c, co), bf16Tol)
			})
		}
	}
}

// TestF8GemvCUDACores runs f8_gemv, the FP8 decode kernel of devices
// before sm_89 (MatMul takes f8_mma on later ones), directly against the
// CPU, after f8_act_quant.
func TestF8GemvCUDACores(t *testing.T) {
	g := sharedBackend(t, true)
	for _, c := range []struct{ n, in, out int }{{1, 1024, 300}, {5, 1024, 300}, {16, 1024, 300}, {3, 336, 40}} {
		n, in, out := c.n, c.in, c.out
		t.Run(fmt.Sprintf("n%d_%dx%d", n, in, out), func(t *testing.T) {
			p := newPair(t)
			dt := backend.F8E4M3Row
			cx, gx := p.act(backend.BF16, []int{n, in}, p.normal(n*in, 1))
			wv := p.normal(out*in, float32(1/math.Sqrt(float64(in))))
			cw, gw := p.same(dt, []int{out, in}, encodeWQ(t, dt, wv, out, in))
			co, gout := p.cpuOut(n, out), p.poisoned(backend.F32, n, out)
			p.must("cpu", p.c.MatMul(co, cx, cw, nil))
			p.must("gpu", g.call(func() error {
				ot, err := g.tensorOf("test", "out", gout)
				if err != nil {
					return err
				}
				xt, err := g.tensorOf("test", "x", gx)
				if err != nil {
					return err
				}
				wt, err := g.tensorOf("test", "w", gw)
				if err != nil {
					return err
				}
				xq, err := g.tmpGet(n*in + 4*n + 16)
				if err != nil {
					return err
				}
				defer g.tmpPut(xq)
				sx := xq + uint64((n*in+15)/16*16)
				spec := modSpec{file: "wquant", p: [8]int{int(dt), int(backend.F32), 1}}
				f, err := g.fn(fnKey{spec, "f8_act_quant"})
				if err != nil {
					return err
				}
				if err := g.launch(f, [3]int{n, 1, 1}, 256, 0, xq, sx, xt.ptr, i32(n), i32(in)); err != nil {
					return err
				}
				if f, err = g.fn(fnKey{spec, "f8_gemv"}); err != nil {
					return err
				}
				return g.launch(f, [3]int{(out + 7) / 8, (n + wqMaxn - 1) / wqMaxn, 1}, 256, 0, ot.ptr, xq, sx, wt.ptr, i32(n), i32(out), i32(in))
			}))
			p.must("sync", g.Sync())
			p.expectClose("f8_gemv", read(t, g, gout), read(t, p.c, co), bf16Tol)
		})
	}
}

// TestWQuantKernelsCompile builds kernels/wquant.cu for each weight dtype
// at the row tiles MatMul asks for (NT 1 and 2: awq_dec, f8_dec and the
// smallest awq_mma / f8_mma; 8: the largest), BF16 and F32 out, with NVRTC
// for the device's target, or the newest up to Hopper without a GPU.
// Without a GPU the check stops at PTX: the NVRTC of a machine without one
// may predate ptxas's e4m3 mma.sync (CUDA 12.4), which f8_mma and f8_dec
// use; with a GPU the cubin is built as the backend builds it.
func TestWQuantKernelsCompile(t *testing.T) {
	c := testCompiler(t, t.TempDir())
	if sharedBackend(t, false) == nil {
		c = &compiler{nv: c.nv, arch: strings.Replace(c.arch, "sm_", "compute_", 1), cubin: false, cache: c.cache}
	}
	for _, dt := range []backend.DType{backend.AWQ4G32, backend.AWQ4G64, backend.AWQ4G128, backend.F8E4M3Row} {
		for _, v := range []struct{ ot, nt int }{{int(backend.BF16), 1}, {int(backend.F32), 2}, {int(backend.BF16), 8}} {
			s := modSpec{file: "wquant", p: [8]int{int(dt), v.ot, v.nt}}
			t.Run(s.String(), func(t *testing.T) {
				t.Parallel() // NVRTC is thread-safe
				if _, _, err := c.build(s, true); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// f8DropPlan forgets the FP8 plan of key, destroying its descriptors (a
// test that lowered a plan's path restores the default). CUDA thread only.
func (b *Backend) f8DropPlan(key f8Key) {
	if p := b.f8.plans[key]; p != nil {
		p.scaled.destroy(b.blas.lib)
		p.plain.destroy(b.blas.lib)
		delete(b.f8.plans, key)
	}
}

// TestF8GemmPlan: on a GPU with FP8 tensor cores (sm_89 and later), the
// FP8 products of prefill-sized row counts at Llama-3-8B's shapes run on
// cuBLASLt's FP8 GEMM, not on the BF16 GEMM of codes, once a product ran;
// on Hopper with cuBLASLt 12.9 or later (outer-vector scales), with the
// scales applied inside cuBLASLt. It logs each shape's path and why a
// faster one was refused.
func TestF8GemmPlan(t *testing.T) {
	g := sharedBackend(t, true)
	if g.cc < 89 {
		t.Skipf("compute capability %d: no FP8 tensor cores", g.cc)
	}
	var ver int
	_ = g.call(func() error { ver = g.blas.lib.call(g.blas.lib.version); return nil })
	t.Logf("cuBLASLt %d, sm_%d", ver, g.cc)
	r := rand.New(rand.NewPCG(5, 6))
	for _, s := range []struct{ n, m, k int }{{256, 6144, 4096}, {256, 4096, 4096}, {256, 28672, 4096}, {256, 4096, 14336}, {2048, 28672, 4096}} {
		t.Run(fmt.Sprintf("n%d_%dx%d", s.n, s.k, s.m), func(t *testing.T) {
			vals := make([]float32, s.m*s.k)
			for i := range vals {
				vals[i] = float32(r.NormFloat64() * 0.02)
			}
			w, err := g.Upload(backend.F8E4M3Row, []int{s.m, s.k}, encodeWQ(t, backend.F8E4M3Row, vals, s.m, s.k))
			if err != nil {
				t.Fatal(err)
			}
			defer g.Free(w)
			xv := make([]float32, s.n*s.k)
			for i := range xv {
				xv[i] = float32(r.NormFloat64())
			}
			x, err := g.Upload(backend.BF16, []int{s.n, s.k}, encode(backend.BF16, xv))
			if err != nil {
				t.Fatal(err)
			}
			defer g.Free(x)
			y, err := g.Alloc(backend.BF16, s.n, s.m)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Free(y)
			if err := g.MatMul(y, x, w, nil); err != nil {
				t.Fatal(err)
			}
			if err := g.Sync(); err != nil {
				t.Fatal(err)
			}
			var path f8Path
			var why string
			if err := g.call(func() error {
				p := g.f8.plans[f8Key{s.n, s.m, s.k, backend.BF16}]
				if p == nil {
					return fmt.Errorf("no FP8 plan for the shape")
				}
				path, why = p.path, p.refused
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			t.Logf("FP8 GEMM path: %v (%s)", path, why)
			if path == f8Codes {
				t.Errorf("the FP8 product runs the BF16 GEMM of codes: %s", why)
			}
			if g.cc == 90 && ver >= 120900 && path != f8Scaled {
				t.Errorf("sm_90, cuBLASLt %d: the scales are not applied in cuBLASLt: %s", ver, why)
			}
		})
	}
}
