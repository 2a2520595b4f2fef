package model

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/format/safetensors"
)

// Weight is one tensor of a checkpoint under its Hugging Face name.
type Weight struct {
	Name  string
	DType backend.DType
	Shape []int // outermost first: [outFeatures, inFeatures] for a projection
	// Data is the tensor in DType's encoding. It usually aliases a file
	// mapping: read-only, valid until the Weights is closed.
	Data []byte
}

// Weights is a checkpoint's tensors under Hugging Face names
// (model.embed_tokens.weight, model.layers.N.self_attn.q_proj.weight, ...,
// lm_head.weight), whatever the file format. The Weights owns the memory
// behind every Weight.Data; Close releases it.
type Weights interface {
	Tensor(name string) (Weight, bool)
	// Names lists every tensor, sorted.
	Names() []string
	Close() error
}

// Filler is an optional Weights interface for weights that need not exist
// as host bytes (bench's synthetic weights): a loader asks Fill to make a
// tensor's values directly in device memory, and calls Tensor only where
// Fill says it cannot.
type Filler interface {
	// Spec returns a tensor's dtype and shape without making its bytes.
	Spec(name string) (backend.DType, []int, bool)
	// Fill writes tensor name's values into dst, a tensor on b of Spec's
	// dtype with the same element count (or a row range of a bigger
	// tensor: the caller's View). It reports false, having done nothing,
	// where it cannot (b is not a backend.RandomFiller, or the dtype is
	// quantized).
	Fill(b backend.Backend, name string, dst backend.Tensor) (bool, error)
}

// HF tensor names. Per-layer names are "model.layers.N." + the suffix.
const (
	NameEmbed     = "model.embed_tokens.weight"
	NameFinalNorm = "model.norm.weight"
	NameLMHead    = "lm_head.weight"
	layerPrefix   = "model.layers."

	SuffixInputNorm = "input_layernorm.weight"
	SuffixPostNorm  = "post_attention_layernorm.weight"
	SuffixQ         = "self_attn.q_proj.weight"
	SuffixK         = "self_attn.k_proj.weight"
	SuffixV         = "self_attn.v_proj.weight"
	SuffixO         = "self_attn.o_proj.weight"
	SuffixQBias     = "self_attn.q_proj.bias"
	SuffixKBias     = "self_attn.k_proj.bias"
	SuffixVBias     = "self_attn.v_proj.bias"
	SuffixOBias     = "self_attn.o_proj.bias"
	SuffixQNorm     = "self_attn.q_norm.weight"
	SuffixKNorm     = "self_attn.k_norm.weight"
	SuffixGate      = "mlp.gate_proj.weight"
	SuffixUp        = "mlp.up_proj.weight"
	SuffixDown      = "mlp.down_proj.weight"
)

// LayerName is the HF name of a per-layer tensor.
func LayerName(layer int, suffix string) string {
	return layerPrefix + strconv.Itoa(layer) + "." + suffix
}

// splitLayerName is LayerName's inverse; ok is false for global names.
func splitLayerName(name string) (layer int, suffix string, ok bool) {
	rest, found := strings.CutPrefix(name, layerPrefix)
	if !found {
		return 0, "", false
	}
	num, suffix, found := strings.Cut(rest, ".")
	if !found {
		return 0, "", false
	}
	layer, err := strconv.Atoi(num)
	if err != nil || layer < 0 || strconv.Itoa(layer) != num {
		return 0, "", false
	}
	return layer, suffix, true
}

// WeightSpec is a tensor a Config requires.
type WeightSpec struct {
	Name  string
	Shape []int
	// Matrix marks projections and embeddings, which may be quantized;
	// the rest (norms, biases) must be float.
	Matrix bool
}

