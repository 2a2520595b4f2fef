package cpu

import (
	"fmt"
	"math"
	"testing"

	"github.com/trigon-llm/trigon/backend"
)

// refMatMul computes x . w^T + bias in f64 from the decoded bytes, and for
// each output the sum of |x*w| terms, the scale of f32 accumulation error.
func refMatMul(x, w, bias []float64, n, in, out int) (want, scale []float64) {
	want, scale = make([]float64, n*out), make([]float64, n*out)
	for i := range n {
		for o := range out {
			var s, a float64
			for k := range in {
				p := x[i*in+k] * w[o*in+k]
				s += p
				a += math.Abs(p)
			}
			if bias != nil {
				s += bias[o]
				a += math.Abs(bias[o])
			}
			want[i*out+o], scale[i*out+o] = s, a
		}
	}
	return want, scale
}

func TestMatMul(t *testing.T) {
	r := newRand(t)
	shapes := []struct{ n, in, out int }{
		{1, 32, 1}, {1, 64, 7}, {2, 96, 5}, {3, 32, 4}, {4, 128, 8}, {5, 160, 13},
		{7, 64, 9}, {17, 256, 33}, {9, 1024, 70}, {70, 96, 11}, {1, 512, 300}, {3, 256, 530},
		// Prefill tails: rows past the int8 kernels' 6, features past a
		// 32-wide panel, a single block of k.
		{13, 32, 65}, {50, 224, 97},
		// One token over an odd number of blocks (the two-block decode
		// kernels' last block alone).
		{1, 160, 37},
		// Rows that are not whole quantization blocks: plain dtypes only.
		{1, 7, 3}, {2, 33, 5}, {6, 45, 6}, {3, 1, 2},
	}
	for _, set := range kernelSets() {
		for _, dt := range weightDTypes {
			for _, threads := range []int{1, 3} {
				for _, sh := range shapes {
					if sh.in%dt.BlockSize() != 0 {
						continue
					}
					for _, biasDT := range []backend.DType{0, backend.F32, backend.BF16} {
						name := fmt.Sprintf("%s/%v/threads=%d/%dx%dx%d/bias=%v", set.name, dt, threads, sh.n, sh.in, sh.out, biasDT)
						t.Run(name, func(t *testing.T) {
							b := newWithKernels(Options{Threads: threads}, set)
							x := randFloats(r, sh.n*sh.in, 1)
							wb := encode(t, dt, randFloats(r, sh.out*sh.in, 0.5))
							xt := uploadF32(t, b, x, sh.n, sh.in)
							wt := upload(t, b, dt, []int{sh.out, sh.in}, wb)
							var bt backend.Tensor
							var bias []float64
							if biasDT != 0 {
								bb := encode(t, biasDT, randFloats(r, sh.out, 1))
								bt = upload(t, b, biasDT, []int{sh.out}, bb)
								bias = decodeRef(t, biasDT, bb, sh.out)
							}
							ot := alloc(t, b, backend.F32, sh.n, sh.out)
							if err := b.MatMul(ot, xt, wt, bt); err != nil {
								t.Fatal(err)
							}
							wref := decodeRef(t, dt, wb, sh.out*sh.in)
							want, scale := refMatMul(widen(x), wref, bias, sh.n, sh.in, sh.out)
							decodeQ := sh.n <= set.dotsMaxRows(dt) && set.dotQ8 != nil
							prefillQ := sh.n > set.dotsMaxRows(dt) && set.gemmQ != nil
							if dt.Quantized() && (decodeQ || prefillQ) {
								// x quantized to int8 blocks: allow the rounding bound on top.
								q := quantBound(x, wref, sh.n, sh.in, sh.out)
								for i := range scale {
									scale[i] += q[i] / 1e-5
								}
							}
							checkClose(t, "out", readF32(t, b, ot), want, scale, 1e-5, 1e-30)
						})
					}
				}
			}
		}
	}
}

// quantBound is, for each output of x . w^T, the most that quantizing x
// to int8 per 32-element block can change it: per block, half the
// quantization step (max|x|/127/2) times the sum of |w| over the block.
func quantBound(x []float32, w []float64, n, in, out int) []float64 {
	bound := make([]float64, n*out)
	for i := range n {
		for blk := 0; blk < in; blk += 32 {
			var amax float64
			for _, v := range x[i*in+blk : i*in+blk+32] {
				amax = math.Max(amax, math.Abs(float64(v)))
			}
			half := amax / 127 / 2 * (1 + 1e-6)
			for o := range out {
				var sw float64
				for _, v := range w[o*in+blk : o*in+blk+32] {
					sw += math.Abs(v)
				}
				bound[i*out+o] += half * sw
			}
		}
	}
	return bound
}

