package model

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
)

// hfArchitectures maps config.json "architectures" entries to Arch.
var hfArchitectures = map[string]string{
	"LlamaForCausalLM":   ArchLlama,
	"MistralForCausalLM": ArchMistral,
	"Qwen2ForCausalLM":   ArchQwen2,
	"Qwen3ForCausalLM":   ArchQwen3,
}

// hfConfig is the subset of a transformers config.json trigon reads.
// Pointers and raw messages tell "absent" from zero and carry the fields
// whose JSON type varies between checkpoints.
type hfConfig struct {
	Architectures         []string        `json:"architectures"`
	ModelType             string          `json:"model_type"`
	AutoMap               json.RawMessage `json:"auto_map"`
	QuantizationConfig    json.RawMessage `json:"quantization_config"`
	VocabSize             *int            `json:"vocab_size"`
	HiddenSize            *int            `json:"hidden_size"`
	IntermediateSize      *int            `json:"intermediate_size"`
	NumHiddenLayers       *int            `json:"num_hidden_layers"`
	NumAttentionHeads     *int            `json:"num_attention_heads"`
	NumKeyValueHeads      *int            `json:"num_key_value_heads"`
	HeadDim               *int            `json:"head_dim"`
	HiddenAct             *string         `json:"hidden_act"`
	RMSNormEps            *float64        `json:"rms_norm_eps"`
	MaxPositionEmbeddings *int            `json:"max_position_embeddings"`
	RopeTheta             *float64        `json:"rope_theta"`
	RopeScaling           json.RawMessage `json:"rope_scaling"`
	RopeParameters        json.RawMessage `json:"rope_parameters"`
	PartialRotaryFactor   *float64        `json:"partial_rotary_factor"`
	TieWordEmbeddings     *bool           `json:"tie_word_embeddings"`
	AttentionBias         *bool           `json:"attention_bias"`
	MLPBias               *bool           `json:"mlp_bias"`
	SlidingWindow         *int            `json:"sliding_window"`
	UseSlidingWindow      *bool           `json:"use_sliding_window"`
	MaxWindowLayers       *int            `json:"max_window_layers"`
	LayerTypes            []string        `json:"layer_types"`
	BOSTokenID            json.RawMessage `json:"bos_token_id"`
	EOSTokenID            json.RawMessage `json:"eos_token_id"`
	TorchDType            string          `json:"torch_dtype"`
	DType                 string          `json:"dtype"`
}

// ropeParams is a transformers 4.x rope_scaling or 5.x rope_parameters
// object; both spellings of the type key occur in the wild.
type ropeParams struct {
	RopeType                      string   `json:"rope_type"`
	Type                          string   `json:"type"`
	RopeTheta                     *float64 `json:"rope_theta"`
	Factor                        *float64 `json:"factor"`
	LowFreqFactor                 *float64 `json:"low_freq_factor"`
	HighFreqFactor                *float64 `json:"high_freq_factor"`
	OriginalMaxPositionEmbeddings *int     `json:"original_max_position_embeddings"`
	PartialRotaryFactor           *float64 `json:"partial_rotary_factor"`
}

