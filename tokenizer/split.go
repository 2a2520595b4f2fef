package tokenizer

import (
	"fmt"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// The pre-tokenizer regexes of the families this package serves, exactly as
// they appear in tokenizer.json. Each has a hand-written scanner (scanGPT2,
// scanLlama3) that gives the same matches as the regex, checked against
// regexp2 in split_test.go; any other regex runs on regexp2.
const (
	// gpt2Pattern is what HF's ByteLevel pre-tokenizer uses when use_regex is true.
	gpt2Pattern   = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
	llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	qwen2Pattern  = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// trigonGoPattern is the embedded default model's split (Llama 3's
	// without the English contractions, which mean nothing in Go source).
	// GGUF names it "trigon-go", as llama.cpp names each model family's.
	trigonGoPattern = `[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// matcher finds the successive non-overlapping, non-empty matches of a
// pattern in s and calls fn with each as [start, end) byte offsets.
type matcher interface {
	matches(s string, fn func(start, end int)) error
}

// newMatcher returns the fast scanner for a known pattern and regexp2
// otherwise.
func newMatcher(pattern string) (matcher, error) {
	switch pattern {
	case gpt2Pattern:
		return scanMatcher(scanGPT2), nil
	case llama3Pattern:
		return scanMatcher(func(s string, i int) int { return scanLlama3(s, i, 3) }), nil
	case qwen2Pattern:
		return scanMatcher(func(s string, i int) int { return scanLlama3(s, i, 1) }), nil
	}
	return newRegexMatcher(pattern)
}

// regexTimeout bounds one regexp2 search, since patterns from model files
// could backtrack catastrophically.
const regexTimeout = 5 * time.Second

func newRegexMatcher(pattern string) (*regexMatcher, error) {
	re, err := regexp2.Compile(pattern, regexp2.Unicode)
	if err != nil {
		return nil, fmt.Errorf("compile pre-tokenizer regex %q: %w", pattern, err)
	}
	re.MatchTimeout = regexTimeout
	return &regexMatcher{re: re}, nil
}

// regexMatcher runs an arbitrary regex with regexp2, which (unlike Go's
// regexp) supports the lookahead these patterns use. regexp2 works on runes,
// so rune positions are mapped back to byte offsets.
type regexMatcher struct{ re *regexp2.Regexp }

func (m *regexMatcher) matches(s string, fn func(start, end int)) error {
	runes := []rune(s)
	offs := make([]int, len(runes)+1) // rune index -> byte offset
	b := 0
	for i, r := range runes {
		offs[i] = b
		b += utf8.RuneLen(r)
	}
	offs[len(runes)] = b
	mt, err := m.re.FindRunesMatch(runes)
	for err == nil && mt != nil {
		if mt.Length > 0 { // an empty match splits nothing; HF skips them
			fn(offs[mt.Index], offs[mt.Index+mt.Length])
		}
		mt, err = m.re.FindNextMatch(mt)
	}
	if err != nil {
		return fmt.Errorf("pre-tokenizer regex: %w", err)
	}
	return nil
}

// scanMatcher adapts a scanner that returns the end of the match starting
// at i; the known patterns match at every position, so there are no gaps.
type scanMatcher func(s string, i int) int

func (m scanMatcher) matches(s string, fn func(start, end int)) error {
	for i := 0; i < len(s); {
		j := m(s, i)
		fn(i, j)
		i = j
	}
	return nil
}

// Character classes as Oniguruma (HF's regex engine) sees them.
func isL(r rune) bool { return unicode.IsLetter(r) }
func isN(r rune) bool { return unicode.IsNumber(r) }
func isS(r rune) bool { return unicode.IsSpace(r) }

// isOther is [^\s\p{L}\p{N}].
func isOther(r rune) bool { return !isS(r) && !isL(r) && !isN(r) }

func runeAt(s string, i int) (rune, int) {
	if i >= len(s) {
		return -1, 0
	}
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

// spanWhile returns the end of the run of runes from i that satisfy f.
func spanWhile(s string, i int, f func(rune) bool) int {
	for i < len(s) {
		r, n := runeAt(s, i)
		if !f(r) {
			break
		}
		i += n
	}
	return i
}

// contraction returns the length of a contraction ('s 't 're 've 'm 'll 'd)
// at s[i], or 0. With fold, letters match case-insensitively the way
// Oniguruma folds them, which includes U+017F (long s) for s.
func contraction(s string, i int, fold bool) int {
	if i >= len(s) || s[i] != '\'' {
		return 0
	}
	r1, n1 := runeAt(s, i+1)
	lower := func(r rune) rune {
		if !fold {
			return r
		}
		if r == 'ſ' {
			return 's'
		}
		if r >= 'A' && r <= 'Z' {
			return r + ('a' - 'A')
		}
		return r
	}
	switch lower(r1) {
	case 's', 't', 'm', 'd':
		return 1 + n1
	case 'r', 'v':
		r2, n2 := runeAt(s, i+1+n1)
		if lower(r2) == 'e' {
			return 1 + n1 + n2
		}
	case 'l':
		r2, n2 := runeAt(s, i+1+n1)
		if lower(r2) == 'l' {
			return 1 + n1 + n2
		}
	}
	return 0
}

// spaceRunEnd handles the two trailing alternatives \s+(?!\S)|\s+ at a
// whitespace rune: a run of whitespace followed by a non-space gives up
// its last rune (which then leads the next piece), unless the run is a
// single rune.
func spaceRunEnd(s string, i int) int {
	end := spanWhile(s, i, isS)
	if end == len(s) {
		return end
	}
	_, lastSize := utf8.DecodeLastRuneInString(s[:end])
	if end-lastSize > i {
		return end - lastSize
	}
	return end
}

// scanGPT2 returns the end of gpt2Pattern's match at i.
func scanGPT2(s string, i int) int {
	if n := contraction(s, i, false); n > 0 {
		return i + n
	}
	r, n := runeAt(s, i)
	j := i
	if r == ' ' {
		r2, n2 := runeAt(s, i+n)
		if n2 > 0 && !isS(r2) {
			r, j = r2, i+n
			n = n2
		}
	}
	switch {
	case isL(r):
		return spanWhile(s, j+n, isL)
	case isN(r):
		return spanWhile(s, j+n, isN)
	case isOther(r):
		return spanWhile(s, j+n, isOther)
	}
	return spaceRunEnd(s, i)
}

// scanLlama3 returns the end of the Llama-3 (maxDigits 3) or Qwen2
// (maxDigits 1) pattern's match at i.
func scanLlama3(s string, i int, maxDigits int) int {
	if n := contraction(s, i, true); n > 0 {
		return i + n
	}
	r, n := runeAt(s, i)
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if isL(r) {
		return spanWhile(s, i+n, isL)
	}
	if r != '\r' && r != '\n' && !isN(r) {
		if r2, n2 := runeAt(s, i+n); n2 > 0 && isL(r2) {
			return spanWhile(s, i+n+n2, isL)
		}
	}
	// \p{N}{1,maxDigits}
	if isN(r) {
		j := i + n
		for k := 1; k < maxDigits; k++ {
			r2, n2 := runeAt(s, j)
			if n2 == 0 || !isN(r2) {
				break
			}
			j += n2
		}
		return j
	}
	//  ?[^\s\p{L}\p{N}]+[\r\n]*
	j, rr, nn := i, r, n
	if r == ' ' {
		if r2, n2 := runeAt(s, i+n); n2 > 0 && isOther(r2) {
			j, rr, nn = i+n, r2, n2
		}
	}
	if isOther(rr) {
		end := spanWhile(s, j+nn, isOther)
		return spanWhile(s, end, func(r rune) bool { return r == '\r' || r == '\n' })
	}
	// \s*[\r\n]+ : the run up to and including its last newline.
	end := spanWhile(s, i, isS)
	for k := end - 1; k >= i; k-- {
		if s[k] == '\r' || s[k] == '\n' {
			return k + 1
		}
	}
	return spaceRunEnd(s, i)
}

// splitBehavior is HF's SplitDelimiterBehavior: what happens to the
// matched parts when splitting.
type splitBehavior int

const (
	splitIsolated splitBehavior = iota
	splitRemoved
	splitMergedWithPrevious
	splitMergedWithNext
	splitContiguous
)

// splitPieces calls emit for the pieces of s that splitting by m gives. With
// invert, the matches are the non-delimiter parts.
func splitPieces(s string, m matcher, behavior splitBehavior, invert bool, emit func(piece string, offset int)) error {
	type span struct {
		start, end int
		delim      bool
	}
	var spans []span
	pos := 0
	err := m.matches(s, func(a, b int) {
		if a > pos {
			spans = append(spans, span{pos, a, invert})
		}
		spans = append(spans, span{a, b, !invert})
		pos = b
	})
	if err != nil {
		return err
	}
	if pos < len(s) {
		spans = append(spans, span{pos, len(s), invert})
	}
	switch behavior {
	case splitIsolated:
		for _, sp := range spans {
			emit(s[sp.start:sp.end], sp.start)
		}
	case splitRemoved:
		for _, sp := range spans {
			if !sp.delim {
				emit(s[sp.start:sp.end], sp.start)
			}
		}
	case splitMergedWithPrevious:
		start := -1
		for _, sp := range spans {
			if start < 0 {
				start = sp.start
			}
			if sp.delim {
				emit(s[start:sp.end], start)
				start = -1
			}
		}
		if start >= 0 {
			emit(s[start:], start)
		}
	case splitMergedWithNext:
		start := 0
		for k, sp := range spans {
			if sp.delim && sp.start > start {
				emit(s[start:sp.start], start)
				start = sp.start
			}
			if k == len(spans)-1 {
				emit(s[start:sp.end], start)
			}
		}
	case splitContiguous:
		for k := 0; k < len(spans); {
			j := k
			for j+1 < len(spans) && spans[j+1].delim == spans[k].delim && spans[k].delim {
				j++
			}
			emit(s[spans[k].start:spans[j].end], spans[k].start)
			k = j + 1
		}
	}
	return nil
}
