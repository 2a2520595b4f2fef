package samplerule

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/trigon-llm/trigon/backend"
)

// refKept is the rule of backend.SampleRow written the obvious way: sort
// the whole vocabulary, softmax in f64, filter, renormalise.
func refKept(logits []float32, row backend.SampleRow) (ids []int32, probs []float64) {
	if row.Temperature <= 0 {
		best := 0
		for i, l := range logits {
			if l > logits[best] {
				best = i
			}
		}
		return []int32{int32(best)}, []float64{1}
	}
	order := make([]int32, len(logits))
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortStableFunc(order, func(a, b int32) int {
		switch {
		case logits[a] > logits[b]:
			return -1
		case logits[a] < logits[b]:
			return 1
		}
		return 0
	})
	m := float64(logits[order[0]])
	w := make([]float64, len(order))
	for j, id := range order {
		w[j] = math.Exp((float64(logits[id]) - m) / float64(row.Temperature))
	}
	n := len(order)
	for n > 1 && !((m-float64(logits[order[n-1]]))/float64(row.Temperature) < 745) {
		n--
	}
	if row.TopK > 0 {
		n = min(n, row.TopK)
	}
	if row.TopP > 0 && row.TopP < 1 {
		var mass, cum float64
		for _, x := range w[:n] {
			mass += x
		}
		for j := range n {
			if cum += w[j]; cum >= float64(row.TopP)*mass {
				n = j + 1
				break
			}
		}
	}
	if row.MinP > 0 {
		for j := 1; j < n; j++ {
			if w[j] < float64(row.MinP) {
				n = j
				break
			}
		}
	}
	var mass float64
	for _, x := range w[:n] {
		mass += x
	}
	for j := range n {
		ids = append(ids, order[j])
		probs = append(probs, w[j]/mass)
	}
	return ids, probs
}

func TestFilterHandComputed(t *testing.T) {
	// Probabilities 0.5, 0.2, 0.15, 0.1, 0.05 on shuffled ids 3, 0, 4, 1, 2.
	logits := make([]float32, 5)
	for id, p := range map[int]float64{3: 0.5, 0: 0.2, 4: 0.15, 1: 0.1, 2: 0.05} {
		logits[id] = float32(math.Log(p))
	}
	for _, c := range []struct {
		name  string
		row   backend.SampleRow
		ids   []int32
		probs []float64
	}{
		{"greedy", backend.SampleRow{}, []int32{3}, []float64{1}},
		{"all", backend.SampleRow{Temperature: 1}, []int32{3, 0, 4, 1, 2}, []float64{0.5, 0.2, 0.15, 0.1, 0.05}},
		{"top-k 2", backend.SampleRow{Temperature: 1, TopK: 2}, []int32{3, 0}, []float64{0.5 / 0.7, 0.2 / 0.7}},
		{"top-k past vocab", backend.SampleRow{Temperature: 1, TopK: 9}, []int32{3, 0, 4, 1, 2}, []float64{0.5, 0.2, 0.15, 0.1, 0.05}},
		{"top-p 0.65", backend.SampleRow{Temperature: 1, TopP: 0.65}, []int32{3, 0}, []float64{0.5 / 0.7, 0.2 / 0.7}},
		{"top-p 0.71", backend.SampleRow{Temperature: 1, TopP: 0.71}, []int32{3, 0, 4}, []float64{0.5 / 0.85, 0.2 / 0.85, 0.15 / 0.85}},
		{"top-p 0.4", backend.SampleRow{Temperature: 1, TopP: 0.4}, []int32{3}, []float64{1}},
		{"top-p 1 is off", backend.SampleRow{Temperature: 1, TopP: 1}, []int32{3, 0, 4, 1, 2}, []float64{0.5, 0.2, 0.15, 0.1, 0.05}},
		{"min-p 0.25", backend.SampleRow{Temperature: 1, MinP: 0.25}, []int32{3, 0, 4}, []float64{0.5 / 0.85, 0.2 / 0.85, 0.15 / 0.85}},
		{"min-p 0.9", backend.SampleRow{Temperature: 1, MinP: 0.9}, []int32{3}, []float64{1}},
		// Top-p applies to the top-k renormalised set: 0.5/0.85 < 0.6.
		{"top-k 3 then top-p 0.6", backend.SampleRow{Temperature: 1, TopK: 3, TopP: 0.6}, []int32{3, 0}, []float64{0.5 / 0.7, 0.2 / 0.7}},
		{"top-p 0.9 then min-p 0.29", backend.SampleRow{Temperature: 1, TopP: 0.9, MinP: 0.29}, []int32{3, 0, 4}, []float64{0.5 / 0.85, 0.2 / 0.85, 0.15 / 0.85}},
		// Temperature 0.5 squares the probabilities: 0.25, 0.04, ...
		{"temperature 0.5 top-k 2", backend.SampleRow{Temperature: 0.5, TopK: 2}, []int32{3, 0}, []float64{0.25 / 0.29, 0.04 / 0.29}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := Filter(logits, c.row, nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(c.ids) {
				t.Fatalf("kept %v, want ids %v", got, c.ids)
			}
			for i, g := range got {
				if g.ID != c.ids[i] || math.Abs(g.Prob-c.probs[i]) > 1e-6 {
					t.Fatalf("kept %v, want ids %v probs %v", got, c.ids, c.probs)
				}
			}
		})
	}
}

