// Command padhf writes a Llama HF directory padded with zeros to wider
// hidden, head and MLP sizes, computing the same function as the source:
// for GGML's K-quants, whose 256-value super-blocks do not divide the
// default model's widths (320 and 864), so that its K-quant files can be
// measured (docs/quantization.md).
//
//	padhf SRC-DIR OUT-DIR HIDDEN INTERMEDIATE
//
// Why the function is unchanged: the extra embedding columns, rows of
// o_proj and down_proj, and so residual-stream dimensions, are zero; the
// extra query and KV heads have zero Q/K/V rows (their attention output is
// zero, and their o_proj columns are zero too), the extra MLP units zero
// gate, up and down weights (silu(0)*0 = 0). RMSNorm over the padded width
// divides the same sum of squares by HIDDEN instead of the source's width
// h: the norm weights are scaled by sqrt(h/HIDDEN) and the epsilon by
// h/HIDDEN, which makes it exact in real arithmetic. The norm weights are
// written F32 (the scaled values would round in BF16); matrices keep their
// dtype, since padding them is exact. The head size stays, so HIDDEN must
// be a multiple of it, with the query heads HIDDEN/head_dim a multiple of
// the group size.
package main

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/format/safetensors"
	"github.com/trigon-llm/trigon/model"
)

func main() {
	if len(os.Args) != 5 {
		fmt.Fprintln(os.Stderr, "usage: padhf SRC-DIR OUT-DIR HIDDEN INTERMEDIATE")
		os.Exit(2)
	}
	hidden, err1 := strconv.Atoi(os.Args[3])
	inter, err2 := strconv.Atoi(os.Args[4])
	if err1 != nil || err2 != nil {
		fmt.Fprintln(os.Stderr, "padhf: HIDDEN and INTERMEDIATE must be integers")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2], hidden, inter); err != nil {
		fmt.Fprintln(os.Stderr, "padhf:", err)
		os.Exit(1)
	}
}

func run(src, out string, hidden, inter int) error {
	cfg, _, w, err := model.OpenWeights(src)
	if err != nil {
		return err
	}
	defer w.Close()
	if cfg.Arch != model.ArchLlama {
		return fmt.Errorf("%s: architecture %s; padhf handles Llama", src, cfg.Arch)
	}
	group := cfg.NumHeads / cfg.NumKVHeads
	heads := hidden / cfg.HeadDim
	switch {
	case hidden < cfg.Hidden || inter < cfg.Intermediate:
		return fmt.Errorf("padding %d/%d to %d/%d would shrink it", cfg.Hidden, cfg.Intermediate, hidden, inter)
	case cfg.NumHeads*cfg.HeadDim != cfg.Hidden:
		return fmt.Errorf("%d heads of %d are not the hidden size %d", cfg.NumHeads, cfg.HeadDim, cfg.Hidden)
	case hidden%cfg.HeadDim != 0 || heads%group != 0:
		return fmt.Errorf("hidden %d: not whole heads of %d in groups of %d", hidden, cfg.HeadDim, group)
	}
	kvHeads := heads / group
	// Source size -> padded size of every dimension a tensor can have.
	dims := map[int]int{
		cfg.Hidden:                   hidden, // also the query width
		cfg.NumKVHeads * cfg.HeadDim: kvHeads * cfg.HeadDim,
		cfg.Intermediate:             inter,
		cfg.VocabSize:                cfg.VocabSize,
	}
	if len(dims) != 4 {
		return fmt.Errorf("the hidden, KV, MLP and vocabulary sizes of %s coincide: a tensor's dimensions cannot be told apart", src)
	}
	raw, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil {
		return err
	}
	var hf map[string]any
	if err := json.Unmarshal(raw, &hf); err != nil {
		return fmt.Errorf("%s/config.json: %w", src, err)
	}
	ratio := float64(cfg.Hidden) / float64(hidden)
	hf["hidden_size"], hf["intermediate_size"] = hidden, inter
	hf["num_attention_heads"], hf["num_key_value_heads"], hf["head_dim"] = heads, kvHeads, cfg.HeadDim
	hf["rms_norm_eps"] = float64(cfg.RMSNormEps) * ratio
	cfgJSON, err := json.MarshalIndent(hf, "", "  ")
	if err != nil {
		return err
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
	var padded []model.Weight
	for _, name := range w.Names() {
		t, _ := w.Tensor(name)
		p, err := pad(t, dims, float32(math.Sqrt(ratio)))
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		padded = append(padded, p)
	}
	return writeSafetensors(filepath.Join(out, "model.safetensors"), padded)
}

// pad copies t into the top-left corner of a zero tensor of the padded
// shape. 1-D tensors (the norms) are scaled by normScale and written F32.
func pad(t model.Weight, dims map[int]int, normScale float32) (model.Weight, error) {
	if strings.HasSuffix(t.Name, "_proj.bias") {
		return t, fmt.Errorf("biases are not handled")
	}
	shape := make([]int, len(t.Shape))
	for i, d := range t.Shape {
		nd, ok := dims[d]
		if !ok {
			return t, fmt.Errorf("dimension %d of %v has no padded size", d, t.Shape)
		}
		shape[i] = nd
	}
	if len(shape) == 1 {
		v := make([]float32, t.Shape[0])
		if err := backend.DequantizeRow(t.DType, t.Data, v); err != nil {
			return t, err
		}
		data := make([]byte, 4*shape[0])
		for i, x := range v {
			binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(x*normScale))
		}
		return model.Weight{Name: t.Name, DType: backend.F32, Shape: shape, Data: data}, nil
	}
	if len(shape) != 2 || t.DType.Quantized() {
		return t, fmt.Errorf("want a 2-D float matrix, have %v %v", t.DType, t.Shape)
	}
	el := t.DType.BlockBytes()
	data := make([]byte, shape[0]*shape[1]*el)
	row := t.Shape[1] * el
	for r := range t.Shape[0] {
		copy(data[r*shape[1]*el:], t.Data[r*row:(r+1)*row])
	}
	return model.Weight{Name: t.Name, DType: t.DType, Shape: shape, Data: data}, nil
}

// writeSafetensors writes ws to path as one safetensors file.
func writeSafetensors(path string, ws []model.Weight) error {
	ts := make([]safetensors.TensorInfo, len(ws))
	for i, w := range ws {
		t, err := model.SafetensorsTensor(w)
		if err != nil {
			return err
		}
		ts[i] = t
	}
	return safetensors.Write(path, ts, map[string]string{"format": "pt"})
}
