package gguf

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkParse parses a file shaped like a small real model: a 150k-token
// vocabulary with scores and types, 200k merges, and 300 tensor infos.
func BenchmarkParse(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	const vocab = 150_000
	tokens := make([]string, vocab)
	scores := make([]float32, vocab)
	types := make([]int32, vocab)
	for i := range tokens {
		tokens[i] = fmt.Sprintf("tok%d", rng.IntN(1e6))
		scores[i] = rng.Float32()
		types[i] = 1
	}
	merges := make([]string, 200_000)
	for i := range merges {
		merges[i] = fmt.Sprintf("a%d b%d", i, i+1)
	}
	w := NewWriter()
	w.AddKV("general.architecture", StringValue("llama"))
	w.AddKV("tokenizer.ggml.tokens", StringsValue(tokens))
	w.AddKV("tokenizer.ggml.scores", Float32sValue(scores))
	w.AddKV("tokenizer.ggml.token_type", Int32sValue(types))
	w.AddKV("tokenizer.ggml.merges", StringsValue(merges))
	data := make([]byte, 256*144)
	for i := range 300 {
		if err := w.AddTensor(fmt.Sprintf("blk.%d.attn_q.weight", i), TypeQ4_K, []uint64{256, 256}, data); err != nil {
			b.Fatal(err)
		}
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		b.Fatal(err)
	}
	in := buf.Bytes()
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(in); err != nil {
			b.Fatal(err)
		}
	}
}
