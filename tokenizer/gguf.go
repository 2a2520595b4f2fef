package tokenizer

import (
	"fmt"

	"github.com/trigon-llm/trigon/format/gguf"
)

// GGUF metadata keys of a tokenizer (llama.cpp's names).
const (
	ggufModel        = "tokenizer.ggml.model"
	ggufPre          = "tokenizer.ggml.pre"
	ggufTokens       = "tokenizer.ggml.tokens"
	ggufScores       = "tokenizer.ggml.scores"
	ggufTypes        = "tokenizer.ggml.token_type"
	ggufMerges       = "tokenizer.ggml.merges"
	ggufBOS          = "tokenizer.ggml.bos_token_id"
	ggufEOS          = "tokenizer.ggml.eos_token_id"
	ggufUNK          = "tokenizer.ggml.unknown_token_id"
	ggufPAD          = "tokenizer.ggml.padding_token_id"
	ggufAddBOS       = "tokenizer.ggml.add_bos_token"
	ggufAddEOS       = "tokenizer.ggml.add_eos_token"
	ggufSpacePrefix  = "tokenizer.ggml.add_space_prefix"
	ggufChatTemplate = "tokenizer.chat_template"
)

// FromGGUF builds the tokenizer a GGUF file's tokenizer.ggml.* metadata
// describes.
func FromGGUF(f *gguf.File) (*Tokenizer, error) {
	s, err := SpecFromGGUF(f)
	if err != nil {
		return nil, err
	}
	return FromSpec(s)
}

// SpecFromGGUF reads a Spec from GGUF metadata.
func SpecFromGGUF(f *gguf.File) (Spec, error) {
	var s Spec
	var ok bool
	if s.Model, ok = f.String(ggufModel); !ok {
		return s, fmt.Errorf("gguf: missing string %s", ggufModel)
	}
	s.Pre, _ = f.String(ggufPre)
	if s.Tokens, ok = f.Strings(ggufTokens); !ok {
		return s, fmt.Errorf("gguf: missing string array %s", ggufTokens)
	}
	if f.Has(ggufScores) {
		if s.Scores, ok = f.Floats(ggufScores); !ok {
			return s, fmt.Errorf("gguf: %s is not a float32 array", ggufScores)
		}
	}
	if f.Has(ggufTypes) {
		if s.Types, ok = f.Ints(ggufTypes); !ok {
			return s, fmt.Errorf("gguf: %s is not an integer array", ggufTypes)
		}
	}
	if f.Has(ggufMerges) {
		if s.Merges, ok = f.Strings(ggufMerges); !ok {
			return s, fmt.Errorf("gguf: %s is not a string array", ggufMerges)
		}
	}
	for _, id := range []struct {
		key string
		dst *int32
	}{{ggufBOS, &s.BOS}, {ggufEOS, &s.EOS}, {ggufUNK, &s.UNK}, {ggufPAD, &s.PAD}} {
		*id.dst = -1
		if !f.Has(id.key) {
			continue
		}
		v, ok := f.Uint(id.key)
		if !ok || v >= uint64(len(s.Tokens)) {
			return s, fmt.Errorf("gguf: %s is not a token id below the vocabulary size %d", id.key, len(s.Tokens))
		}
		*id.dst = int32(v)
	}
	s.AddBOS, _ = f.Bool(ggufAddBOS)
	s.AddEOS, _ = f.Bool(ggufAddEOS)
	if sp, ok := f.Bool(ggufSpacePrefix); ok && !sp {
		s.SpacePrefix = "none"
	}
	s.ChatTemplate, _ = f.String(ggufChatTemplate)
	return s, nil
}

// GGUFMetadata returns s as GGUF key-values, the inverse of SpecFromGGUF.
func (s Spec) GGUFMetadata() []gguf.KV {
	kvs := []gguf.KV{
		{Key: ggufModel, Value: gguf.StringValue(s.Model)},
		{Key: ggufTokens, Value: gguf.StringsValue(s.Tokens)},
	}
	if s.Pre != "" {
		kvs = append(kvs, gguf.KV{Key: ggufPre, Value: gguf.StringValue(s.Pre)})
	}
	if len(s.Scores) > 0 {
		kvs = append(kvs, gguf.KV{Key: ggufScores, Value: gguf.Float32sValue(s.Scores)})
	}
	if len(s.Types) > 0 {
		kvs = append(kvs, gguf.KV{Key: ggufTypes, Value: gguf.Int32sValue(s.Types)})
	}
	if len(s.Merges) > 0 {
		kvs = append(kvs, gguf.KV{Key: ggufMerges, Value: gguf.StringsValue(s.Merges)})
	}
	for _, id := range []struct {
		key string
		v   int32
	}{{ggufBOS, s.BOS}, {ggufEOS, s.EOS}, {ggufUNK, s.UNK}, {ggufPAD, s.PAD}} {
		if id.v >= 0 {
			kvs = append(kvs, gguf.KV{Key: id.key, Value: gguf.Uint32Value(uint32(id.v))})
		}
	}
	kvs = append(kvs,
		gguf.KV{Key: ggufAddBOS, Value: gguf.BoolValue(s.AddBOS)},
		gguf.KV{Key: ggufAddEOS, Value: gguf.BoolValue(s.AddEOS)})
	if s.SpacePrefix == "none" {
		kvs = append(kvs, gguf.KV{Key: ggufSpacePrefix, Value: gguf.BoolValue(false)})
	}
	if s.ChatTemplate != "" {
		kvs = append(kvs, gguf.KV{Key: ggufChatTemplate, Value: gguf.StringValue(s.ChatTemplate)})
	}
	return kvs
}
