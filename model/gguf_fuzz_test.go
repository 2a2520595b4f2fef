package model

import (
	"bytes"
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/format/gguf"
)

// FuzzGGUFWeights: GGUF files are untrusted input. Mapping a parsed file to
// a config and HF-named weights, and validating them, must never panic.
func FuzzGGUFWeights(f *testing.F) {
	for _, c := range []Config{
		{Arch: ArchLlama, VocabSize: 4, Hidden: 4, Intermediate: 4, NumLayers: 1, NumHeads: 2, NumKVHeads: 1,
			HeadDim: 4, RMSNormEps: 1e-5, RopeTheta: 1e4, MaxPositions: 16,
			RopeScaling: &RopeScaling{Type: RopeLlama3, Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 8}},
		{Arch: ArchQwen3, VocabSize: 4, Hidden: 4, Intermediate: 4, NumLayers: 1, NumHeads: 2, NumKVHeads: 2,
			HeadDim: 2, RMSNormEps: 1e-6, RopeTheta: 1e6, MaxPositions: 16, TieEmbeddings: true,
			Llama: LlamaConfig{AttentionBias: true, AttnOutputBias: true, QKNorm: true}},
	} {
		w := gguf.NewWriter()
		kvs, err := c.GGUFMetadata()
		if err != nil {
			f.Fatal(err)
		}
		for _, kv := range kvs {
			w.AddKV(kv.Key, kv.Value)
		}
		if t, ok, err := c.RopeFreqsTensor(); err != nil {
			f.Fatal(err)
		} else if ok {
			if err := w.AddTensor(t.Name, t.Type, t.Dims, t.Data); err != nil {
				f.Fatal(err)
			}
		}
		for _, s := range ExpectedWeights(c) {
			n, _ := backend.NumElements(s.Shape)
			t, err := ToGGUFTensor(c, Weight{Name: s.Name, DType: backend.F32, Shape: s.Shape, Data: make([]byte, 4*n)})
			if err != nil {
				f.Fatal(err)
			}
			if err := w.AddTensor(t.Name, t.Type, t.Dims, t.Data); err != nil {
				f.Fatal(err)
			}
		}
		var buf bytes.Buffer
		if _, err := w.WriteTo(&buf); err != nil {
			f.Fatal(err)
		}
		f.Add(buf.Bytes())
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := gguf.Parse(data)
		if err != nil {
			return
		}
		c, _, w, err := weightsFromGGUF(file)
		if err != nil {
			return
		}
		if err := ValidateWeights(c, w); err == nil {
			_ = c.InvFreq()
		}
	})
}
