// Package tokenizer turns text into token ids and back for the model
// families trigon serves: byte-level BPE (GPT-2, Llama 3, Qwen2/Qwen3) and
// SentencePiece-style BPE (Llama 2, Mistral, TinyLlama).
//
// A Tokenizer comes from a Hugging Face tokenizer.json (FromHFDir,
// FromHFJSON) or from what a GGUF file's tokenizer.ggml.* metadata holds
// (FromSpec), and gives the same ids as HF tokenizers for the layouts those
// families ship: the golden tests in this package compare every id against
// HF tokenizers on a few hundred lines of prose, code, CJK, emoji, whitespace
// runs and embedded special-token strings.
//
// The pipeline mirrors HF tokenizers, stage by stage, so that each stage can
// be checked against its HF counterpart:
//
//	text --added tokens--> segments --normalizer--> --pre-tokenizer--> words --BPE--> ids --post-processor--> ids
//
// Added tokens (special or not) found in the text become their ids whatever
// the addSpecial argument says, as HF does; addSpecial only controls the
// post-processor's BOS/EOS. Encoding caches word -> ids in a size-capped,
// sharded map, so a Tokenizer is safe for concurrent use and repeated words
// cost one map lookup.
//
// Invalid UTF-8 in Encode's input is not an error: each maximal invalid
// subsequence becomes U+FFFD first, as Python's bytes.decode(errors="replace")
// (and so an HF client) would give. Decode and the streaming Decoder follow HF
// decoders: byte sequences that are not valid UTF-8 come out as U+FFFD, the
// same way HF's ByteLevel and ByteFallback decoders do.
//
// Round trips: Decode(Encode(x, false), false) == x for valid UTF-8 x, except
// that tokenizers with a normalizer (Qwen's NFC) give back the normalized x,
// and that SentencePiece layouts which put a "▁" after every added token
// (the legacy Llama/Mistral layout) give back an extra space after added
// tokens found in the text.
//
// Chat templates are rendered with github.com/ardanlabs/jinja under limits on
// template size, loop iterations, macro recursion and output size, because
// templates come from model files.
//
// Example:
//
//	tok, err := tokenizer.FromHFDir("/models/qwen3")
//	if err != nil { ... }
//	prompt, err := tok.ApplyChatTemplate([]tokenizer.Message{{Role: "user", Content: "Hi"}}, true)
//	ids, err := tok.Encode(prompt, false)
//	dec := tokenizer.NewDecoder(tok, true)
//	for _, id := range generated {
//		s, err := dec.Add(id) // only text no later token can change
//		...
//	}
//	rest := dec.Flush()
package tokenizer
