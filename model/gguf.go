package model

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/format/gguf"
)

// GGUF side of the model: llama.cpp's metadata keys and tensor names, its
// Q/K row order, and its type numbers, mapped to and from trigon's HF view.

// ggufArchs maps general.architecture to Arch. llama.cpp converts Mistral
// checkpoints as "llama".
var ggufArchs = map[string]string{"llama": ArchLlama, "qwen2": ArchQwen2, "qwen3": ArchQwen3}

// GGUFArch is the general.architecture llama.cpp uses for c.Arch.
func GGUFArch(arch string) (string, error) {
	switch arch {
	case ArchLlama, ArchMistral:
		return "llama", nil
	case ArchQwen2, ArchQwen3:
		return arch, nil
	}
	return "", fmt.Errorf("architecture %q has no GGUF mapping", arch)
}

// Global tensor names, HF -> GGUF; per-layer suffixes below.
var ggufGlobalNames = map[string]string{
	NameEmbed:     "token_embd.weight",
	NameFinalNorm: "output_norm.weight",
	NameLMHead:    "output.weight",
}

var ggufLayerNames = map[string]string{
	SuffixInputNorm: "attn_norm.weight",
	SuffixPostNorm:  "ffn_norm.weight",
	SuffixQ:         "attn_q.weight",
	SuffixK:         "attn_k.weight",
	SuffixV:         "attn_v.weight",
	SuffixO:         "attn_output.weight",
	SuffixQBias:     "attn_q.bias",
	SuffixKBias:     "attn_k.bias",
	SuffixVBias:     "attn_v.bias",
	SuffixOBias:     "attn_output.bias",
	SuffixQNorm:     "attn_q_norm.weight",
	SuffixKNorm:     "attn_k_norm.weight",
	SuffixGate:      "ffn_gate.weight",
	SuffixUp:        "ffn_up.weight",
	SuffixDown:      "ffn_down.weight",
}

// ggufRopeFreqs is the tensor of Llama 3.1 per-pair frequency divisors.
const ggufRopeFreqs = "rope_freqs.weight"

// GGUFTensorName maps an HF tensor name to llama.cpp's.
func GGUFTensorName(hf string) (string, error) {
	if g, ok := ggufGlobalNames[hf]; ok {
		return g, nil
	}
	if layer, suffix, ok := splitLayerName(hf); ok {
		if g, ok := ggufLayerNames[suffix]; ok {
			return "blk." + strconv.Itoa(layer) + "." + g, nil
		}
	}
	return "", fmt.Errorf("tensor %s has no GGUF name", hf)
}

// HFTensorName maps a llama.cpp tensor name to the HF one; ok is false for
// names outside the Llama family's set.
func HFTensorName(g string) (string, bool) {
	for hf, gg := range ggufGlobalNames {
		if gg == g {
			return hf, true
		}
	}
	rest, found := strings.CutPrefix(g, "blk.")
	if !found {
		return "", false
	}
	num, suffix, found := strings.Cut(rest, ".")
	if !found {
		return "", false
	}
	layer, err := strconv.Atoi(num)
	if err != nil || layer < 0 || strconv.Itoa(layer) != num {
		return "", false
	}
	for hfSuffix, gs := range ggufLayerNames {
		if gs == suffix {
			return LayerName(layer, hfSuffix), true
		}
	}
	return "", false
}

// DTypeFromGGML maps a GGML tensor type to a backend dtype.
func DTypeFromGGML(t gguf.GGMLType) (backend.DType, error) {
	switch t {
	case gguf.TypeF32:
		return backend.F32, nil
	case gguf.TypeF16:
		return backend.F16, nil
	case gguf.TypeBF16:
		return backend.BF16, nil
	case gguf.TypeQ8_0:
		return backend.Q8_0, nil
	case gguf.TypeQ4_0:
		return backend.Q4_0, nil
	case gguf.TypeQ4_K:
		return backend.Q4_K, nil
	case gguf.TypeQ5_K:
		return backend.Q5_K, nil
	case gguf.TypeQ6_K:
		return backend.Q6_K, nil
	}
	return 0, fmt.Errorf("GGML type %v is not supported (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K)", t)
}

// GGMLFromDType maps a backend weight dtype to its GGML type.
func GGMLFromDType(dt backend.DType) (gguf.GGMLType, error) {
	switch dt {
	case backend.F32:
		return gguf.TypeF32, nil
	case backend.F16:
		return gguf.TypeF16, nil
	case backend.BF16:
		return gguf.TypeBF16, nil
	case backend.Q8_0:
		return gguf.TypeQ8_0, nil
	case backend.Q4_0:
		return gguf.TypeQ4_0, nil
	case backend.Q4_K:
		return gguf.TypeQ4_K, nil
	case backend.Q5_K:
		return gguf.TypeQ5_K, nil
	case backend.Q6_K:
		return gguf.TypeQ6_K, nil
	}
	return 0, fmt.Errorf("dtype %v has no GGML type", dt)
}

