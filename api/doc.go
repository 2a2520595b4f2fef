// Package api serves trigon's OpenAI-compatible HTTP API: /v1/completions,
// /v1/chat/completions (JSON or server-sent events), /v1/models, vLLM's
// /tokenize and /detokenize, /health and /metrics.
//
// The package owns request validation, the chat template call,
// tokenization, streaming, auth, limits and OpenAI-shaped errors. It knows
// the engine and the tokenizer only through the small Engine and Tokenizer
// interfaces defined here, so it can be tested with a fake model and the
// engine can change behind it.
//
// Choices made where OpenAI's API leaves room:
//   - "model" may be omitted or name the served model; any other name is
//     404 (as vLLM), so a client never silently gets a different model.
//   - response_format json_object is enforced by constrained decoding (the
//     engine masks every token that would break the JSON object);
//     json_schema is refused with 400: the server cannot guarantee a
//     schema. {"type": "text"} is accepted.
//   - tools, logit_bias, suffix, best_of != n, echo with logprobs and
//     batched prompts are refused with 400 naming the field; unknown fields
//     (user, metadata, store, ...) are ignored.
//   - max_tokens follows sample.LengthRule, the engine's rule: an explicit
//     value that does not fit the context is refused with a context-length
//     message in vLLM's shape that names the prompt or the messages and
//     gives the numbers; an omitted one defaults to 16 for completions
//     (OpenAI's legacy default) and to the rest of the context for chat,
//     shrunk to fit.
//   - Graceful shutdown: Server.Drain answers new generation requests 503
//     (before their body is read) while the ones in flight go on; a
//     request still sending its body gets the 503 at once, not at its body
//     timeout. WaitReplies waits for the replies in flight, not for
//     clients still sending a body. A body that fails (408, 413, or cut by
//     the drain) closes the connection after the reply.
//   - The API key, when set, guards every route except /health and
//     /metrics.
//
// Usage:
//
//	srv, err := api.New(api.Options{Engine: eng, Tokenizer: tok,
//		Model: api.ModelInfo{ID: "llama-3-8b", MaxContext: 8192}})
//	if err != nil { ... }
//	hs := api.NewHTTPServer(":8000", srv.Handler())
//	err = hs.ListenAndServe()
package api
