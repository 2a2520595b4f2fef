package tokenizer

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"
)

// refLossy is String::from_utf8_lossy written as the Unicode standard
// states it (U+FFFD for each maximal subpart of an ill-formed sequence),
// independently of utf8SeqEnd: it tries the longest prefix that is still
// the start of some valid sequence.
func refLossy(b []byte) string {
	var out strings.Builder
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r != utf8.RuneError || n > 1 {
			out.WriteRune(r)
			b = b[n:]
			continue
		}
		// Longest prefix of b (1..3 bytes) that some valid 4-byte-or-less
		// sequence starts with.
		k := 1
		for l := 2; l <= 3 && l <= len(b); l++ {
			if isValidPrefix(b[:l]) {
				k = l
			}
		}
		out.WriteRune(utf8.RuneError)
		b = b[k:]
	}
	return out.String()
}

// validPrefixes holds every proper prefix of every valid UTF-8 encoding,
// found by encoding all scalar values.
var validPrefixes = sync.OnceValue(func() map[string]bool {
	m := map[string]bool{}
	for r := rune(0x80); r <= utf8.MaxRune; r++ {
		if !utf8.ValidRune(r) {
			continue
		}
		enc := string(utf8.AppendRune(nil, r))
		for l := 1; l < len(enc); l++ {
			m[enc[:l]] = true
		}
	}
	return m
})

func isValidPrefix(p []byte) bool { return validPrefixes()[string(p)] }

func TestAppendLossy(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	pool := []byte{'a', 0x80, 0xBF, 0xC2, 0xC0, 0xE0, 0xA0, 0xE2, 0x82, 0xAC, 0xED, 0x9F, 0xF0, 0x90, 0x9F, 0x98, 0x80, 0xF4, 0x8F, 0xF5, 0xFF}
	for range 3000 {
		b := make([]byte, r.IntN(12))
		for i := range b {
			b[i] = pool[r.IntN(len(pool))]
		}
		want := refLossy(b)
		got, held := appendLossy(nil, b, true)
		if string(got) != want || held != 0 {
			t.Fatalf("% x: got %q, want %q", b, got, want)
		}
		// Streaming in random pieces gives the same text.
		var stream []byte
		var pending []byte
		for i := 0; i < len(b); {
			j := i + 1 + r.IntN(3)
			j = min(j, len(b))
			pending = append(pending, b[i:j]...)
			out, h := appendLossy(nil, pending, false)
			stream = append(stream, out...)
			pending = append([]byte{}, pending[len(pending)-h:]...)
			i = j
		}
		out, _ := appendLossy(nil, pending, true)
		stream = append(stream, out...)
		if string(stream) != want {
			t.Fatalf("% x streamed: got %q, want %q", b, stream, want)
		}
	}
}

func TestByteLevelAlphabet(t *testing.T) {
	seen := map[rune]bool{}
	for b := 0; b < 256; b++ {
		r := byteToRune[b]
		if seen[r] || r == ' ' || r < '!' {
			t.Fatalf("byte %d maps to %q, which is not a fresh printable rune", b, r)
		}
		seen[r] = true
		got, ok := byteLevelDecode(string(r))
		if !ok || len(got) != 1 || got[0] != byte(b) {
			t.Fatalf("byte %d does not round trip", b)
		}
	}
	if byteToRune[' '] != 'Ġ' || byteToRune['\n'] != 'Ċ' || byteToRune['a'] != 'a' {
		t.Fatal("GPT-2's well-known mappings (space -> Ġ, newline -> Ċ) do not hold")
	}
}

