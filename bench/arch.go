package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/trigon-llm/trigon/format/gguf"
	"github.com/trigon-llm/trigon/model"
	"github.com/trigon-llm/trigon/models"
)

// ArchDefault names the embedded default model's architecture.
const ArchDefault = "default"

// presets are published architectures, with the values of their Hugging
// Face config.json files, and ArchTiny. Only shapes and dtypes matter for
// speed; the token ids and RoPE settings are kept so the configs validate
// and read like the real ones.
var presets = map[string]func() model.Config{
	// Meta-Llama-3.1-8B. Llama-3-8B has the same shapes (it lacks only the
	// llama3 RoPE scaling and has an 8192 context), so both names map here.
	"llama-3-8b": func() model.Config {
		return model.Config{
			Arch: model.ArchLlama, VocabSize: 128256, Hidden: 4096, Intermediate: 14336,
			NumLayers: 32, NumHeads: 32, NumKVHeads: 8, HeadDim: 128,
			RMSNormEps: 1e-5, RopeTheta: 500000, MaxPositions: 131072,
			RopeScaling: &model.RopeScaling{Type: model.RopeLlama3, Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 8192},
			BOSTokenID:  128000, HasBOS: true, EOSTokenIDs: []int32{128001}, TorchDType: "bfloat16",
		}
	},
	// Meta-Llama-3.1-70B: the shape tensor parallelism exists for (140 GB
	// of bf16 weights, more than one GPU holds).
	"llama-3-70b": func() model.Config {
		return model.Config{
			Arch: model.ArchLlama, VocabSize: 128256, Hidden: 8192, Intermediate: 28672,
			NumLayers: 80, NumHeads: 64, NumKVHeads: 8, HeadDim: 128,
			RMSNormEps: 1e-5, RopeTheta: 500000, MaxPositions: 131072,
			RopeScaling: &model.RopeScaling{Type: model.RopeLlama3, Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 8192},
			BOSTokenID:  128000, HasBOS: true, EOSTokenIDs: []int32{128001}, TorchDType: "bfloat16",
		}
	},
	// Qwen2.5-7B: biased q/k/v projections, untied LM head.
	"qwen2.5-7b": func() model.Config {
		return model.Config{
			Arch: model.ArchQwen2, VocabSize: 152064, Hidden: 3584, Intermediate: 18944,
			NumLayers: 28, NumHeads: 28, NumKVHeads: 4, HeadDim: 128,
			RMSNormEps: 1e-6, RopeTheta: 1e6, MaxPositions: 131072, Llama: model.LlamaConfig{AttentionBias: true},
			BOSTokenID: 151643, HasBOS: false, EOSTokenIDs: []int32{151643}, TorchDType: "bfloat16",
		}
	},
	// Qwen3-8B: per-head RMS norms of q and k before RoPE, no biases,
	// untied LM head.
	"qwen3-8b": func() model.Config {
		return model.Config{
			Arch: model.ArchQwen3, VocabSize: 151936, Hidden: 4096, Intermediate: 12288,
			NumLayers: 36, NumHeads: 32, NumKVHeads: 8, HeadDim: 128,
			RMSNormEps: 1e-6, RopeTheta: 1e6, MaxPositions: 40960, Llama: model.LlamaConfig{QKNorm: true},
			BOSTokenID: 151643, HasBOS: false, EOSTokenIDs: []int32{151645}, TorchDType: "bfloat16",
		}
	},
	ArchTiny: func() model.Config {
		return model.Config{
			Arch: model.ArchLlama, VocabSize: 1024, Hidden: 256, Intermediate: 512,
			NumLayers: 2, NumHeads: 4, NumKVHeads: 2, HeadDim: 64,
			RMSNormEps: 1e-5, RopeTheta: 10000, MaxPositions: 2048,
			BOSTokenID: 1, HasBOS: true, EOSTokenIDs: []int32{2}, TorchDType: "bfloat16",
		}
	},
	// Llama-3.2-1B: head dim 64, LM head tied to the embeddings.
	"llama-3.2-1b": func() model.Config {
		return model.Config{
			Arch: model.ArchLlama, VocabSize: 128256, Hidden: 2048, Intermediate: 8192,
			NumLayers: 16, NumHeads: 32, NumKVHeads: 8, HeadDim: 64,
			RMSNormEps: 1e-5, RopeTheta: 500000, MaxPositions: 131072, TieEmbeddings: true,
			RopeScaling: &model.RopeScaling{Type: model.RopeLlama3, Factor: 32, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 8192},
			BOSTokenID:  128000, HasBOS: true, EOSTokenIDs: []int32{128001}, TorchDType: "bfloat16",
		}
	},
}