// ExpectedWeights lists every tensor c needs, with its shape. c must be
// valid.
func ExpectedWeights(c Config) []WeightSpec {
	h, q, kv, inter := c.Hidden, c.NumHeads*c.HeadDim, c.NumKVHeads*c.HeadDim, c.Intermediate
	specs := []WeightSpec{
		{NameEmbed, []int{c.VocabSize, h}, true},
		{NameFinalNorm, []int{h}, false},
	}
	if !c.TieEmbeddings {
		specs = append(specs, WeightSpec{NameLMHead, []int{c.VocabSize, h}, true})
	}
	for l := range c.NumLayers {
		add := func(suffix string, matrix bool, shape ...int) {
			specs = append(specs, WeightSpec{LayerName(l, suffix), shape, matrix})
		}
		add(SuffixInputNorm, false, h)
		add(SuffixQ, true, q, h)
		add(SuffixK, true, kv, h)
		add(SuffixV, true, kv, h)
		add(SuffixO, true, h, q)
		if c.Llama.AttentionBias {
			add(SuffixQBias, false, q)
			add(SuffixKBias, false, kv)
			add(SuffixVBias, false, kv)
		}
		if c.Llama.AttnOutputBias {
			add(SuffixOBias, false, h)
		}
		if c.Llama.QKNorm {
			add(SuffixQNorm, false, c.HeadDim)
			add(SuffixKNorm, false, c.HeadDim)
		}
		add(SuffixPostNorm, false, h)
		add(SuffixGate, true, inter, h)
		add(SuffixUp, true, inter, h)
		add(SuffixDown, true, h, inter)
	}
	return specs
}

// ignorable reports tensors some checkpoints carry that no forward pass
// reads: rotary tables saved by old transformers versions.
// The FP8 KV cache scales (k_scale, v_scale) are read by the cache, not
// the forward pass (ReadKVScales).
func ignorable(name string) bool {
	if _, _, ok := kvScaleName(name); ok {
		return true
	}
	return strings.HasSuffix(name, "rotary_emb.inv_freq")
}

// IsKVScale reports a tensor ReadKVScales reads: an FP8 KV cache scale,
// which no forward pass reads and GGUF has no name for.
func IsKVScale(name string) bool {
	_, _, ok := kvScaleName(name)
	return ok
}

// kvScaleName reports a layer's FP8 KV cache scale tensor under the names
// vLLM and compressed-tensors write: self_attn.k_scale / v_scale, or the
// older self_attn.k_proj.k_scale / v_proj.v_scale.
func kvScaleName(name string) (layer int, isK, ok bool) {
	l, suffix, ok := splitLayerName(name)
	if !ok {
		return 0, false, false
	}
	switch suffix {
	case "self_attn.k_scale", "self_attn.k_proj.k_scale":
		return l, true, true
	case "self_attn.v_scale", "self_attn.v_proj.v_scale":
		return l, false, true
	}
	return 0, false, false
}

// ReadKVScales returns a checkpoint's FP8 KV cache scales, per layer
// (x = e4m3 * scale), or nil when it has none. A checkpoint that has
// some must have both for every layer: a scalar or one per KV head, F32,
// F16 or BF16.
func ReadKVScales(w Weights, numLayers int) ([]KVScales, error) {
	out := make([]KVScales, numLayers)
	found := 0
	for _, name := range w.Names() {
		l, isK, ok := kvScaleName(name)
		if !ok {
			continue
		}
		if l < 0 || l >= numLayers {
			return nil, fmt.Errorf("kv scale %s: layer %d of %d", name, l, numLayers)
		}
		t, ok := w.Tensor(name)
		if !ok {
			return nil, fmt.Errorf("kv scale %s: not readable", name)
		}
		n, err := backend.NumElements(t.Shape)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("kv scale %s: shape %v", name, t.Shape)
		}
		v := make([]float32, n)
		if err := backend.DequantizeRow(t.DType, t.Data, v); err != nil {
			return nil, fmt.Errorf("kv scale %s: %w", name, err)
		}
		dst := &out[l].V
		if isK {
			dst = &out[l].K
		}
		if *dst != nil {
			return nil, fmt.Errorf("kv scale %s: layer %d has two", name, l)
		}
		*dst = v
		found++
	}
	if found == 0 {
		return nil, nil
	}
	for l, s := range out {
		if s.K == nil || s.V == nil {
			return nil, fmt.Errorf("kv scales: layer %d lacks k_scale or v_scale", l)
		}
	}
	return out, nil
}

