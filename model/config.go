package model

import (
	"errors"
	"fmt"
	"math"
)

// Architectures the config parsers resolve (from config.json's
// "architectures" or GGUF's general.architecture) into Config.Arch. They
// all belong to the Llama family: model/llama runs them with one forward
// pass, differing only in the switches of Config.Llama. model/arch maps
// each to its constructor.
const (
	ArchLlama   = "llama"
	ArchMistral = "mistral"
	ArchQwen2   = "qwen2"
	ArchQwen3   = "qwen3"
)

// Rope scaling types (RopeScaling.Type).
const (
	RopeLinear = "linear" // positions divided by Factor (inv_freq / Factor)
	RopeLlama3 = "llama3" // Llama 3.1 wavelength-dependent interpolation
)

// Config is the architecture of one model, resolved at load time so that
// nothing downstream parses a checkpoint again.
//
// The top-level fields are what any decoder-only transformer has and what
// every consumer may read (the runner and the engine size the KV cache,
// the context and the vocabulary by them; benchmarks count parameters).
// What only one family's forward pass reads is grouped under that family
// (Llama), zero for the others, so a new family adds its own group (its
// MoE sizes, activation, norm variant) without the other consumers
// knowing.
type Config struct {
	// Arch is the architecture, one of the Arch* constants: which family
	// runs the model (model/arch) and which switches it reads.
	Arch         string
	VocabSize    int
	Hidden       int // width of the residual stream
	Intermediate int // width of the MLP's gate and up projections
	NumLayers    int
	NumHeads     int // query heads
	NumKVHeads   int // key/value heads (GQA: NumHeads is a multiple)
	HeadDim      int // need not equal Hidden/NumHeads (Qwen3)
	RMSNormEps   float32
	RopeTheta    float64
	RopeScaling  *RopeScaling // nil: plain RoPE
	// RopeFreqFactors, when set, divides each pair's inverse frequency
	// ([HeadDim/2]). It is how GGUF stores Llama 3.1 scaling (the
	// rope_freqs.weight tensor); HF configs use RopeScaling instead.
	RopeFreqFactors []float32
	MaxPositions    int
	TieEmbeddings   bool // the LM head reuses embed_tokens
	SlidingWindow   int  // attend to at most this many positions; 0: unlimited
	BOSTokenID      int32
	HasBOS          bool
	EOSTokenIDs     []int32 // from the config; generation_config may add more
	TorchDType      string  // dtype the checkpoint declares ("bfloat16", ...); informative

	// Llama holds the switches of the Llama family's forward pass.
	Llama LlamaConfig
}

// LlamaConfig is what tells the Llama family's architectures apart: the
// tensors model/llama loads besides the common ones, and what it does
// with them.
type LlamaConfig struct {
	AttentionBias bool // q/k/v projections have a bias (Qwen2; Llama/Qwen3 attention_bias)
	// AttnOutputBias: o_proj has a bias too (Llama and Qwen3 with
	// attention_bias, never Qwen2).
	AttnOutputBias bool
	QKNorm         bool // per-head RMS norm of Q and K before RoPE (Qwen3)
}

// RopeScaling is a context-extension rule applied to RoPE's inverse
// frequencies.
type RopeScaling struct {
	Type   string  // RopeLinear or RopeLlama3
	Factor float64 // > 0; llama3: 8 for Llama 3.1
	// Llama 3 only.
	LowFreqFactor        float64
	HighFreqFactor       float64
	OriginalMaxPositions int
}

// maxDim bounds every size in a config: far above any real model, low
// enough that products of two sizes cannot overflow an int64. Counts that
// multiply work before any tensor is read (layers, heads) get a tighter
// bound, so a hostile header cannot make validation itself expensive.
const (
	maxDim   = 1 << 24
	maxCount = 1 << 12
)

// Validate reports the first inconsistency in c. Every loader calls it, so
// code downstream may rely on the sizes being positive and divisible.
func (c Config) Validate() error {
	switch c.Arch {
	case ArchLlama, ArchMistral, ArchQwen2, ArchQwen3:
	default:
		return fmt.Errorf("config: unsupported architecture %q", c.Arch)
	}
	for _, f := range []struct {
		name string
		v    int
	}{
		{"vocab size", c.VocabSize}, {"hidden size", c.Hidden}, {"intermediate size", c.Intermediate},
		{"layer count", c.NumLayers}, {"head count", c.NumHeads}, {"KV head count", c.NumKVHeads},
		{"head dim", c.HeadDim}, {"max positions", c.MaxPositions},
	} {
		if f.v <= 0 || f.v > maxDim {
			return fmt.Errorf("config: %s %d out of range (1..%d)", f.name, f.v, maxDim)
		}
	}
	if c.NumLayers > maxCount || c.NumHeads > maxCount {
		return fmt.Errorf("config: %d layers and %d heads; at most %d each", c.NumLayers, c.NumHeads, maxCount)
	}
	if c.NumHeads%c.NumKVHeads != 0 {
		return fmt.Errorf("config: %d query heads are not a multiple of %d KV heads", c.NumHeads, c.NumKVHeads)
	}
	if c.HeadDim%2 != 0 {
		return fmt.Errorf("config: head dim %d is odd; RoPE rotates pairs", c.HeadDim)
	}
	if _, err := checkedMul(c.NumHeads, c.HeadDim); err != nil {
		return fmt.Errorf("config: query width: %w", err)
	}
	if !(c.RMSNormEps > 0) || math.IsInf(float64(c.RMSNormEps), 0) {
		return fmt.Errorf("config: rms_norm_eps %g must be positive and finite", c.RMSNormEps)
	}
	if !(c.RopeTheta > 1) || math.IsInf(c.RopeTheta, 0) {
		return fmt.Errorf("config: rope theta %g must be finite and > 1", c.RopeTheta)
	}
	if c.SlidingWindow < 0 {
		return fmt.Errorf("config: sliding window %d is negative", c.SlidingWindow)
	}
	if c.Llama.QKNorm && c.Arch != ArchQwen3 {
		return fmt.Errorf("config: q/k norm is a Qwen3 feature, not %s", c.Arch)
	}
	if c.HasBOS && (c.BOSTokenID < 0 || int(c.BOSTokenID) >= c.VocabSize) {
		return fmt.Errorf("config: BOS id %d outside the vocabulary of %d", c.BOSTokenID, c.VocabSize)
	}
	for _, id := range c.EOSTokenIDs {
		if id < 0 || int(id) >= c.VocabSize {
			return fmt.Errorf("config: EOS id %d outside the vocabulary of %d", id, c.VocabSize)
		}
	}
	if f := c.RopeFreqFactors; f != nil {
		if len(f) != c.HeadDim/2 {
			return fmt.Errorf("config: %d rope frequency factors for head dim %d, want %d", len(f), c.HeadDim, c.HeadDim/2)
		}
		for i, v := range f {
			if !(v > 0) || math.IsInf(float64(v), 0) {
				return fmt.Errorf("config: rope frequency factor %d is %g, want positive and finite", i, v)
			}
		}
	}
	if s := c.RopeScaling; s != nil {
		if err := s.validate(); err != nil {
			return fmt.Errorf("config: rope scaling: %w", err)
		}
	}
	return nil
}

