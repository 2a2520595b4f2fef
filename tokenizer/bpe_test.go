package tokenizer

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// naiveRankBPE is the textbook algorithm: repeatedly merge the leftmost
// occurrence of the lowest-ranked adjacent pair. It is quadratic and shares
// no code with bpeModel.
func naiveRankBPE(word []string, ranks map[[2]string]int) []string {
	w := slices.Clone(word)
	for {
		best, at := -1, -1
		for i := 0; i+1 < len(w); i++ {
			if r, ok := ranks[[2]string{w[i], w[i+1]}]; ok && (best < 0 || r < best) {
				best, at = r, i
			}
		}
		if at < 0 {
			return w
		}
		w = slices.Replace(w, at, at+2, w[at]+w[at+1])
	}
}

// naiveScoreBPE merges the leftmost adjacent pair whose concatenation has
// the highest score, as SentencePiece describes its BPE.
func naiveScoreBPE(word []string, scores map[string]float32) []string {
	w := slices.Clone(word)
	for {
		var best float32
		at := -1
		for i := 0; i+1 < len(w); i++ {
			if s, ok := scores[w[i]+w[i+1]]; ok && (at < 0 || s > best) {
				best, at = s, i
			}
		}
		if at < 0 {
			return w
		}
		w = slices.Replace(w, at, at+2, w[at]+w[at+1])
	}
}

// randomBPE makes a vocabulary over a small alphabet by merging random
// pairs, so that words meet many competing merges.
func randomBPE(r *rand.Rand) (pieces []string, merges [][2]string) {
	pieces = []string{"a", "b", "c", "d"}
	seen := map[string]bool{"a": true, "b": true, "c": true, "d": true}
	for len(merges) < 40 {
		x, y := pieces[r.IntN(len(pieces))], pieces[r.IntN(len(pieces))]
		if len(x)+len(y) > 6 || seen[x+y] {
			continue
		}
		seen[x+y] = true
		pieces = append(pieces, x+y)
		merges = append(merges, [2]string{x, y})
	}
	return pieces, merges
}

func TestBPEMatchesNaive(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for trial := range 50 {
		pieces, merges := randomBPE(r)
		b := &builder{}
		b.m.vocab = map[string]TokenID{}
		for i, p := range pieces {
			b.m.vocab[p] = TokenID(i)
			b.setPiece(TokenID(i), p)
		}
		if err := b.setMerges(merges); err != nil {
			t.Fatal(err)
		}
		b.m.unk = -1
		ranks := map[[2]string]int{}
		for i, m := range merges {
			ranks[m] = i
		}
		// A scores model over the same pieces: later pieces score lower.
		scored := bpeModel{vocab: b.m.vocab, unk: -1, scores: make([]float32, len(pieces)), mergeable: make([]bool, len(pieces))}
		scoreOf := map[string]float32{}
		for i, p := range pieces {
			scored.scores[i] = -float32(i)
			scored.mergeable[i] = true
			if len(p) > 1 {
				scoreOf[p] = -float32(i)
			}
		}
		for range 200 {
			n := 1 + r.IntN(40)
			var sb strings.Builder
			chars := make([]string, n)
			for i := range n {
				chars[i] = string(rune('a' + r.IntN(4)))
				sb.WriteString(chars[i])
			}
			word := sb.String()
			check := func(name string, m *bpeModel, want []string) {
				var got []string
				for _, id := range m.encodeWord(word, nil) {
					got = append(got, pieces[id])
				}
				if !slices.Equal(got, want) {
					t.Fatalf("trial %d %s %q: got %q, want %q", trial, name, word, got, want)
				}
			}
			check("ranks", &b.m, naiveRankBPE(chars, ranks))
			check("scores", &scored, naiveScoreBPE(chars, scoreOf))
		}
	}
}

func TestBPEUnknownAndByteFallback(t *testing.T) {
	vocab := map[string]TokenID{"<unk>": 0, "a": 1, "b": 2, "ab": 3, "<0xC3>": 4, "<0xA9>": 5}
	base := bpeModel{vocab: vocab, merges: map[uint64]merge{mergeKey(1, 2): {rank: 0, id: 3}}, unk: 0}
	for i := range base.byteTokens {
		base.byteTokens[i] = -1
	}
	base.byteTokens[0xC3], base.byteTokens[0xA9] = 4, 5
	cases := []struct {
		name   string
		modify func(*bpeModel)
		word   string
		want   []TokenID
	}{
		{"merge", nil, "ab", []TokenID{3}},
		{"unknown each", nil, "xyab", []TokenID{0, 0, 3}},
		{"unknown fused", func(m *bpeModel) { m.fuseUnk = true }, "xyabz", []TokenID{0, 3, 0}},
		{"no unk drops", func(m *bpeModel) { m.unk = -1 }, "xaby", []TokenID{3}},
		{"byte fallback", func(m *bpeModel) { m.byteFallback = true }, "aé", []TokenID{1, 4, 5}},
		{"fallback needs all bytes", func(m *bpeModel) { m.byteFallback = true }, "aè", []TokenID{1, 0}},
		{"ignore merges", func(m *bpeModel) { m.ignoreMerges = true; m.merges = map[uint64]merge{} }, "ab", []TokenID{3}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := base
			if c.modify != nil {
				c.modify(&m)
			}
			if got := m.encodeWord(c.word, nil); !slices.Equal(got, c.want) {
				t.Fatalf("encodeWord(%q) = %v, want %v", c.word, got, c.want)
			}
		})
	}
}
