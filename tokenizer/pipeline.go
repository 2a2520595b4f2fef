package tokenizer

import (
	"strings"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// normalizer rewrites a text segment before pre-tokenization (HF's
// normalizers). Segments never contain added tokens.
type normalizer interface {
	normalize(s string) string
}

type normSequence []normalizer

func (q normSequence) normalize(s string) string {
	for _, n := range q {
		s = n.normalize(s)
	}
	return s
}

// normUnicode is NFC, NFD, NFKC or NFKD.
type normUnicode struct{ form norm.Form }

func (n normUnicode) normalize(s string) string { return n.form.String(s) }

// normPrepend prepends to non-empty segments (Llama's legacy "▁").
type normPrepend struct{ prefix string }

func (n normPrepend) normalize(s string) string {
	if s == "" {
		return s
	}
	return n.prefix + s
}

// normReplace replaces every occurrence of a literal string.
type normReplace struct{ old, new string }

func (n normReplace) normalize(s string) string { return strings.ReplaceAll(s, n.old, n.new) }

type normLowercase struct{}

func (normLowercase) normalize(s string) string { return strings.ToLower(s) }

// normStrip removes leading and/or trailing whitespace.
type normStrip struct{ left, right bool }

func (n normStrip) normalize(s string) string {
	if n.left {
		s = strings.TrimLeftFunc(s, isS)
	}
	if n.right {
		s = strings.TrimRightFunc(s, isS)
	}
	return s
}

// preTokenizer splits a normalized segment into words (HF's pre-tokenizers).
// atStart says that s begins at offset 0 of the original text (Metaspace's
// prepend_scheme "first" needs it). emit receives each word and whether it
// begins at the start of s.
type preTokenizer interface {
	split(s string, atStart bool, emit func(word string, atStart bool)) error
}

type preSequence []preTokenizer

func (q preSequence) split(s string, atStart bool, emit func(string, bool)) error {
	return q.run(0, s, atStart, emit)
}

func (q preSequence) run(k int, s string, atStart bool, emit func(string, bool)) error {
	if k == len(q) {
		emit(s, atStart)
		return nil
	}
	var inner error
	err := q[k].split(s, atStart, func(w string, st bool) {
		if inner == nil {
			inner = q.run(k+1, w, st, emit)
		}
	})
	if err != nil {
		return err
	}
	return inner
}

// preSplit is HF's Split pre-tokenizer.
type preSplit struct {
	m        matcher
	behavior splitBehavior
	invert   bool
}

func (p preSplit) split(s string, atStart bool, emit func(string, bool)) error {
	if p.behavior == splitIsolated && !p.invert {
		// Hot path: matches and the gaps between them, in order.
		pos := 0
		err := p.m.matches(s, func(a, b int) {
			if a > pos {
				emit(s[pos:a], atStart && pos == 0)
			}
			emit(s[a:b], atStart && a == 0)
			pos = b
		})
		if err != nil {
			return err
		}
		if pos < len(s) {
			emit(s[pos:], atStart && pos == 0)
		}
		return nil
	}
	return splitPieces(s, p.m, p.behavior, p.invert, func(w string, off int) { emit(w, atStart && off == 0) })
}

// preByteLevel is HF's ByteLevel pre-tokenizer. Its byte-to-rune mapping is
// left to the byte-level BPE model, which works on raw bytes, so the words
// it emits are still raw text.
type preByteLevel struct {
	addPrefixSpace bool
	re             matcher // nil unless use_regex
}

func (p preByteLevel) split(s string, atStart bool, emit func(string, bool)) error {
	if p.addPrefixSpace && !strings.HasPrefix(s, " ") {
		s = " " + s
	}
	if p.re == nil {
		emit(s, atStart)
		return nil
	}
	return preSplit{m: p.re}.split(s, atStart, emit)
}

// prependScheme is Metaspace's rule for adding the leading "▁".
type prependScheme int

const (
	prependAlways prependScheme = iota
	prependFirst
	prependNever
)

// preMetaspace is HF's Metaspace pre-tokenizer: spaces become the
// replacement rune, which is also prepended per the scheme unless the
// segment already starts with it.
type preMetaspace struct {
	replacement string
	scheme      prependScheme
	splitWords  bool
}

func (p preMetaspace) split(s string, atStart bool, emit func(string, bool)) error {
	s = strings.ReplaceAll(s, " ", p.replacement)
	if !strings.HasPrefix(s, p.replacement) &&
		(p.scheme == prependAlways || (p.scheme == prependFirst && atStart)) {
		s = p.replacement + s
	}
	if !p.splitWords {
		emit(s, atStart)
		return nil
	}
	// Each word starts at a replacement rune (MergedWithNext).
	start := 0
	for i := 0; i < len(s); {
		if strings.HasPrefix(s[i:], p.replacement) {
			if i > start {
				emit(s[start:i], atStart && start == 0)
				start = i
			}
			i += len(p.replacement)
			continue
		}
		_, n := utf8.DecodeRuneInString(s[i:])
		i += n
	}
	if start < len(s) {
		emit(s[start:], atStart && start == 0)
	}
	return nil
}

// spaceChunks splits a SentencePiece-style word (spaces already replaced by
// sep) before every sep that follows a non-sep rune. When no vocabulary piece
// has a sep after another rune, no merge can cross these cuts, so the
// result equals BPE over the whole word; the cut lets the word cache work
// and keeps the merge queues short.
func spaceChunks(s, sep string, emit func(string)) {
	start := 0
	for i := 0; i < len(s); {
		if strings.HasPrefix(s[i:], sep) {
			if i > start && !strings.HasSuffix(s[start:i], sep) {
				emit(s[start:i])
				start = i
			}
			i += len(sep)
			continue
		}
		_, n := utf8.DecodeRuneInString(s[i:])
		i += n
	}
	if start < len(s) {
		emit(s[start:])
	}
}
