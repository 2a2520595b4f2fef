package cpu

import (
	"fmt"
	"testing"

	"github.com/trigon-llm/trigon/backend"
)

// encodeWQ encodes a [rows, cols] weight in one of the wquant dtypes.
func encodeWQ(t testing.TB, dt backend.DType, v []float32, rows, cols int) []byte {
	t.Helper()
	var out []byte
	for r := range rows {
		row := v[r*cols : (r+1)*cols]
		var b []byte
		var err error
		if g := backend.AWQGroup(dt); g != 0 {
			b, err = backend.EncodeAWQ4(row, g)
		} else {
			b, err = backend.EncodeF8E4M3Row(row, 0)
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b...)
	}
	return out
}

// TestMatMulWeightQuant checks MatMul against the weight-quantized dtypes
// against an f64 product of the decoded weights (and, for F8E4M3Row, of
// the activations quantized per row to e4m3, which the contract says the
// product computes), on fresh random inputs: decode (fused dot) and
// prefill (GEMM) shapes, every kernel set, one and several threads.
func TestMatMulWeightQuant(t *testing.T) {
	r := newRand(t)
	shapes := []struct{ n, in, out int }{
		{1, 128, 1}, {1, 256, 7}, {2, 384, 5}, {3, 128, 33}, {4, 128, 8}, {5, 512, 13},
		{17, 256, 33}, {70, 128, 11}, {13, 1024, 65},
		// FP8 rows of 16 codes past a multiple of 32 (the AVX-512 dot
		// takes 32 at a time and leaves 16 to the AVX2 one); too narrow
		// for the AWQ groups.
		{2, 144, 7}, {1, 16, 3},
	}
	for _, set := range kernelSets() {
		for _, dt := range []backend.DType{backend.AWQ4G32, backend.AWQ4G64, backend.AWQ4G128, backend.F8E4M3Row} {
			for _, threads := range []int{1, 3} {
				for _, sh := range shapes {
					if g := backend.AWQGroup(dt); g != 0 && sh.in%g != 0 {
						continue
					}
					for _, withBias := range []bool{false, true} {
						name := fmt.Sprintf("%s/%v/threads=%d/%dx%dx%d/bias=%v", set.name, dt, threads, sh.n, sh.in, sh.out, withBias)
						t.Run(name, func(t *testing.T) {
							b := newWithKernels(Options{Threads: threads}, set)
							x := randFloats(r, sh.n*sh.in, 1)
							wb := encodeWQ(t, dt, randFloats(r, sh.out*sh.in, 0.5), sh.out, sh.in)
							xt := uploadF32(t, b, x, sh.n, sh.in)
							wt := upload(t, b, dt, []int{sh.out, sh.in}, wb)
							var bt backend.Tensor
							var bias []float64
							if withBias {
								bv := randFloats(r, sh.out, 1)
								bt = uploadF32(t, b, bv, sh.out)
								bias = widen(bv)
							}
							ot := alloc(t, b, backend.F32, sh.n, sh.out)
							if err := b.MatMul(ot, xt, wt, bt); err != nil {
								t.Fatal(err)
							}
							w, err := backend.DequantizeRows(dt, wb, sh.out, sh.in)
							if err != nil {
								t.Fatal(err)
							}
							xr := x
							if dt == backend.F8E4M3Row {
								xr = make([]float32, len(x))
								for i := range sh.n {
									backend.QuantizeActE4M3(x[i*sh.in:(i+1)*sh.in], xr[i*sh.in:(i+1)*sh.in])
								}
							}
							want, scale := refMatMul(widen(xr), widen(w), bias, sh.n, sh.in, sh.out)
							checkClose(t, "out", readF32(t, b, ot), want, scale, 1e-5, 1e-30)
						})
					}
				}
			}
		}
	}
}

// TestMatMulF8QuantizesActivations checks that the FP8 product is the
// product of e4m3 activations, not of the f32 ones: an activation row
// whose values e4m3 cannot hold changes the result by the rounding.
func TestMatMulF8QuantizesActivations(t *testing.T) {
	b := New(Options{Threads: 1})
	in := 16
	x := make([]float32, in)
	x[0], x[1] = 448, 1.0625 // e4m3 holds 448 and 1.0 (step 1/8 at 1), not 1.0625
	w := make([]float32, in)
	w[1] = 1
	wb := encodeWQ(t, backend.F8E4M3Row, w, 1, in)
	ot := alloc(t, b, backend.F32, 1, 1)
	if err := b.MatMul(ot, uploadF32(t, b, x, 1, in), upload(t, b, backend.F8E4M3Row, []int{1, in}, wb), nil); err != nil {
		t.Fatal(err)
	}
	if got := readF32(t, b, ot)[0]; got != 1 {
		t.Errorf("got %v, want 1 (x[1] = 1.0625 rounded to e4m3 at scale 1)", got)
	}
}

func BenchmarkMatMulWeightQuant(b *testing.B) {
	r := newRand(b)
	for _, dt := range []backend.DType{backend.BF16, backend.Q4_0, backend.AWQ4G128, backend.F8E4M3Row} {
		for _, n := range []int{1, 4, 16, 64} {
			in, out := 1024, 1024
			b.Run(fmt.Sprintf("%v/n=%d", dt, n), func(b *testing.B) {
				be := New(Options{})
				wv := randFloats(r, in*out, 0.5)
				var wb []byte
				if dt == backend.AWQ4G128 || dt == backend.F8E4M3Row {
					wb = encodeWQ(b, dt, wv, out, in)
				} else {
					wb = encode(b, dt, wv)
				}
				xt := uploadF32(b, be, randFloats(r, n*in, 1), n, in)
				wt := upload(b, be, dt, []int{out, in}, wb)
				ot := alloc(b, be, backend.F32, n, out)
				b.ReportAllocs()
				for b.Loop() {
					if err := be.MatMul(ot, xt, wt, nil); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(n*in*out)*2*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}
