package sample

import (
	"errors"
	"math"
	"strings"
	"testing"
)

// TestLengthRule is the max_tokens rule, case by case, for a prompt of 30
// tokens in a context of 100 (70 left).
func TestLengthRule(t *testing.T) {
	n := func(v int) *int { return &v }
	ctx := LengthRule{Context: 100}
	for _, c := range []struct {
		name      string
		rule      LengthRule
		requested *int
		prompt    int
		minTokens int
		want      int
		problem   LengthProblem // 0: resolves to want
	}{
		{"absent: the context left", ctx, nil, 30, 0, 70, 0},
		{"absent: shrunk to the default", LengthRule{Context: 100, Default: 16}, nil, 30, 0, 16, 0},
		{"absent: a default larger than the room shrinks", LengthRule{Context: 100, Default: 500}, nil, 30, 0, 70, 0},
		{"absent: shrunk to the cap", LengthRule{Context: 100, Default: 50, Cap: 20}, nil, 30, 0, 20, 0},
		{"absent: prompt fills the context", ctx, nil, 100, 0, 0, ContextExceeded},
		{"absent: prompt past the context", ctx, nil, 120, 3, 0, ContextExceeded},
		{"0", ctx, n(0), 30, 0, 0, MaxTokensTooSmall},
		{"negative", ctx, n(-5), 30, 0, 0, MaxTokensTooSmall},
		{"1", ctx, n(1), 30, 0, 1, 0},
		{"within the context", ctx, n(40), 30, 0, 40, 0},
		{"exactly the context left", ctx, n(70), 30, 0, 70, 0},
		{"larger than the context left", ctx, n(71), 30, 0, 0, ContextExceeded},
		{"huge", ctx, n(math.MaxInt), 30, 0, 0, ContextExceeded},
		{"given over the default", LengthRule{Context: 100, Default: 16}, n(60), 30, 0, 60, 0},
		{"given over the cap", LengthRule{Context: 100, Cap: 32}, n(40), 30, 0, 0, MaxTokensOverCap},
		{"given at the cap", LengthRule{Context: 100, Cap: 32}, n(32), 30, 0, 32, 0},
		{"min_tokens at max", ctx, n(5), 30, 5, 5, 0},
		{"min_tokens over max", ctx, n(5), 30, 6, 0, MinTokensOverMax},
		{"min_tokens over the shrunk default", LengthRule{Context: 100, Default: 16}, nil, 30, 17, 0, MinTokensOverMax},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := c.rule.MaxTokens(c.requested, c.prompt, c.minTokens)
			if c.problem == 0 {
				if err != nil || got != c.want {
					t.Fatalf("got %d, %v; want %d", got, err, c.want)
				}
				return
			}
			var le *LengthError
			if !errors.As(err, &le) || le.Problem != c.problem {
				t.Fatalf("got %d, %v; want a LengthError of problem %d", got, err, c.problem)
			}
		})
	}
}

// TestLengthErrorNumbers checks what the errors report: the request's
// total without overflow, and the least output of a request without
// max_tokens whose prompt fills the context.
func TestLengthErrorNumbers(t *testing.T) {
	huge := math.MaxInt
	_, err := LengthRule{Context: 100}.MaxTokens(&huge, 30, 0)
	var le *LengthError
	if !errors.As(err, &le) || le.Requested() != math.MaxInt || le.MaxTokens != huge {
		t.Fatalf("huge max_tokens: %v", err)
	}
	_, err = LengthRule{Context: 100}.MaxTokens(nil, 100, 4)
	if !errors.As(err, &le) || le.MaxTokens != 4 || le.Requested() != 104 {
		t.Fatalf("full prompt with min_tokens 4: %+v", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "maximum context length is 100 tokens") || !strings.Contains(msg, "needs 104 (100 in the prompt, 4 in the completion)") {
		t.Errorf("message %q", msg)
	}
}
