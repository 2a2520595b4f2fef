package bench

import (
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/trigon-llm/trigon/tokenizer"
)

func TestSyntheticTokenizer(t *testing.T) {
	for _, name := range []string{ArchTiny, "llama-3-8b", "qwen2.5-7b"} {
		t.Run(name, func(t *testing.T) {
			cfg, err := Arch(name)
			if err != nil {
				t.Fatal(err)
			}
			tok, err := SyntheticTokenizer(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if tok.VocabSize() != cfg.VocabSize {
				t.Fatalf("vocabulary %d, the model's %d", tok.VocabSize(), cfg.VocabSize)
			}
			for _, id := range cfg.EOSTokenIDs {
				if !tok.IsSpecial(id) {
					t.Errorf("EOS %d is not a special token", id)
				}
			}
			if bos, ok := tok.BOS(); cfg.HasBOS && (!ok || bos != cfg.BOSTokenID || !tok.IsSpecial(bos)) {
				t.Errorf("BOS %d %v, want the special token %d", bos, ok, cfg.BOSTokenID)
			}
			// Any text round-trips, bytes the tokenizer has no word for
			// included.
			text := "héllo wörld, 1 + 2 = 3\t✓\n"
			ids, err := tok.Encode(text, false)
			if err != nil {
				t.Fatal(err)
			}
			if got, err := tok.Decode(ids, true); err != nil || got != text {
				t.Errorf("decode(encode(%q)) = %q, %v", text, got, err)
			}
			// Every id a random model may sample decodes to visible text.
			for id := int32(0); int(id) < cfg.VocabSize; id += int32(max(1, cfg.VocabSize/4000)) {
				if tok.IsSpecial(id) {
					continue
				}
				b, ok := tok.TokenBytes(id)
				if !ok || len(b) == 0 {
					t.Fatalf("token %d has no bytes", id)
				}
				if len(b) > 1 && (b[0] != ' ' || !utf8.Valid(b) || strings.Trim(string(b[1:]), "abcdefghijklmnopqrstuvwxyz") != "") {
					t.Fatalf("token %d is %q, want a space and letters", id, b)
				}
			}
			chat, err := tok.ApplyChatTemplate(nil, true)
			if err != nil || !strings.HasSuffix(chat, "assistant:") {
				t.Errorf("chat template: %q, %v", chat, err)
			}
		})
	}
}

func TestSyntheticTokenizerTooSmall(t *testing.T) {
	cfg, err := Arch(ArchTiny)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{100, 258} { // 256 bytes and 2 specials leave no word at 258
		c := cfg
		c.VocabSize = n
		c.BOSTokenID, c.EOSTokenIDs = 1, []int32{2}
		if _, err := SyntheticTokenizer(c); err == nil {
			t.Errorf("vocabulary %d: no error", n)
		}
	}
	c := cfg
	c.VocabSize = 259
	if _, err := SyntheticTokenizer(c); err != nil {
		t.Errorf("vocabulary 259 (bytes, 2 specials, 1 word): %v", err)
	}
}

func TestWord(t *testing.T) {
	for k, want := range map[int]string{0: "a", 25: "z", 26: "aa", 27: "ab", 26 + 26*26: "aaa"} {
		if got := word(k); got != want {
			t.Errorf("word(%d) = %q, want %q", k, got, want)
		}
	}
}

// TestPadTokenizer extends the fixture's byte-level BPE tokenizer to a
// larger vocabulary: text encodes as before, and every new id decodes.
func TestPadTokenizer(t *testing.T) {
	tok, err := tokenizer.FromHFDir("../testdata/models/llama3")
	if err != nil {
		t.Fatal(err)
	}
	const vocab = 1024
	padded, err := PadTokenizer(tok, vocab)
	if err != nil {
		t.Fatal(err)
	}
	if padded.VocabSize() != vocab {
		t.Fatalf("padded to %d ids, want %d", padded.VocabSize(), vocab)
	}
	text := "The quick brown fox, 42 times."
	a, err1 := tok.Encode(text, true)
	b, err2 := padded.Encode(text, true)
	if err1 != nil || err2 != nil || !slices.Equal(a, b) {
		t.Errorf("encodings differ: %v %v / %v %v", a, err1, b, err2)
	}
	for id := int32(tok.VocabSize()); id < vocab; id++ {
		b, ok := padded.TokenBytes(id)
		if !ok || !strings.HasPrefix(string(b), " pad") {
			t.Fatalf("new id %d decodes to %q", id, b)
		}
	}
	if same, err := PadTokenizer(tok, tok.VocabSize()); err != nil || same != tok {
		t.Errorf("a tokenizer that covers the vocabulary: %v, %v", same, err)
	}
}
