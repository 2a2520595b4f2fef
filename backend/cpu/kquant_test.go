package cpu

import (
	"fmt"
	"math"
	"testing"

	"github.com/trigon-llm/trigon/backend"
)

var kDTypes = []backend.DType{backend.Q4_K, backend.Q5_K, backend.Q6_K}

// quantBoundK is quantBound for x quantized per 256-value block
// (quantizeQ8K): per block, half the step max|x|/127 times the sum of |w|.
func quantBoundK(x []float32, w []float64, n, in, out int) []float64 {
	bound := make([]float64, n*out)
	for i := range n {
		for blk := 0; blk < in; blk += qkK {
			var amax float64
			for _, v := range x[i*in+blk : i*in+blk+qkK] {
				amax = math.Max(amax, math.Abs(float64(v)))
			}
			half := amax / 127 / 2 * (1 + 1e-6)
			for o := range out {
				var sw float64
				for _, v := range w[o*in+blk : o*in+blk+qkK] {
					sw += math.Abs(v)
				}
				bound[i*out+o] += half * sw
			}
		}
	}
	return bound
}

// TestQuantizeQ8K checks the activation quantizer's invariants on fresh
// random blocks of several magnitudes and a zero block: |x - d*q| <= d/2,
// d = max|x|/127, and the per-16 sums.
func TestQuantizeQ8K(t *testing.T) {
	r := newRand(t)
	const nb = 5
	var x []float32
	for blk := range nb {
		scale := math.Pow(10, float64(blk-2))
		if blk == 3 {
			scale = 0
		}
		x = append(x, randFloats(r, qkK, scale)...)
	}
	q, d, s := make([]int8, nb*qkK), make([]float32, nb), make([]int16, nb*16)
	quantizeQ8K(x, q, d, s)
	for blk := range nb {
		var amax float32
		for _, v := range x[blk*qkK : (blk+1)*qkK] {
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		if d[blk] != amax/127 {
			t.Errorf("block %d: scale %v, want %v", blk, d[blk], amax/127)
		}
		for j := range 16 {
			var sum int16
			for l := blk*qkK + 16*j; l < blk*qkK+16*j+16; l++ {
				sum += int16(q[l])
				if e := math.Abs(float64(x[l]) - float64(d[blk])*float64(q[l])); e > float64(d[blk])/2*(1+1e-6) {
					t.Errorf("x[%d] = %v: q %d, scale %v", l, x[l], q[l], d[blk])
				}
			}
			if s[blk*16+j] != sum {
				t.Errorf("block %d sum %d: %d, want %d", blk, j, s[blk*16+j], sum)
			}
		}
	}
}

// TestKDot checks every kernel set's K-quant dot products against the
// exact product of the decoded weights with the decoded Q8_K activations
// (f64): the integer sums leave only f32 rounding of the scaled block
// sums. The weights are quantized random values, or random bytes (any
// scale and value codes, Q6_K's scale -128 included) with the f16 block
// scales kept small and finite.
func TestKDot(t *testing.T) {
	r := newRand(t)
	for _, set := range kernelSets() {
		for _, dt := range kDTypes {
			for _, c := range []struct {
				nb  int
				raw bool
			}{{1, false}, {3, false}, {16, false}, {2, true}, {5, true}} {
				t.Run(fmt.Sprintf("%s/%v/nb=%d/raw=%v", set.name, dt, c.nb, c.raw), func(t *testing.T) {
					nb := c.nb
					n := nb * qkK
					w := encode(t, dt, randFloats(r, n, 0.5))
					if c.raw {
						for i := range w {
							w[i] = byte(r.Uint32())
						}
						bb := dt.BlockBytes()
						for blk := range nb {
							// f16 exponent field 0..15: magnitudes under 2.
							if dt == backend.Q6_K {
								w[blk*bb+209] &= 0xbb
							} else {
								w[blk*bb+1] &= 0xbb
								w[blk*bb+3] &= 0xbb
							}
						}
					}
					x := randFloats(r, n, 1)
					q, d, s := make([]int8, n), make([]float32, nb), make([]int16, nb*16)
					quantizeQ8K(x, q, d, s)
					wref := decodeRef(t, dt, w, n)
					var want, scale float64
					for i := range n {
						p := wref[i] * float64(d[i/qkK]) * float64(q[i])
						want += p
						scale += math.Abs(p)
					}
					got := set.kDot(dt)(&w[0], &q[0], &d[0], &s[0], nb)
					checkClose(t, "dot", []float32{got}, []float64{want}, []float64{scale}, 1e-5, 1e-30)
				})
			}
		}
	}
}

// TestMatMulKQuant runs MatMul with K-quant weights on fresh random
// inputs through every kernel set, decode (Q8_K activations) and prefill
// shapes (Q4_K/Q5_K through the int8 GEMM, gemmK, where the set has it;
// Q6_K dequantizing into the f32 GEMM), against the f64 product of x with
// the decoded weights plus the bound of x's quantization.
func TestMatMulKQuant(t *testing.T) {
	r := newRand(t)
	shapes := []struct{ n, in, out int }{
		{1, 256, 1}, {1, 512, 37}, {2, 256, 5}, {3, 768, 33},
		{4, 256, 8}, {7, 512, 9}, {17, 256, 65}, {50, 1024, 40},
	}
	for _, set := range kernelSets() {
		for _, dt := range kDTypes {
			for _, threads := range []int{1, 3} {
				for _, sh := range shapes {
					t.Run(fmt.Sprintf("%s/%v/threads=%d/%dx%dx%d", set.name, dt, threads, sh.n, sh.in, sh.out), func(t *testing.T) {
						b := newWithKernels(Options{Threads: threads}, set)
						x := randFloats(r, sh.n*sh.in, 1)
						wb := encode(t, dt, randFloats(r, sh.out*sh.in, 0.5))
						bb := encode(t, backend.F32, randFloats(r, sh.out, 1))
						xt := uploadF32(t, b, x, sh.n, sh.in)
						wt := upload(t, b, dt, []int{sh.out, sh.in}, wb)
						bt := upload(t, b, backend.F32, []int{sh.out}, bb)
						ot := alloc(t, b, backend.F32, sh.n, sh.out)
						if err := b.MatMul(ot, xt, wt, bt); err != nil {
							t.Fatal(err)
						}
						wref := decodeRef(t, dt, wb, sh.out*sh.in)
						want, scale := refMatMul(widen(x), wref, decodeRef(t, backend.F32, bb, sh.out), sh.n, sh.in, sh.out)
						var q []float64
						switch {
						case sh.n <= set.dotsMaxRows(dt):
							q = quantBoundK(x, wref, sh.n, sh.in, sh.out)
						case set.gemmQ != nil && set.gemm != nil && (dt == backend.Q4_K || dt == backend.Q5_K):
							q = quantBound(x, wref, sh.n, sh.in, sh.out) // gemmK: x per 32 values
						}
						for i := range q {
							scale[i] += q[i] / 1e-5
						}
						checkClose(t, "out", readF32(t, b, ot), want, scale, 1e-5, 1e-30)
					})
				}
			}
		}
	}
}

// TestEmbedKQuant gathers rows of a K-quant table.
func TestEmbedKQuant(t *testing.T) {
	r := newRand(t)
	b := New(Options{Threads: 2})
	for _, dt := range kDTypes {
		t.Run(dt.String(), func(t *testing.T) {
			const rows, dim = 9, 512
			tb := encode(t, dt, randFloats(r, rows*dim, 1))
			table := upload(t, b, dt, []int{rows, dim}, tb)
			ids := []int32{3, 0, 8, 3}
			out := alloc(t, b, backend.F32, len(ids), dim)
			if err := b.Embed(out, table, uploadI32(t, b, ids, len(ids))); err != nil {
				t.Fatal(err)
			}
			ref := decodeRef(t, dt, tb, rows*dim)
			var want []float64
			for _, id := range ids {
				want = append(want, ref[int(id)*dim:int(id+1)*dim]...)
			}
			checkClose(t, "rows", readF32(t, b, out), want, nil, 1e-6, 1e-30)
		})
	}
}

func BenchmarkKDot(b *testing.B) {
	for _, set := range kernelSets() {
		for _, dt := range kDTypes {
			b.Run(fmt.Sprintf("%s/%v", set.name, dt), func(b *testing.B) {
				const nb = 16 // a 4096-wide row
				r := newRand(b)
				w := encode(b, dt, randFloats(r, nb*qkK, 0.5))
				x := randFloats(r, nb*qkK, 1)
				q, d, s := make([]int8, nb*qkK), make([]float32, nb), make([]int16, nb*16)
				quantizeQ8K(x, q, d, s)
				kd := set.kDot(dt)
				b.SetBytes(int64(len(w)))
				b.ReportAllocs()
				for b.Loop() {
					kd(&w[0], &q[0], &d[0], &s[0], nb)
				}
			})
		}
	}
}

// BenchmarkMatMulKQuant times K-quant decode (Q8_K integer dots) and
// prefill (dequantized panels through the f32 GEMM) products beside
// Q8_0 and Q4_0 (the int8 GEMM) at one 4096-square shape.
func BenchmarkMatMulKQuant(bm *testing.B) {
	r := newRand(bm)
	for _, sh := range []struct{ n, in, out int }{{1, 4096, 4096}, {64, 4096, 4096}} {
		w := randFloats(r, sh.out*sh.in, 0.02)
		for _, dt := range append([]backend.DType{backend.Q8_0, backend.Q4_0}, kDTypes...) {
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

// TestMatMulKQuantThenQ8 runs decode products of K-quant and then Q8_0
// and Q4_0 weights on one Backend (GGUF mixes fall back to Q8_0 where rows
// are not whole super-blocks): the activation scratch the K-quant path
// sized per 256 values must serve the per-32 paths too.
func TestMatMulKQuantThenQ8(t *testing.T) {
	r := newRand(t)
	for _, set := range kernelSets() {
		t.Run(set.name, func(t *testing.T) {
			b := newWithKernels(Options{Threads: 2}, set)
			const n, in, out = 2, 512, 16
			x := randFloats(r, n*in, 1)
			xt := uploadF32(t, b, x, n, in)
			for _, dt := range []backend.DType{backend.Q4_K, backend.Q8_0, backend.Q6_K, backend.Q4_0} {
				wb := encode(t, dt, randFloats(r, out*in, 0.5))
				wt := upload(t, b, dt, []int{out, in}, wb)
				ot := alloc(t, b, backend.F32, n, out)
				if err := b.MatMul(ot, xt, wt, nil); err != nil {
					t.Fatal(err)
				}
				wref := decodeRef(t, dt, wb, out*in)
				want, scale := refMatMul(widen(x), wref, nil, n, in, out)
				q := quantBoundK(x, wref, n, in, out)
				for i := range scale {
					scale[i] += q[i] / 1e-5
				}
				checkClose(t, dt.String(), readF32(t, b, ot), want, scale, 1e-5, 1e-30)
			}
		})
	}
}