func (s *RopeScaling) validate() error {
	if !(s.Factor > 0) || math.IsInf(s.Factor, 0) {
		return fmt.Errorf("factor %g must be positive and finite", s.Factor)
	}
	switch s.Type {
	case RopeLinear:
		return nil
	case RopeLlama3:
		if !(s.LowFreqFactor > 0) || !(s.HighFreqFactor > s.LowFreqFactor) || math.IsInf(s.HighFreqFactor, 0) {
			return fmt.Errorf("llama3 needs 0 < low_freq_factor < high_freq_factor, got %g and %g", s.LowFreqFactor, s.HighFreqFactor)
		}
		if s.OriginalMaxPositions <= 0 {
			return fmt.Errorf("llama3 needs original_max_position_embeddings > 0, got %d", s.OriginalMaxPositions)
		}
		return nil
	}
	return fmt.Errorf("type %q is not supported (supported: %s, %s)", s.Type, RopeLinear, RopeLlama3)
}

// QKVWidth is the row count of the fused Q,K,V projection:
// (NumHeads + 2*NumKVHeads) * HeadDim.
func (c Config) QKVWidth() int { return (c.NumHeads + 2*c.NumKVHeads) * c.HeadDim }

// InvFreq returns RoPE's per-pair inverse frequencies ([HeadDim/2]) with
// the configured scaling applied. It follows transformers' rope init
// functions formula by formula but evaluates them in float64 and rounds
// once, so it is within an ulp of transformers' float32 result.
func (c Config) InvFreq() []float32 {
	half := c.HeadDim / 2
	out := make([]float32, half)
	for i := range half {
		inv := 1 / math.Pow(c.RopeTheta, float64(2*i)/float64(c.HeadDim))
		if s := c.RopeScaling; s != nil {
			switch s.Type {
			case RopeLinear:
				inv /= s.Factor
			case RopeLlama3:
				inv = llama3Scale(inv, s)
			}
		}
		if c.RopeFreqFactors != nil {
			inv /= float64(c.RopeFreqFactors[i])
		}
		out[i] = float32(inv)
	}
	return out
}

// llama3Scale applies Llama 3.1's rule to one inverse frequency: short
// wavelengths are kept, long ones divided by the factor, and those between
// the two thresholds interpolated smoothly.
func llama3Scale(inv float64, s *RopeScaling) float64 {
	old := float64(s.OriginalMaxPositions)
	lowWavelen := old / s.LowFreqFactor   // longer than this: fully scaled
	highWavelen := old / s.HighFreqFactor // shorter than this: untouched
	wavelen := 2 * math.Pi / inv
	switch {
	case wavelen < highWavelen:
		return inv
	case wavelen > lowWavelen:
		return inv / s.Factor
	}
	smooth := (old/wavelen - s.LowFreqFactor) / (s.HighFreqFactor - s.LowFreqFactor)
	return (1-smooth)*inv/s.Factor + smooth*inv
}

// Llama3FreqFactors returns the per-pair divisors ([HeadDim/2]) that turn
// plain RoPE frequencies into c's llama3-scaled ones: the rope_freqs.weight
// tensor llama.cpp stores in GGUF files instead of the scaling parameters.
// It errors unless c has llama3 scaling.
func (c Config) Llama3FreqFactors() ([]float32, error) {
	s := c.RopeScaling
	if s == nil || s.Type != RopeLlama3 {
		return nil, errors.New("config has no llama3 rope scaling")
	}
	out := make([]float32, c.HeadDim/2)
	for i := range out {
		inv := 1 / math.Pow(c.RopeTheta, float64(2*i)/float64(c.HeadDim))
		out[i] = float32(inv / llama3Scale(inv, s))
	}
	return out, nil
}

// checkedMul returns a*b for non-negative a, b, or an error on overflow.
func checkedMul(a, b int) (int, error) {
	if a < 0 || b < 0 {
		return 0, fmt.Errorf("negative size %d x %d", a, b)
	}
	if a != 0 && b > math.MaxInt64/a {
		return 0, fmt.Errorf("size %d x %d overflows", a, b)
	}
	return a * b, nil
}
