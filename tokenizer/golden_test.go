package tokenizer

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// The goldens in testdata/*.golden.json.gz come from HF tokenizers and
// transformers via tools/tokgolden/gen.py; testdata/README.md says how.

type manifestEntry struct {
	Name       string                     `json:"name"`
	Base       string                     `json:"base"`
	Config     string                     `json:"config"`
	Patch      map[string]json.RawMessage `json:"patch"`
	ModelPatch map[string]json.RawMessage `json:"model_patch"`
}

type golden struct {
	Name   string `json:"name"`
	Encode []struct {
		Text       string    `json:"text"`
		IDs        []TokenID `json:"ids"`
		IDsSpecial []TokenID `json:"ids_special"`
	} `json:"encode"`
	Decode []struct {
		IDs      []TokenID `json:"ids"`
		Text     string    `json:"text"`
		TextSkip string    `json:"text_skip"`
	} `json:"decode"`
	Chat []struct {
		Conversation        int            `json:"conversation"`
		AddGenerationPrompt bool           `json:"add_generation_prompt"`
		Vars                map[string]any `json:"vars"`
		Text                *string        `json:"text"`
		Error               *string        `json:"error"`
	} `json:"chat"`
	HasChatTemplate bool     `json:"has_chat_template"`
	Errors          []string `json:"errors"`
}

func readMaybeGz(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(path, ".gz") {
		return b
	}
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	out, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return out
}

