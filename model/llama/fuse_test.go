package llama

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/cpu"
)

// composedFuser is the CPU backend with a backend.NormFuser made of its
// own unfused ops, so a forward through it must give exactly the plain
// CPU backend's logits. accept decides, call by call, whether a method
// fuses (false: it queues nothing, as a real backend refusing would), so
// the model's bookkeeping of the residual (added by a product, or left in
// delta for the next norm to add) is exercised in every mix.
type composedFuser struct {
	*cpu.Backend
	accept func(op string) bool
	calls  map[string]int // fused calls per method
}

var _ backend.NormFuser = (*composedFuser)(nil)

// tmp allocates an F32 scratch tensor; the caller frees it.
func (f *composedFuser) tmp(shape ...int) (backend.Tensor, error) {
	return f.Alloc(backend.F32, shape...)
}

// ones is an F32 vector of n ones: a norm weight for AddRMSNorm used only
// for its residual add.
func (f *composedFuser) ones(n int) (backend.Tensor, error) {
	b := make([]byte, 4*n)
	for i := range n {
		bits := math.Float32bits(1)
		b[4*i], b[4*i+1], b[4*i+2], b[4*i+3] = byte(bits), byte(bits>>8), byte(bits>>16), byte(bits>>24)
	}
	return f.Upload(backend.F32, []int{n}, b)
}

func (f *composedFuser) MatMulAdd(resid, x, w backend.Tensor) (bool, error) {
	if !f.accept("add") {
		return false, nil
	}
	n, m := resid.Shape()[0], resid.Shape()[1]
	d, err := f.tmp(n, m)
	if err != nil {
		return false, err
	}
	defer f.Free(d)
	out, err := f.tmp(n, m)
	if err != nil {
		return false, err
	}
	defer f.Free(out)
	one, err := f.ones(m)
	if err != nil {
		return false, err
	}
	defer f.Free(one)
	if err := f.MatMul(d, x, w, nil); err != nil {
		return false, err
	}
	if err := f.AddRMSNorm(out, d, resid, one, 0); err != nil {
		return false, err
	}
	f.calls["add"]++
	return true, nil
}

// greedyTwo runs fixture f on b: a prefill of its first prompt and of
// that prompt's first half+1 tokens as two sequences, then steps greedy
// decode steps of both, and returns every logits row in order. seed picks
// the harness's block tables.
func greedyTwo(t *testing.T, b backend.Backend, f fixture, steps int, seed uint64) [][]float32 {
	m := newModel(t, b, f.cfg, f.w)
	h := newHarness(t, b, m, backend.F32, blockSize, numBlocks, rand.New(rand.NewPCG(seed, seed+1)))
	defer h.close()
	p := f.ref.Prompts[0].IDs
	s1 := &seq{tokens: append([]int32(nil), p...)}
	s2 := &seq{tokens: append([]int32(nil), p[:len(p)/2+1]...)}
	out := h.step([]work{{s: s1, n: len(s1.tokens)}, {s: s2, n: len(s2.tokens)}})
	logits := [][]float32{out[0][0], out[1][0]}
	for range steps {
		s1.tokens = append(s1.tokens, argmax(logits[len(logits)-2]))
		s2.tokens = append(s2.tokens, argmax(logits[len(logits)-1]))
		out = h.step([]work{{s: s1, n: 1}, {s: s2, n: 1}})
		logits = append(logits, out[0][0], out[1][0])
	}
	return logits
}

// sameLogits fails unless got and want are the same bits.
func sameLogits(t *testing.T, got, want [][]float32) {
	t.Helper()
	for i := range want {
		for j := range want[i] {
			if math.Float32bits(got[i][j]) != math.Float32bits(want[i][j]) {
				t.Fatalf("logits row %d, element %d: %v, want %v (plain CPU)", i, j, got[i][j], want[i][j])
			}
		}
	}
}

// TestNormFuserBookkeeping runs every fixture through a prefill and decode
// steps on the plain CPU backend and on composedFuser under several
// patterns of fusing and refusing: the logits must be identical, bit for
// bit, and each pattern must have fused what it says.
func TestNormFuserBookkeeping(t *testing.T) {
	for _, f := range loadFixtures(t) {
		const steps = 4
		run := func(b backend.Backend) [][]float32 { return greedyTwo(t, b, f, steps, 3) }
		want := run(cpu.New(cpu.Options{}))
		for _, pat := range []struct {
			name   string
			accept func(rng *rand.Rand, op string) bool
		}{
			{"all", func(*rand.Rand, string) bool { return true }},
			{"none", func(*rand.Rand, string) bool { return false }},
			{"random", func(rng *rand.Rand, _ string) bool { return rng.IntN(2) == 0 }},
		} {
			t.Run(fmt.Sprintf("%s/%s", f.name, pat.name), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(len(pat.name)), 9))
				fb := &composedFuser{Backend: cpu.New(cpu.Options{}), calls: map[string]int{}}
				fb.accept = func(op string) bool { return pat.accept(rng, op) }
				sameLogits(t, run(fb), want)
				t.Logf("fused calls: %v", fb.calls)
				switch pat.name {
				case "none":
					if len(fb.calls) != 0 {
						t.Fatalf("fused %v with every call refused", fb.calls)
					}
				case "all":
					layers := f.cfg.NumLayers * (1 + steps)
					if fb.calls["add"] != 2*layers {
						t.Fatalf("fused %v; want %d adds", fb.calls, 2*layers)
					}
				}
			})
		}
	}
}
