package specdec

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/samplerule"
)

// chi2Crit are the chi-square critical values at significance 1e-4 by
// degrees of freedom (1..9): a correct rule fails a case with probability
// 1e-4, and the seeds are fixed, so the test is deterministic.
var chi2Crit = []float64{0, 15.14, 18.42, 21.11, 23.51, 25.74, 27.86, 29.88, 31.83, 33.72}

// chiSquare compares counts of n draws with the distribution p: the
// statistic over p's support, and whether any draw fell outside it.
func chiSquare(counts map[int32]int, p Dist, n int) (stat float64, df int, outside bool) {
	inSupport := map[int32]bool{}
	for _, c := range p {
		if c.Prob <= 0 {
			continue
		}
		inSupport[c.ID] = true
		e := c.Prob * float64(n)
		d := float64(counts[c.ID]) - e
		stat += d * d / e
		df++
	}
	for id, k := range counts {
		if k > 0 && !inSupport[id] {
			outside = true
		}
	}
	return stat, df - 1, outside
}

// residualRule is the rule under test: the correct one, or one of the
// wrong ones the test must catch.
type residualRule func(p, q Dist, u float64) int32

// fromP is a wrong residual: it draws from p itself, ignoring what q had
// a chance to propose (the emitted distribution then leans towards q).
func fromP(p, _ Dist, u float64) int32 { return Residual(p, nil, u) }

// acceptP is a wrong acceptance test: it ignores p/q.
func acceptP(p, q Dist, tok int32, u float64) bool { return u < Prob(p, tok) }

// speculate emits one token the speculative way: tok drawn from q,
// accepted by accept, else replaced by the residual draw.
func speculate(rng *rand.Rand, p, q Dist, accept func(p, q Dist, tok int32, u float64) bool, residual residualRule) int32 {
	u, acc := rng.Float64(), 0.0
	tok := q[len(q)-1].ID
	for _, c := range q {
		acc += c.Prob
		if u < acc {
			tok = c.ID
			break
		}
	}
	if accept(p, q, tok, rng.Float64()) {
		return tok
	}
	return residual(p, q, rng.Float64())
}

// target is p for logits under a sampling row, as the engine samples it.
func target(t *testing.T, logits []float32, row backend.SampleRow) Dist {
	t.Helper()
	p, err := samplerule.Filter(logits, row, nil)
	if err != nil {
		t.Fatal(err)
	}
	return append(Dist(nil), p...)
}

// TestRejectionSamplingKeepsDistribution draws many tokens by speculative
// sampling on a vocabulary of 8 and checks with a chi-square test that
// they follow the target's distribution (temperature, top-k, top-p applied)
// for point-mass drafts (prompt lookup, greedy draft model) on each token,
// filtered-out ones included, and for full draft distributions. It also
// checks that the test catches wrong rules: a residual drawn from p, and
// an acceptance that ignores q.
func TestRejectionSamplingKeepsDistribution(t *testing.T) {
	logits := []float32{2.0, 1.5, 1.4, 0.3, -0.5, 0.9, -2, 1.0}
	rows := []struct {
		name string
		row  backend.SampleRow
	}{
		{"t=1", backend.SampleRow{Temperature: 1, TopP: 1}},
		{"t=0.7 top_k=4", backend.SampleRow{Temperature: 0.7, TopK: 4, TopP: 1}},
		{"t=1.3 top_p=0.8", backend.SampleRow{Temperature: 1.3, TopP: 0.8}},
		{"greedy", backend.SampleRow{Temperature: 0, TopP: 1}},
	}
	qFull := Dist{{ID: 4, Prob: 0.3}, {ID: 0, Prob: 0.1}, {ID: 1, Prob: 0.25}, {ID: 6, Prob: 0.05}, {ID: 3, Prob: 0.3}}
	const n = 40000
	seed := uint64(1)
	check := func(p, q Dist, accept func(p, q Dist, tok int32, u float64) bool, residual residualRule) (float64, int, bool) {
		seed++
		rng := rand.New(rand.NewPCG(seed, 7))
		counts := map[int32]int{}
		for range n {
			counts[speculate(rng, p, q, accept, residual)]++
		}
		return chiSquare(counts, p, n)
	}
	for _, r := range rows {
		p := target(t, logits, r.row)
		qs := []struct {
			name string
			q    Dist
		}{{"draft distribution", qFull}}
		for tok := range int32(len(logits)) {
			qs = append(qs, struct {
				name string
				q    Dist
			}{"point mass " + string(rune('0'+tok)), PointMass(tok)})
		}
		for _, q := range qs {
			stat, df, outside := check(p, q.q, Accept, Residual)
			if outside || df > 0 && stat > chi2Crit[df] {
				t.Errorf("%s, %s: chi-square %.1f (df %d, critical %.1f), outside the support %v", r.name, q.name, stat, df, chi2Crit[df], outside)
			}
		}
		if r.row.Temperature == 0 {
			continue // p is a point mass: every rule emits the argmax
		}
		// The test has teeth: a wrong rule is rejected. A point mass on
		// token 1 (likely under every row) and the full draft
		// distribution each expose both mistakes.
		for _, bad := range []struct {
			name     string
			q        Dist
			accept   func(p, q Dist, tok int32, u float64) bool
			residual residualRule
		}{
			{"residual from p, point mass", PointMass(1), Accept, fromP},
			{"residual from p, draft distribution", qFull, Accept, fromP},
			{"acceptance ignoring q", qFull, acceptP, Residual},
		} {
			stat, df, outside := check(p, bad.q, bad.accept, bad.residual)
			if !outside && stat <= chi2Crit[df] {
				t.Errorf("%s: the wrong rule %q passed: chi-square %.1f (df %d, critical %.1f)", r.name, bad.name, stat, df, chi2Crit[df])
			}
		}
	}
}

