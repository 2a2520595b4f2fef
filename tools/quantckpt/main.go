// Command quantckpt writes a pre-quantized Hugging Face checkpoint (AutoAWQ
// GEMM or compressed-tensors FP8) from an unquantized one, round to
// nearest, so that the AWQ and FP8 loaders and kernels can be tested and
// measured without downloads (docs/quantization.md).
//
//	quantckpt -format awq [-group 128] SRC DST
//	quantckpt -format fp8 [-scale channel|tensor] SRC DST
//	quantckpt -format awq -random [-seed 1] SRC DST
//
// SRC is a Hugging Face directory (config.json, safetensors weights in
// F32, F16 or BF16); DST gets its config.json with a quantization_config,
// its other files (tokenizer, generation config) copied, and one
// model.safetensors in which every per-layer projection is quantized and
// every other tensor is as it was. With -random only SRC's config.json is
// read, or SRC is a bench preset name (llama-3-8b, qwen3-8b, ...; the
// config.json is then written from it and no tokenizer comes with the
// checkpoint): the weights are bench.SyntheticWeights of its shapes (BF16,
// the seed), which makes 8B-shaped test checkpoints from a config alone.
//
// AWQ rounding is backend.QuantizeAWQ4 (AutoAWQ's quantizer without its
// activation-aware scale search); FP8 is e4m3 with max|w|/448 per output
// feature or per tensor, weight_scale F32, activations declared dynamic per
// token.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/bench"
	"github.com/trigon-llm/trigon/format/safetensors"
	"github.com/trigon-llm/trigon/model"
)

// options are the command's flags.
type options struct {
	format string // "awq" or "fp8"
	group  int    // AWQ group size
	scale  string // FP8 scale granularity: "channel" or "tensor"
	random bool
	seed   uint64
}

func main() {
	var o options
	flag.StringVar(&o.format, "format", "", "awq or fp8")
	flag.IntVar(&o.group, "group", 128, "AWQ group size (32, 64 or 128)")
	flag.StringVar(&o.scale, "scale", "channel", "FP8 weight scale: channel (one per output feature) or tensor")
	flag.BoolVar(&o.random, "random", false, "synthetic BF16 weights of SRC's config.json instead of SRC's weights")
	flag.Uint64Var(&o.seed, "seed", 1, "seed of -random")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: quantckpt -format awq|fp8 [flags] SRC DST")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 2 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(o, flag.Arg(0), flag.Arg(1)); err != nil {
		fmt.Fprintln(os.Stderr, "quantckpt:", err)
		os.Exit(1)
	}
}

