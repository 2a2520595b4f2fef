package sample

import (
	"fmt"
	"math"
)

// LengthRule is the rule of a request's output length (max_tokens), the
// one place it is written. Everything that takes a request from outside
// resolves max_tokens with it: the engine for every request it is handed
// (Params.MaxTokens 0 meaning not given), the HTTP API before the engine
// (to answer in OpenAI's terms: its own default and cap), `trigon run` for
// its flag. What comes after (the scheduler, which ends a sequence at
// MaxTokens) takes the resolved value.
//
// The rule, for a prompt of p tokens and a context of Context tokens:
//   - max_tokens given: it must be at least 1, at most Cap (when Cap > 0),
//     and p + max_tokens must fit in Context. It is never clamped: a client
//     that asks for more than can be served learns so.
//   - max_tokens not given: the Context - p tokens the prompt leaves,
//     shrunk to Default and to Cap where those are set.
//   - Either way the prompt must leave at least one token (p < Context),
//     and min_tokens must not exceed the result.
type LengthRule struct {
	Context int // the model's context length: prompt plus output
	Default int // bound of a request that gives none; 0: the rest of the context
	Cap     int // most a request may ask for; 0: only the context bounds it
}

// LengthProblem says which part of the rule a request broke.
type LengthProblem int

const (
	// MaxTokensTooSmall: max_tokens given below 1.
	MaxTokensTooSmall LengthProblem = iota + 1
	// MaxTokensOverCap: max_tokens given above Cap.
	MaxTokensOverCap
	// ContextExceeded: the prompt and the output do not fit the context.
	ContextExceeded
	// MinTokensOverMax: min_tokens above the resolved max_tokens.
	MinTokensOverMax
)

// LengthError is a request LengthRule refuses, with the numbers an error
// message needs.
type LengthError struct {
	Problem LengthProblem
	Rule    LengthRule
	Prompt  int // prompt tokens
	// MaxTokens is the max_tokens given; for ContextExceeded without one,
	// the least output the request needs (1, or min_tokens); for
	// MinTokensOverMax, the resolved bound.
	MaxTokens int
	MinTokens int
}

// Requested is the tokens the request needs in all, prompt plus output,
// saturating instead of overflowing.
func (e *LengthError) Requested() int {
	if e.MaxTokens > math.MaxInt-e.Prompt {
		return math.MaxInt
	}
	return e.Prompt + e.MaxTokens
}

func (e *LengthError) Error() string {
	switch e.Problem {
	case MaxTokensTooSmall:
		return fmt.Sprintf("max_tokens must be at least 1, got %d", e.MaxTokens)
	case MaxTokensOverCap:
		return fmt.Sprintf("max_tokens must be at most %d, got %d", e.Rule.Cap, e.MaxTokens)
	case ContextExceeded:
		return fmt.Sprintf("this model's maximum context length is %d tokens, but the request needs %d (%d in the prompt, %d in the completion)",
			e.Rule.Context, e.Requested(), e.Prompt, e.MaxTokens)
	case MinTokensOverMax:
		return fmt.Sprintf("min_tokens (%d) must not exceed max_tokens (%d)", e.MinTokens, e.MaxTokens)
	}
	return fmt.Sprintf("max_tokens %d refused", e.MaxTokens)
}

// MaxTokens resolves the output bound of a request whose prompt has
// promptLen tokens: requested is the max_tokens it gives (nil: none). The
// error, when the request breaks the rule, is a *LengthError.
func (r LengthRule) MaxTokens(requested *int, promptLen, minTokens int) (int, error) {
	fail := func(p LengthProblem, maxTokens int) (int, error) {
		return 0, &LengthError{Problem: p, Rule: r, Prompt: promptLen, MaxTokens: maxTokens, MinTokens: minTokens}
	}
	room := r.Context - promptLen
	var mt int
	if requested != nil {
		mt = *requested
		switch {
		case mt < 1:
			return fail(MaxTokensTooSmall, mt)
		case r.Cap > 0 && mt > r.Cap:
			return fail(MaxTokensOverCap, mt)
		case mt > room: // compared so, a huge mt cannot overflow a sum
			return fail(ContextExceeded, mt)
		}
	} else {
		if room < 1 {
			return fail(ContextExceeded, max(1, minTokens))
		}
		mt = room
		if r.Default > 0 {
			mt = min(mt, r.Default)
		}
		if r.Cap > 0 {
			mt = min(mt, r.Cap)
		}
	}
	if minTokens > mt {
		return fail(MinTokensOverMax, mt)
	}
	return mt, nil
}