// PermutesQK reports whether llama.cpp reorders the Q/K projection rows of
// arch. Its "llama" converter rearranges each head's rows from the HF
// rotate-half layout (pairs i, i+d/2) to GGML's interleaved one (pairs 2i,
// 2i+1); Qwen models keep the HF layout (NeoX RoPE).
func PermutesQK(arch string) bool { return arch == ArchLlama || arch == ArchMistral }

// PermuteQKRows reorders the rows of a Q or K projection (weight or bias)
// between the HF and llama.cpp layouts, as a byte copy: rows are whole
// quantization blocks, so it works for every dtype. data holds numHeads *
// headDim rows of rowBytes each. toGGUF selects the direction:
//
//	GGUF row h*d + 2j + s  =  HF row h*d + s*d/2 + j   (j < d/2, s in {0,1})
func PermuteQKRows(data []byte, numHeads, headDim, rowBytes int, toGGUF bool) ([]byte, error) {
	rows, err := checkedMul(numHeads, headDim)
	if err != nil {
		return nil, err
	}
	size, err := checkedMul(rows, rowBytes)
	if err != nil {
		return nil, err
	}
	if numHeads <= 0 || headDim <= 0 || headDim%2 != 0 || rowBytes <= 0 || size != len(data) {
		return nil, fmt.Errorf("permute q/k rows: %d bytes are not %d heads x %d (even) rows x %d bytes", len(data), numHeads, headDim, rowBytes)
	}
	out := make([]byte, len(data))
	half := headDim / 2
	for h := range numHeads {
		for j := range half {
			for s := range 2 {
				hf := h*headDim + s*half + j
				gg := h*headDim + 2*j + s
				dst, src := gg, hf
				if !toGGUF {
					dst, src = hf, gg
				}
				copy(out[dst*rowBytes:(dst+1)*rowBytes], data[src*rowBytes:(src+1)*rowBytes])
			}
		}
	}
	return out, nil
}

// GGUFTensor is one tensor in llama.cpp's naming, dims and row order.
type GGUFTensor struct {
	Name string
	Type gguf.GGMLType
	Dims []uint64 // innermost first
	Data []byte
}

// ToGGUFTensor turns an HF weight of a model with config c into its GGUF
// form: name mapped, dims reversed, Q/K rows permuted for llama-arch
// models. It converts no dtypes; callers quantize before calling.
func ToGGUFTensor(c Config, w Weight) (GGUFTensor, error) {
	name, err := GGUFTensorName(w.Name)
	if err != nil {
		return GGUFTensor{}, err
	}
	typ, err := GGMLFromDType(w.DType)
	if err != nil {
		return GGUFTensor{}, fmt.Errorf("tensor %s: %w", w.Name, err)
	}
	dims := make([]uint64, len(w.Shape))
	for i, d := range w.Shape {
		if d <= 0 {
			return GGUFTensor{}, fmt.Errorf("tensor %s: bad shape %v", w.Name, w.Shape)
		}
		dims[len(w.Shape)-1-i] = uint64(d)
	}
	data := w.Data
	if heads, ok := qkHeads(c, w.Name); ok {
		data, err = permuteWeight(w, heads, c.HeadDim, true)
		if err != nil {
			return GGUFTensor{}, err
		}
	}
	return GGUFTensor{Name: name, Type: typ, Dims: dims, Data: data}, nil
}

// qkHeads reports whether name is a Q or K projection (weight or bias)
// that llama.cpp permutes for c, and over how many heads.
func qkHeads(c Config, name string) (int, bool) {
	if !PermutesQK(c.Arch) {
		return 0, false
	}
	_, suffix, ok := splitLayerName(name)
	if !ok {
		return 0, false
	}
	switch suffix {
	case SuffixQ, SuffixQBias:
		return c.NumHeads, true
	case SuffixK, SuffixKBias:
		return c.NumKVHeads, true
	}
	return 0, false
}