func run(o options, src, dst string) error {
	qc, err := quantConfig(o)
	if err != nil {
		return err
	}
	var raw []byte
	preset := false
	if st, err := os.Stat(src); o.random && os.IsNotExist(err) {
		cfg, err := bench.Arch(src)
		if err != nil {
			return err
		}
		if raw, err = presetConfig(cfg); err != nil {
			return fmt.Errorf("preset %s: %w", src, err)
		}
		preset = true
	} else if err != nil || !st.IsDir() {
		return fmt.Errorf("%s: not a Hugging Face directory (%v)", src, err)
	} else if raw, err = os.ReadFile(filepath.Join(src, "config.json")); err != nil {
		return err
	}
	var hf map[string]any
	if err := json.Unmarshal(raw, &hf); err != nil {
		return fmt.Errorf("%s/config.json: %w", src, err)
	}
	if q, ok := hf["quantization_config"]; ok && q != nil {
		return fmt.Errorf("%s is already quantized", src)
	}
	var w model.Weights
	if o.random {
		cfg, err := model.ParseHFConfig(raw)
		if err != nil {
			return err
		}
		if w, err = bench.SyntheticWeights(cfg, backend.BF16, o.seed); err != nil {
			return err
		}
	} else if _, _, w, err = model.OpenWeights(src); err != nil {
		return err
	}
	defer w.Close()
	tensors, err := quantize(o, w)
	if err != nil {
		return err
	}
	hf["quantization_config"] = qc
	cfgJSON, err := json.MarshalIndent(hf, "", "  ")
	if err != nil {
		return err
	}
	if _, err := model.ParseHFConfig(cfgJSON); err != nil {
		return fmt.Errorf("written config: %w", err)
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	if !preset {
		if err := copyFiles(src, dst); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(dst, "config.json"), append(cfgJSON, '\n'), 0o644); err != nil {
		return err
	}
	if err := safetensors.Write(filepath.Join(dst, "model.safetensors"), tensors, map[string]string{"format": "pt"}); err != nil {
		return err
	}
	// The result must load: repacked by the loader and validated.
	_, _, check, err := model.OpenWeights(dst)
	if err != nil {
		return fmt.Errorf("written checkpoint does not load: %w", err)
	}
	return check.Close()
}

// quantConfig is the quantization_config the format writes.
func quantConfig(o options) (map[string]any, error) {
	switch o.format {
	case "awq":
		if _, err := backend.AWQDType(o.group); err != nil {
			return nil, err
		}
		return map[string]any{"quant_method": "awq", "bits": 4, "group_size": o.group, "zero_point": true,
			"version": "gemm", "modules_to_not_convert": nil}, nil
	case "fp8":
		if o.scale != "channel" && o.scale != "tensor" {
			return nil, fmt.Errorf("-scale %q: want channel or tensor", o.scale)
		}
		return map[string]any{
			"quant_method": "compressed-tensors", "format": "float-quantized",
			"config_groups": map[string]any{"group_0": map[string]any{
				"targets":           []string{"Linear"},
				"weights":           map[string]any{"num_bits": 8, "type": "float", "strategy": o.scale, "dynamic": false, "symmetric": true},
				"input_activations": map[string]any{"num_bits": 8, "type": "float", "strategy": "token", "dynamic": true, "symmetric": true},
			}},
			"ignore": []string{"lm_head"},
		}, nil
	}
	return nil, fmt.Errorf("-format %q: want awq or fp8", o.format)
}

// quantize returns the checkpoint's tensors with the projections
// quantized, one tensor per goroutine on every core.
func quantize(o options, w model.Weights) ([]safetensors.TensorInfo, error) {
	names := w.Names()
	parts := make([][]safetensors.TensorInfo, len(names))
	errs := make([]error, len(names))
	next := make(chan int)
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				parts[i], errs[i] = quantizeOne(o, w, names[i])
			}
		}()
	}
	for i := range names {
		next <- i
	}
	close(next)
	wg.Wait()
	var out []safetensors.TensorInfo
	for i := range names {
		if errs[i] != nil {
			return nil, errs[i]
		}
		out = append(out, parts[i]...)
	}
	return out, nil
}

// quantizeOne returns the tensors that replace tensor name: the tensor
// itself unless it is a projection.
func quantizeOne(o options, w model.Weights, name string) ([]safetensors.TensorInfo, error) {
	t, ok := w.Tensor(name)
	if !ok {
		return nil, fmt.Errorf("tensor %s not readable", name)
	}
	if t.DType != backend.F32 && t.DType != backend.F16 && t.DType != backend.BF16 {
		return nil, fmt.Errorf("tensor %s is %v; want F32, F16 or BF16", name, t.DType)
	}
	if !model.IsProjection(name) {
		st, err := model.SafetensorsTensor(t)
		return []safetensors.TensorInfo{st}, err
	}
	rows, cols := t.Shape[0], t.Shape[1]
	vals, err := backend.DequantizeRows(t.DType, t.Data, rows, cols)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	base := strings.TrimSuffix(name, ".weight")
	if o.format == "awq" {
		qw, qz, sc, err := model.PackAutoAWQ(vals, rows, cols, o.group)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		return []safetensors.TensorInfo{
			{Name: base + ".qweight", DType: "I32", Shape: []int{cols, rows / 8}, Data: qw},
			{Name: base + ".qzeros", DType: "I32", Shape: []int{cols / o.group, rows / 8}, Data: qz},
			{Name: base + ".scales", DType: "F16", Shape: []int{cols / o.group, rows}, Data: sc},
		}, nil
	}
	q, scales, err := model.PackFP8(vals, rows, cols, o.scale == "tensor")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	shape := []int{rows, 1}
	if o.scale == "tensor" {
		shape = []int{1}
	}
	return []safetensors.TensorInfo{
		{Name: name, DType: "F8_E4M3", Shape: t.Shape, Data: q},
		{Name: base + ".weight_scale", DType: "F32", Shape: shape, Data: model.F32Bytes(scales)},
	}, nil
}

