package safetensors

import (
	"fmt"
	"testing"
)

// BenchmarkParseHeader parses the header of a file with 3000 tensors (a
// 7B-class model has about 300; large MoE shards have thousands).
func BenchmarkParseHeader(b *testing.B) {
	var tensors []testTensor
	for i := range 3000 {
		tensors = append(tensors, testTensor{name: fmt.Sprintf("model.layers.%d.mlp.experts.%d.down_proj.weight", i/64, i%64), dtype: "BF16", shape: []int{4, 8}, data: make([]byte, 64)})
	}
	in := encodeFile(b, tensors, map[string]string{"format": "pt"})
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(in); err != nil {
			b.Fatal(err)
		}
	}
}