func permuteWeight(w Weight, heads, headDim int, toGGUF bool) ([]byte, error) {
	rowBytes := w.DType.BlockBytes()
	if len(w.Shape) == 2 {
		var err error
		if rowBytes, err = w.DType.RowBytes(w.Shape[1]); err != nil {
			return nil, fmt.Errorf("tensor %s: %w", w.Name, err)
		}
	}
	out, err := PermuteQKRows(w.Data, heads, headDim, rowBytes, toGGUF)
	if err != nil {
		return nil, fmt.Errorf("tensor %s: %w", w.Name, err)
	}
	return out, nil
}

// GGUFMetadata returns the architecture keys llama.cpp reads for c, in the
// order its converter writes them. Tokenizer keys (tokenizer.ggml.*,
// including the BOS/EOS ids) belong to the tokenizer and are not included.
// Llama 3.1 scaling is not metadata but the rope_freqs.weight tensor: see
// Llama3FreqFactors and RopeFreqsTensor.
func (c Config) GGUFMetadata() ([]gguf.KV, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	a, err := GGUFArch(c.Arch)
	if err != nil {
		return nil, err
	}
	u32 := func(v int) gguf.Value { return gguf.Uint32Value(uint32(v)) }
	kvs := []gguf.KV{
		{Key: "general.architecture", Value: gguf.StringValue(a)},
		{Key: a + ".vocab_size", Value: u32(c.VocabSize)},
		{Key: a + ".context_length", Value: u32(c.MaxPositions)},
		{Key: a + ".embedding_length", Value: u32(c.Hidden)},
		{Key: a + ".feed_forward_length", Value: u32(c.Intermediate)},
		{Key: a + ".block_count", Value: u32(c.NumLayers)},
		{Key: a + ".attention.head_count", Value: u32(c.NumHeads)},
		{Key: a + ".attention.head_count_kv", Value: u32(c.NumKVHeads)},
		{Key: a + ".attention.key_length", Value: u32(c.HeadDim)},
		{Key: a + ".attention.value_length", Value: u32(c.HeadDim)},
		{Key: a + ".rope.dimension_count", Value: u32(c.HeadDim)},
		{Key: a + ".rope.freq_base", Value: gguf.Float32Value(float32(c.RopeTheta))},
		{Key: a + ".attention.layer_norm_rms_epsilon", Value: gguf.Float32Value(c.RMSNormEps)},
	}
	if s := c.RopeScaling; s != nil && s.Type == RopeLinear {
		kvs = append(kvs,
			gguf.KV{Key: a + ".rope.scaling.type", Value: gguf.StringValue("linear")},
			gguf.KV{Key: a + ".rope.scaling.factor", Value: gguf.Float32Value(float32(s.Factor))})
	}
	if c.SlidingWindow > 0 {
		kvs = append(kvs, gguf.KV{Key: a + ".attention.sliding_window", Value: u32(c.SlidingWindow)})
	}
	return kvs, nil
}

// RopeFreqsTensor returns the rope_freqs.weight tensor a GGUF file of c
// needs, ok false when c has neither llama3 scaling nor frequency factors.
// A config read from GGUF carries the factors themselves (RopeFreqFactors,
// no RopeScaling); they are written back as read, so a GGUF-to-GGUF
// conversion keeps the scaling.
func (c Config) RopeFreqsTensor() (t GGUFTensor, ok bool, err error) {
	f := c.RopeFreqFactors
	if len(f) == 0 {
		if c.RopeScaling == nil || c.RopeScaling.Type != RopeLlama3 {
			return GGUFTensor{}, false, nil
		}
		if f, err = c.Llama3FreqFactors(); err != nil {
			return GGUFTensor{}, false, err
		}
	}
	data := make([]byte, 4*len(f))
	for i, v := range f {
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(v))
	}
	return GGUFTensor{Name: ggufRopeFreqs, Type: gguf.TypeF32, Dims: []uint64{uint64(len(f))}, Data: data}, true, nil
}

