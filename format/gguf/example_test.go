package gguf_test

import (
	"bytes"
	"fmt"
	"log"

	"github.com/trigon-llm/trigon/format/gguf"
)

func ExampleWriter() {
	w := gguf.NewWriter()
	w.AddKV("general.architecture", gguf.StringValue("llama"))
	w.AddKV("llama.block_count", gguf.Uint32Value(2))
	w.AddKV("tokenizer.ggml.tokens", gguf.StringsValue([]string{"<s>", "</s>", "hi"}))
	// A [2, 4] F32 matrix: dims are innermost first.
	if err := w.AddTensor("output_norm.weight", gguf.TypeF32, []uint64{4, 2}, make([]byte, 32)); err != nil {
		log.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		log.Fatal(err)
	}

	f, err := gguf.Parse(buf.Bytes())
	if err != nil {
		log.Fatal(err)
	}
	arch, _ := f.String("general.architecture")
	layers, _ := f.Uint(arch + ".block_count")
	tokens, _ := f.Strings("tokenizer.ggml.tokens")
	t, _ := f.Tensor("output_norm.weight")
	fmt.Println(arch, layers, len(tokens))
	fmt.Println(t.Type, t.Dims, len(t.Data), f.DataOffset%f.Alignment)
	// Output:
	// llama 2 3
	// F32 [4 2] 32 0
}