// TestMatMulViews checks that MatMul reads and writes through row views at
// a non-zero offset (the runner slices batches out of bigger buffers).
func TestMatMulViews(t *testing.T) {
	r := newRand(t)
	b := New(Options{Threads: 2})
	const n, in, out = 6, 64, 10
	x := randFloats(r, (n+3)*in, 1)
	wb := encode(t, backend.Q8_0, randFloats(r, (out+2)*in, 1))
	xt := uploadF32(t, b, x, n+3, in)
	wt := upload(t, b, backend.Q8_0, []int{out + 2, in}, wb)
	ot := alloc(t, b, backend.F32, n+4, out)
	xv, err := b.View(xt, 2, n)
	if err != nil {
		t.Fatal(err)
	}
	wv, err := b.View(wt, 1, out)
	if err != nil {
		t.Fatal(err)
	}
	ov, err := b.View(ot, 3, n)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.MatMul(ov, xv, wv, nil); err != nil {
		t.Fatal(err)
	}
	wref := decodeRef(t, backend.Q8_0, wb, (out+2)*in)[in : (out+1)*in]
	want, scale := refMatMul(widen(x[2*in:(n+2)*in]), wref, nil, n, in, out)
	if b.k.gemmQ != nil {
		// x quantized to int8 blocks: allow the rounding bound on top.
		for i, q := range quantBound(x[2*in:(n+2)*in], wref, n, in, out) {
			scale[i] += q / 1e-5
		}
	}
	got := readF32(t, b, ot)
	checkClose(t, "view out", got[3*out:(n+3)*out], want, scale, 1e-5, 1e-30)
	for i, v := range append(got[:3*out:3*out], got[(n+3)*out:]...) {
		if v == v {
			t.Fatalf("row outside the view written: element %d = %v", i, v)
		}
	}
}

func TestMatMulErrors(t *testing.T) {
	b := New(Options{})
	f32 := func(shape ...int) backend.Tensor { return alloc(t, b, backend.F32, shape...) }
	x, w, out := f32(2, 64), f32(3, 64), f32(2, 3)
	freed := f32(3, 64)
	b.Free(freed)
	q, _ := b.Alloc(backend.Q8_0, 3, 64)
	i32, _ := b.Alloc(backend.I32, 2, 64)
	outView, _ := b.Reshape(x, 2, 64)
	outAlias, _ := b.View(outView, 0, 2)
	xAsOut, _ := b.Reshape(x, 2, 64)
	for _, c := range []struct {
		name               string
		out, x, w, bias    backend.Tensor
		wantShapeErrorKind bool
	}{
		{"x inner mismatch", out, f32(2, 32), w, nil, true},
		{"out rows", f32(3, 3), x, w, nil, true},
		{"out cols", f32(2, 4), x, w, nil, true},
		{"w 3-D", out, x, f32(3, 64, 1), nil, true},
		{"bias length", out, x, w, f32(4), true},
		{"x dtype", out, i32, w, nil, true},
		{"out dtype", q, x, w, nil, true},
		{"w dtype I32", out, x, i32, nil, true},
		{"out overlaps x", outAlias, x, f32(64, 64), nil, true},
		{"out is x", xAsOut, x, f32(64, 64), nil, true},
		{"nil x", out, nil, w, nil, false},
		{"freed w", out, x, freed, nil, false},
		{"foreign tensor", out, x, fakeTensor{}, nil, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := b.MatMul(c.out, c.x, c.w, c.bias)
			if err == nil {
				t.Fatal("no error")
			}
			if c.wantShapeErrorKind && !isShapeErr(err) {
				t.Errorf("error %v does not wrap backend.ErrShape", err)
			}
		})
	}
}

type fakeTensor struct{}

func (fakeTensor) DType() backend.DType { return backend.F32 }
func (fakeTensor) Shape() []int         { return []int{3, 64} }

// BenchmarkMatMul times decode (n=1) and prefill (n=512) products at the
// default model's shapes (320 hidden, 864 intermediate) and a 4096-square
// one, for every weight dtype.
func BenchmarkMatMul(bm *testing.B) {
	r := newRand(bm)
	for _, sh := range []struct{ n, in, out int }{
		{1, 320, 864}, {512, 320, 864}, {512, 864, 320}, {1, 4096, 4096}, {64, 4096, 4096},
	} {
		w := randFloats(r, sh.out*sh.in, 0.02)
		for _, dt := range weightDTypes {
			wb := encode(bm, dt, w)
			bm.Run(fmt.Sprintf("%v/n=%d/%dx%d", dt, sh.n, sh.out, sh.in), func(bm *testing.B) {
				b := New(Options{})
				wt := upload(bm, b, dt, []int{sh.out, sh.in}, wb)
				xt := uploadF32(bm, b, randFloats(r, sh.n*sh.in, 1), sh.n, sh.in)
				ot := alloc(bm, b, backend.F32, sh.n, sh.out)
				bm.ReportAllocs()
				for bm.Loop() {
					if err := b.MatMul(ot, xt, wt, nil); err != nil {
						bm.Fatal(err)
					}
				}
				sec := bm.Elapsed().Seconds()
				bm.ReportMetric(float64(len(wb))*float64(bm.N)/sec/1e9, "weightGB/s")
				bm.ReportMetric(2*float64(sh.n*sh.in*sh.out)*float64(bm.N)/sec/1e9, "GFLOP/s")
			})
		}
	}
}