// ConfigFromGGUF reads the architecture from llama.cpp metadata, with the
// defaults llama.cpp applies to absent keys. What the metadata does not say
// is read off the tensors: tied embeddings (no output.weight), attention
// biases, Q/K norms and Llama 3.1 frequency factors (rope_freqs.weight).
func ConfigFromGGUF(f *gguf.File) (Config, error) {
	name, ok := f.String("general.architecture")
	if !ok {
		return Config{}, fmt.Errorf("gguf: general.architecture is missing")
	}
	arch, ok := ggufArchs[name]
	if !ok {
		return Config{}, fmt.Errorf("gguf: architecture %q is not supported (supported: llama, qwen2, qwen3)", name)
	}
	c := Config{Arch: arch}
	key := func(k string) string { return name + "." + k }
	uintKey := func(k string, dst *int, required bool) error {
		v, ok := f.Uint(key(k))
		if !ok {
			if required || f.Has(key(k)) {
				return fmt.Errorf("gguf: %s is missing or not a non-negative integer", key(k))
			}
			return nil
		}
		if v > maxDim {
			return fmt.Errorf("gguf: %s = %d is out of range", key(k), v)
		}
		*dst = int(v)
		return nil
	}
	for _, r := range []struct {
		k   string
		dst *int
	}{
		{"context_length", &c.MaxPositions},
		{"embedding_length", &c.Hidden},
		{"feed_forward_length", &c.Intermediate},
		{"block_count", &c.NumLayers},
		{"attention.head_count", &c.NumHeads},
	} {
		if err := uintKey(r.k, r.dst, true); err != nil {
			return Config{}, err
		}
	}
	c.NumKVHeads = c.NumHeads
	if err := uintKey("attention.head_count_kv", &c.NumKVHeads, false); err != nil {
		return Config{}, err
	}
	if c.NumHeads > 0 {
		c.HeadDim = c.Hidden / c.NumHeads
	}
	if err := uintKey("attention.key_length", &c.HeadDim, false); err != nil {
		return Config{}, err
	}
	var valueLen, ropeDim int
	if err := uintKey("attention.value_length", &valueLen, false); err != nil {
		return Config{}, err
	}
	if valueLen != 0 && valueLen != c.HeadDim {
		return Config{}, fmt.Errorf("gguf: value length %d differs from key length %d", valueLen, c.HeadDim)
	}
	if err := uintKey("rope.dimension_count", &ropeDim, false); err != nil {
		return Config{}, err
	}
	if ropeDim != 0 && ropeDim != c.HeadDim {
		return Config{}, fmt.Errorf("gguf: partial rotary (rope dimension %d of head dim %d) is not supported", ropeDim, c.HeadDim)
	}
	if err := uintKey("attention.sliding_window", &c.SlidingWindow, false); err != nil {
		return Config{}, err
	}
	if v, ok := f.Value(key("attention.sliding_window_pattern")); ok {
		// Per-layer pattern: one window for all layers or none.
		pattern, ok := v.AsBools()
		if !ok {
			return Config{}, fmt.Errorf("gguf: %s is not a bool array", key("attention.sliding_window_pattern"))
		}
		sliding := 0
		for _, s := range pattern {
			if s {
				sliding++
			}
		}
		switch sliding {
		case 0:
			c.SlidingWindow = 0
		case len(pattern):
		default:
			return Config{}, fmt.Errorf("gguf: sliding window on %d of %d layers is not supported", sliding, len(pattern))
		}
	}
	eps, ok := f.Float(key("attention.layer_norm_rms_epsilon"))
	if !ok {
		return Config{}, fmt.Errorf("gguf: %s is missing", key("attention.layer_norm_rms_epsilon"))
	}
	c.RMSNormEps = float32(eps)
	c.RopeTheta = 10000
	if v, ok := f.Float(key("rope.freq_base")); ok {
		c.RopeTheta = v
	}
	if err := ggufRopeScaling(f, key, &c); err != nil {
		return Config{}, err
	}

	// Vocabulary: explicit key, else the tokenizer's token list, else the
	// embedding's rows.
	if err := uintKey("vocab_size", &c.VocabSize, false); err != nil {
		return Config{}, err
	}
	if c.VocabSize == 0 {
		if v, ok := f.Value("tokenizer.ggml.tokens"); ok && v.Len() > 0 {
			c.VocabSize = v.Len()
		} else if t, ok := f.Tensor("token_embd.weight"); ok && len(t.Dims) == 2 && t.Dims[1] <= maxDim {
			c.VocabSize = int(t.Dims[1])
		}
	}

	_, hasOutput := f.Tensor("output.weight")
	c.TieEmbeddings = !hasOutput
	_, c.Llama.AttentionBias = f.Tensor("blk.0.attn_q.bias")
	_, c.Llama.AttnOutputBias = f.Tensor("blk.0.attn_output.bias")
	_, c.Llama.QKNorm = f.Tensor("blk.0.attn_q_norm.weight")
	if arch == ArchQwen2 && !c.Llama.AttentionBias {
		return Config{}, fmt.Errorf("gguf: qwen2 model without attention biases")
	}

	if id, ok := f.Uint("tokenizer.ggml.bos_token_id"); ok && id <= math.MaxInt32 {
		c.BOSTokenID, c.HasBOS = int32(id), true
	}
	if id, ok := f.Uint("tokenizer.ggml.eos_token_id"); ok && id <= math.MaxInt32 {
		c.EOSTokenIDs = []int32{int32(id)}
	}
	if err := c.Validate(); err != nil {
		return Config{}, fmt.Errorf("gguf: %w", err)
	}
	return c, nil
}

