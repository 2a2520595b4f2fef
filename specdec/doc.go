// Package specdec is speculative decoding's policy-free parts: the
// --speculative-config settings (vLLM's JSON keys), the proposers that
// guess the next tokens of a sequence (prompt lookup, a draft model), and
// the acceptance rule that keeps the target model's output distribution.
//
// A step with drafts feeds each decoding sequence its last sampled token
// followed by up to K proposed tokens, so the target computes 1+K logits
// rows for it in one forward pass (a varlen batch, like a prefill chunk).
// Row i is the target's distribution for the token after position i; the
// proposals are accepted in order while the rule accepts them, the first
// rejected one is replaced by a token drawn from the residual
// distribution, and when all K are accepted row K gives one more (bonus)
// token. A step so yields between 1 and K+1 tokens per sequence, whose
// distribution is exactly the target's (Leviathan et al. 2023, Chen et al.
// 2023): see Accept and Residual.
//
//	cfg, err := specdec.ParseConfig(`{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}`)
//	p, err := specdec.NewNGram(cfg)
//	drafts, err := p.Propose([]specdec.Seq{{ID: 1, Tokens: tokens, K: cfg.NumSpeculativeTokens}})
//
// The scheduler (sched: Draft, Update's StepOutput.Accepted) places the
// drafts in a step and rolls the KV cache back past the rejected ones; the
// engine asks the proposer, verifies and streams.
package specdec
