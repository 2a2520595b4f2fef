package model_test

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/model"
	"github.com/trigon-llm/trigon/model/internal/modeltest"
)

// hfJSON builds a config.json from a base Llama config and overrides
// (a nil value deletes the key).
func hfJSON(t *testing.T, overrides map[string]any) []byte {
	t.Helper()
	base := map[string]any{
		"architectures":           []string{"LlamaForCausalLM"},
		"model_type":              "llama",
		"vocab_size":              128256,
		"hidden_size":             2048,
		"intermediate_size":       8192,
		"num_hidden_layers":       16,
		"num_attention_heads":     32,
		"num_key_value_heads":     8,
		"hidden_act":              "silu",
		"rms_norm_eps":            1e-5,
		"max_position_embeddings": 131072,
		"rope_theta":              500000.0,
		"tie_word_embeddings":     true,
		"bos_token_id":            128000,
		"eos_token_id":            128001,
		"torch_dtype":             "bfloat16",
	}
	for k, v := range overrides {
		if v == nil {
			delete(base, k)
		} else {
			base[k] = v
		}
	}
	data, err := json.Marshal(base)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestParseHFConfig(t *testing.T) {
	llama3 := map[string]any{"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
		"high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
	llama32 := model.Config{
		Arch: model.ArchLlama, VocabSize: 128256, Hidden: 2048, Intermediate: 8192, NumLayers: 16,
		NumHeads: 32, NumKVHeads: 8, HeadDim: 64, RMSNormEps: 1e-5, RopeTheta: 500000,
		RopeScaling:  &model.RopeScaling{Type: model.RopeLlama3, Factor: 32, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 8192},
		MaxPositions: 131072, TieEmbeddings: true, BOSTokenID: 128000, HasBOS: true,
		EOSTokenIDs: []int32{128001}, TorchDType: "bfloat16",
	}
	with := func(f func(*model.Config)) model.Config {
		c := llama32
		c.RopeScaling = &model.RopeScaling{}
		*c.RopeScaling = *llama32.RopeScaling
		c.EOSTokenIDs = append([]int32(nil), llama32.EOSTokenIDs...)
		f(&c)
		return c
	}
	tests := []struct {
		name      string
		overrides map[string]any
		want      model.Config
	}{
		{"transformers 4 rope_scaling with rope_type", map[string]any{"rope_scaling": llama3}, llama32},
		{"transformers 4 rope_scaling with legacy type key", map[string]any{"rope_scaling": map[string]any{
			"type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
			"original_max_position_embeddings": 8192}}, llama32},
		{"transformers 5 rope_parameters", map[string]any{"rope_theta": nil, "torch_dtype": nil, "dtype": "bfloat16",
			"rope_parameters": map[string]any{"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
				"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}, llama32},
		{"linear scaling", map[string]any{"rope_scaling": map[string]any{"type": "linear", "factor": 4.0}},
			with(func(c *model.Config) { c.RopeScaling = &model.RopeScaling{Type: model.RopeLinear, Factor: 4} })},
		{"default rope type means no scaling", map[string]any{"rope_scaling": map[string]any{"rope_type": "default"}},
			with(func(c *model.Config) { c.RopeScaling = nil })},
		{"eos list and null bos", map[string]any{"rope_scaling": nil, "eos_token_id": []int{128001, 128008, 128009}, "bos_token_id": nil},
			with(func(c *model.Config) {
				c.RopeScaling, c.HasBOS, c.BOSTokenID = nil, false, 0
				c.EOSTokenIDs = []int32{128001, 128008, 128009}
			})},
		{"defaults: no kv heads, eps, theta, tie", map[string]any{"rope_scaling": nil, "num_key_value_heads": nil,
			"rms_norm_eps": nil, "rope_theta": nil, "tie_word_embeddings": nil},
			with(func(c *model.Config) {
				c.RopeScaling, c.NumKVHeads, c.RMSNormEps, c.RopeTheta, c.TieEmbeddings = nil, 32, 1e-6, 10000, false
			})},
		{"llama attention_bias biases o_proj too", map[string]any{"rope_scaling": llama3, "attention_bias": true},
			with(func(c *model.Config) { c.Llama.AttentionBias, c.Llama.AttnOutputBias = true, true })},
		{"mistral sliding window", map[string]any{"architectures": []string{"MistralForCausalLM"}, "model_type": "mistral",
			"rope_scaling": nil, "sliding_window": 4096, "head_dim": 128},
			with(func(c *model.Config) {
				c.Arch, c.RopeScaling, c.SlidingWindow, c.HeadDim = model.ArchMistral, nil, 4096, 128
			})},
		{"qwen2 has qkv bias and ignores a disabled window", map[string]any{"architectures": []string{"Qwen2ForCausalLM"},
			"rope_scaling": nil, "use_sliding_window": false, "sliding_window": 32768, "max_window_layers": 21},
			with(func(c *model.Config) { c.Arch, c.RopeScaling, c.Llama.AttentionBias = model.ArchQwen2, nil, true })},
		{"qwen2 window on every layer", map[string]any{"architectures": []string{"Qwen2ForCausalLM"},
			"rope_scaling": nil, "use_sliding_window": true, "sliding_window": 1024, "max_window_layers": 0},
			with(func(c *model.Config) {
				c.Arch, c.RopeScaling, c.Llama.AttentionBias, c.SlidingWindow = model.ArchQwen2, nil, true, 1024
			})},
		{"qwen3 q/k norm and explicit head_dim", map[string]any{"architectures": []string{"Qwen3ForCausalLM"},
			"rope_scaling": nil, "head_dim": 128, "layer_types": []string{
				"full_attention", "full_attention", "full_attention", "full_attention", "full_attention", "full_attention",
				"full_attention", "full_attention", "full_attention", "full_attention", "full_attention", "full_attention",
				"full_attention", "full_attention", "full_attention", "full_attention"}},
			with(func(c *model.Config) {
				c.Arch, c.RopeScaling, c.Llama.QKNorm, c.HeadDim = model.ArchQwen3, nil, true, 128
			})},
		{"model_type without architectures", map[string]any{"architectures": nil, "rope_scaling": llama3}, llama32},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := model.ParseHFConfig(hfJSON(t, tc.overrides))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v (scaling %+v)\nwant %+v (scaling %+v)", got, got.RopeScaling, tc.want, tc.want.RopeScaling)
			}
		})
	}
}

func TestParseHFConfigErrors(t *testing.T) {
	tests := []struct {
		name      string
		overrides map[string]any
		wantErr   string
	}{
		{"custom code", map[string]any{"auto_map": map[string]any{"AutoModelForCausalLM": "modeling_x.X"}}, "auto_map"},
		{"unknown architecture", map[string]any{"architectures": []string{"GPT2LMHeadModel"}}, "GPT2LMHeadModel"},
		{"two architectures", map[string]any{"architectures": []string{"LlamaForCausalLM", "X"}}, "exactly one"},
		{"no architecture", map[string]any{"architectures": nil, "model_type": "gpt2"}, "gpt2"},
		{"pre-quantized", map[string]any{"quantization_config": map[string]any{"quant_method": "awq"}}, "quantization_config"},
		{"yarn", map[string]any{"rope_scaling": map[string]any{"type": "yarn", "factor": 4.0}}, `"yarn" is not supported`},
		{"dynamic", map[string]any{"rope_scaling": map[string]any{"rope_type": "dynamic", "factor": 2.0}}, `"dynamic" is not supported`},
		{"llama3 missing keys", map[string]any{"rope_scaling": map[string]any{"rope_type": "llama3", "factor": 8.0}}, "needs factor"},
		{"linear without factor", map[string]any{"rope_scaling": map[string]any{"type": "linear"}}, "without factor"},
		{"per-layer rope parameters", map[string]any{"rope_parameters": map[string]any{
			"full_attention": map[string]any{"rope_type": "default", "rope_theta": 1e6}}}, "per-layer-type"},
		{"gelu", map[string]any{"hidden_act": "gelu"}, "hidden_act"},
		{"mlp bias", map[string]any{"mlp_bias": true}, "mlp_bias"},
		{"partial rotary", map[string]any{"partial_rotary_factor": 0.5}, "partial_rotary_factor"},
		{"missing hidden size", map[string]any{"hidden_size": nil}, "hidden_size is missing"},
		{"heads not dividing hidden", map[string]any{"num_attention_heads": 30}, "not a multiple"},
		{"gqa mismatch", map[string]any{"num_key_value_heads": 5}, "not a multiple of 5"},
		{"zero layers", map[string]any{"num_hidden_layers": 0}, "layer count"},
		{"absurd vocab", map[string]any{"vocab_size": 1 << 40}, "vocab size"},
		{"negative eps", map[string]any{"rms_norm_eps": -1.0}, "rms_norm_eps"},
		{"eos as string", map[string]any{"eos_token_id": "</s>"}, "eos_token_id"},
		{"eos out of vocab", map[string]any{"eos_token_id": 200000}, "outside the vocabulary"},
		{"negative bos", map[string]any{"bos_token_id": -1}, "bos_token_id"},
		{"mixed sliding layers", map[string]any{"architectures": []string{"Qwen2ForCausalLM"},
			"use_sliding_window": true, "sliding_window": 4096, "max_window_layers": 8}, "8 of 16 layers"},
		{"layer_types length", map[string]any{"architectures": []string{"Qwen3ForCausalLM"},
			"layer_types": []string{"full_attention"}}, "1 entries for 16 layers"},
		{"odd head dim", map[string]any{"head_dim": 63}, "odd"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := model.ParseHFConfig(hfJSON(t, tc.overrides))
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("got error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
	t.Run("not json", func(t *testing.T) {
		if _, err := model.ParseHFConfig([]byte("{")); err == nil {
			t.Fatal("no error")
		}
	})
}

// TestFixtureConfigs parses the config.json files transformers 5 saved for
// the fixture models and checks what each fixture was built to exercise.
func TestFixtureConfigs(t *testing.T) {
	type want struct {
		arch                    string
		heads, kvHeads, headDim int
		tie, bias, qkNorm       bool
		window                  int
		scaling                 string
	}
	wants := map[string]want{
		"llama3":      {model.ArchLlama, 4, 2, 16, false, false, false, 0, model.RopeLlama3},
		"llama3-bf16": {model.ArchLlama, 4, 2, 16, false, false, false, 0, model.RopeLlama3},
		"llama-tied":  {model.ArchLlama, 8, 1, 16, true, false, false, 0, model.RopeLinear},
		"mistral":     {model.ArchMistral, 4, 2, 16, false, false, false, 40, ""},
		"qwen2":       {model.ArchQwen2, 4, 2, 16, false, true, false, 0, ""},
		"qwen3":       {model.ArchQwen3, 4, 2, 32, true, false, true, 0, ""},
		"qwen3-bf16":  {model.ArchQwen3, 4, 2, 32, true, false, true, 0, ""},
	}
	names, err := modeltest.Fixtures()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			w, ok := wants[name]
			if !ok {
				t.Fatalf("fixture %s has no expectations in this test", name)
			}
			data, err := os.ReadFile(filepath.Join(modeltest.ModelsDir(), name, "config.json"))
			if err != nil {
				t.Fatal(err)
			}
			c, err := model.ParseHFConfig(data)
			if err != nil {
				t.Fatal(err)
			}
			scaling := ""
			if c.RopeScaling != nil {
				scaling = c.RopeScaling.Type
			}
			got := want{c.Arch, c.NumHeads, c.NumKVHeads, c.HeadDim, c.TieEmbeddings, c.Llama.AttentionBias, c.Llama.QKNorm, c.SlidingWindow, scaling}
			if got != w {
				t.Errorf("got %+v, want %+v", got, w)
			}
			if c.VocabSize != 512 || c.Hidden != 64 || !c.HasBOS || c.BOSTokenID != 0 {
				t.Errorf("sizes/bos: %+v", c)
			}
		})
	}
}

// ulpDiff is the distance between two float32s in units in the last place.
func ulpDiff(a, b float32) int64 {
	ia, ib := int64(math.Float32bits(a)), int64(math.Float32bits(b))
	if ia > ib {
		return ia - ib
	}
	return ib - ia
}

// TestInvFreqMatchesTransformers compares InvFreq with the inverse
// frequencies transformers' rope init functions produced for each fixture
// (default, llama3 and linear scaling). transformers evaluates them in
// float32 arithmetic and we in float64 rounded once, so an ulp or two of
// difference is expected; a wrong formula is off by far more.
func TestInvFreqMatchesTransformers(t *testing.T) {
	names, err := modeltest.Fixtures()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(modeltest.ModelsDir(), name, "config.json"))
			if err != nil {
				t.Fatal(err)
			}
			c, err := model.ParseHFConfig(data)
			if err != nil {
				t.Fatal(err)
			}
			ref, err := modeltest.LoadReference(name)
			if err != nil {
				t.Fatal(err)
			}
			if ref.AttentionScaling != 1 {
				t.Fatalf("reference attention scaling %g; trigon assumes 1", ref.AttentionScaling)
			}
			got := c.InvFreq()
			if len(got) != len(ref.InvFreq) {
				t.Fatalf("%d frequencies, want %d", len(got), len(ref.InvFreq))
			}
			for i := range got {
				if d := ulpDiff(got[i], ref.InvFreq[i]); d > 2 {
					t.Errorf("inv_freq[%d] = %g, transformers %g (%d ulp)", i, got[i], ref.InvFreq[i], d)
				}
			}
		})
	}
}

