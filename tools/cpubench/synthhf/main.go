// Command synthhf writes a Hugging Face model directory of random weights,
// for the synthetic Llama rows of docs/benchmarks.md ("CPU backend: vector
// kernels"): trigon convert turns it into the GGUF files both engines read,
// so nothing is downloaded.
//
//	synthhf TOKENIZER-DIR OUT-DIR
//
// TOKENIZER-DIR is an HF directory (models/default/hf) whose tokenizer
// files are copied and whose config.json gives the vocabulary and the
// special token ids; the architecture is replaced by the sizes below. The
// weights are bench.SyntheticWeights in BF16 (seed 1), written as one
// safetensors file, so the same command makes the same bytes everywhere.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/bench"
	"github.com/trigon-llm/trigon/format/safetensors"
	"github.com/trigon-llm/trigon/model"
)

// arch is the synthetic Llama: about 132M parameters over the tokenizer's
// vocabulary (8,192 for the default model), head size 64, grouped-query
// attention, an untied LM head. Every matrix's input size is a multiple of
// the Q8_0/Q4_0 block (32).
var arch = map[string]any{
	"hidden_size":             768,
	"intermediate_size":       2560,
	"num_hidden_layers":       16,
	"num_attention_heads":     12,
	"num_key_value_heads":     4,
	"head_dim":                64,
	"max_position_embeddings": 2048,
	"tie_word_embeddings":     false,
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: synthhf TOKENIZER-DIR OUT-DIR")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2]); err != nil {
		fmt.Fprintln(os.Stderr, "synthhf:", err)
		os.Exit(1)
	}
}

func run(src, out string) error {
	raw, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil {
		return err
	}
	var hf map[string]any
	if err := json.Unmarshal(raw, &hf); err != nil {
		return fmt.Errorf("%s/config.json: %w", src, err)
	}
	for k, v := range arch {
		hf[k] = v
	}
	hf["dtype"], hf["torch_dtype"] = "bfloat16", "bfloat16"
	cfgJSON, err := json.MarshalIndent(hf, "", "  ")
	if err != nil {
		return err
	}
	cfg, err := model.ParseHFConfig(cfgJSON)
	if err != nil {
		return fmt.Errorf("synthetic config: %w", err)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, "config.json"), cfgJSON, 0o644); err != nil {
		return err
	}
	for _, name := range []string{"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"} {
		b, err := os.ReadFile(filepath.Join(src, name))
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(out, name), b, 0o644); err != nil {
			return err
		}
	}
	w, err := bench.SyntheticWeights(cfg, backend.BF16, 1)
	if err != nil {
		return err
	}
	defer w.Close()
	return writeSafetensors(filepath.Join(out, "model.safetensors"), w)
}

// writeSafetensors writes every tensor of w to path as one safetensors
// file.
func writeSafetensors(path string, w model.Weights) error {
	var ts []safetensors.TensorInfo
	for _, n := range w.Names() {
		t, ok := w.Tensor(n)
		if !ok {
			return fmt.Errorf("tensor %s not generated", n)
		}
		st, err := model.SafetensorsTensor(t)
		if err != nil {
			return err
		}
		ts = append(ts, st)
	}
	return safetensors.Write(path, ts, map[string]string{"format": "pt"})
}
