package tokenizer

import (
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// addedToken is an entry of tokenizer.json's added_tokens: a string that is
// cut out of the text and becomes one id before any other processing.
type addedToken struct {
	id         TokenID
	content    string
	special    bool // skipped by Decode(skipSpecial=true)
	lstrip     bool // also swallows whitespace on its left
	rstrip     bool // also swallows whitespace on its right
	singleWord bool // only matches when not inside a word
	normalized bool // matched in the normalized text rather than the raw text
}

// addedMatcher finds added tokens leftmost-longest, as HF's Aho-Corasick
// matcher does. Added-token sets are small (tens), so candidates are
// bucketed by first byte and tried longest first.
type addedMatcher struct {
	byFirst [256][]int // token indices by first byte, longest content first
	tokens  []addedToken
}

func newAddedMatcher(tokens []addedToken) *addedMatcher {
	m := &addedMatcher{tokens: tokens}
	for i, t := range tokens {
		if t.content == "" {
			continue
		}
		b := t.content[0]
		m.byFirst[b] = append(m.byFirst[b], i)
	}
	for b := range m.byFirst {
		c := m.byFirst[b]
		sort.SliceStable(c, func(x, y int) bool { return len(tokens[c[x]].content) > len(tokens[c[y]].content) })
	}
	return m
}

func (m *addedMatcher) empty() bool { return len(m.tokens) == 0 }

// find returns the leftmost-longest match at or after pos.
func (m *addedMatcher) find(s string, pos int) (tok int, start, end int) {
	for i := pos; i < len(s); i++ {
		for _, k := range m.byFirst[s[i]] {
			if strings.HasPrefix(s[i:], m.tokens[k].content) {
				return k, i, i + len(m.tokens[k].content)
			}
		}
	}
	return -1, -1, -1
}

// segment is a piece of text between added tokens, or an added token.
type segment struct {
	text   string
	offset int     // byte offset of text in the string it was cut from
	id     TokenID // -1 for text
}

// split cuts s into text segments and added tokens, applying single_word,
// lstrip and rstrip the way HF's AddedVocabulary does.
func (m *addedMatcher) split(s string, emit func(segment)) {
	if m.empty() {
		emit(segment{text: s, id: -1})
		return
	}
	last := 0 // end of the previous token (text before it is pending)
	pos := 0
	for pos < len(s) {
		k, start, stop := m.find(s, pos)
		if k < 0 {
			break
		}
		t := &m.tokens[k]
		if t.singleWord && (endsWithWordChar(s[:start]) || startsWithWordChar(s[stop:])) {
			pos = stop // HF's matcher resumes after the rejected match
			continue
		}
		if t.lstrip {
			start = max(len(strings.TrimRightFunc(s[:start], unicode.IsSpace)), last)
		}
		if t.rstrip {
			stop = len(s) - len(strings.TrimLeftFunc(s[stop:], unicode.IsSpace))
		}
		if start > last {
			emit(segment{text: s[last:start], offset: last, id: -1})
		}
		emit(segment{text: s[start:stop], offset: start, id: t.id})
		last, pos = stop, stop
	}
	if last < len(s) || len(s) == 0 {
		emit(segment{text: s[last:], offset: last, id: -1})
	}
}

// isWordChar is \w as Rust's regex crate has it: letters, marks, decimal
// digits, connector punctuation and the joiners.
func isWordChar(r rune) bool {
	return unicode.IsLetter(r) || unicode.IsMark(r) || unicode.Is(unicode.Nd, r) ||
		unicode.Is(unicode.Pc, r) || r == 0x200C || r == 0x200D
}

func endsWithWordChar(s string) bool {
	r, n := utf8.DecodeLastRuneInString(s)
	return n > 0 && isWordChar(r)
}

func startsWithWordChar(s string) bool {
	r, n := utf8.DecodeRuneInString(s)
	return n > 0 && isWordChar(r)
}