func TestPickHandComputed(t *testing.T) {
	// Probabilities 0.4, 0.3, 0.2, 0.1 on ids 2, 0, 3, 1.
	logits := []float32{float32(math.Log(0.3)), float32(math.Log(0.1)), float32(math.Log(0.4)), float32(math.Log(0.2))}
	for _, c := range []struct {
		row  backend.SampleRow
		want int32
	}{
		{backend.SampleRow{Temperature: 1, U: 0}, 2},
		{backend.SampleRow{Temperature: 1, U: 0.39}, 2},
		{backend.SampleRow{Temperature: 1, U: 0.41}, 0},
		{backend.SampleRow{Temperature: 1, U: 0.69}, 0},
		{backend.SampleRow{Temperature: 1, U: 0.71}, 3},
		{backend.SampleRow{Temperature: 1, U: 0.95}, 1},
		{backend.SampleRow{Temperature: 1, U: 0.99999}, 1},
		// Top-k 2 renormalises 0.4, 0.3: U = 0.6 lies past 4/7.
		{backend.SampleRow{Temperature: 1, TopK: 2, U: 0.5}, 2},
		{backend.SampleRow{Temperature: 1, TopK: 2, U: 0.6}, 0},
		{backend.SampleRow{Temperature: 1, TopK: 2, U: 0.99}, 0},
		{backend.SampleRow{Temperature: 0, U: 0.99}, 2},
	} {
		t.Run(fmt.Sprintf("%+v", c.row), func(t *testing.T) {
			got, err := Pick(logits, c.row, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("Pick = %d, want %d", got, c.want)
			}
		})
	}
}

func TestGreedyTiesAndMasks(t *testing.T) {
	inf := float32(math.Inf(-1))
	for _, c := range []struct {
		name   string
		logits []float32
		want   int32
	}{
		{"tie picks lowest id", []float32{1, 3, 2, 3, 3}, 1},
		{"masked max", []float32{inf, 0.5, inf, -2}, 1},
		{"single", []float32{-7}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, temp := range []float32{0, -1} {
				if got, err := Pick(c.logits, backend.SampleRow{Temperature: temp}, nil); err != nil || got != c.want {
					t.Errorf("temperature %v: Pick = %d, %v; want %d", temp, got, err, c.want)
				}
			}
		})
	}
	t.Run("masked tokens are never sampled", func(t *testing.T) {
		logits := []float32{inf, 0, inf, 0, inf}
		s := new(Scratch)
		for i := range 100 {
			u := float32(i) / 100
			got, err := Pick(logits, backend.SampleRow{Temperature: 2, U: u}, s)
			if err != nil || (got != 1 && got != 3) {
				t.Fatalf("U=%v: Pick = %d, %v", u, got, err)
			}
		}
	})
	t.Run("ties in top-k keep lower ids", func(t *testing.T) {
		got, err := Filter([]float32{1, 2, 2, 2, 0}, backend.SampleRow{Temperature: 1, TopK: 2}, nil)
		if err != nil || len(got) != 2 || got[0].ID != 1 || got[1].ID != 2 {
			t.Errorf("Filter = %v, %v; want ids 1, 2", got, err)
		}
	})
}

