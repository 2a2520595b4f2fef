package model_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/trigon-llm/trigon/model"
	"github.com/trigon-llm/trigon/model/internal/modeltest"
)

// addFixtureSeeds seeds a fuzzer with every fixture's file called name.
func addFixtureSeeds(f *testing.F, name string) {
	names, err := modeltest.Fixtures()
	if err != nil {
		f.Fatal(err)
	}
	for _, n := range names {
		data, err := os.ReadFile(filepath.Join(modeltest.ModelsDir(), n, name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
}

// FuzzParseHFConfig: config.json comes from untrusted model directories.
// Parsing must never panic, and whatever it accepts must be a valid
// config whose derived quantities are computable.
func FuzzParseHFConfig(f *testing.F) {
	addFixtureSeeds(f, "config.json")
	f.Add([]byte(`{"architectures":["Qwen2ForCausalLM"],"vocab_size":8,"hidden_size":8,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2,"max_position_embeddings":8,"use_sliding_window":true,"sliding_window":4,"max_window_layers":0,"eos_token_id":[1,2]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := model.ParseHFConfig(data)
		if err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("accepted an invalid config: %v", err)
		}
		if got := len(c.InvFreq()); got != c.HeadDim/2 {
			t.Fatalf("%d inverse frequencies for head dim %d", got, c.HeadDim)
		}
		if _, err := c.GGUFMetadata(); err != nil {
			t.Fatalf("valid config has no GGUF metadata: %v", err)
		}
	})
}

func FuzzParseGenerationConfig(f *testing.F) {
	addFixtureSeeds(f, "generation_config.json")
	f.Fuzz(func(t *testing.T, data []byte) {
		g, err := model.ParseGenerationConfig(data)
		if err != nil {
			return
		}
		if g.TopP != nil && (*g.TopP < 0 || *g.TopP > 1) {
			t.Fatalf("accepted top_p %g", *g.TopP)
		}
		for _, id := range g.EOSTokenIDs {
			if id < 0 {
				t.Fatalf("accepted eos id %d", id)
			}
		}
	})
}