// ParseHFConfig reads a transformers config.json (4.x or 5.x layout) for one
// of the supported architectures. It refuses, with an error that says why,
// any checkpoint whose semantics it would not reproduce exactly: custom
// code (auto_map), quantization it cannot repack (ParseQuantization), other activations, partial
// rotary, MLP biases, unsupported RoPE scaling, per-layer sliding windows.
func ParseHFConfig(data []byte) (Config, error) {
	var h hfConfig
	if err := json.Unmarshal(data, &h); err != nil {
		return Config{}, fmt.Errorf("config.json: %w", err)
	}
	if !isNull(h.AutoMap) {
		return Config{}, fmt.Errorf("config.json: auto_map asks for custom modelling code, which trigon never runs")
	}
	if _, err := ParseQuantization(h.QuantizationConfig); err != nil {
		return Config{}, fmt.Errorf("config.json: %w", err)
	}
	c := Config{}
	switch {
	case len(h.Architectures) > 0:
		if len(h.Architectures) > 1 {
			return Config{}, fmt.Errorf("config.json: %d architectures %v; want exactly one", len(h.Architectures), h.Architectures)
		}
		arch, ok := hfArchitectures[h.Architectures[0]]
		if !ok {
			return Config{}, fmt.Errorf("config.json: architecture %q is not supported (supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)", h.Architectures[0])
		}
		c.Arch = arch
	case h.ModelType == ArchLlama || h.ModelType == ArchMistral || h.ModelType == ArchQwen2 || h.ModelType == ArchQwen3:
		c.Arch = h.ModelType
	default:
		return Config{}, fmt.Errorf("config.json: no architectures entry and model_type %q is not supported", h.ModelType)
	}

	required := []struct {
		name string
		src  *int
		dst  *int
	}{
		{"vocab_size", h.VocabSize, &c.VocabSize},
		{"hidden_size", h.HiddenSize, &c.Hidden},
		{"intermediate_size", h.IntermediateSize, &c.Intermediate},
		{"num_hidden_layers", h.NumHiddenLayers, &c.NumLayers},
		{"num_attention_heads", h.NumAttentionHeads, &c.NumHeads},
		{"max_position_embeddings", h.MaxPositionEmbeddings, &c.MaxPositions},
	}
	for _, r := range required {
		if r.src == nil {
			return Config{}, fmt.Errorf("config.json: %s is missing", r.name)
		}
		*r.dst = *r.src
	}
	c.NumKVHeads = c.NumHeads // transformers' default: no GQA
	if h.NumKeyValueHeads != nil {
		c.NumKVHeads = *h.NumKeyValueHeads
	}
	if h.HeadDim != nil {
		c.HeadDim = *h.HeadDim
	} else if c.NumHeads > 0 {
		if c.Hidden%c.NumHeads != 0 {
			return Config{}, fmt.Errorf("config.json: hidden_size %d is not a multiple of %d heads and head_dim is not given", c.Hidden, c.NumHeads)
		}
		c.HeadDim = c.Hidden / c.NumHeads
	}
	if h.HiddenAct != nil && *h.HiddenAct != "silu" {
		return Config{}, fmt.Errorf("config.json: hidden_act %q is not supported (only silu)", *h.HiddenAct)
	}
	c.RMSNormEps = 1e-6 // transformers' default for all four architectures
	if h.RMSNormEps != nil {
		c.RMSNormEps = float32(*h.RMSNormEps)
	}
	if h.PartialRotaryFactor != nil && *h.PartialRotaryFactor != 1 {
		return Config{}, fmt.Errorf("config.json: partial_rotary_factor %g is not supported", *h.PartialRotaryFactor)
	}
	if h.MLPBias != nil && *h.MLPBias {
		return Config{}, fmt.Errorf("config.json: mlp_bias is not supported")
	}
	if h.TieWordEmbeddings != nil {
		c.TieEmbeddings = *h.TieWordEmbeddings
	}
	switch c.Arch {
	case ArchQwen2:
		c.Llama.AttentionBias = true // hard-wired in Qwen2's attention
	case ArchLlama, ArchQwen3:
		if h.AttentionBias != nil && *h.AttentionBias {
			c.Llama.AttentionBias, c.Llama.AttnOutputBias = true, true
		}
	}
	c.Llama.QKNorm = c.Arch == ArchQwen3

	if err := parseRope(&c, &h); err != nil {
		return Config{}, fmt.Errorf("config.json: %w", err)
	}
	window, err := slidingWindow(c, &h)
	if err != nil {
		return Config{}, fmt.Errorf("config.json: %w", err)
	}
	c.SlidingWindow = window

	if bos, ok, err := tokenIDs(h.BOSTokenID); err != nil {
		return Config{}, fmt.Errorf("config.json: bos_token_id: %w", err)
	} else if ok {
		if len(bos) != 1 {
			return Config{}, fmt.Errorf("config.json: bos_token_id holds %d ids, want one", len(bos))
		}
		c.BOSTokenID, c.HasBOS = bos[0], true
	}
	eos, _, err := tokenIDs(h.EOSTokenID)
	if err != nil {
		return Config{}, fmt.Errorf("config.json: eos_token_id: %w", err)
	}
	c.EOSTokenIDs = eos
	c.TorchDType = h.DType
	if c.TorchDType == "" {
		c.TorchDType = h.TorchDType
	}
	if err := c.Validate(); err != nil {
		return Config{}, fmt.Errorf("config.json: %w", err)
	}
	return c, nil
}

