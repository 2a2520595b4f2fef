package api

import (
	"context"
	"errors"
)

// Engine is what the HTTP layer needs from the inference engine. The api
// package owns this interface so that it depends on nothing below it; the
// engine is adapted to it.
type Engine interface {
	// Generate starts one request with req.N choices and streams its
	// progress. Events of different choices may interleave; each choice
	// ends with exactly one event whose FinishReason is set, and the
	// channel is closed after the last choice has ended.
	//
	// Cancelling ctx aborts the request and frees its resources (KV
	// blocks, queue slot). After cancellation the engine may skip the final
	// events, but it must still close the channel, and it must never block
	// forever on a send: the api keeps draining the channel until it is
	// closed, so a plain send is safe, and a send that selects on
	// ctx.Done() is also fine.
	//
	// Errors returned directly map to HTTP statuses: ErrQueueFull -> 429,
	// ErrNotReady and ErrShuttingDown -> 503, anything wrapping ErrBadRequest -> 400 (its text
	// is shown to the client, less a leading "bad request: "), anything
	// else -> 500.
	//
	// The engine may keep req; the api does not modify it after the call.
	Generate(ctx context.Context, req *GenerateRequest) (<-chan Event, error)

	// Ready reports whether the engine accepts requests: false while the
	// model loads or the server drains (/health then answers 503).
	Ready() bool
}

// Errors an Engine returns from Generate (or sets as Event.Err, wrapped as
// it likes) to choose the HTTP status.
var (
	// ErrQueueFull rejects a request because the waiting queue is at its
	// bound; clients should retry later (429).
	ErrQueueFull = errors.New("the server is at capacity, please retry later")
	// ErrNotReady rejects a request while the engine loads (503).
	ErrNotReady = errors.New("the model is not ready")
	// ErrShuttingDown rejects a request while the server drains (503):
	// clients should retry on another replica.
	ErrShuttingDown = errors.New("the server is shutting down")
	// ErrBadRequest marks a request the engine cannot serve as asked, for
	// example one needing more KV blocks than the cache has (400).
	ErrBadRequest = errors.New("bad request")
)

// Finish reasons carried by Event.FinishReason.
const (
	FinishStop   = "stop"   // EOS, a stop token id or a stop string
	FinishLength = "length" // MaxTokens reached (or the context is full)
	FinishAbort  = "abort"  // aborted by the engine (shutdown) or by ctx
	FinishError  = "error"  // Event.Err says why
)

// GenerateRequest is one validated request, already tokenized.
type GenerateRequest struct {
	// RequestID is unique per request ("cmpl-..." / "chatcmpl-..."); the
	// engine uses it in logs and traces.
	RequestID string
	// Prompt is the tokenized prompt, BOS and chat template included.
	Prompt []int32 // [numPromptTokens]
	// N is the number of choices, 1 or more. Choices share the prompt (and
	// its KV blocks through the prefix cache) and must sample
	// independently: with a seed, choice i should draw from a stream of the
	// seed and i, so choices differ while the request stays reproducible
	// (vLLM seeds choice i with Seed+i; engine.Request.N says how trigon's
	// engine does).
	N int
	// Sampling holds the sampling and stopping parameters of every choice.
	Sampling SamplingParams
	// Logprobs asks for the log-probability of each sampled token.
	Logprobs bool
	// TopLogprobs asks additionally for the k most likely tokens at each
	// position (0..20); only meaningful with Logprobs.
	TopLogprobs int
}

