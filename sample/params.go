// Package sample turns a request's sampling parameters into tokens and
// decides when a request stops.
//
// It holds the per-request state the engine keeps on the host: the seeded
// random stream (Sampler), logits processors (penalties, the min_tokens EOS
// mask), logprobs, and the stop-condition checker that also decides which
// detokenized text may be streamed (StopChecker); and the rule of a
// request's output length (LengthRule), which the engine applies to every
// request. The selection rule itself (temperature, top-k, top-p, min-p,
// choice by U) lives once, in backend/samplerule's Pick, which
// Sampler.Pick calls and every device kernel is tested against.
//
// A request's lifecycle:
//
//	p := sample.Defaults(genConfig)          // model defaults
//	// ... overwrite the fields the request sets ...
//	if err := p.Validate(); err != nil { ... }
//	p.MaxTokens, err = sample.LengthRule{Context: ctx}.MaxTokens(asked, len(prompt), p.MinTokens)
//	s, _ := sample.NewSampler(p, choice)
//	stop := sample.NewStopChecker(p, eosIDs)
//	for each step:
//	    raw := slices.Clone(logits)             // only when logprobs are asked
//	    stop.Mask(logits)                       // min_tokens
//	    s.ApplyPenalties(logits, generated, prompt)
//	    tok, _ := s.Pick(logits)                // or s.Row() for a device Sample
//	    lp, top, _ := s.Logprobs(raw, tok, p.Logprobs)
//	    done, reason, text := stop.Add(tok, detokenizedDelta) // stop conditions; MaxTokens is the scheduler's
package sample

import (
	"fmt"
	"math"
)

// Limits of Params, as the OpenAI API documents them (temperature and
// logprobs) or as this server chooses (stop strings).
const (
	MaxTemperature = 2
	MaxLogprobs    = 20
	MaxStopStrings = 64
	MaxStopLen     = 1024 // bytes of one stop string
)

// Params are one request's sampling parameters, after the API layer has
// merged the request over Defaults.
type Params struct {
	// Temperature scales logits; 0 (or below 1e-5) is greedy.
	Temperature float32
	// TopP keeps the smallest set of most likely tokens whose mass reaches
	// TopP; 1 is off.
	TopP float32
	// MinP keeps tokens whose probability is at least MinP times the top
	// token's; 0 is off.
	MinP float32
	// TopK keeps the TopK most likely tokens; 0 or -1 is off.
	TopK int
	// RepetitionPenalty (HF semantics, 1 is off) divides positive and
	// multiplies negative logits of every token seen in the prompt or the
	// output.
	RepetitionPenalty float32
	// PresencePenalty and FrequencyPenalty (OpenAI semantics, 0 is off)
	// subtract presence + frequency*count from tokens of the output.
	PresencePenalty  float32
	FrequencyPenalty float32
	// Seed makes sampling reproducible; nil draws a random seed.
	Seed *uint64
	// MaxTokens bounds the generated tokens; 0: not given. LengthRule
	// resolves it (the engine does, for every request), so Validate does
	// not look at it.
	MaxTokens int
	// MinTokens is the number of tokens generated before EOS, stop token
	// ids or stop strings may end the request.
	MinTokens int
	// Stop strings end the request; they are not part of the output.
	Stop []string
	// StopTokenIDs end the request like EOS; their text is not emitted.
	StopTokenIDs []int32
	// IgnoreEOS keeps generating past the model's EOS tokens.
	IgnoreEOS bool
	// Logprobs is the number of most likely alternatives to return with
	// each token's logprob, 0..MaxLogprobs.
	Logprobs int
}

// greedyBelow is the temperature under which sampling is greedy, as vLLM
// does: dividing by a smaller one only amplifies rounding.
const greedyBelow = 1e-5

// Validate reports the first parameter out of range, in the terms of the
// OpenAI API field names so the API layer can return it as is.
func (p Params) Validate() error {
	finite := func(v float32) bool { return !math.IsNaN(float64(v)) && !math.IsInf(float64(v), 0) }
	switch {
	case !finite(p.Temperature) || p.Temperature < 0 || p.Temperature > MaxTemperature:
		return fmt.Errorf("temperature must be in [0, %d], got %v", MaxTemperature, p.Temperature)
	case !finite(p.TopP) || p.TopP <= 0 || p.TopP > 1:
		return fmt.Errorf("top_p must be in (0, 1], got %v", p.TopP)
	case !finite(p.MinP) || p.MinP < 0 || p.MinP > 1:
		return fmt.Errorf("min_p must be in [0, 1], got %v", p.MinP)
	case p.TopK < -1:
		return fmt.Errorf("top_k must be -1 or 0 (off) or positive, got %d", p.TopK)
	case !finite(p.RepetitionPenalty) || p.RepetitionPenalty <= 0:
		return fmt.Errorf("repetition_penalty must be a positive number, got %v", p.RepetitionPenalty)
	case !finite(p.PresencePenalty) || p.PresencePenalty < -2 || p.PresencePenalty > 2:
		return fmt.Errorf("presence_penalty must be in [-2, 2], got %v", p.PresencePenalty)
	case !finite(p.FrequencyPenalty) || p.FrequencyPenalty < -2 || p.FrequencyPenalty > 2:
		return fmt.Errorf("frequency_penalty must be in [-2, 2], got %v", p.FrequencyPenalty)
	case p.MinTokens < 0:
		return fmt.Errorf("min_tokens must be non-negative, got %d", p.MinTokens)
	case p.Logprobs < 0 || p.Logprobs > MaxLogprobs:
		return fmt.Errorf("logprobs must be in [0, %d], got %d", MaxLogprobs, p.Logprobs)
	case len(p.Stop) > MaxStopStrings:
		return fmt.Errorf("at most %d stop strings are allowed, got %d", MaxStopStrings, len(p.Stop))
	}
	for i, s := range p.Stop {
		if s == "" || len(s) > MaxStopLen {
			return fmt.Errorf("stop[%d] must be 1 to %d bytes long, got %d", i, MaxStopLen, len(s))
		}
	}
	for i, id := range p.StopTokenIDs {
		if id < 0 {
			return fmt.Errorf("stop_token_ids[%d] must be non-negative, got %d", i, id)
		}
	}
	return nil
}

// Neutral returns parameters that change nothing: temperature 1, no
// filters, no penalties. Callers lay a model's generation config and then
// the request over them.
func Neutral() Params {
	return Params{Temperature: 1, TopP: 1, RepetitionPenalty: 1}
}
