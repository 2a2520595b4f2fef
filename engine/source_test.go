package engine_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/backend/cpu"
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
		notGGUF:                                  []byte("{}"),
		truncated:                                head[:1000],
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

// TestMaxContextAboveTheModelsIsRefused: a context cap up to the model's
// own (1024 for the fixture) is served; one above it is refused, at load
// and by ContextLength, as vLLM refuses a max_model_len above
// max_position_embeddings, naming the flag, the value and the model's.
func TestMaxContextAboveTheModelsIsRefused(t *testing.T) {
	for _, tc := range []struct {
		maxContext, want int
		msg              string // "": no error
	}{
		{0, 1024, ""},
		{512, 512, ""},
		{1024, 1024, ""},
		{1025, 0, "--max-model-len 1025 is more than the model's context of 1024 tokens"},
	} {
		t.Run(fmt.Sprint(tc.maxContext), func(t *testing.T) {
			check := func(what string, got int, err error) {
				t.Helper()
				switch {
				case tc.msg == "" && (err != nil || got != tc.want):
					t.Errorf("%s: %d, %v; want %d", what, got, err, tc.want)
				case tc.msg != "" && (err == nil || !strings.Contains(err.Error(), tc.msg)):
					t.Errorf("%s: %d, %v; want an error saying %q", what, got, err, tc.msg)
				}
			}
			n, err := engine.ContextLength(fixture, tc.maxContext)
			check("ContextLength", n, err)
			l, err := engine.Load(engine.LoadOptions{Model: fixture, Backend: cpu.New(cpu.Options{Threads: 1}),
				MaxContext: tc.maxContext, MaxSeqs: 2, MaxBatchedTokens: 64, KVBlocks: 80})
			if err == nil {
				n = l.Context
				l.Close()
			}
			check("Load", n, err)
		})
	}
}
