package sample

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/cpu"
)

func newRand(t testing.TB) *rand.Rand {
	h := fnv.New64a()
	h.Write([]byte(t.Name()))
	return rand.New(rand.NewPCG(h.Sum64(), 0x2545f4914f6cdd1d))
}

func randLogits(r *rand.Rand, n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64() * scale)
	}
	return v
}

func seeded(p Params, seed uint64) Params {
	p.Seed = &seed
	return p
}

func mustSampler(t testing.TB, p Params, choice int) *Sampler {
	t.Helper()
	s, err := NewSampler(p, choice)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func pickSequence(t *testing.T, s *Sampler, logits [][]float32) []int32 {
	t.Helper()
	var out []int32
	for _, l := range logits {
		tok, err := s.Pick(l)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, tok)
	}
	return out
}

func TestSeedReproducible(t *testing.T) {
	r := newRand(t)
	var steps [][]float32
	for range 200 {
		steps = append(steps, randLogits(r, 50, 1))
	}
	p := Neutral()
	p.Temperature, p.TopP = 1.2, 0.98
	a := pickSequence(t, mustSampler(t, seeded(p, 7), 0), steps)
	b := pickSequence(t, mustSampler(t, seeded(p, 7), 0), steps)
	if !slices.Equal(a, b) {
		t.Fatalf("same seed, different tokens:\n%v\n%v", a, b)
	}
	for _, c := range []struct {
		name string
		s    *Sampler
	}{
		{"other seed", mustSampler(t, seeded(p, 8), 0)},
		{"other choice", mustSampler(t, seeded(p, 7), 1)},
		// Choice 1 of seed 6 is its own stream, not seed 7's choice 0
		// (engine.Request.N: not vLLM's Seed+i).
		{"choice 1 of seed 6", mustSampler(t, seeded(p, 6), 1)},
		{"unseeded", mustSampler(t, p, 0)},
	} {
		if got := pickSequence(t, c.s, steps); slices.Equal(got, a) {
			t.Errorf("%s: the same 200 tokens as seed 7 choice 0", c.name)
		}
	}
	if s1, s2 := mustSampler(t, p, 0), mustSampler(t, p, 0); s1.Seed() == s2.Seed() {
		t.Error("two unseeded samplers drew the same seed")
	}
	if s := mustSampler(t, seeded(p, 99), 0); s.Seed() != 99 {
		t.Errorf("Seed() = %d, want 99", s.Seed())
	}
}

// TestDistribution draws 20k tokens and compares frequencies with the
// renormalised probabilities, within 5 binomial standard deviations.
func TestDistribution(t *testing.T) {
	logits := []float32{1.5, 0.2, -0.7, 2.1, 0.9, -3, 0}
	// softmax returns the probabilities at temperature temp, with the
	// tokens keep rejects zeroed and the rest renormalised. keep sees the
	// token's rank, probability, the mass ranked above it and the top
	// probability.
	softmax := func(temp float64, keep func(rank int, p, above, top float64) bool) []float64 {
		p := make([]float64, len(logits))
		var sum float64
		for i, l := range logits {
			p[i] = math.Exp(float64(l) / temp)
			sum += p[i]
		}
		order := make([]int, len(logits))
		for i := range order {
			order[i] = i
			p[i] /= sum
		}
		slices.SortFunc(order, func(a, b int) int { return -cmpFloat(p[a], p[b]) })
		var above, kept float64
		top := p[order[0]]
		for rank, i := range order {
			q := p[i]
			if !keep(rank, q, above, top) {
				p[i] = 0
			}
			above += q
			kept += p[i]
		}
		for i := range p {
			p[i] /= kept
		}
		return p
	}
	all := func(int, float64, float64, float64) bool { return true }
	for _, c := range []struct {
		name string
		edit func(*Params)
		want []float64
	}{
		{"T=1", func(p *Params) {}, softmax(1, all)},
		{"T=0.5", func(p *Params) { p.Temperature = 0.5 }, softmax(0.5, all)},
		{"T=1.7", func(p *Params) { p.Temperature = 1.7 }, softmax(1.7, all)},
		{"top-k 3", func(p *Params) { p.TopK = 3 }, softmax(1, func(rank int, _, _, _ float64) bool { return rank < 3 })},
		{"top-p 0.8", func(p *Params) { p.TopP = 0.8 }, softmax(1, func(_ int, _, above, _ float64) bool { return above < 0.8 })},
		{"min-p 0.2", func(p *Params) { p.MinP = 0.2 }, softmax(1, func(_ int, q, _, top float64) bool { return q >= 0.2*top })},
		{"T=0.7 top-k 4 top-p 0.9", func(p *Params) { p.Temperature, p.TopK, p.TopP = 0.7, 4, 0.9 }, func() []float64 {
			// Top-p applies to the top-4 set renormalised.
			q := softmax(0.7, func(rank int, _, _, _ float64) bool { return rank < 4 })
			return renormTopP(q, 0.9)
		}()},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := Neutral()
			c.edit(&p)
			s := mustSampler(t, seeded(p, 12345), 0)
			const draws = 20000
			counts := make([]int, len(logits))
			for range draws {
				tok, err := s.Pick(logits)
				if err != nil {
					t.Fatal(err)
				}
				counts[tok]++
			}
			for i, q := range c.want {
				if q == 0 {
					if counts[i] != 0 {
						t.Errorf("token %d is filtered out but was drawn %d times", i, counts[i])
					}
					continue
				}
				sd := math.Sqrt(draws * q * (1 - q))
				if d := math.Abs(float64(counts[i]) - draws*q); d > 5*sd {
					t.Errorf("token %d drawn %d times, want %.0f ± %.0f", i, counts[i], draws*q, 5*sd)
				}
			}
		})
	}
}

