package specdec_test

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/specdec"
)

func TestParseConfig(t *testing.T) {
	for _, tc := range []struct {
		text string
		want specdec.Config
		err  string
	}{
		{text: "", want: specdec.Config{}},
		{text: `{"method":"ngram","num_speculative_tokens":4}`,
			want: specdec.Config{Method: "ngram", NumSpeculativeTokens: 4, PromptLookupMin: 5, PromptLookupMax: 5}},
		{text: `{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4}`,
			want: specdec.Config{Method: "ngram", NumSpeculativeTokens: 3, PromptLookupMin: 4, PromptLookupMax: 4}},
		{text: `{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_min":2}`,
			want: specdec.Config{Method: "ngram", NumSpeculativeTokens: 3, PromptLookupMin: 2, PromptLookupMax: 2}},
		{text: `{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_min":1,"prompt_lookup_max":4}`,
			want: specdec.Config{Method: "ngram", NumSpeculativeTokens: 3, PromptLookupMin: 1, PromptLookupMax: 4}},
		{text: `{"model":"[ngram]","num_speculative_tokens":2}`,
			want: specdec.Config{Method: "ngram", NumSpeculativeTokens: 2, PromptLookupMin: 5, PromptLookupMax: 5}},
		{text: `{"method":"draft_model","model":"/m/draft","num_speculative_tokens":5}`,
			want: specdec.Config{Method: "draft_model", Model: "/m/draft", NumSpeculativeTokens: 5}},
		{text: `{"model":"/m/draft","num_speculative_tokens":5}`,
			want: specdec.Config{Method: "draft_model", Model: "/m/draft", NumSpeculativeTokens: 5}},
		{text: `{"method":"ngram"`, err: "unexpected EOF"},
		{text: `{"method":"ngram","num_speculative_tokens":4,"draft_tensor_parallel_size":1}`, err: `unknown field "draft_tensor_parallel_size"`},
		{text: `{"method":"ngram","num_speculative_tokens":"4"}`, err: "num_speculative_tokens"},
		{text: `{"method":"ngram"}`, err: `"num_speculative_tokens" is required`},
		{text: `{"num_speculative_tokens":4}`, err: `"method" is required`},
		{text: `{"method":"eagle","num_speculative_tokens":4}`, err: `method "eagle"`},
		{text: `{"method":"ngram","num_speculative_tokens":0}`, err: "num_speculative_tokens 0"},
		{text: `{"method":"ngram","num_speculative_tokens":17}`, err: "num_speculative_tokens 17"},
		{text: `{"method":"ngram","num_speculative_tokens":2,"prompt_lookup_min":4,"prompt_lookup_max":2}`, err: "min <= max"},
		{text: `{"method":"ngram","num_speculative_tokens":2,"prompt_lookup_min":0}`, err: "prompt_lookup_min 0"},
		{text: `{"method":"ngram","num_speculative_tokens":2,"model":"x"}`, err: "prompt lookup has no draft model"},
		{text: `{"method":"draft_model","num_speculative_tokens":2}`, err: `needs "model"`},
		{text: `{"model":"d","num_speculative_tokens":2,"prompt_lookup_max":3}`, err: `are for method "ngram"`},
		{text: `{"method":"ngram","num_speculative_tokens":2} {}`, err: "text after"},
	} {
		got, err := specdec.ParseConfig(tc.text)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "--speculative-config") {
				t.Errorf("%s: error %v, want one containing %q", tc.text, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s: %+v, %v; want %+v", tc.text, got, err, tc.want)
		}
		if got.Enabled() != (tc.text != "") {
			t.Errorf("%s: Enabled %v", tc.text, got.Enabled())
		}
	}
}

func TestLookup(t *testing.T) {
	for _, tc := range []struct {
		tokens     []int32
		minN, maxN int
		k          int
		want       []int32
	}{
		// The 2-gram "1 2" occurred at 0 and 4; the later one wins.
		{[]int32{1, 2, 3, 9, 1, 2, 7, 8, 1, 2}, 1, 2, 3, []int32{7, 8, 1}},
		// The 3-gram "8 1 2" does not occur earlier, the 2-gram does.
		{[]int32{1, 2, 3, 9, 1, 2, 7, 8, 1, 2}, 2, 3, 2, []int32{7, 8}},
		// Only 3-grams allowed: none matches.
		{[]int32{1, 2, 3, 9, 1, 2, 7, 8, 1, 2}, 3, 3, 2, nil},
		// No earlier "2 5 6"; of the earlier "5 6"s (at 0 and 5) the
		// later one gives what follows it.
		{[]int32{5, 6, 1, 1, 1, 5, 6, 2, 5, 6}, 1, 3, 2, []int32{2, 5}},
		{[]int32{3, 4, 5, 3, 4, 5, 3, 4}, 2, 3, 2, []int32{5, 3}},
		// Proposals stop where the tokens end.
		{[]int32{7, 7}, 1, 1, 4, []int32{7}},
		{[]int32{1, 2, 3}, 1, 2, 4, nil},
		{[]int32{1}, 1, 2, 4, nil},
		{[]int32{1, 2, 1, 2}, 1, 2, 0, nil},
	} {
		got := specdec.Lookup(tc.tokens, tc.minN, tc.maxN, tc.k)
		if !slicesEqual(got, tc.want) {
			t.Errorf("Lookup(%v, %d, %d, %d) = %v, want %v", tc.tokens, tc.minN, tc.maxN, tc.k, got, tc.want)
		}
	}
}