func ggufRopeScaling(f *gguf.File, key func(string) string, c *Config) error {
	typ, hasType := f.String(key("rope.scaling.type"))
	factor, hasFactor := f.Float(key("rope.scaling.factor"))
	if !hasType {
		// Older files: rope.scale_linear alone means linear scaling.
		if v, ok := f.Float(key("rope.scale_linear")); ok && v != 1 {
			typ, factor, hasFactor = RopeLinear, v, true
		}
	}
	switch typ {
	case "", "none":
	case RopeLinear:
		if !hasFactor {
			return fmt.Errorf("gguf: linear rope scaling without %s", key("rope.scaling.factor"))
		}
		if factor != 1 {
			c.RopeScaling = &RopeScaling{Type: RopeLinear, Factor: factor}
		}
	default:
		return fmt.Errorf("gguf: rope scaling %q is not supported (supported: none, linear, llama3 frequency factors)", typ)
	}
	t, ok := f.Tensor(ggufRopeFreqs)
	if !ok {
		return nil
	}
	if t.Type != gguf.TypeF32 || len(t.Dims) != 1 || len(t.Data) != 4*int(t.Dims[0]) {
		return fmt.Errorf("gguf: %s must be a 1-D F32 tensor, got %v %v", ggufRopeFreqs, t.Type, t.Dims)
	}
	c.RopeFreqFactors = make([]float32, t.Dims[0])
	for i := range c.RopeFreqFactors {
		c.RopeFreqFactors[i] = math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*i:]))
	}
	return nil
}

// generationFromGGUF collects the ids that end generation: EOS plus the
// end-of-turn and end-of-message ids llama.cpp also stops on.
func generationFromGGUF(f *gguf.File) GenerationConfig {
	var g GenerationConfig
	if id, ok := f.Uint("tokenizer.ggml.bos_token_id"); ok && id <= math.MaxInt32 {
		v := int32(id)
		g.BOSTokenID = &v
	}
	for _, k := range []string{"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"} {
		if id, ok := f.Uint(k); ok && id <= math.MaxInt32 && !slices.Contains(g.EOSTokenIDs, int32(id)) {
			g.EOSTokenIDs = append(g.EOSTokenIDs, int32(id))
		}
	}
	return g
}

// openGGUF maps a GGUF file's tensors to HF names and layout. Q/K rows of
// llama-arch files are copied back into HF order; everything else aliases
// the mapping.
func openGGUF(path string) (Config, GenerationConfig, Weights, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return Config{}, GenerationConfig{}, nil, err
	}
	cfg, gen, w, err := weightsFromGGUF(f)
	if err != nil {
		f.Close()
		return Config{}, GenerationConfig{}, nil, err
	}
	return cfg, gen, w, nil
}

// weightsFromGGUF builds the HF view of a parsed file; the Weights closes f.
func weightsFromGGUF(f *gguf.File) (Config, GenerationConfig, Weights, error) {
	cfg, err := ConfigFromGGUF(f)
	if err != nil {
		return Config{}, GenerationConfig{}, nil, err
	}
	byName := map[string]Weight{}
	for _, t := range f.Tensors {
		if t.Name == ggufRopeFreqs {
			continue
		}
		hf, ok := HFTensorName(t.Name)
		if !ok {
			return Config{}, GenerationConfig{}, nil, fmt.Errorf("gguf: unexpected tensor %s", t.Name)
		}
		dt, err := DTypeFromGGML(t.Type)
		if err != nil {
			return Config{}, GenerationConfig{}, nil, fmt.Errorf("gguf: tensor %s: %w", t.Name, err)
		}
		shape := make([]int, len(t.Dims))
		for i, d := range t.Dims {
			if d == 0 || d > maxDim*maxDim {
				return Config{}, GenerationConfig{}, nil, fmt.Errorf("gguf: tensor %s has dim %d", t.Name, d)
			}
			shape[len(t.Dims)-1-i] = int(d)
		}
		w := Weight{Name: hf, DType: dt, Shape: shape, Data: t.Data}
		if heads, ok := qkHeads(cfg, hf); ok {
			if w.Data, err = permuteWeight(w, heads, cfg.HeadDim, false); err != nil {
				return Config{}, GenerationConfig{}, nil, fmt.Errorf("gguf: %w", err)
			}
		}
		byName[hf] = w
	}
	return cfg, generationFromGGUF(f), newMapWeights(byName, f), nil
}