// parseRope fills RopeTheta and RopeScaling from either layout: 4.x keeps
// rope_theta at the top level and scaling in rope_scaling, 5.x keeps both
// in rope_parameters.
func parseRope(c *Config, h *hfConfig) error {
	c.RopeTheta = 10000 // transformers' default
	if h.RopeTheta != nil {
		c.RopeTheta = *h.RopeTheta
	}
	raw, key := h.RopeScaling, "rope_scaling"
	if !isNull(h.RopeParameters) {
		raw, key = h.RopeParameters, "rope_parameters"
	}
	if isNull(raw) {
		return nil
	}
	var p ropeParams
	if err := json.Unmarshal(raw, &p); err != nil {
		return fmt.Errorf("%s: %w (per-layer-type rope parameters are not supported)", key, err)
	}
	if p.RopeTheta != nil {
		c.RopeTheta = *p.RopeTheta
	}
	if p.PartialRotaryFactor != nil && *p.PartialRotaryFactor != 1 {
		return fmt.Errorf("%s: partial_rotary_factor %g is not supported", key, *p.PartialRotaryFactor)
	}
	typ := p.RopeType
	if typ == "" {
		typ = p.Type
	}
	if typ == "" && key == "rope_parameters" && p.Factor == nil && p.RopeTheta == nil {
		return fmt.Errorf("%s: no rope_type or rope_theta (per-layer-type rope parameters are not supported)", key)
	}
	switch typ {
	case "", "default":
		return nil
	case RopeLinear:
		if p.Factor == nil {
			return fmt.Errorf("%s: linear scaling without factor", key)
		}
		c.RopeScaling = &RopeScaling{Type: RopeLinear, Factor: *p.Factor}
	case RopeLlama3:
		if p.Factor == nil || p.LowFreqFactor == nil || p.HighFreqFactor == nil || p.OriginalMaxPositionEmbeddings == nil {
			return fmt.Errorf("%s: llama3 scaling needs factor, low_freq_factor, high_freq_factor and original_max_position_embeddings", key)
		}
		c.RopeScaling = &RopeScaling{
			Type: RopeLlama3, Factor: *p.Factor,
			LowFreqFactor: *p.LowFreqFactor, HighFreqFactor: *p.HighFreqFactor,
			OriginalMaxPositions: *p.OriginalMaxPositionEmbeddings,
		}
	default:
		return fmt.Errorf("%s: rope type %q is not supported (supported: default, %s, %s)", key, typ, RopeLinear, RopeLlama3)
	}
	return nil
}

// slidingWindow resolves the window every layer uses. Qwen2/Qwen3 can slide
// only some layers (layer_types, or use_sliding_window with
// max_window_layers); one forward pass with one window cannot express that,
// so mixed configs are refused.
func slidingWindow(c Config, h *hfConfig) (int, error) {
	window := 0
	if h.SlidingWindow != nil {
		window = *h.SlidingWindow
	}
	switch c.Arch {
	case ArchLlama:
		return 0, nil
	case ArchMistral:
		if window < 0 {
			return 0, fmt.Errorf("sliding_window %d is negative", window)
		}
		return window, nil
	}
	sliding := 0
	switch {
	case h.LayerTypes != nil:
		if len(h.LayerTypes) != c.NumLayers {
			return 0, fmt.Errorf("layer_types has %d entries for %d layers", len(h.LayerTypes), c.NumLayers)
		}
		for i, t := range h.LayerTypes {
			switch t {
			case "full_attention":
			case "sliding_attention":
				sliding++
			default:
				return 0, fmt.Errorf("layer_types[%d] %q is not supported", i, t)
			}
		}
	case h.UseSlidingWindow != nil && *h.UseSlidingWindow:
		// transformers 4.x: layers from max_window_layers on slide.
		first := 0
		if h.MaxWindowLayers != nil {
			first = *h.MaxWindowLayers
		}
		sliding = max(0, c.NumLayers-max(0, first))
	}
	switch {
	case sliding == 0:
		return 0, nil
	case sliding < c.NumLayers:
		return 0, fmt.Errorf("sliding window on %d of %d layers is not supported", sliding, c.NumLayers)
	case window <= 0:
		return 0, fmt.Errorf("sliding attention without a positive sliding_window")
	}
	return window, nil
}

// tokenIDs decodes a token id field that may be null, an integer or a list
// of integers. ok is false when the field is absent or null.
func tokenIDs(raw json.RawMessage) (ids []int32, ok bool, err error) {
	if isNull(raw) {
		return nil, false, nil
	}
	var one json.Number
	if err := json.Unmarshal(raw, &one); err == nil {
		id, err := tokenID(one)
		if err != nil {
			return nil, false, err
		}
		return []int32{id}, true, nil
	}
	var many []json.Number
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, false, fmt.Errorf("want an integer or a list of integers, got %s", truncate(raw))
	}
	for _, n := range many {
		id, err := tokenID(n)
		if err != nil {
			return nil, false, err
		}
		ids = append(ids, id)
	}
	return ids, true, nil
}