func slicesEqual(a, b []int32) bool {
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

func TestNGramProposer(t *testing.T) {
	cfg, err := specdec.ParseConfig(`{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_min":1,"prompt_lookup_max":2}`)
	if err != nil {
		t.Fatal(err)
	}
	p, err := specdec.NewNGram(cfg)
	if err != nil {
		t.Fatal(err)
	}
	got, err := p.Propose([]specdec.Seq{
		{ID: 1, Tokens: []int32{4, 5, 6, 4, 5}, K: 3},
		{ID: 2, Tokens: []int32{4, 5, 6, 4, 5}, K: 1},
		{ID: 3, Tokens: []int32{1, 2, 3}, K: 3},
	})
	if err != nil || len(got) != 3 || !slicesEqual(got[0], []int32{6, 4, 5}) || !slicesEqual(got[1], []int32{6}) || got[2] != nil {
		t.Errorf("Propose: %v, %v", got, err)
	}
	if _, err := specdec.NewNGram(specdec.Config{Method: "draft_model", Model: "x", NumSpeculativeTokens: 1}); err == nil {
		t.Error("NewNGram took a draft_model config")
	}
}

// TestNGramLikelyDraft: prompt lookup expects a draft exactly where the
// tokens end in an n-gram (of PromptLookupMin to PromptLookupMax) seen
// earlier, which is where it would propose now.
func TestNGramLikelyDraft(t *testing.T) {
	p, err := specdec.NewNGram(specdec.Config{Method: specdec.MethodNGram, NumSpeculativeTokens: 3, PromptLookupMin: 2, PromptLookupMax: 3})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		tokens []int32
		want   bool
	}{
		{[]int32{4, 5, 6, 4, 5}, true},  // 4 5 seen before
		{[]int32{4, 5, 6, 7, 5}, false}, // only the unigram 5 repeats: below the minimum
		{[]int32{1, 2, 3}, false},
		{[]int32{9}, false},
		{nil, false},
		{[]int32{1, 2, 3, 9, 1, 2, 3}, true},
	} {
		if got := p.LikelyDraft(tc.tokens); got != tc.want {
			t.Errorf("LikelyDraft(%v) = %v, want %v", tc.tokens, got, tc.want)
		}
		if got, now := p.LikelyDraft(tc.tokens), specdec.Lookup(tc.tokens, 2, 3, 3) != nil; got != now {
			t.Errorf("LikelyDraft(%v) = %v, but a proposal now is %v", tc.tokens, got, now)
		}
	}
}

// lookupRef is Lookup as its doc states it, n by n.
func lookupRef(tokens []int32, minN, maxN, k int) []int32 {
	l := len(tokens)
	for n := min(maxN, l-1); n >= minN && k >= 1; n-- {
		suffix := tokens[l-n:]
	search:
		for j := l - n - 1; j >= 0; j-- {
			for t := range n {
				if tokens[j+t] != suffix[t] {
					continue search
				}
			}
			return tokens[j+n : min(j+n+k, l)]
		}
	}
	return nil
}

// TestLookupMatchesDefinition compares Lookup's one-pass scan with the
// n-by-n definition on random token strings over small vocabularies
// (many repeats).
func TestLookupMatchesDefinition(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 20000 {
		n := rng.IntN(40)
		vocab := int32(2 + rng.IntN(5))
		tokens := make([]int32, n)
		for j := range tokens {
			tokens[j] = rng.Int32N(vocab)
		}
		minN := 1 + rng.IntN(4)
		maxN := minN + rng.IntN(4)
		k := 1 + rng.IntN(5)
		got, want := specdec.Lookup(tokens, minN, maxN, k), lookupRef(tokens, minN, maxN, k)
		if !slicesEqual(got, want) {
			t.Fatalf("case %d: Lookup(%v, %d, %d, %d) = %v, the definition gives %v", i, tokens, minN, maxN, k, got, want)
		}
	}
}

// BenchmarkLookup: prompt lookup over an 8192-token context with no
// match of the longest n-gram (the whole scan runs).
func BenchmarkLookup(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	tokens := make([]int32, 8192)
	for i := range tokens {
		tokens[i] = rng.Int32N(32000)
	}
	b.ReportAllocs()
	for b.Loop() {
		specdec.Lookup(tokens, 1, 5, 4)
	}
}
