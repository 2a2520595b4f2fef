package tokenizer

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// splitAlphabet leans on the characters where the pre-tokenizer patterns
// branch: contraction letters in both cases, the apostrophe, each kind of
// whitespace, letters, numbers of several kinds, marks and symbols.
var splitAlphabet = []rune{
	'\'', '\'', '\'', 's', 't', 'r', 'e', 'v', 'm', 'l', 'd', 'S', 'T', 'R', 'E', 'V', 'M', 'L', 'D', 'a', 'Z',
	' ', ' ', ' ', ' ', '\t', '\n', '\n', '\r', '\v', '\f', 0x85, 0xA0, 0x2003, 0x3000, 0x2028,
	'0', '7', '٣', 'Ⅷ', '½', '²',
	'é', 'ß', '中', 'ア', '한', 'Ж', 'ا', 0x301, 0x200D, 0xFE0F,
	'.', ',', '!', '?', '-', '_', '(', '<', '|', '>', '#', '$', '😀', '€', '©',
}

func randomSplitText(r *rand.Rand) string {
	n := r.IntN(24)
	var b strings.Builder
	for range n {
		b.WriteRune(splitAlphabet[r.IntN(len(splitAlphabet))])
	}
	return b.String()
}

func collect(t *testing.T, m matcher, s string) []string {
	t.Helper()
	var out []string
	pos := 0
	if err := m.matches(s, func(a, b int) {
		if a > pos {
			out = append(out, "gap:"+s[pos:a])
		}
		out = append(out, s[a:b])
		pos = b
	}); err != nil {
		t.Fatal(err)
	}
	if pos < len(s) {
		out = append(out, "gap:"+s[pos:])
	}
	return out
}

// TestScannersMatchRegexp2 checks the hand-written scanners against the
// patterns themselves run by regexp2, on random text and the corpus.
func TestScannersMatchRegexp2(t *testing.T) {
	corpus := corpusLines(t)
	for _, pat := range []struct{ name, pattern string }{
		{"gpt2", gpt2Pattern}, {"llama3", llama3Pattern}, {"qwen2", qwen2Pattern},
	} {
		t.Run(pat.name, func(t *testing.T) {
			fast, err := newMatcher(pat.pattern)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := fast.(scanMatcher); !ok {
				t.Fatalf("pattern did not get a fast scanner: %T", fast)
			}
			slow, err := newRegexMatcher(pat.pattern)
			if err != nil {
				t.Fatal(err)
			}
			r := rand.New(rand.NewPCG(1, uint64(len(pat.name))))
			inputs := corpus
			for range 20000 {
				inputs = append(inputs, randomSplitText(r))
			}
			for _, s := range inputs {
				got, want := collect(t, fast, s), collect(t, slow, s)
				if !slices.Equal(got, want) {
					t.Fatalf("%q:\nscanner %q\nregexp2 %q", s, got, want)
				}
			}
		})
	}
}

func TestSplitBehaviors(t *testing.T) {
	m, err := newRegexMatcher("-")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		b      splitBehavior
		invert bool
		want   []string
	}{
		{splitIsolated, false, []string{"a", "-", "b", "-", "-", "c", "-"}},
		{splitRemoved, false, []string{"a", "b", "c"}},
		{splitMergedWithPrevious, false, []string{"a-", "b-", "-", "c-"}},
		{splitMergedWithNext, false, []string{"a", "-b", "-", "-c", "-"}},
		{splitContiguous, false, []string{"a", "-", "b", "--", "c", "-"}},
		{splitRemoved, true, []string{"-", "-", "-", "-"}},
	}
	for _, c := range cases {
		var got []string
		if err := splitPieces("a-b--c-", m, c.b, c.invert, func(p string, off int) {
			if !strings.HasPrefix("a-b--c-"[off:], p) {
				t.Errorf("offset %d does not point at %q", off, p)
			}
			got = append(got, p)
		}); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("behavior %d invert %v: got %q, want %q", c.b, c.invert, got, c.want)
		}
	}
}
