package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/format/gguf"
)

// TestConvertPreTokenizerFlag: --pre-tokenizer writes the name it is given
// as tokenizer.ggml.pre, read back from the file; warns on stderr when the
// name's split is not the tokenizer's (the fixture's is gpt-2's); and
// refuses a name trigon does not know, writing no file.
func TestConvertPreTokenizerFlag(t *testing.T) {
	for _, c := range []struct {
		pre  string
		warn bool
		err  string
	}{
		{"llama-bpe", true, ""},
		{"qwen2", true, ""},
		{"gpt-2", false, ""},
		{"gpt2", false, ""},
		{"bogus-bpe", false, `"bogus-bpe" is not one trigon knows`},
	} {
		t.Run(c.pre, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "out.gguf")
			_, errOut, err := execute(t, "", "convert", "--type", "f16", "--pre-tokenizer", c.pre, "../../testdata/models/qwen3", dst)
			if c.err != "" {
				if _, serr := os.Stat(dst); err == nil || !strings.Contains(err.Error(), c.err) || serr == nil {
					t.Fatalf("%v (file stat: %v), want an error containing %q and no file", err, serr, c.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("%v\n%s", err, errOut)
			}
			warned := strings.Contains(errOut, "warning: "+dst+`: pre-tokenizer "`+c.pre+`" does not split text as the tokenizer's own "gpt-2"`)
			if warned != c.warn {
				t.Errorf("stderr %q: warning %v, want %v", errOut, warned, c.warn)
			}
			f, err := gguf.Open(dst)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if got, _ := f.String("tokenizer.ggml.pre"); got != c.pre {
				t.Errorf("tokenizer.ggml.pre %q, want %q", got, c.pre)
			}
		})
	}
}