// copyFiles copies src's files other than weights and config.json to dst.
func copyFiles(src, dst string) error {
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range entries {
		n := e.Name()
		if e.IsDir() || n == "config.json" || strings.HasSuffix(n, ".safetensors") || strings.HasSuffix(n, ".safetensors.index.json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, n))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dst, n), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// hfArchitectures are the config.json architectures of model.Config.Arch.
var hfArchitectures = map[string]string{
	model.ArchLlama: "LlamaForCausalLM", model.ArchMistral: "MistralForCausalLM",
	model.ArchQwen2: "Qwen2ForCausalLM", model.ArchQwen3: "Qwen3ForCausalLM",
}

// presetConfig writes cfg (a bench preset) as a transformers config.json
// and checks that it parses back to the same shapes.
func presetConfig(cfg model.Config) ([]byte, error) {
	arch, ok := hfArchitectures[cfg.Arch]
	if !ok || cfg.SlidingWindow != 0 || cfg.RopeFreqFactors != nil {
		return nil, fmt.Errorf("architecture %s with sliding window %d: not writable as a config.json here", cfg.Arch, cfg.SlidingWindow)
	}
	eos := make([]int, len(cfg.EOSTokenIDs))
	for i, id := range cfg.EOSTokenIDs {
		eos[i] = int(id)
	}
	hf := map[string]any{
		"architectures": []string{arch}, "model_type": cfg.Arch,
		"vocab_size": cfg.VocabSize, "hidden_size": cfg.Hidden, "intermediate_size": cfg.Intermediate,
		"num_hidden_layers": cfg.NumLayers, "num_attention_heads": cfg.NumHeads, "num_key_value_heads": cfg.NumKVHeads,
		"head_dim": cfg.HeadDim, "hidden_act": "silu", "rms_norm_eps": cfg.RMSNormEps, "rope_theta": cfg.RopeTheta,
		"max_position_embeddings": cfg.MaxPositions, "tie_word_embeddings": cfg.TieEmbeddings,
		"attention_bias": cfg.Llama.AttentionBias && cfg.Arch != model.ArchQwen2, "eos_token_id": eos, "torch_dtype": "bfloat16",
	}
	if cfg.HasBOS {
		hf["bos_token_id"] = cfg.BOSTokenID
	}
	if r := cfg.RopeScaling; r != nil {
		hf["rope_scaling"] = map[string]any{"rope_type": r.Type, "factor": r.Factor, "low_freq_factor": r.LowFreqFactor,
			"high_freq_factor": r.HighFreqFactor, "original_max_position_embeddings": r.OriginalMaxPositions}
	}
	raw, err := json.MarshalIndent(hf, "", "  ")
	if err != nil {
		return nil, err
	}
	back, err := model.ParseHFConfig(raw)
	if err != nil {
		return nil, err
	}
	if back.Hidden != cfg.Hidden || back.Intermediate != cfg.Intermediate || back.NumLayers != cfg.NumLayers || back.NumHeads != cfg.NumHeads ||
		back.NumKVHeads != cfg.NumKVHeads || back.HeadDim != cfg.HeadDim || back.VocabSize != cfg.VocabSize || back.Llama != cfg.Llama ||
		back.TieEmbeddings != cfg.TieEmbeddings {
		return nil, fmt.Errorf("written config parses to %+v, want %+v", back, cfg)
	}
	return raw, nil
}
