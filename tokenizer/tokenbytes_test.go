package tokenizer

import (
	"bytes"
	"strings"
	"testing"
)

// TestTokenBytesSpellDecodedText: for every golden tokenizer and corpus
// line, the bytes of the tokens concatenated are the decoded text (up to
// the space SentencePiece prepends), wherever Decode(Encode(x)) == x.
func TestTokenBytesSpellDecodedText(t *testing.T) {
	forEachTokenizer(t, func(t *testing.T, tok *Tokenizer, g *golden) {
		for i, c := range g.Encode {
			ids, err := tok.Encode(c.Text, false)
			if err != nil {
				t.Fatal(err)
			}
			var b bytes.Buffer
			for _, id := range ids {
				tb, ok := tok.TokenBytes(id)
				if !ok {
					t.Fatalf("TokenBytes(%d) not ok", id)
				}
				b.Write(tb)
			}
			want, err := tok.Decode(ids, false)
			if err != nil {
				t.Fatal(err)
			}
			if want != c.Text {
				continue // a lossy round trip (normalizer, stripped spaces): nothing to spell
			}
			got := b.String()
			if tok.Kind() == KindSentencePieceBPE {
				got = strings.TrimPrefix(got, " ") // the "▁" SentencePiece prepends
			}
			if strings.ToValidUTF8(got, "\uFFFD") != want {
				t.Errorf("line %d: token bytes spell %q, Decode gives %q", i, got, want)
				return
			}
		}
	})
	if _, ok := (&Tokenizer{}).TokenBytes(-1); ok {
		t.Error("TokenBytes(-1) ok")
	}
}