func loadManifest(t testing.TB) []manifestEntry {
	t.Helper()
	var m []manifestEntry
	if err := json.Unmarshal(readMaybeGz(t, "testdata/manifest.json"), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// tokenizerJSON applies an entry's patches to its base file, as gen.py does.
func tokenizerJSON(t testing.TB, e manifestEntry) []byte {
	t.Helper()
	raw := readMaybeGz(t, filepath.Join("testdata", e.Base))
	if len(e.Patch) == 0 && len(e.ModelPatch) == 0 {
		return raw
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(raw, &top); err != nil {
		t.Fatal(err)
	}
	for k, v := range e.Patch {
		top[k] = v
	}
	if len(e.ModelPatch) > 0 {
		var model map[string]json.RawMessage
		if err := json.Unmarshal(top["model"], &model); err != nil {
			t.Fatal(err)
		}
		for k, v := range e.ModelPatch {
			model[k] = v
		}
		b, err := json.Marshal(model)
		if err != nil {
			t.Fatal(err)
		}
		top["model"] = b
	}
	b, err := json.Marshal(top)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

type loaded struct {
	tok    *Tokenizer
	golden *golden
	err    error
}

var (
	loadOnce  sync.Once
	loadedAll map[string]*loaded
	loadOrder []string
)

// testTokenizers loads every manifest tokenizer once per test binary.
func testTokenizers(t testing.TB) ([]string, map[string]*loaded) {
	t.Helper()
	loadOnce.Do(func() {
		loadedAll = map[string]*loaded{}
		for _, e := range loadManifest(t) {
			l := &loaded{}
			cfg := readMaybeGz(t, filepath.Join("testdata", e.Config))
			l.tok, l.err = FromHFJSON(tokenizerJSON(t, e), cfg)
			var g golden
			if err := json.Unmarshal(readMaybeGz(t, filepath.Join("testdata", e.Name+".golden.json.gz")), &g); err != nil {
				l.err = fmt.Errorf("golden: %w", err)
			}
			l.golden = &g
			loadedAll[e.Name] = l
			loadOrder = append(loadOrder, e.Name)
		}
	})
	return loadOrder, loadedAll
}

func forEachTokenizer(t *testing.T, fn func(t *testing.T, tok *Tokenizer, g *golden)) {
	names, all := testTokenizers(t)
	for _, name := range names {
		l := all[name]
		t.Run(name, func(t *testing.T) {
			if l.err != nil {
				t.Fatal(l.err)
			}
			if len(l.golden.Errors) > 0 {
				t.Fatalf("golden generation reported errors: %v", l.golden.Errors)
			}
			fn(t, l.tok, l.golden)
		})
	}
}

func TestGoldenEncode(t *testing.T) {
	forEachTokenizer(t, func(t *testing.T, tok *Tokenizer, g *golden) {
		if len(g.Encode) < 500 {
			t.Fatalf("only %d encode goldens", len(g.Encode))
		}
		bad := 0
		for _, c := range g.Encode {
			for _, special := range []bool{false, true} {
				want := c.IDs
				if special {
					want = c.IDsSpecial
				}
				got, err := tok.Encode(c.Text, special)
				if err != nil {
					t.Fatalf("Encode(%q): %v", c.Text, err)
				}
				if !slices.Equal(got, want) {
					bad++
					if bad <= 5 {
						t.Errorf("Encode(%q, %v)\n got %v\nwant %v", c.Text, special, got, want)
					}
				}
			}
		}
		if bad > 0 {
			t.Errorf("%d of %d encodings differ from HF", bad, 2*len(g.Encode))
		}
	})
}

func TestGoldenDecode(t *testing.T) {
	forEachTokenizer(t, func(t *testing.T, tok *Tokenizer, g *golden) {
		bad := 0
		for _, c := range g.Decode {
			for _, skip := range []bool{false, true} {
				want := c.Text
				if skip {
					want = c.TextSkip
				}
				got, err := tok.Decode(c.IDs, skip)
				if err != nil {
					t.Fatalf("Decode(%v): %v", c.IDs, err)
				}
				if got != want {
					bad++
					if bad <= 5 {
						t.Errorf("Decode(%v, %v)\n got %q\nwant %q", c.IDs, skip, got, want)
					}
				}
			}
		}
		if bad > 0 {
			t.Errorf("%d of %d decodings differ from HF", bad, 2*len(g.Decode))
		}
	})
}

// TestStreamingDecoder feeds ids one at a time: every piece must be valid
// UTF-8, and the pieces must add up to HF's decoding of the whole.
func TestStreamingDecoder(t *testing.T) {
	forEachTokenizer(t, func(t *testing.T, tok *Tokenizer, g *golden) {
		for _, c := range g.Decode {
			for _, skip := range []bool{false, true} {
				want := c.Text
				if skip {
					want = c.TextSkip
				}
				d := NewDecoder(tok, skip)
				var b strings.Builder
				for _, id := range c.IDs {
					s, err := d.Add(id)
					if err != nil {
						t.Fatal(err)
					}
					if !strings.HasPrefix(want[b.Len():], s) {
						t.Fatalf("ids %v skip=%v: after %q Add gave %q, which the final text %q does not continue with",
							c.IDs, skip, b.String(), s, want)
					}
					b.WriteString(s)
				}
				b.WriteString(d.Flush())
				if b.String() != want {
					t.Fatalf("ids %v skip=%v: streamed %q, want %q", c.IDs, skip, b.String(), want)
				}
			}
		}
	})
}

func TestGoldenChatTemplate(t *testing.T) {
	var chats [][]struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	if err := json.Unmarshal(readMaybeGz(t, "testdata/chats.json"), &chats); err != nil {
		t.Fatal(err)
	}
	forEachTokenizer(t, func(t *testing.T, tok *Tokenizer, g *golden) {
		if tok.HasChatTemplate() != g.HasChatTemplate {
			t.Fatalf("HasChatTemplate = %v, HF says %v", tok.HasChatTemplate(), g.HasChatTemplate)
		}
		if !g.HasChatTemplate {
			if _, err := tok.ApplyChatTemplate([]Message{{Role: "user", Content: "x"}}, true); err == nil {
				t.Fatal("ApplyChatTemplate without a template: want an error")
			}
			return
		}
		if len(g.Chat) == 0 {
			t.Fatal("no chat goldens")
		}
		for _, c := range g.Chat {
			var msgs []Message
			for _, m := range chats[c.Conversation] {
				msgs = append(msgs, Message{Role: m.Role, Content: m.Content})
			}
			got, err := tok.ApplyChatTemplateVars(msgs, c.AddGenerationPrompt, c.Vars)
			name := fmt.Sprintf("conversation %d agp=%v vars=%v", c.Conversation, c.AddGenerationPrompt, c.Vars)
			if c.Error != nil {
				if err == nil {
					t.Errorf("%s: got %q, want an error like %q", name, got, *c.Error)
				} else if !strings.Contains(*c.Error, strings.TrimPrefix(err.Error(), "apply chat template: ")) {
					t.Errorf("%s: error %q, HF raised %q", name, err, *c.Error)
				}
				continue
			}
			if err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			if got != *c.Text {
				t.Errorf("%s:\n got %q\nwant %q", name, got, *c.Text)
			}
		}
	})
}
