package cuda

import (
	"strings"
	"testing"
)

// TestCheckAttention: the shapes the attention kernels take pass, others
// are refused with the reason; no GPU needed.
func TestCheckAttention(t *testing.T) {
	cases := []struct {
		h, kvh, d int
		want      string // "" accepts; else part of the error
	}{
		{32, 8, 128, ""}, // Llama 3 8B
		{40, 8, 128, ""}, // Qwen3 14B
		{10, 5, 32, ""},  // the default model
		{4, 2, 16, ""},   // the test fixtures
		{16, 8, 256, ""}, // Gemma-sized heads
		{16, 8, 24, "head dim 24"},
		{16, 8, 80, "head dim 80"},
		{16, 8, 512, "head dim 512"},
		{12, 8, 64, "multiple of the KV heads"},
		{0, 0, 64, "positive counts"},
		{70000, 70000, 64, "at most 65535"},
	}
	for _, c := range cases {
		err := checkAttention(c.h, c.kvh, c.d)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%d/%d heads, head dim %d: %v, want accepted", c.h, c.kvh, c.d, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%d/%d heads, head dim %d: %v, want an error saying %q", c.h, c.kvh, c.d, err, c.want)
		}
	}
}