// renormTopP keeps the smallest most-likely set of q reaching mass p.
func renormTopP(q []float64, p float64) []float64 {
	order := make([]int, len(q))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return -cmpFloat(q[a], q[b]) })
	out := make([]float64, len(q))
	var above, kept float64
	for _, i := range order {
		if above < p {
			out[i] = q[i]
			kept += q[i]
		}
		above += q[i]
	}
	for i := range out {
		out[i] /= kept
	}
	return out
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func TestRow(t *testing.T) {
	p := Neutral()
	p.TopK, p.TopP, p.MinP, p.Temperature = -1, 0.9, 0.05, 0.8
	s := mustSampler(t, seeded(p, 1), 0)
	row := s.Row()
	if row.TopK != 0 || row.TopP != 0.9 || row.MinP != 0.05 || row.Temperature != 0.8 {
		t.Errorf("Row = %+v", row)
	}
	us := map[float32]bool{}
	for range 100 {
		u := s.Row().U
		if !(u >= 0 && u < 1) {
			t.Fatalf("U = %v outside [0, 1)", u)
		}
		us[u] = true
	}
	if len(us) < 95 {
		t.Errorf("only %d distinct U in 100 rows", len(us))
	}
	p.Temperature = 5e-6
	if row := mustSampler(t, p, 0).Row(); row.Temperature != 0 {
		t.Errorf("temperature 5e-6: Row temperature %v, want greedy", row.Temperature)
	}
}

// TestPickMatchesBackendRule checks that Sampler.Pick is backend.SampleRow's
// rule with the sampler's U: the same tokens as a CPU backend's Sample fed
// the rows of a twin sampler.
func TestPickMatchesBackendRule(t *testing.T) {
	r := newRand(t)
	p := Neutral()
	p.Temperature, p.TopK, p.TopP = 0.9, 30, 0.9
	a, twin := mustSampler(t, seeded(p, 3), 2), mustSampler(t, seeded(p, 3), 2)
	b := cpu.New(cpu.Options{Threads: 1})
	const vocab = 500
	for range 50 {
		logits := randLogits(r, vocab, 2)
		got, err := a.Pick(logits)
		if err != nil {
			t.Fatal(err)
		}
		raw := make([]byte, 4*vocab)
		for i, l := range logits {
			bits := math.Float32bits(l)
			raw[4*i], raw[4*i+1], raw[4*i+2], raw[4*i+3] = byte(bits), byte(bits>>8), byte(bits>>16), byte(bits>>24)
		}
		lt, err := b.Upload(backend.F32, []int{1, vocab}, raw)
		if err != nil {
			t.Fatal(err)
		}
		want, err := b.Sample(backend.SampleArgs{Logits: lt, Rows: []backend.SampleRow{twin.Row()}})
		if err != nil {
			t.Fatal(err)
		}
		if got != want[0] {
			t.Fatalf("Pick = %d, backend Sample = %d", got, want[0])
		}
	}
}