// TestInvFreqScalingRegimes checks llama3 scaling against the three cases
// of its definition on a config where the head's frequencies straddle both
// wavelength thresholds.
func TestInvFreqScalingRegimes(t *testing.T) {
	c := model.Config{HeadDim: 16, RopeTheta: 500000, RopeScaling: &model.RopeScaling{
		Type: model.RopeLlama3, Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 64}}
	got := c.InvFreq()
	var kept, divided, smoothed int
	for i, g := range got {
		base := math.Pow(500000, -float64(2*i)/16)
		wavelen := 2 * math.Pi / base
		var want float64
		switch {
		case wavelen < 16: // 64 / high_freq_factor
			want, kept = base, kept+1
		case wavelen > 64: // 64 / low_freq_factor
			want, divided = base/8, divided+1
		default:
			s := (64/wavelen - 1) / 3
			want, smoothed = (1-s)*base/8+s*base, smoothed+1
		}
		if ulpDiff(g, float32(want)) > 1 {
			t.Errorf("inv_freq[%d] = %g, want %g", i, g, want)
		}
	}
	if kept == 0 || divided == 0 || smoothed == 0 {
		t.Fatalf("regimes kept %d, divided %d, smoothed %d: test config does not cover all three", kept, divided, smoothed)
	}
}