// refHFDecode applies HF's decoders to a whole token list at once, the way
// tokenizers' decode_chain does, with no streaming. It is the reference the
// streaming stages are checked against.
func refHFDecode(steps []decodeStep, tokens []string) string {
	for _, s := range steps {
		var next []string
		switch s.kind {
		case decByteLevel:
			var raw []byte
			for _, tok := range tokens {
				if b, ok := byteLevelDecode(tok); ok {
					raw = append(raw, b...)
				} else {
					raw = append(raw, tok...)
				}
			}
			next = []string{refLossy(raw)}
		case decReplace:
			for _, tok := range tokens {
				next = append(next, strings.ReplaceAll(tok, s.old, s.new))
			}
		case decByteFallback:
			var pend []byte
			emit := func() {
				if len(pend) == 0 {
					return
				}
				if utf8.Valid(pend) {
					next = append(next, string(pend))
				} else {
					for range pend {
						next = append(next, "\uFFFD")
					}
				}
				pend = nil
			}
			for _, tok := range tokens {
				if c, ok := parseByteToken(tok); ok {
					pend = append(pend, c)
					continue
				}
				emit()
				next = append(next, tok)
			}
			emit()
		case decFuse:
			next = []string{strings.Join(tokens, "")}
		case decStrip:
			for _, tok := range tokens {
				next = append(next, stripRunes(tok, s.content, s.start, s.stop))
			}
		case decMetaspace:
			for i, tok := range tokens {
				var b strings.Builder
				for _, r := range tok {
					switch {
					case r != s.replacement:
						b.WriteRune(r)
					case i != 0 || s.scheme == prependNever:
						b.WriteByte(' ')
					}
				}
				next = append(next, b.String())
			}
		case decJoinSpace:
			next = []string{strings.Join(tokens, " ")}
		}
		tokens = next
	}
	return strings.Join(tokens, "")
}

// TestDecoderStagesMatchReference runs random token lists through random
// decoder pipelines, streaming one token at a time, and compares with the
// whole-list reference.
func TestDecoderStagesMatchReference(t *testing.T) {
	pieces := []string{"▁", "▁▁", "a", "▁the", "xx▁", "<0x41>", "<0xE2>", "<0x82>", "<0xAC>", "<0xFF>", " ",
		"  ", "é", "Ġ", "ĠĠ", "Ċ", "ä", "â", "Ĥ", "<s>", "\u2581\u2581b"}
	stepPool := []decodeStep{
		{kind: decByteLevel},
		{kind: decReplace, old: "▁", new: " "},
		{kind: decReplace, old: "xx", new: "Y"},
		{kind: decByteFallback},
		{kind: decFuse},
		{kind: decStrip, content: ' ', start: 1},
		{kind: decStrip, content: ' ', start: 2, stop: 2},
		{kind: decMetaspace, replacement: '▁', scheme: prependFirst},
		{kind: decMetaspace, replacement: '▁', scheme: prependNever},
	}
	r := rand.New(rand.NewPCG(7, 8))
	for trial := range 4000 {
		var steps []decodeStep
		if trial%10 == 0 {
			steps = []decodeStep{{kind: decJoinSpace}}
		} else {
			for range 1 + r.IntN(4) {
				steps = append(steps, stepPool[r.IntN(len(stepPool))])
			}
		}
		toks := make([]string, r.IntN(10))
		for i := range toks {
			toks[i] = pieces[r.IntN(len(pieces))]
		}
		tk := &Tokenizer{decoder: steps}
		d := NewDecoder(tk, false)
		var got strings.Builder
		for _, tok := range toks {
			d.nexts[0](tok)
			got.WriteString(d.take())
		}
		got.WriteString(d.Flush())
		want := refHFDecode(steps, toks)
		if got.String() != want {
			t.Fatalf("steps %v tokens %q: streamed %q, reference %q", describeSteps(steps), toks, got.String(), want)
		}
	}
}

func describeSteps(steps []decodeStep) string {
	var parts []string
	for _, s := range steps {
		parts = append(parts, fmt.Sprintf("%d", s.kind))
	}
	return strings.Join(parts, ",")
}

func TestDecodeRejectsUnknownIDs(t *testing.T) {
	forEachTokenizer(t, func(t *testing.T, tok *Tokenizer, _ *golden) {
		for _, id := range []TokenID{-1, TokenID(tok.VocabSize()), 1 << 30} {
			if _, err := tok.Decode([]TokenID{0, id}, false); err == nil {
				t.Errorf("Decode with id %d: want an error", id)
			}
		}
	})
}