// SamplingParams are the per-request sampling and stopping parameters.
// Zero values mean "off" wherever that is meaningful, so the api always
// sets every field explicitly from the request or its defaults.
type SamplingParams struct {
	// Temperature divides the logits; 0 means greedy (argmax).
	Temperature float32
	// TopP keeps the smallest set of tokens whose probability reaches TopP;
	// 1 keeps all.
	TopP float32
	// TopK keeps the K most likely tokens; 0 keeps all.
	TopK int
	// MinP drops tokens less likely than MinP times the top token; 0 off.
	MinP float32
	// RepetitionPenalty (1 off) divides positive and multiplies negative
	// logits of tokens seen in the prompt or output.
	RepetitionPenalty float32
	// PresencePenalty (0 off) is subtracted once from the logit of every
	// token already generated; FrequencyPenalty (0 off) is subtracted per
	// occurrence.
	PresencePenalty  float32
	FrequencyPenalty float32
	// Seed makes sampling reproducible; nil means a random seed.
	Seed *uint64
	// MaxTokens bounds the generated tokens per choice (>= 1); reaching it
	// ends the choice with FinishLength.
	MaxTokens int
	// MinTokens suppresses EOS and StopTokenIDs until this many tokens
	// were generated (stop strings still apply, as in vLLM).
	MinTokens int
	// Stop strings end a choice when they appear in the output; the engine
	// removes the matched string and anything after it from the text, and
	// holds back text that could still become a stop string.
	Stop []string
	// StopTokenIDs end a choice like EOS does; the token is not shown.
	StopTokenIDs []int32
	// IgnoreEOS keeps generating past EOS until MaxTokens (benchmarking).
	IgnoreEOS bool
	// SkipSpecialTokens leaves special tokens out of the output text.
	SkipSpecialTokens bool
	// JSONObject constrains the output to one JSON object
	// (response_format json_object): tokens that would break it are never
	// sampled, and EOS only once the object is complete.
	JSONObject bool
}

// Event reports progress of one choice. Slices in an event belong to the
// api once sent; the engine must not reuse them.
type Event struct {
	// Choice is the index of the choice, 0 <= Choice < N.
	Choice int
	// Text is the new output text since the previous event of this
	// choice: UTF-8-safe (never half a character) with stop strings
	// already removed. Concatenating a choice's Text values gives its
	// whole output.
	Text string
	// TokenIDs are the tokens sampled since the previous event, including
	// an EOS or stop token that ends the choice (it counts in usage, its
	// text is not shown). usage.completion_tokens is their total count.
	TokenIDs []int32 // [numNewTokens]
	// Logprobs holds one entry per token in TokenIDs when the request
	// asked for logprobs, nil otherwise.
	Logprobs []TokenLogprob // [numNewTokens]
	// FinishReason is "" while the choice runs, else one of the Finish*
	// constants; it is set on the last event of the choice.
	FinishReason string
	// Err explains FinishReason == FinishError.
	Err error
	// CachedPromptTokens, set on the final event, is how many prompt tokens
	// were served from the prefix cache (usage.prompt_tokens_details).
	CachedPromptTokens int
}

// TokenLogprob is the log-probability of one sampled token and its top
// alternatives. Values are log-softmax of the model's raw logits, before
// temperature and penalties (vLLM's default), so they describe the model,
// not the sampler. The api renders token text and bytes itself through the
// Tokenizer, so the engine only deals in ids.
type TokenLogprob struct {
	ID      int32
	Logprob float32
	// Top holds the TopLogprobs most likely tokens, most likely first.
	Top []TopLogprob // [topLogprobs]
}

// TopLogprob is one alternative token at a position.
type TopLogprob struct {
	ID      int32
	Logprob float32
}

// Tokenizer is what the HTTP layer needs from the tokenizer.
type Tokenizer interface {
	// Encode tokenizes text; addSpecial adds BOS (and whatever the model's
	// tokenizer config adds).
	Encode(text string, addSpecial bool) ([]int32, error)
	// Decode turns ids back into text. It fails on ids outside the vocab.
	Decode(ids []int32, skipSpecial bool) (string, error)
	// ApplyChatTemplate renders messages with the model's chat template.
	// Errors raised by the template (such as roles that do not alternate)
	// are reported to the client as 400.
	ApplyChatTemplate(msgs []ChatMessage, addGenerationPrompt bool) (string, error)
	// TokenString returns the text a token contributes to decoded output
	// (byte-level BPE bytes unmapped, SentencePiece "▁" as a space), as raw
	// bytes that may be an incomplete UTF-8 sequence. ok is false for ids
	// outside the vocab; the api uses it to validate ids and to render
	// logprobs.
	TokenString(id int32) (s string, ok bool)
}

// ChatMessage is one message handed to the chat template. Roles are
// "system", "user" and "assistant" (OpenAI's "developer" arrives as
// "system").
type ChatMessage struct {
	Role    string
	Content string
}

// ModelInfo describes the served model for /v1/models and validation.
type ModelInfo struct {
	// ID is the name clients pass as "model".
	ID string
	// MaxContext is the context length in tokens (prompt + completion).
	MaxContext int
	// Created is a Unix time shown in /v1/models.
	Created int64
	// OwnedBy is shown in /v1/models; empty means "trigon".
	OwnedBy string
}