// TestLlama3FreqFactors checks that dividing plain frequencies by the GGUF
// factors reproduces the llama3-scaled frequencies, on random scalings.
func TestLlama3FreqFactors(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 20 {
		hd := 2 * (4 + rng.IntN(60))
		c := model.Config{HeadDim: hd, RopeTheta: 1000 + rng.Float64()*1e6, RopeScaling: &model.RopeScaling{
			Type: model.RopeLlama3, Factor: 1 + rng.Float64()*31, LowFreqFactor: 0.5 + rng.Float64(),
			HighFreqFactor: 2 + rng.Float64()*4, OriginalMaxPositions: 16 + rng.IntN(10000)}}
		f, err := c.Llama3FreqFactors()
		if err != nil {
			t.Fatal(err)
		}
		plain := c
		plain.RopeScaling, plain.RopeFreqFactors = nil, f
		want, got := c.InvFreq(), plain.InvFreq()
		for j := range want {
			if ulpDiff(got[j], want[j]) > 2 {
				t.Fatalf("case %d pair %d: via factors %g, direct %g", i, j, got[j], want[j])
			}
		}
	}
	if _, err := (model.Config{HeadDim: 8, RopeTheta: 1e4}).Llama3FreqFactors(); err == nil {
		t.Fatal("no error without llama3 scaling")
	}
}