// TestFilterProperties checks Filter and Pick against refKept on random
// logits of several spreads, so that the lazy bands are crossed.
func TestFilterProperties(t *testing.T) {
	r := newRand(t)
	s := new(Scratch)
	for _, vocab := range []int{1, 2, 7, 100, 5000, 50000} {
		for _, spread := range []float64{0.1, 1, 5, 30} {
			t.Run(fmt.Sprintf("vocab=%d/spread=%v", vocab, spread), func(t *testing.T) {
				rounds := max(4, 20000/vocab)
				for range min(rounds, 40) {
					logits := randFloats(r, vocab, spread)
					if r.IntN(3) == 0 {
						for range vocab / 10 {
							logits[r.IntN(vocab)] = float32(math.Inf(-1))
						}
						logits[r.IntN(vocab)] = 3
					}
					row := randomRow(r, vocab)
					got, err := Filter(logits, row, s)
					if err != nil {
						t.Fatal(err)
					}
					ids, probs := refKept(logits, row)
					if len(got) != len(ids) {
						t.Fatalf("%+v: kept %d tokens, want %d", row, len(got), len(ids))
					}
					var total float64
					for i, g := range got {
						if g.ID != ids[i] || math.Abs(g.Prob-probs[i]) > 1e-9 {
							t.Fatalf("%+v: kept[%d] = %+v, want id %d prob %v", row, i, g, ids[i], probs[i])
						}
						total += g.Prob
					}
					if math.Abs(total-1) > 1e-9 {
						t.Fatalf("kept probabilities sum to %v", total)
					}
					checkFilterInvariants(t, logits, row, got)
					// The pick is the token where the cumulative sum passes
					// U; skip U too close to a boundary for rounding to decide.
					var cum float64
					want, near := ids[len(ids)-1], false
					for i, p := range probs {
						if math.Abs(cum+p-float64(row.U)) < 1e-9 {
							near = true
						}
						if cum += p; cum > float64(row.U) {
							want = ids[i]
							break
						}
					}
					if pick, err := Pick(logits, row, s); err != nil || (!near && pick != want) {
						t.Fatalf("%+v: Pick = %d, %v; want %d", row, pick, err, want)
					}
				}
			})
		}
	}
}

// checkFilterInvariants states each filter's defining property on its
// own, from the full softmax: the kept set is a prefix of the order; top-k
// keeps at most k; top-p keeps the smallest prefix whose mass reaches p;
// min-p keeps exactly the tokens with p >= MinP * pMax.
func checkFilterInvariants(t *testing.T, logits []float32, row backend.SampleRow, kept []Candidate) {
	t.Helper()
	if row.Temperature <= 0 {
		return
	}
	probs := make([]float64, len(logits))
	m := math.Inf(-1)
	for _, l := range logits {
		m = max(m, float64(l))
	}
	var sum, pMax float64
	for i, l := range logits {
		probs[i] = math.Exp((float64(l) - m) / float64(row.Temperature))
		sum += probs[i]
	}
	for i := range probs {
		probs[i] /= sum
		pMax = max(pMax, probs[i])
	}
	inKept := map[int32]bool{}
	var keptMass, minKept float64 = 0, 2
	for _, c := range kept {
		inKept[c.ID] = true
		keptMass += probs[c.ID]
		minKept = min(minKept, probs[c.ID])
	}
	for i, p := range probs {
		if !inKept[int32(i)] && p > minKept*(1+1e-12) {
			t.Fatalf("%+v: token %d (p %v) dropped while a less likely one (p %v) is kept", row, i, p, minKept)
		}
	}
	active := 0
	for _, on := range []bool{row.TopK > 0, row.TopP > 0 && row.TopP < 1, row.MinP > 0} {
		if on {
			active++
		}
	}
	onlyOne := active == 1
	switch {
	case row.TopK > 0 && len(kept) > row.TopK:
		t.Fatalf("%+v: %d kept", row, len(kept))
	case onlyOne && row.TopP > 0 && row.TopP < 1:
		last := probs[kept[len(kept)-1].ID]
		if keptMass < float64(row.TopP)-1e-9 || keptMass-last >= float64(row.TopP)+1e-9 {
			t.Fatalf("%+v: kept mass %v (without the last token %v) is not the smallest prefix reaching %v", row, keptMass, keptMass-last, row.TopP)
		}
	case onlyOne && row.MinP > 0:
		for i, p := range probs {
			want := p >= float64(row.MinP)*pMax
			if inKept[int32(i)] != want && math.Abs(p-float64(row.MinP)*pMax) > 1e-12 && len(kept) > 1 {
				t.Fatalf("%+v: token %d (p %v, threshold %v) kept = %v", row, i, p, float64(row.MinP)*pMax, inKept[int32(i)])
			}
		}
	}
}

