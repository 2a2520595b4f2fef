package tokenizer

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// englishMB builds about 1 MB of English-like prose: corpus sentences plus
// random words, so that the word cache sees both repeats and misses.
func englishMB(tb testing.TB) string {
	lines := corpusLines(tb)
	prose := append([]string(nil), lines[:12]...)
	r := rand.New(rand.NewPCG(9, 9))
	var b strings.Builder
	for b.Len() < 1<<20 {
		if r.IntN(4) == 0 {
			for range 12 {
				n := 2 + r.IntN(9)
				b.WriteByte(' ')
				for range n {
					b.WriteByte(byte('a' + r.IntN(26)))
				}
			}
			b.WriteString(".\n")
			continue
		}
		b.WriteString(prose[r.IntN(len(prose))])
		b.WriteByte(' ')
	}
	return b.String()
}

func BenchmarkEncode1MB(b *testing.B) {
	text := englishMB(b)
	names, all := testTokenizers(b)
	for _, name := range names {
		tok := all[name].tok
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := tok.Encode(text, false); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkDecode(b *testing.B) {
	text := englishMB(b)[:64<<10]
	names, all := testTokenizers(b)
	for _, name := range names {
		tok := all[name].tok
		ids, err := tok.Encode(text, false)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := tok.Decode(ids, false); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkLoadQwen3(b *testing.B) {
	var e manifestEntry
	for _, m := range loadManifest(b) {
		if m.Name == "qwen3" {
			e = m
		}
	}
	raw := tokenizerJSON(b, e)
	cfg := readMaybeGz(b, "testdata/"+e.Config)
	b.SetBytes(int64(len(raw)))
	for b.Loop() {
		if _, err := FromHFJSON(raw, cfg); err != nil {
			b.Fatal(err)
		}
	}
}