func TestApplyPenaltiesHandComputed(t *testing.T) {
	p := Neutral()
	p.RepetitionPenalty, p.PresencePenalty, p.FrequencyPenalty = 2, 0.5, 0.25
	s := mustSampler(t, p, 0)
	logits := []float32{2, -1, 0.5, 3, -2, 1}
	prompt := []int32{0, 1, 1}
	generated := []int32{3, 3, 1, 5}
	if err := s.ApplyPenalties(logits, generated, prompt); err != nil {
		t.Fatal(err)
	}
	// Repetition over {0, 1, 3, 5}: 2/2, -1*2, 3/2, 1/2. Then output counts
	// {3: 2, 1: 1, 5: 1}: subtract 0.5 + 0.25*count.
	want := []float32{1, -2 - 0.75, 0.5, 1.5 - 1, -2, 0.5 - 0.75}
	if !slices.Equal(logits, want) {
		t.Errorf("logits %v, want %v", logits, want)
	}
	t.Run("off", func(t *testing.T) {
		s := mustSampler(t, Neutral(), 0)
		l := []float32{1, 2, 3}
		if err := s.ApplyPenalties(l, []int32{0, 1}, []int32{2}); err != nil || !slices.Equal(l, []float32{1, 2, 3}) {
			t.Errorf("logits %v, %v; want unchanged", l, err)
		}
	})
	t.Run("errors", func(t *testing.T) {
		s := mustSampler(t, p, 0)
		if err := s.ApplyPenalties(make([]float32, 6), []int32{6}, nil); err == nil {
			t.Error("generated id 6 of 6: no error")
		}
		if err := s.ApplyPenalties(make([]float32, 6), nil, []int32{-1}); err == nil {
			t.Error("prompt id -1: no error")
		}
	})
}

// TestApplyPenaltiesStayFinite: a repetition penalty that Validate accepts
// (any positive float32, subnormal ones included) or a large logit must
// not push a penalised logit to an infinity, which Pick refuses: the
// result saturates at the largest float32 of its sign, and the penalised
// tokens keep their order among the unpenalised ones.
func TestApplyPenaltiesStayFinite(t *testing.T) {
	const big = math.MaxFloat32
	for _, tc := range []struct {
		name   string
		rep    float32
		logits []float32
		want   []float32 // after the penalty over ids 0 and 1
	}{
		{"subnormal penalty", math.SmallestNonzeroFloat32, []float32{3, -3, 1}, []float32{big, -3 * math.SmallestNonzeroFloat32, 1}},
		{"tiny penalty", 1e-38, []float32{16, 0, 1}, []float32{big, 0, 1}},
		{"large penalty, large negative logit", 10, []float32{2, -1e38, 1}, []float32{0.2, -big, 1}},
		{"large logit", 0.5, []float32{big, 1, 2}, []float32{big, 2, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := Neutral()
			p.RepetitionPenalty = tc.rep
			if err := p.Validate(); err != nil {
				t.Fatalf("params refused: %v", err)
			}
			s := mustSampler(t, p, 0)
			logits := slices.Clone(tc.logits)
			if err := s.ApplyPenalties(logits, nil, []int32{0, 1}); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(logits, tc.want) {
				t.Errorf("logits %v, want %v", logits, tc.want)
			}
			if _, err := s.Pick(logits); err != nil {
				t.Errorf("Pick after the penalty: %v", err)
			}
		})
	}
}

// refPenalties applies the penalties from their definitions.
func refPenalties(p Params, logits []float32, generated, prompt []int32) []float32 {
	out := slices.Clone(logits)
	seen := map[int32]bool{}
	for _, id := range append(slices.Clone(prompt), generated...) {
		seen[id] = true
	}
	for id := range seen {
		if out[id] > 0 {
			out[id] /= p.RepetitionPenalty
		} else {
			out[id] *= p.RepetitionPenalty
		}
	}
	counts := map[int32]int{}
	for _, id := range generated {
		counts[id]++
	}
	for id, n := range counts {
		out[id] -= p.PresencePenalty + p.FrequencyPenalty*float32(n)
	}
	return out
}

