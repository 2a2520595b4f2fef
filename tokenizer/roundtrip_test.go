package tokenizer

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

func corpusLines(t testing.TB) []string {
	t.Helper()
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(readMaybeGz(t, "testdata/corpus.jsonl")))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var s string
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, s)
	}
	if len(lines) < 300 {
		t.Fatalf("corpus has only %d lines", len(lines))
	}
	return lines
}

// roundTripText is what Decode(Encode(s)) should give back: the text as the
// normalizer leaves it. ok is false where the tokenizer cannot give the
// text back by design (HF gives the same):
//   - added tokens with lstrip/rstrip swallow the whitespace next to them;
//   - SentencePiece layouts decode a literal "▁" in the text as a space;
//   - the legacy SentencePiece layout puts a "▁" after every added token;
//   - a Metaspace decoder drops every "▁" of the first token, so leading
//     spaces are lost.
func roundTripText(tok *Tokenizer, s string) (string, bool) {
	if hasFlaggedAddedToken(tok, s) {
		return "", false
	}
	if tok.normalizer != nil {
		if u, isNFC := tok.normalizer.(normUnicode); isNFC && u.form == norm.NFC {
			return norm.NFC.String(s), true
		}
	}
	if tok.kind == KindSentencePieceBPE {
		if strings.Contains(s, "▁") {
			return "", false
		}
		for _, a := range tok.added {
			if strings.Contains(s, a.content) {
				return "", false
			}
		}
		for _, d := range tok.decoder {
			if d.kind == decMetaspace && strings.HasPrefix(s, " ") {
				return "", false
			}
		}
	}
	return s, true
}

func checkRoundTrip(t testing.TB, tok *Tokenizer, s string) {
	want, ok := roundTripText(tok, s)
	if !ok {
		return
	}
	ids, err := tok.Encode(s, false)
	if err != nil {
		t.Fatalf("Encode(%q): %v", s, err)
	}
	got, err := tok.Decode(ids, false)
	if err != nil {
		t.Fatalf("Decode(Encode(%q)): %v", s, err)
	}
	if got != want {
		t.Fatalf("Decode(Encode(%q)) = %q (ids %v)", s, got, ids)
	}
}

func TestRoundTrip(t *testing.T) {
	lines := corpusLines(t)
	r := rand.New(rand.NewPCG(3, 4))
	for range 300 {
		lines = append(lines, randomSplitText(r)+randomSplitText(r))
	}
	forEachTokenizer(t, func(t *testing.T, tok *Tokenizer, _ *golden) {
		for _, s := range lines {
			checkRoundTrip(t, tok, s)
		}
	})
}

func TestInvalidUTF8IsReplaced(t *testing.T) {
	forEachTokenizer(t, func(t *testing.T, tok *Tokenizer, _ *golden) {
		for _, c := range []struct{ in, asIf string }{
			{"a\xffb", "a\uFFFDb"},
			{"\xe2\x82 euro cut", "\uFFFD euro cut"},   // one maximal subpart
			{"\xe2\x28\xa1", "\uFFFD(\uFFFD"},          // broken after the lead byte
			{"\xf0\x9f\x98", "\uFFFD"},                 // truncated emoji
			{"\xed\xa0\x80", "\uFFFD\uFFFD\uFFFD"},     // surrogate: each byte
			{"ok\xc0\xafslash", "ok\uFFFD\uFFFDslash"}, // overlong
		} {
			got, err := tok.Encode(c.in, false)
			if err != nil {
				t.Fatal(err)
			}
			want, err := tok.Encode(c.asIf, false)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Errorf("Encode(%q) = %v, want the ids of %q: %v", c.in, got, c.asIf, want)
			}
		}
	})
}

// TestSpecRoundTrip checks the path GGUF files take: Spec() fed to
// FromSpec must encode the corpus exactly as the tokenizer.json tokenizer
// (HF's goldens), and for SentencePiece layouts also without merges, by
// scores alone, as llama.cpp's GGUFs have it.
func TestSpecRoundTrip(t *testing.T) {
	forEachTokenizer(t, func(t *testing.T, tok *Tokenizer, g *golden) {
		spec := tok.Spec()
		if spec.Pre == "" {
			t.Fatal("Spec has no pre-tokenizer name for a layout that should have one")
		}
		variants := map[string]Spec{"merges": spec}
		if spec.Model == "llama" {
			scoresOnly := spec
			scoresOnly.Merges = nil
			variants["scores"] = scoresOnly
		}
		for vname, s := range variants {
			t.Run(vname, func(t *testing.T) {
				tok2, err := FromSpec(s)
				if err != nil {
					t.Fatal(err)
				}
				if tok2.Kind() != tok.Kind() || tok2.VocabSize() != tok.VocabSize() {
					t.Fatalf("kind %q size %d, want %q %d", tok2.Kind(), tok2.VocabSize(), tok.Kind(), tok.VocabSize())
				}
				again := tok2.Spec()
				if again.Pre != s.Pre || again.SpacePrefix != s.SpacePrefix || again.BOS != s.BOS ||
					again.EOS != s.EOS || again.AddBOS != s.AddBOS || !slices.Equal(again.Tokens, s.Tokens) ||
					!slices.Equal(again.Types, s.Types) || !slices.Equal(again.Merges, s.Merges) {
					t.Fatal("Spec(FromSpec(spec)) differs from spec")
				}
				bad := 0
				for _, c := range g.Encode {
					if hasFlaggedAddedToken(tok, c.Text) {
						continue // lstrip/rstrip/single_word have no GGUF form
					}
					got, err := tok2.Encode(c.Text, true)
					if err != nil {
						t.Fatal(err)
					}
					if !slices.Equal(got, c.IDsSpecial) {
						bad++
						if bad <= 3 {
							t.Errorf("Encode(%q)\n got %v\nwant %v", c.Text, got, c.IDsSpecial)
						}
					}
				}
				if bad > 0 {
					t.Errorf("%d texts encode differently", bad)
				}
				if !slices.Equal(tok2.decoder, tok.decoder) {
					return // the decoder has no GGUF form (Metaspace's)
				}
				for _, c := range g.Decode[:200] {
					got, err := tok2.Decode(c.IDs, true)
					if err != nil {
						t.Fatal(err)
					}
					if got != c.TextSkip {
						t.Errorf("Decode(%v) = %q, want %q", c.IDs, got, c.TextSkip)
					}
				}
			})
		}
	})
}