// ArchTiny is not a published model: a two-layer Llama of 1.7M parameters
// with a 1,024-token vocabulary, for tests and CPU smoke runs (serve
// --load-format dummy).
const ArchTiny = "tiny"

// aliases map other spellings to preset names.
var aliases = map[string]string{
	"llama-3.1-8b":       "llama-3-8b",
	"meta-llama-3-8b":    "llama-3-8b",
	"meta-llama-3.1-8b":  "llama-3-8b",
	"llama-3.1-70b":      "llama-3-70b",
	"meta-llama-3.1-70b": "llama-3-70b",
}

// ArchNames lists the names Arch accepts besides config paths.
func ArchNames() []string {
	names := []string{ArchDefault}
	for n := range presets {
		names = append(names, n)
	}
	for n := range aliases {
		names = append(names, n)
	}
	sort.Strings(names[1:])
	return names
}

// ArchLabel is the name reports use for the architecture Arch(name)
// returns: the preset's own name for presets and their aliases (so trigon's
// and the peers' results group together), name itself otherwise.
func ArchLabel(name string) string {
	key := strings.ToLower(strings.TrimSpace(name))
	if a, ok := aliases[key]; ok {
		return a
	}
	if _, ok := presets[key]; ok || key == ArchDefault {
		return key
	}
	return name
}

// Arch returns the architecture called name: a preset ("llama-3-8b",
// "qwen2.5-7b", "qwen3-8b", "llama-3.2-1b", "tiny"), "default" (the
// embedded model's config, read from its GGUF metadata), the path of a
// Hugging Face config.json (or of a directory holding one), or of a .gguf
// file (its metadata; the weights are not read).
func Arch(name string) (model.Config, error) {
	key := strings.ToLower(strings.TrimSpace(name))
	if a, ok := aliases[key]; ok {
		key = a
	}
	if mk, ok := presets[key]; ok {
		cfg := mk()
		if err := cfg.Validate(); err != nil {
			return model.Config{}, fmt.Errorf("arch %s: %w", name, err)
		}
		return cfg, nil
	}
	if key == ArchDefault {
		return defaultArch()
	}
	if st, err := os.Stat(name); err == nil && !st.IsDir() && strings.HasSuffix(key, ".gguf") {
		return ggufArch(name)
	}
	if st, err := os.Stat(name); err == nil {
		path := name
		if st.IsDir() {
			path = filepath.Join(name, "config.json")
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return model.Config{}, fmt.Errorf("arch %s: %w", name, err)
		}
		cfg, err := model.ParseHFConfig(data)
		if err != nil {
			return model.Config{}, fmt.Errorf("arch %s: %w", path, err)
		}
		return cfg, nil
	}
	return model.Config{}, fmt.Errorf("arch %q: not a known architecture (%s) nor a config.json path",
		name, strings.Join(ArchNames(), ", "))
}

// defaultArch reads the embedded model's config from its GGUF header only:
// the weights are not needed for synthetic runs.
func defaultArch() (model.Config, error) {
	path, err := models.DefaultPath()
	if err != nil {
		return model.Config{}, fmt.Errorf("arch default: %w", err)
	}
	cfg, err := ggufArch(path)
	if err != nil {
		return model.Config{}, fmt.Errorf("arch default: %w", err)
	}
	return cfg, nil
}

// ggufArch reads a GGUF file's config from its header.
func ggufArch(path string) (model.Config, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return model.Config{}, fmt.Errorf("arch %s: %w", path, err)
	}
	defer f.Close()
	cfg, err := model.ConfigFromGGUF(f)
	if err != nil {
		return model.Config{}, fmt.Errorf("arch %s: %w", path, err)
	}
	return cfg, nil
}