// TestVerifyKeepsDistribution runs Verify, the engine's rule, over two
// positions with fixed target rows: the first emitted token follows row
// 0's distribution, and, when the first draft token was accepted, the
// second follows row 1's (a real model's row 1 is the distribution given
// that token, which is when it is used).
func TestVerifyKeepsDistribution(t *testing.T) {
	rows := [][]float32{{1.0, 0.2, 0.8, -1, 0.5, 0.1}, {-0.3, 1.2, 0.4, 0.9, -2, 0.6}, {0, 0, 1, 0, 0, 0}}
	rule := backend.SampleRow{Temperature: 0.9, TopK: 5, TopP: 0.95}
	draft := []int32{2, 3}
	rng := rand.New(rand.NewPCG(3, 4))
	next := func() backend.SampleRow { r := rule; r.U = rng.Float32(); return r }
	logits := func(i int) ([]float32, error) { return rows[i], nil }
	const n = 40000
	first, second := map[int32]int{}, map[int32]int{}
	seconds, lens := 0, map[int]int{}
	var s samplerule.Scratch
	for range n {
		out, err := Verify(logits, draft, next, &s)
		if err != nil {
			t.Fatal(err)
		}
		lens[len(out)]++
		if len(out) < 1 || len(out) > len(draft)+1 {
			t.Fatalf("Verify yielded %d tokens for a draft of %d", len(out), len(draft))
		}
		for i := range len(out) - 1 {
			if out[i] != draft[i] {
				t.Fatalf("Verify yielded %v: token %d before the last is not the draft's", out, i)
			}
		}
		first[out[0]]++
		if out[0] == draft[0] && len(out) > 1 {
			second[out[1]]++
			seconds++
		}
	}
	for i, c := range []struct {
		counts map[int32]int
		n      int
	}{{first, n}, {second, seconds}} {
		p := target(t, rows[i], rule)
		stat, df, outside := chiSquare(c.counts, p, c.n)
		if outside || stat > chi2Crit[df] {
			t.Errorf("position %d: chi-square %.1f (df %d, critical %.1f) over %d draws, outside the support %v", i, stat, df, chi2Crit[df], c.n, outside)
		}
	}
	if lens[3] == 0 || lens[1] == 0 {
		t.Errorf("lengths %v: want all-accepted steps (bonus) and first-token rejections", lens)
	}
	// A greedy rule accepts exactly the argmax prefix.
	for _, tc := range []struct {
		draft, want []int32
	}{{[]int32{0, 1}, []int32{0, 1, 2}}, {[]int32{0, 3}, []int32{0, 1}}, {[]int32{5, 1}, []int32{0}}, {nil, []int32{0}}} {
		greedyRow := func() backend.SampleRow { return backend.SampleRow{TopP: 1, U: rng.Float32()} }
		out, err := Verify(logits, tc.draft, greedyRow, nil)
		if err != nil || !equal(out, tc.want) {
			t.Errorf("greedy Verify(%v) = %v, %v; want %v", tc.draft, out, err, tc.want)
		}
		if g := Greedy([]int32{0, 1, 2}, tc.draft); !equal(g, tc.want) {
			t.Errorf("Greedy(%v) = %v, want %v", tc.draft, g, tc.want)
		}
	}
}

func equal(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestResidual(t *testing.T) {
	p := Dist{{ID: 3, Prob: 0.5}, {ID: 1, Prob: 0.3}, {ID: 2, Prob: 0.2}}
	// Point mass on 3: the residual is {1: 0.6, 2: 0.4}.
	for _, tc := range []struct {
		u    float64
		want int32
	}{{0, 1}, {0.59, 1}, {0.61, 2}, {0.999, 2}} {
		if got := Residual(p, PointMass(3), tc.u); got != tc.want {
			t.Errorf("Residual(u=%v) = %d, want %d", tc.u, got, tc.want)
		}
	}
	// p == q leaves nothing: the most likely token.
	if got := Residual(p, p, 0.5); got != 3 {
		t.Errorf("empty residual: %d, want 3", got)
	}
	if Accept(p, PointMass(7), 7, 0) || !Accept(p, PointMass(3), 3, 0.49) || Accept(p, PointMass(3), 3, 0.5) {
		t.Error("Accept with a point mass is not u < p(tok)")
	}
	if !Accept(p, Dist{{ID: 1, Prob: 0.6}}, 1, 0.49) || Accept(p, Dist{{ID: 1, Prob: 0.6}}, 1, 0.5) {
		t.Error("Accept is not u < p/q")
	}
	if math.IsNaN(Prob(nil, 1)) || Prob(nil, 1) != 0 {
		t.Error("Prob of an absent token")
	}
}

// BenchmarkVerify: the host's acceptance rule over one sequence's 5 rows
// of a 32000-token vocabulary, sampled (temperature 0.8, top-p 0.95),
// with a draft of 4 that the rows reject at varying positions.
func BenchmarkVerify(b *testing.B) {
	rng := rand.New(rand.NewPCG(5, 6))
	rows := make([][]float32, 5)
	for i := range rows {
		rows[i] = make([]float32, 32000)
		for j := range rows[i] {
			rows[i][j] = float32(rng.NormFloat64() * 3)
		}
	}
	draft := []int32{1, 2, 3, 4}
	logits := func(i int) ([]float32, error) { return rows[i], nil }
	next := func() backend.SampleRow {
		return backend.SampleRow{Temperature: 0.8, TopP: 0.95, U: rng.Float32()}
	}
	var s samplerule.Scratch
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Verify(logits, draft, next, &s); err != nil {
			b.Fatal(err)
		}
	}
}
