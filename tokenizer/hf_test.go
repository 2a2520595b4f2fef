package tokenizer

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// tinyTokenizerJSON is a minimal byte-level tokenizer.json: the 256 byte
// pieces, one merge, two added tokens.
func tinyTokenizerJSON(t *testing.T, mutate func(map[string]any)) []byte {
	t.Helper()
	vocab := map[string]any{}
	for b := 0; b < 256; b++ {
		vocab[string(byteToRune[b])] = b
	}
	vocab["ab"] = 256
	doc := map[string]any{
		"added_tokens": []any{
			map[string]any{"id": 257, "content": "<|end|>", "special": true, "normalized": false},
			map[string]any{"id": 258, "content": "<|eot|>", "special": true, "normalized": false},
		},
		"pre_tokenizer": map[string]any{"type": "ByteLevel", "add_prefix_space": false},
		"decoder":       map[string]any{"type": "ByteLevel"},
		"model":         map[string]any{"type": "BPE", "vocab": vocab, "merges": []any{[]any{"a", "b"}}},
	}
	if mutate != nil {
		mutate(doc)
	}
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestFromHFJSONConfig(t *testing.T) {
	cases := []struct {
		name    string
		config  string
		wantEOS []TokenID
		wantBOS TokenID
		wantErr string
	}{
		{"none", `{}`, nil, -1, ""},
		{"string eos", `{"eos_token": "<|end|>"}`, []TokenID{257}, -1, ""},
		{"object eos", `{"eos_token": {"content": "<|eot|>", "lstrip": false}}`, []TokenID{258}, -1, ""},
		{"list eos", `{"eos_token": ["<|end|>", "<|eot|>", "<|end|>"]}`, []TokenID{257, 258}, -1, ""},
		{"bos", `{"bos_token": "<|end|>", "eos_token": null}`, nil, 257, ""},
		{"unknown eos", `{"eos_token": "<nope>"}`, nil, -1, "not in the vocabulary"},
		{"bad template", `{"chat_template": "{% if %}"}`, nil, -1, "chat template"},
		{"not json", `{`, nil, -1, "tokenizer_config.json"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tok, err := FromHFJSON(tinyTokenizerJSON(t, nil), []byte(c.config))
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want one mentioning %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(tok.EOS(), c.wantEOS) {
				t.Errorf("EOS = %v, want %v", tok.EOS(), c.wantEOS)
			}
			if got, ok := tok.BOS(); got != c.wantBOS || ok != (c.wantBOS >= 0) {
				t.Errorf("BOS = %d %v, want %d", got, ok, c.wantBOS)
			}
		})
	}
}

func TestFromHFJSONRejectsUnsupported(t *testing.T) {
	cases := map[string]func(map[string]any){
		"unigram":      func(d map[string]any) { d["model"].(map[string]any)["type"] = "Unigram" },
		"dropout":      func(d map[string]any) { d["model"].(map[string]any)["dropout"] = 0.1 },
		"suffix":       func(d map[string]any) { d["model"].(map[string]any)["end_of_word_suffix"] = "</w>" },
		"bad merge":    func(d map[string]any) { d["model"].(map[string]any)["merges"] = []any{"a"} },
		"merge oov":    func(d map[string]any) { d["model"].(map[string]any)["merges"] = []any{"q z"} },
		"merges type":  func(d map[string]any) { d["model"].(map[string]any)["merges"] = 7 },
		"empty vocab":  func(d map[string]any) { d["model"].(map[string]any)["vocab"] = map[string]any{} },
		"negative id":  func(d map[string]any) { d["model"].(map[string]any)["vocab"].(map[string]any)["zz"] = -4 },
		"huge id":      func(d map[string]any) { d["model"].(map[string]any)["vocab"].(map[string]any)["zz"] = 1 << 40 },
		"unk missing":  func(d map[string]any) { d["model"].(map[string]any)["unk_token"] = "<unk>" },
		"normalizer":   func(d map[string]any) { d["normalizer"] = map[string]any{"type": "Precompiled"} },
		"pretokenizer": func(d map[string]any) { d["pre_tokenizer"] = map[string]any{"type": "Whitespace"} },
		"after bytelvl": func(d map[string]any) {
			d["pre_tokenizer"] = map[string]any{"type": "Sequence", "pretokenizers": []any{map[string]any{"type": "ByteLevel"}, map[string]any{"type": "Metaspace"}}}
		},
		"bad regex": func(d map[string]any) {
			d["pre_tokenizer"] = map[string]any{"type": "Split", "pattern": map[string]any{"Regex": "(("}}
		},
		"decoder": func(d map[string]any) { d["decoder"] = map[string]any{"type": "WordPiece"} },
		"post": func(d map[string]any) {
			d["post_processor"] = map[string]any{"type": "TemplateProcessing", "single": []any{}}
		},
		"empty added":    func(d map[string]any) { d["added_tokens"] = []any{map[string]any{"id": 300, "content": ""}} },
		"added id range": func(d map[string]any) { d["added_tokens"] = []any{map[string]any{"id": -1, "content": "x"}} },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			if _, err := FromHFJSON(tinyTokenizerJSON(t, mutate), nil); err == nil {
				t.Fatal("want an error")
			}
		})
	}
	if _, err := FromHFJSON([]byte("{not json"), nil); err == nil {
		t.Fatal("bad JSON: want an error")
	}
	tok, err := FromHFJSON(tinyTokenizerJSON(t, nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := tok.Encode("cab<|end|>", false)
	if err != nil || !slices.Equal(ids, []TokenID{'c', 256, 257}) {
		t.Fatalf("tiny tokenizer: Encode = %v, %v", ids, err)
	}
}