func TestParseGenerationConfig(t *testing.T) {
	f32 := func(v float32) *float32 { return &v }
	i32 := func(v int32) *int32 { return &v }
	yes, k := true, 40
	tests := []struct {
		name    string
		json    string
		want    model.GenerationConfig
		wantErr string
	}{
		{"full", `{"bos_token_id":0,"eos_token_id":[3,1],"do_sample":true,"temperature":0.7,"top_p":0.9,"top_k":40,"repetition_penalty":1.05,"max_length":512}`,
			model.GenerationConfig{DoSample: &yes, Temperature: f32(0.7), TopP: f32(0.9), TopK: &k, RepetitionPenalty: f32(1.05),
				BOSTokenID: i32(0), EOSTokenIDs: []int32{3, 1}, MaxLength: 512}, ""},
		{"single eos", `{"eos_token_id":2}`, model.GenerationConfig{EOSTokenIDs: []int32{2}}, ""},
		{"empty", `{}`, model.GenerationConfig{}, ""},
		{"min_p", `{"min_p":0.05}`, model.GenerationConfig{MinP: f32(0.05)}, ""},
		{"bad top_p", `{"top_p":1.5}`, model.GenerationConfig{}, "top_p"},
		{"negative temperature", `{"temperature":-1}`, model.GenerationConfig{}, "temperature"},
		{"zero repetition penalty", `{"repetition_penalty":0}`, model.GenerationConfig{}, "repetition_penalty"},
		{"negative top_k", `{"top_k":-1}`, model.GenerationConfig{}, "top_k"},
		{"eos object", `{"eos_token_id":{"a":1}}`, model.GenerationConfig{}, "eos_token_id"},
		{"fractional eos", `{"eos_token_id":1.5}`, model.GenerationConfig{}, "eos_token_id"},
		{"not json", `[`, model.GenerationConfig{}, "generation_config.json"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := model.ParseGenerationConfig([]byte(tc.json))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestStopTokenIDs(t *testing.T) {
	got := model.StopTokenIDs(model.Config{EOSTokenIDs: []int32{1, 5}}, model.GenerationConfig{EOSTokenIDs: []int32{3, 1}})
	if want := []int32{3, 1, 5}; !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}