func tokenID(n json.Number) (int32, error) {
	v, err := n.Int64()
	if err != nil || v < 0 || v > math.MaxInt32 {
		return 0, fmt.Errorf("token id %s is not an integer in [0, 2^31)", n)
	}
	return int32(v), nil
}

func isNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || bytes.Equal(t, []byte("null"))
}

func truncate(raw []byte) string {
	if len(raw) > 40 {
		return string(raw[:40]) + "..."
	}
	return string(raw)
}

// GenerationConfig holds the sampling defaults and stop tokens a checkpoint
// ships in generation_config.json. Nil pointers mean "not given": callers
// fall back to their own defaults rather than to zero.
type GenerationConfig struct {
	DoSample          *bool
	Temperature       *float32
	TopP              *float32
	TopK              *int
	MinP              *float32
	RepetitionPenalty *float32
	BOSTokenID        *int32
	// EOSTokenIDs are every id that ends generation (chat models list
	// several, e.g. <|eot_id|> and <|end_of_text|>).
	EOSTokenIDs []int32
	MaxLength   int // 0: not given
}

type hfGenerationConfig struct {
	DoSample          *bool           `json:"do_sample"`
	Temperature       *float64        `json:"temperature"`
	TopP              *float64        `json:"top_p"`
	TopK              *int            `json:"top_k"`
	MinP              *float64        `json:"min_p"`
	RepetitionPenalty *float64        `json:"repetition_penalty"`
	BOSTokenID        json.RawMessage `json:"bos_token_id"`
	EOSTokenID        json.RawMessage `json:"eos_token_id"`
	MaxLength         *int            `json:"max_length"`
}

// ParseGenerationConfig reads a generation_config.json. Values outside the
// ranges transformers accepts are errors, not silently clamped.
func ParseGenerationConfig(data []byte) (GenerationConfig, error) {
	var h hfGenerationConfig
	if err := json.Unmarshal(data, &h); err != nil {
		return GenerationConfig{}, fmt.Errorf("generation_config.json: %w", err)
	}
	g := GenerationConfig{DoSample: h.DoSample, TopK: h.TopK}
	f32 := func(name string, v *float64, lo, hi float64) (*float32, error) {
		if v == nil {
			return nil, nil
		}
		if !(*v >= lo && *v <= hi) {
			return nil, fmt.Errorf("generation_config.json: %s %g outside [%g, %g]", name, *v, lo, hi)
		}
		x := float32(*v)
		return &x, nil
	}
	var err error
	if g.Temperature, err = f32("temperature", h.Temperature, 0, 100); err != nil {
		return GenerationConfig{}, err
	}
	if g.TopP, err = f32("top_p", h.TopP, 0, 1); err != nil {
		return GenerationConfig{}, err
	}
	if g.MinP, err = f32("min_p", h.MinP, 0, 1); err != nil {
		return GenerationConfig{}, err
	}
	if g.RepetitionPenalty, err = f32("repetition_penalty", h.RepetitionPenalty, 1e-6, 100); err != nil {
		return GenerationConfig{}, err
	}
	if g.TopK != nil && *g.TopK < 0 {
		return GenerationConfig{}, fmt.Errorf("generation_config.json: top_k %d is negative", *g.TopK)
	}
	if h.MaxLength != nil {
		if *h.MaxLength < 0 {
			return GenerationConfig{}, fmt.Errorf("generation_config.json: max_length %d is negative", *h.MaxLength)
		}
		g.MaxLength = *h.MaxLength
	}
	bos, ok, err := tokenIDs(h.BOSTokenID)
	if err != nil {
		return GenerationConfig{}, fmt.Errorf("generation_config.json: bos_token_id: %w", err)
	}
	if ok {
		if len(bos) != 1 {
			return GenerationConfig{}, fmt.Errorf("generation_config.json: bos_token_id holds %d ids, want one", len(bos))
		}
		g.BOSTokenID = &bos[0]
	}
	if g.EOSTokenIDs, _, err = tokenIDs(h.EOSTokenID); err != nil {
		return GenerationConfig{}, fmt.Errorf("generation_config.json: eos_token_id: %w", err)
	}
	return g, nil
}

// StopTokenIDs merges the EOS ids of a config and its generation config,
// without duplicates, in first-seen order: generation_config.json often
// lists more end tokens than config.json (chat turn ends).
func StopTokenIDs(c Config, g GenerationConfig) []int32 {
	var out []int32
	seen := map[int32]bool{}
	for _, id := range append(append([]int32(nil), g.EOSTokenIDs...), c.EOSTokenIDs...) {
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
}
