// Command kvgroups is a workbench for the int8 and int4 KV caches' channel
// group size: the error that each group size G (backend.KVGroupSizes) adds
// to decode attention, against the bytes it costs, at the head dims of
// the models trigon serves. It quantizes K and V with the product's own
// codecs (backend.QuantizeSym8, QuantizeAsym4) and compares the attention
// output with f32 attention over the unquantized K and V.
//
// K is drawn as real K caches look: most channels unit normal, a few
// outlier channels (fixed across tokens) scaled 10-100x. int8 quantizes K
// and V per token over groups of G channels; int4 quantizes K per channel
// over the 16 tokens of a block (G does not enter) and V per token over G
// channels, as docs/kv-cache.md describes.
//
//	go run ./dev/kvgroups
package main

import (
	"flag"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/trigon-llm/trigon/backend"
)

func main() {
	tokens := flag.Int("tokens", 2048, "context length")
	trials := flag.Int("trials", 16, "random heads per case")
	outliers := flag.Int("outliers", 4, "outlier channels of K per head")
	scoreStd := flag.Float64("score-std", 1, "standard deviation of the attention scores q·k")
	flag.Parse()
	fmt.Println("| head dim | format | G | bytes per token and head (K+V) | vs bf16 | attention rel. L2 error (mean / worst) |")
	fmt.Println("|---|---|---|---|---|---|")
	for _, d := range []int{64, 128} {
		for _, f := range []string{"int8", "int4"} {
			for _, g := range backend.KVGroupSizes {
				if d%g != 0 {
					continue
				}
				var sum, worst float64
				rng := rand.New(rand.NewPCG(uint64(d), uint64(g)))
				for range *trials {
					e := trial(rng, f, d, g, *tokens, *outliers, *scoreStd)
					sum += e
					worst = max(worst, e)
				}
				b := bytesPerToken(f, d, g)
				fmt.Printf("| %d | %s | %d | %.1f | %.3f | %.2e / %.2e |\n", d, f, g, b, b/float64(4*d), sum/float64(*trials), worst)
			}
		}
	}
}

// bytesPerToken is one token's K and V bytes for one head, scales
// included (f16 scales; int4's K channel scale and zero are shared by a
// block's 16 tokens).
func bytesPerToken(f string, d, g int) float64 {
	switch f {
	case "int8":
		return 2 * (float64(d) + 2*float64(d/g))
	default: // int4
		k := float64(d)/2 + 4*float64(d)/16
		v := float64(d)/2 + 4*float64(d/g)
		return k + v
	}
}

// trial draws one head's K, V and query, and returns the relative L2
// distance of attention over the quantized cache from f32 attention.
func trial(rng *rand.Rand, f string, d, g, n, outliers int, scoreStd float64) float64 {
	scale := make([]float32, d)
	for c := range scale {
		scale[c] = 1
	}
	for range outliers {
		scale[rng.IntN(d)] = float32(10 + 90*rng.Float64())
	}
	k, v := make([][]float32, n), make([][]float32, n)
	for t := range n {
		k[t], v[t] = make([]float32, d), make([]float32, d)
		for c := range d {
			k[t][c] = float32(rng.NormFloat64()) * scale[c]
			v[t][c] = float32(rng.NormFloat64())
		}
	}
	q := make([]float32, d)
	for c := range q {
		// Every channel, outlier or not, contributes alike to the score
		// (q_c·k_c ~ N(0,1)/sqrt(d)·scoreStd), so an outlier's step does
		// not hide behind its own size.
		q[c] = float32(rng.NormFloat64() * scoreStd / float64(scale[c]) / math.Sqrt(float64(d)))
	}
	kq, vq := quantize(f, k, v, g)
	want, got := attend(q, k, v), attend(q, kq, vq)
	var num, den float64
	for i := range want {
		num += float64((got[i] - want[i]) * (got[i] - want[i]))
		den += float64(want[i] * want[i])
	}
	return math.Sqrt(num / den)
}

// quantize returns K and V after a round trip through the format's codec.
func quantize(f string, k, v [][]float32, g int) (kq, vq [][]float32) {
	n, d := len(k), len(k[0])
	kq, vq = make([][]float32, n), make([][]float32, n)
	for t := range n {
		kq[t], vq[t] = make([]float32, d), make([]float32, d)
	}
	for t := range n {
		for c0 := 0; c0 < d; c0 += g {
			vq8 := make([]int8, g)
			if f == "int8" {
				s := backend.F16ToF32(backend.QuantizeSym8(k[t][c0:c0+g], vq8))
				for i := range g {
					kq[t][c0+i] = float32(vq8[i]) * s
				}
				s = backend.F16ToF32(backend.QuantizeSym8(v[t][c0:c0+g], vq8))
				for i := range g {
					vq[t][c0+i] = float32(vq8[i]) * s
				}
				continue
			}
			q4 := make([]uint8, g)
			sb, zb := backend.QuantizeAsym4(v[t][c0:c0+g], q4)
			s, z := backend.F16ToF32(sb), backend.F16ToF32(zb)
			for i := range g {
				vq[t][c0+i] = float32(q4[i])*s + z
			}
		}
	}
	if f == "int4" {
		// K per channel over each block of 16 tokens.
		for t0 := 0; t0 < n; t0 += 16 {
			m := min(16, n-t0)
			col, q4 := make([]float32, m), make([]uint8, m)
			for c := range d {
				for i := range m {
					col[i] = k[t0+i][c]
				}
				sb, zb := backend.QuantizeAsym4(col, q4)
				s, z := backend.F16ToF32(sb), backend.F16ToF32(zb)
				for i := range m {
					kq[t0+i][c] = float32(q4[i])*s + z
				}
			}
		}
	}
	return kq, vq
}

// attend is softmax(q·K^T)·V in float64.
func attend(q []float32, k, v [][]float32) []float32 {
	n, d := len(k), len(q)
	s := make([]float64, n)
	mx := math.Inf(-1)
	for t := range n {
		var dot float64
		for c := range d {
			dot += float64(q[c]) * float64(k[t][c])
		}
		s[t] = dot
		mx = math.Max(mx, dot)
	}
	var z float64
	for t := range s {
		s[t] = math.Exp(s[t] - mx)
		z += s[t]
	}
	out := make([]float32, d)
	for c := range d {
		var acc float64
		for t := range n {
			acc += s[t] * float64(v[t][c])
		}
		out[c] = float32(acc / z)
	}
	return out
}
