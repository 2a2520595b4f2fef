package tokenizer

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
)

// defaultHFJSON is the embedded default model's tokenizer.json with its
// split regex, ignore_merges and normalizer replaced.
func defaultHFJSON(t *testing.T, pattern string, ignoreMerges, nfc bool) []byte {
	t.Helper()
	raw, err := os.ReadFile("../models/default/hf/tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	split := doc["pre_tokenizer"].(map[string]any)["pretokenizers"].([]any)[0].(map[string]any)
	split["pattern"] = map[string]any{"Regex": pattern}
	doc["model"].(map[string]any)["ignore_merges"] = ignoreMerges
	doc["normalizer"] = nil
	if nfc {
		doc["normalizer"] = map[string]any{"type": "NFC"}
	}
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// preTexts are strings on which the pre-tokenizers of the table split
// differently: contractions, an apostrophe that starts a piece (at the
// start, after a letter or a newline) before a word that begins like a
// contraction, digit runs, newlines, a decomposed accent.
var preTexts = []string{
	"func (s *Server) Serve() error {\n\treturn nil\n}\n",
	"'string' x'default O'Really\n'return' it's THEY'RE",
	"x := 1234567 + 89\r\n\n\n  y",
	"cafe\u0301 café ünïcödé",
}

// TestPreTokenizerNames: each HF split layout gets its GGUF name, llama.cpp's
// where llama.cpp has one; the file's name (and every alias read as it)
// rebuilds a tokenizer that encodes like the HF one; LlamaCppLoads says
// which names llama.cpp accepts.
func TestPreTokenizerNames(t *testing.T) {
	cases := []struct {
		pattern      string
		ignoreMerges bool
		nfc          bool
		want         string // Spec().Pre; "" when it has no GGUF name
		llamaCpp     bool
	}{
		{llama3Pattern, true, false, "llama-bpe", true},
		{llama3Pattern, false, false, "smaug-bpe", true},
		{qwen2Pattern, false, true, "qwen2", true},
		{trigonGoPattern, false, false, "trigon-go", false},
		// No name for these: the merge rule or normalizer differs.
		{trigonGoPattern, true, false, "", false},
		{qwen2Pattern, false, false, "", false},
		{llama3Pattern, true, true, "", false},
	}
	for _, c := range cases {
		t.Run(c.want+"/"+c.pattern[:12], func(t *testing.T) {
			hf, err := FromHFJSON(defaultHFJSON(t, c.pattern, c.ignoreMerges, c.nfc), nil)
			if err != nil {
				t.Fatal(err)
			}
			spec := hf.Spec()
			if spec.Pre != c.want {
				t.Fatalf("Spec().Pre = %q, want %q", spec.Pre, c.want)
			}
			if c.want == "" {
				return
			}
			if err := spec.LlamaCppLoads(); (err == nil) != c.llamaCpp {
				t.Errorf("LlamaCppLoads() = %v, want loadable %v", err, c.llamaCpp)
			}
			p, ok := lookupBytePre(c.want)
			if !ok {
				t.Fatalf("%q not in the table", c.want)
			}
			for _, name := range append([]string{p.name}, p.aliases...) {
				s := spec
				s.Pre = name
				if err := s.LlamaCppLoads(); (err == nil) != c.llamaCpp {
					t.Errorf("%q: LlamaCppLoads() = %v, want loadable %v", name, err, c.llamaCpp)
				}
				tok, err := FromSpec(s)
				if err != nil {
					t.Fatalf("%q: %v", name, err)
				}
				if got := tok.Spec().Pre; got != c.want {
					t.Errorf("%q reads back as %q, want %q", name, got, c.want)
				}
				for _, text := range preTexts {
					a, _ := hf.Encode(text, false)
					b, err := tok.Encode(text, false)
					if err != nil || !slices.Equal(a, b) {
						t.Errorf("%q: Encode(%q) = %v, %v; HF tokenizer %v", name, text, b, err, a)
					}
				}
			}
		})
	}
}

// TestTrigonGoIsNotLlamaBPE shows why the default model's split keeps its
// own name: read as llama.cpp's llama-bpe it tokenizes some text
// differently. Where an apostrophe starts a piece, the contraction
// alternatives split "'string" as "'s" "tring"; after a space the
// apostrophe joins the punctuation run under both, which is why ordinary
// text rarely tells them apart.
func TestTrigonGoIsNotLlamaBPE(t *testing.T) {
	hf, err := FromHFJSON(defaultHFJSON(t, trigonGoPattern, false, false), nil)
	if err != nil {
		t.Fatal(err)
	}
	s := hf.Spec()
	s.Pre = "llama-bpe"
	asLlama, err := FromSpec(s)
	if err != nil {
		t.Fatal(err)
	}
	differ := 0
	for _, text := range preTexts {
		a, _ := hf.Encode(text, false)
		b, _ := asLlama.Encode(text, false)
		if !slices.Equal(a, b) {
			differ++
		}
	}
	if differ == 0 {
		t.Error("trigon-go and llama-bpe encode every text alike; the table could name trigon-go llama-bpe")
	}
}

// TestLlamaCppLoadsReadOnlyNames: names trigon reads that llama.cpp does
// not know, or reads as another split, are reported.
func TestLlamaCppLoadsReadOnlyNames(t *testing.T) {
	cases := []struct {
		model, pre string
		ok         bool
	}{
		{"gpt2", "gpt-2", true},
		{"gpt2", "gpt2", false},
		{"gpt2", "default", false},
		{"gpt2", "", false},
		{"gpt2", "llama3", true},
		{"gpt2", "dbrx", true},
		{"gpt2", "no-such-split", false},
		{"llama", "default", true},
		{"llama", "", true},
		{"bert", "", false},
	}
	for _, c := range cases {
		err := Spec{Model: c.model, Pre: c.pre}.LlamaCppLoads()
		if (err == nil) != c.ok {
			t.Errorf("%s/%q: LlamaCppLoads() = %v, want loadable %v", c.model, c.pre, err, c.ok)
		}
	}
}

// TestSamePreSplit: names of one entry (its aliases, trigon's readings of
// "gpt2", "default" and no key) are one split, names of two entries are
// not, and a name trigon does not read is an error naming it. The table's
// entries are distinct splits (SamePreSplit compares entries): no two
// share regex, whole-word lookup and normalization, and every name
// PreNames lists is read.
func TestSamePreSplit(t *testing.T) {
	for _, c := range []struct {
		a, b string
		same bool
		err  bool
	}{
		{"llama-bpe", "llama-bpe", true, false},
		{"llama3", "llama-bpe", true, false},
		{"llama-v3", "llama3", true, false},
		{"dbrx", "smaug-bpe", true, false},
		{"gpt2", "gpt-2", true, false},
		{"", "gpt-2", true, false},
		{"default", "gpt2", true, false},
		{"llama-bpe", "smaug-bpe", false, false}, // the regex alike, whole-word lookup not
		{"llama-bpe", "trigon-go", false, false},
		{"qwen2", "gpt-2", false, false},
		{"no-such-split", "gpt-2", false, true},
		{"trigon-go", "llama", false, true},
	} {
		same, err := SamePreSplit(c.a, c.b)
		if (err != nil) != c.err || same != c.same {
			t.Errorf("SamePreSplit(%q, %q) = %v, %v; want %v, error %v", c.a, c.b, same, err, c.same, c.err)
		}
		if err != nil && !strings.Contains(err.Error(), "no-such-split") && !strings.Contains(err.Error(), `"llama"`) {
			t.Errorf("SamePreSplit(%q, %q): %v does not name the unknown value", c.a, c.b, err)
		}
	}
	ps := bytePres()
	for i, p := range ps {
		for _, q := range ps[i+1:] {
			if p.pattern == q.pattern && p.ignoreMerges == q.ignoreMerges && p.nfc == q.nfc {
				t.Errorf("%q and %q are one split", p.name, q.name)
			}
		}
	}
	for _, name := range PreNames() {
		if _, ok := lookupBytePre(name); !ok {
			t.Errorf("PreNames lists %q, which is not read", name)
		}
	}
}