func randomRow(r *rand.Rand, vocab int) backend.SampleRow {
	row := backend.SampleRow{Temperature: float32(0.05 + 2*r.Float64()), U: r.Float32()}
	if r.IntN(4) == 0 {
		row.Temperature = 0
	}
	if r.IntN(2) == 0 {
		row.TopK = 1 + r.IntN(min(vocab, 100)+1)
	}
	if r.IntN(2) == 0 {
		row.TopP = float32(0.05 + 0.9*r.Float64())
	}
	if r.IntN(3) == 0 {
		row.MinP = float32(0.3 * r.Float64())
	}
	return row
}

func TestSampleRowErrors(t *testing.T) {
	logits := []float32{1, 2, 3}
	for _, c := range []struct {
		name   string
		logits []float32
		row    backend.SampleRow
	}{
		{"empty", nil, backend.SampleRow{Temperature: 1}},
		{"NaN logit", []float32{1, float32(math.NaN())}, backend.SampleRow{}},
		{"+Inf logit", []float32{1, float32(math.Inf(1))}, backend.SampleRow{Temperature: 1}},
		{"all -Inf", []float32{float32(math.Inf(-1))}, backend.SampleRow{}},
		{"U = 1", logits, backend.SampleRow{Temperature: 1, U: 1}},
		{"negative U", logits, backend.SampleRow{Temperature: 1, U: -0.1}},
		{"negative top-k", logits, backend.SampleRow{Temperature: 1, TopK: -1}},
		{"NaN temperature", logits, backend.SampleRow{Temperature: float32(math.NaN())}},
		{"infinite temperature", logits, backend.SampleRow{Temperature: float32(math.Inf(1))}},
		{"negative min-p", logits, backend.SampleRow{Temperature: 1, MinP: -0.5}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := Pick(c.logits, c.row, nil); err == nil {
				t.Error("Pick: no error")
			}
			if _, err := Filter(c.logits, c.row, nil); err == nil {
				t.Error("Filter: no error")
			}
		})
	}
}

func BenchmarkPick(bm *testing.B) {
	r := newRand(bm)
	const vocab = 151936
	logits := randFloats(r, vocab, 3)
	for _, row := range []backend.SampleRow{
		{Temperature: 0},
		{Temperature: 0.7, U: 0.5},
		{Temperature: 0.7, TopK: 50, U: 0.5},
		{Temperature: 0.7, TopP: 0.9, U: 0.5},
		{Temperature: 1, TopK: 40, TopP: 0.95, MinP: 0.05, U: 0.5},
	} {
		bm.Run(fmt.Sprintf("%+v", row), func(bm *testing.B) {
			s := new(Scratch)
			bm.ReportAllocs()
			for bm.Loop() {
				if _, err := Pick(logits, row, s); err != nil {
					bm.Fatal(err)
				}
			}
		})
	}
}

// newRand returns a generator seeded from the test's name, so every test
// gets its own fresh inputs and a failure reproduces.
func newRand(t testing.TB) *rand.Rand {
	h := fnv.New64a()
	h.Write([]byte(t.Name()))
	return rand.New(rand.NewPCG(h.Sum64(), 0x9e3779b97f4a7c15))
}

func randFloats(r *rand.Rand, n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64() * scale)
	}
	return v
}
