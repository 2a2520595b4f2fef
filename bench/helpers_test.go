package bench

import (
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/model"
)

// tinyConfig is a Llama small enough that a CPU forward takes
// milliseconds, with GQA, a tied or untied head and optional Qwen2 biases.
func tinyConfig(tied, bias bool) model.Config {
	c := model.Config{
		Arch: model.ArchLlama, VocabSize: 256, Hidden: 64, Intermediate: 128,
		NumLayers: 2, NumHeads: 4, NumKVHeads: 2, HeadDim: 16,
		RMSNormEps: 1e-5, RopeTheta: 10000, MaxPositions: 512, TieEmbeddings: tied,
	}
	if bias {
		c.Arch, c.Llama.AttentionBias = model.ArchQwen2, true
	}
	return c
}

func mustSynthetic(t testing.TB, cfg model.Config, dt backend.DType, seed uint64) model.Weights {
	t.Helper()
	w, err := SyntheticWeights(cfg, dt, seed)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}
