package bench

import (
	"fmt"

	"github.com/trigon-llm/trigon/model"
	"github.com/trigon-llm/trigon/tokenizer"
)

// syntheticChatTemplate renders messages as "role: content" lines, so that
// chat requests work on a model without a template of its own.
const syntheticChatTemplate = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}" +
	"{% if add_generation_prompt %}assistant:{% endif %}"

// SyntheticTokenizer is a byte-level BPE tokenizer over cfg's vocabulary,
// for a model that has no tokenizer of its own (random weights of an
// architecture preset, trigon serve --load-format dummy). Every byte is a
// token, so any text encodes (a token a byte) and any prompt of token ids
// is valid; the config's BOS and EOS ids are special tokens at their ids;
// every other id decodes to a made-up word, a space and letters (" a",
// " b", ..., " aa", ...), so whatever a random model samples streams as
// visible text. The vocabulary must hold the 256 bytes, the special
// tokens and at least one word.
func SyntheticTokenizer(cfg model.Config) (*tokenizer.Tokenizer, error) {
	n := cfg.VocabSize
	tokens := make([]string, n)
	types := make([]int32, n)
	special := func(id int32, name string) {
		if tokens[id] == "" {
			tokens[id], types[id] = name, tokenizer.TypeControl
		}
	}
	bos, eos := int32(-1), int32(-1)
	if cfg.HasBOS && cfg.BOSTokenID >= 0 && int(cfg.BOSTokenID) < n {
		bos = cfg.BOSTokenID
		special(bos, "<|begin_of_text|>")
	}
	for i, id := range cfg.EOSTokenIDs {
		if id < 0 || int(id) >= n {
			continue
		}
		if eos < 0 {
			eos = id
		}
		if i == 0 {
			special(id, "<|end_of_text|>")
		} else {
			special(id, fmt.Sprintf("<|end_of_text_%d|>", i))
		}
	}
	// The bytes, then the words, at the ids the special tokens left free.
	next := 0
	free := func() (int, bool) {
		for ; next < n; next++ {
			if tokens[next] == "" {
				next++
				return next - 1, true
			}
		}
		return 0, false
	}
	for b := range 256 {
		id, ok := free()
		if !ok {
			return nil, fmt.Errorf("synthetic tokenizer: a vocabulary of %d cannot hold the 256 byte tokens and the special tokens", n)
		}
		tokens[id], types[id] = string(gpt2ByteRune(byte(b))), tokenizer.TypeNormal
	}
	words := 0
	for {
		id, ok := free()
		if !ok {
			break
		}
		tokens[id], types[id] = string(gpt2ByteRune(' '))+word(words), tokenizer.TypeNormal
		words++
	}
	if words == 0 {
		return nil, fmt.Errorf("synthetic tokenizer: a vocabulary of %d leaves no room for words after the byte and special tokens", n)
	}
	tok, err := tokenizer.FromSpec(tokenizer.Spec{
		Model: "gpt2", Pre: "gpt-2", Tokens: tokens, Types: types,
		// Byte-level BPE needs merges; this one makes " a" the word token.
		Merges: []string{string(gpt2ByteRune(' ')) + " a"},
		BOS:    bos, EOS: eos, UNK: -1, PAD: -1, AddBOS: bos >= 0,
		ChatTemplate: syntheticChatTemplate,
	})
	if err != nil {
		return nil, fmt.Errorf("synthetic tokenizer: %w", err)
	}
	return tok, nil
}

// word is the k-th word of the bijective base-26 numbering: a..z, aa..zz, ...
func word(k int) string {
	var b []byte
	for k++; k > 0; k = (k - 1) / 26 {
		b = append(b, byte('a'+(k-1)%26))
	}
	for i, j := 0, len(b)-1; i < j; i, j = i+1, j-1 {
		b[i], b[j] = b[j], b[i]
	}
	return string(b)
}

// gpt2ByteRune is GPT-2's byte-level alphabet, in which byte-level BPE
// vocabularies are written: printable Latin-1 bytes stand for themselves,
// the others (controls, space, 0x7F-0xA0, 0xAD) for U+0100 onwards in
// byte order.
func gpt2ByteRune(b byte) rune {
	printable := func(c int) bool {
		return (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF)
	}
	if printable(int(b)) {
		return rune(b)
	}
	r := rune(256)
	for c := 0; c < int(b); c++ {
		if !printable(c) {
			r++
		}
	}
	return r
}

// PadTokenizer returns tok with made-up word tokens appended up to vocab
// ids (tok itself when it covers them already), for random weights whose
// vocabulary is larger than the tokenizer's, as published vocabularies
// padded for the GPU are (Qwen2.5's 152,064 ids for 151,665 tokens): a
// random model samples every id, and each must decode. The words are
// reachable only by id, never by encoding: byte-level BPE and
// SentencePiece with a merge list merge only by their lists. Added tokens
// lose their lstrip/rstrip flags (tokenizer.Spec has no form for them).
func PadTokenizer(tok *tokenizer.Tokenizer, vocab int) (*tokenizer.Tokenizer, error) {
	have := tok.VocabSize()
	if have >= vocab {
		return tok, nil
	}
	s := tok.Spec()
	var space string
	switch {
	case s.Model == "gpt2" && s.Pre != "":
		space = string(gpt2ByteRune(' '))
	case s.Model == "llama" && len(s.Merges) > 0:
		space = "\u2581" // SentencePiece's space
	default:
		return nil, fmt.Errorf("pad tokenizer: a %s tokenizer of %d tokens cannot be extended to the model's %d ids; pass a tokenizer that covers them", tok.Kind(), have, vocab)
	}
	for k := 0; len(s.Tokens) < vocab; k++ {
		s.Tokens = append(s.Tokens, space+"pad"+word(k))
		if len(s.Types) > 0 {
			s.Types = append(s.Types, tokenizer.TypeNormal)
		}
		if len(s.Scores) > 0 {
			s.Scores = append(s.Scores, 0)
		}
	}
	padded, err := tokenizer.FromSpec(s)
	if err != nil {
		return nil, fmt.Errorf("pad tokenizer to %d ids: %w", vocab, err)
	}
	return padded, nil
}
