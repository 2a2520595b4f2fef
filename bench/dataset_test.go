package bench

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestParseCustomDataset(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want []string
		err  string
	}{
		{"two", "{\"prompt\": \"a\"}\n{\"prompt\": \"b\\nc\"}\n", []string{"a", "b\nc"}, ""},
		{"blank lines and other fields", "\n{\"prompt\": \"a\", \"output_tokens\": 9}\n  \n{\"prompt\":\"<b>\"}", []string{"a", "<b>"}, ""},
		{"not json", "{\"prompt\": \"a\"}\nprompt: b\n", nil, "line 2"},
		{"no prompt", "{\"text\": \"a\"}\n", nil, "line 1: no string field"},
		{"number", "{\"prompt\": 3}\n", nil, "line 1"},
		{"empty prompt", "{\"prompt\": \"\"}\n", nil, "empty prompt"},
		{"empty file", "\n\n", nil, "no prompts"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseCustomDataset(strings.NewReader(tc.in))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestLoadCustomDataset(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.jsonl")
	if err := os.WriteFile(path, []byte("{\"prompt\": \"x\"}\n{\"prompt\": 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCustomDataset(path); err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("error %v: want the path and the line", err)
	}
	if _, err := LoadCustomDataset(path + ".missing"); err == nil {
		t.Error("a missing file loaded")
	}
	// The committed prompt sets of docs/speculative.md load.
	for _, f := range []string{"edit.jsonl", "heldout.jsonl"} {
		ps, err := LoadCustomDataset(filepath.Join("..", "models", "default", "prompts", f))
		if err != nil || len(ps) != 50 {
			t.Errorf("%s: %d prompts, %v", f, len(ps), err)
		}
	}
}
