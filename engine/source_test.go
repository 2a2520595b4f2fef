package engine_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/engine"
)

// TestLoadTokenizerErrorsSayItOnce: a tokenizer that does not load is
// named once, after one "load tokenizer from", whichever layer failed
// (the file system, the GGUF parser, tokenizer.FromHFDir).
func TestLoadTokenizerErrorsSayItOnce(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing")
	noJSON := filepath.Join(dir, "nojson")
	unigram := filepath.Join(dir, "unigram")
	notGGUF := filepath.Join(dir, "model.gguf")
	truncated := filepath.Join(dir, "truncated.gguf")
	for _, d := range []string{noJSON, unigram} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	head, err := os.ReadFile(defaultModel)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{
		filepath.Join(unigram, "tokenizer.json"): []byte(`{"model": {"type": "Unigram"}}`),
		notGGUF:   []byte("{}"),
		truncated: head[:1000],
	} {
		if err := os.WriteFile(name, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name, path, want string // want: the message's start
	}{
		{"missing", missing, "load tokenizer from " + missing + ": no such file or directory"},
		{"no tokenizer.json", noJSON, "load tokenizer from " + noJSON + ": open " + filepath.Join(noJSON, "tokenizer.json") + ": "},
		{"unsupported model", unigram, "load tokenizer from " + unigram + ": tokenizer.json model: "},
		{"not GGUF", notGGUF, "load tokenizer from " + notGGUF + ": not a model directory or a GGUF file"},
		{"truncated GGUF", truncated, "load tokenizer from " + truncated + ": gguf: invalid file at byte "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := engine.LoadTokenizer(tc.path)
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Errorf("got %v, want an error starting %q", err, tc.want)
			}
		})
	}
}