// ValidateWeights checks that w holds every tensor c needs, with the right
// shape, a supported dtype and exactly the bytes that shape takes, and no
// tensor c does not explain (a sign of an architecture variant this code
// would silently run wrong). With tied embeddings a stored lm_head.weight is
// allowed and ignored, as transformers ignores it.
func ValidateWeights(c Config, w Weights) error {
	if err := c.Validate(); err != nil {
		return err
	}
	want := map[string]bool{}
	filler, _ := w.(Filler)
	for _, s := range ExpectedWeights(c) {
		want[s.Name] = true
		var t Weight
		ok := false
		if filler != nil {
			// Checked from the spec: the bytes may never be made on the host.
			t.Name = s.Name
			t.DType, t.Shape, ok = filler.Spec(s.Name)
		} else {
			t, ok = w.Tensor(s.Name)
		}
		if !ok {
			return fmt.Errorf("weights: tensor %s is missing", s.Name)
		}
		if !equalShape(t.Shape, s.Shape) {
			return fmt.Errorf("weights: tensor %s has shape %v, the config needs %v", s.Name, t.Shape, s.Shape)
		}
		switch t.DType {
		case backend.F32, backend.F16, backend.BF16:
		case backend.AWQ4G32, backend.AWQ4G64, backend.AWQ4G128, backend.F8E4M3Row:
			if !s.Matrix || s.Name == NameEmbed {
				return fmt.Errorf("weights: tensor %s is %v; only projections and the LM head may be AWQ or FP8", s.Name, t.DType)
			}
		case backend.Q8_0, backend.Q4_0, backend.Q4_K, backend.Q5_K, backend.Q6_K:
			if !s.Matrix {
				return fmt.Errorf("weights: tensor %s is %v; norms and biases must be F32, F16 or BF16", s.Name, t.DType)
			}
		default:
			return fmt.Errorf("weights: tensor %s has unsupported dtype %v", s.Name, t.DType)
		}
		n, err := t.DType.Bytes(t.Shape)
		if err != nil {
			return fmt.Errorf("weights: tensor %s: %w", s.Name, err)
		}
		if filler == nil && n != len(t.Data) {
			return fmt.Errorf("weights: tensor %s holds %d bytes, %v %v takes %d", s.Name, len(t.Data), t.DType, t.Shape, n)
		}
	}
	for _, name := range w.Names() {
		if want[name] || ignorable(name) || (c.TieEmbeddings && name == NameLMHead) {
			continue
		}
		return fmt.Errorf("weights: unexpected tensor %s (an architecture variant this config does not describe?)", name)
	}
	return nil
}

func equalShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// OpenWeights opens a model: a Hugging Face directory (config.json,
// optional generation_config.json, safetensors weights) or a .gguf file. The
// weights are validated against the config before they are returned; the
// caller closes them.
func OpenWeights(path string) (Config, GenerationConfig, Weights, error) {
	st, err := os.Stat(path)
	if err != nil {
		return Config{}, GenerationConfig{}, nil, fmt.Errorf("open model %s: %w", path, withoutPath(err, path))
	}
	var (
		cfg Config
		gen GenerationConfig
		w   Weights
	)
	if st.IsDir() {
		cfg, gen, w, err = openHFDir(path)
	} else {
		var isGGUF bool
		if isGGUF, err = IsGGUF(path); err == nil {
			if !isGGUF {
				err = errors.New("not a GGUF file (bad magic) and not a Hugging Face model directory")
			} else {
				cfg, gen, w, err = openGGUF(path)
			}
		}
	}
	if err != nil {
		return Config{}, GenerationConfig{}, nil, fmt.Errorf("open model %s: %w", path, withoutPath(err, path))
	}
	if err := ValidateWeights(cfg, w); err != nil {
		w.Close()
		return Config{}, GenerationConfig{}, nil, fmt.Errorf("open model %s: %w", path, err)
	}
	return cfg, gen, w, nil
}

// withoutPath is err less an *fs.PathError naming path (os.Stat's,
// gguf.Open's), for a message that names path itself; an error about
// another file (a directory's config.json) keeps its name.
func withoutPath(err error, path string) error {
	if pe, ok := err.(*fs.PathError); ok && pe.Path == path {
		return pe.Err
	}
	return err
}

// IsGGUF reports whether the file at path starts with the GGUF magic: a
// GGUF file is told by its content, whatever its name (Ollama's blobs
// have no suffix). A file shorter than the magic is not one.
func IsGGUF(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	var magic [4]byte
	if _, err := io.ReadFull(f, magic[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return false, nil
		}
		return false, err
	}
	return bytes.Equal(magic[:], []byte("GGUF")), nil
}