func hasFlaggedAddedToken(tok *Tokenizer, s string) bool {
	for _, a := range tok.added {
		if (a.lstrip || a.rstrip || a.singleWord) && strings.Contains(s, a.content) {
			return true
		}
	}
	return false
}

func TestFromSpecRejectsBadInput(t *testing.T) {
	base := Spec{Model: "llama", Tokens: []string{"<unk>", "a", "b", "ab"}, Scores: []float32{0, -1, -2, -3},
		Types: []int32{TypeUnknown, TypeNormal, TypeNormal, TypeNormal}, BOS: -1, EOS: -1, UNK: 0, PAD: -1}
	if _, err := FromSpec(base); err != nil {
		t.Fatalf("valid spec: %v", err)
	}
	for name, mutate := range map[string]func(*Spec){
		"no tokens":      func(s *Spec) { s.Tokens = nil },
		"short scores":   func(s *Spec) { s.Scores = s.Scores[:2] },
		"short types":    func(s *Spec) { s.Types = s.Types[:1] },
		"bad type":       func(s *Spec) { s.Types[1] = 9 },
		"bos range":      func(s *Spec) { s.BOS = 4 },
		"eos negative":   func(s *Spec) { s.EOS = -2 },
		"unknown model":  func(s *Spec) { s.Model = "bert" },
		"gpt2 no merges": func(s *Spec) { s.Model = "gpt2" },
		"bad merge":      func(s *Spec) { s.Merges = []string{"ab"} },
		"merge not in vocab": func(s *Spec) {
			s.Merges = []string{"b a"}
		},
		"empty token":   func(s *Spec) { s.Tokens[2] = "" },
		"nan score":     func(s *Spec) { s.Scores[2] = float32(nan()) },
		"add bos no id": func(s *Spec) { s.AddBOS = true },
		"bad prefix":    func(s *Spec) { s.SpacePrefix = "sometimes" },
		"bad pre":       func(s *Spec) { s.Model, s.Merges, s.Pre = "gpt2", []string{"a b"}, "klingon" },
		"bad template":  func(s *Spec) { s.ChatTemplate = "{% for %}" },
	} {
		t.Run(name, func(t *testing.T) {
			s := base
			s.Tokens = slices.Clone(base.Tokens)
			s.Scores = slices.Clone(base.Scores)
			s.Types = slices.Clone(base.Types)
			mutate(&s)
			if _, err := FromSpec(s); err == nil {
				t.Fatal("want an error")
			}
		})
	}
}

func nan() float64 {
	z := 0.0
	return z / z
}

// FuzzEncode checks that no input panics and that Decode(Encode(x)) gives
// x back (as normalized), for one tokenizer of each layout.
func FuzzEncode(f *testing.F) {
	for _, s := range corpusLines(f) {
		f.Add(s)
	}
	names, all := testTokenizers(f)
	var toks []*Tokenizer
	for _, n := range names {
		if all[n].err != nil {
			f.Fatal(all[n].err)
		}
		toks = append(toks, all[n].tok)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, tok := range toks {
			ids, err := tok.Encode(s, true)
			if err != nil {
				t.Fatal(err)
			}
			for _, id := range ids {
				if _, ok := tok.TokenString(id); !ok {
					t.Fatalf("Encode(%q) gave unknown id %d", s, id)
				}
			}
			if utf8.ValidString(s) {
				checkRoundTrip(t, tok, s)
			}
			if _, err := tok.Decode(ids, true); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// TestConcurrentEncode shares one Tokenizer (and its word cache) between
// goroutines; every result must equal the sequential one.
func TestConcurrentEncode(t *testing.T) {
	lines := corpusLines(t)
	forEachTokenizer(t, func(t *testing.T, tok *Tokenizer, _ *golden) {
		want := make([][]TokenID, len(lines))
		for i, s := range lines {
			ids, err := tok.Encode(s, true)
			if err != nil {
				t.Fatal(err)
			}
			want[i] = ids
		}
		errs := make(chan error, 4)
		for g := range 4 {
			go func() {
				for k := range lines {
					i := (k*7 + g*13) % len(lines)
					got, err := tok.Encode(lines[i], true)
					if err == nil && !slices.Equal(got, want[i]) {
						err = fmt.Errorf("goroutine %d: Encode(%q) = %v, want %v", g, lines[i], got, want[i])
					}
					if err != nil {
						errs <- err
						return
					}
				}
				errs <- nil
			}()
		}
		for range 4 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
	})
}