// TestApplyPenaltiesIncremental grows the output step by step (the
// engine's pattern) and also rewrites it once (a recount).
func TestApplyPenaltiesIncremental(t *testing.T) {
	r := newRand(t)
	const vocab = 300
	for round := range 5 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			p := Neutral()
			p.RepetitionPenalty = float32(0.5 + 1.5*r.Float64())
			p.PresencePenalty = float32(4*r.Float64() - 2)
			p.FrequencyPenalty = float32(4*r.Float64() - 2)
			s := mustSampler(t, p, 0)
			prompt := make([]int32, 1+r.IntN(60))
			for i := range prompt {
				prompt[i] = int32(r.IntN(vocab))
			}
			var generated []int32
			for step := range 40 {
				switch step {
				case 20:
					// Shorter than before: recounted.
					generated = generated[:5]
				case 30:
					// The last counted token changed: recounted.
					generated[len(generated)-1] = (generated[len(generated)-1] + 1) % vocab
					generated[0] = (generated[0] + 7) % vocab
				}
				generated = append(generated, int32(r.IntN(vocab/3))) // repeats likely
				logits := randLogits(r, vocab, 2)
				want := refPenalties(p, logits, generated, prompt)
				if err := s.ApplyPenalties(logits, generated, prompt); err != nil {
					t.Fatal(err)
				}
				for i := range want {
					if math.Abs(float64(logits[i]-want[i])) > 1e-5 {
						t.Fatalf("step %d: logit %d = %v, want %v", step, i, logits[i], want[i])
					}
				}
			}
		})
	}
}

func refLogSoftmax(logits []float32) []float64 {
	m := math.Inf(-1)
	for _, l := range logits {
		m = max(m, float64(l))
	}
	var sum float64
	for _, l := range logits {
		sum += math.Exp(float64(l) - m)
	}
	out := make([]float64, len(logits))
	for i, l := range logits {
		out[i] = float64(l) - m - math.Log(sum)
	}
	return out
}

func TestLogprobs(t *testing.T) {
	r := newRand(t)
	s := mustSampler(t, Neutral(), 0)
	for _, c := range []struct {
		vocab, n int
	}{{1, 0}, {1, 1}, {5, 3}, {5, 5}, {20, 20}, {1000, 7}, {32000, 20}} {
		t.Run(fmt.Sprintf("vocab=%d/n=%d", c.vocab, c.n), func(t *testing.T) {
			logits := randLogits(r, c.vocab, 4)
			if c.vocab >= 5 {
				logits[2] = logits[4] // a tie: lower id first
				logits[1] = float32(math.Inf(-1))
			}
			ref := refLogSoftmax(logits)
			chosen := int32(r.IntN(c.vocab))
			lp, top, err := s.Logprobs(logits, chosen, c.n)
			if err != nil {
				t.Fatal(err)
			}
			if !closeLogprob(lp, ref[chosen]) {
				t.Errorf("chosen logprob %v, want %v", lp, ref[chosen])
			}
			order := make([]int32, c.vocab)
			for i := range order {
				order[i] = int32(i)
			}
			slices.SortStableFunc(order, func(a, b int32) int { return -cmpFloat(ref[a], ref[b]) })
			if len(top) != c.n {
				t.Fatalf("%d top entries, want %d", len(top), c.n)
			}
			for i, e := range top {
				if e.ID != order[i] || !closeLogprob(e.Logprob, ref[order[i]]) {
					t.Fatalf("top[%d] = %+v, want id %d logprob %v", i, e, order[i], ref[order[i]])
				}
			}
		})
	}
	t.Run("errors", func(t *testing.T) {
		for _, c := range []struct {
			name   string
			logits []float32
			chosen int32
			n      int
		}{
			{"n too large", []float32{1, 2}, 0, 21},
			{"negative n", []float32{1, 2}, 0, -1},
			{"chosen outside", []float32{1, 2}, 2, 1},
			{"NaN", []float32{1, float32(math.NaN())}, 0, 1},
			{"all -Inf", []float32{float32(math.Inf(-1))}, 0, 1},
		} {
			if _, _, err := s.Logprobs(c.logits, c.chosen, c.n); err == nil {
				t.Errorf("%s: no error", c.name)
			}
		}
	})
}

func closeLogprob(got float32, want float64) bool {
	if math.IsInf(want, -1) {
		return math.IsInf(float64(got), -1)
	}
	return math.Abs(float64(got)-want) <= 1e-6*(1+math.Abs(want))
}