func openHFDir(dir string) (Config, GenerationConfig, Weights, error) {
	data, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return Config{}, GenerationConfig{}, nil, err
	}
	cfg, err := ParseHFConfig(data)
	if err != nil {
		return Config{}, GenerationConfig{}, nil, err
	}
	var raw struct {
		Q json.RawMessage `json:"quantization_config"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return Config{}, GenerationConfig{}, nil, fmt.Errorf("config.json: %w", err)
	}
	quant, err := ParseQuantization(raw.Q)
	if err != nil {
		return Config{}, GenerationConfig{}, nil, fmt.Errorf("config.json: %w", err)
	}
	var gen GenerationConfig
	data, err = os.ReadFile(filepath.Join(dir, "generation_config.json"))
	switch {
	case err == nil:
		if gen, err = ParseGenerationConfig(data); err != nil {
			return Config{}, GenerationConfig{}, nil, err
		}
	case !errors.Is(err, fs.ErrNotExist):
		return Config{}, GenerationConfig{}, nil, err
	}
	set, err := safetensors.OpenDir(dir)
	if err != nil {
		return Config{}, GenerationConfig{}, nil, err
	}
	w, err := newSafetensorsWeights(set, quant)
	if err != nil {
		set.Close()
		return Config{}, GenerationConfig{}, nil, err
	}
	return cfg, gen, w, nil
}

// safetensorsDTypes maps the dtype strings of safetensors headers. I32 and
// F8_E4M3 are the storage of quantized checkpoints, which the loader
// repacks (quantized.go); ValidateWeights refuses them anywhere else.
var safetensorsDTypes = map[string]backend.DType{"F32": backend.F32, "F16": backend.F16, "BF16": backend.BF16, "I32": backend.I32, "F8_E4M3": backend.F8E4M3}

// SafetensorsTensor is w as a tensor of a safetensors file, for the tools
// that write checkpoints (safetensors.Write): dtypes safetensors names
// (F32, F16, BF16, I32, F8_E4M3) only.
func SafetensorsTensor(w Weight) (safetensors.TensorInfo, error) {
	for name, dt := range safetensorsDTypes {
		if dt == w.DType {
			return safetensors.TensorInfo{Name: w.Name, DType: name, Shape: w.Shape, Data: w.Data}, nil
		}
	}
	return safetensors.TensorInfo{}, fmt.Errorf("tensor %s: dtype %v has no safetensors name", w.Name, w.DType)
}

// mapWeights is a Weights over a prepared name -> Weight map, closing an
// underlying file.
type mapWeights struct {
	byName map[string]Weight
	names  []string
	closer io.Closer
}

func (m *mapWeights) Tensor(name string) (Weight, bool) {
	w, ok := m.byName[name]
	return w, ok
}

func (m *mapWeights) Names() []string { return append([]string(nil), m.names...) }

func (m *mapWeights) Close() error {
	if m.closer == nil {
		return nil
	}
	err := m.closer.Close()
	m.closer, m.byName = nil, nil
	return err
}

func newMapWeights(byName map[string]Weight, closer io.Closer) *mapWeights {
	names := make([]string, 0, len(byName))
	for n := range byName {
		names = append(names, n)
	}
	sort.Strings(names)
	return &mapWeights{byName: byName, names: names, closer: closer}
}

func newSafetensorsWeights(set *safetensors.Set, quant Quantization) (*mapWeights, error) {
	byName := map[string]Weight{}
	for _, name := range set.Names() {
		// The KV cache scales stay: ReadKVScales reads them from here.
		if _, _, isScale := kvScaleName(name); ignorable(name) && !isScale {
			continue
		}
		t, ok := set.Tensor(name)
		if !ok {
			return nil, fmt.Errorf("safetensors: tensor %s listed but not found", name)
		}
		dt, ok := safetensorsDTypes[t.DType]
		if !ok {
			return nil, fmt.Errorf("safetensors: tensor %s has dtype %s; supported: F32, F16, BF16 (and I32, F8_E4M3 in quantized checkpoints)", name, t.DType)
		}
		byName[name] = Weight{Name: name, DType: dt, Shape: append([]int(nil), t.Shape...), Data: t.Data}
	}
	if quant.Method != "" {
		if err := repackQuantized(quant, byName); err != nil {
			return nil, fmt.Errorf("%s checkpoint: %w", quant.Method, err)
		}
	}
	return newMapWeights(byName, set), nil
}
