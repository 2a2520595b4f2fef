// Package modeltest reads the reference fixtures tools/refgen writes into
// testdata/models and converts fixture models to GGUF, for the tests of
// package model and its architectures.
package modeltest

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/format/gguf"
	"github.com/trigon-llm/trigon/model"
)

// ModelsDir is the absolute path of testdata/models at the repository root.
func ModelsDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "testdata", "models")
}

// Fixtures lists the fixture model names from testdata/models/index.json.
func Fixtures() ([]string, error) {
	data, err := os.ReadFile(filepath.Join(ModelsDir(), "index.json"))
	if err != nil {
		return nil, fmt.Errorf("read fixture index: %w", err)
	}
	var idx struct {
		Models []string `json:"models"`
	}
	if err := json.Unmarshal(data, &idx); err != nil {
		return nil, fmt.Errorf("parse fixture index: %w", err)
	}
	if len(idx.Models) == 0 {
		return nil, fmt.Errorf("fixture index lists no models")
	}
	return idx.Models, nil
}

// Reference is one fixture's reference.json.gz: what transformers computed
// (in float64 from the checkpoint's weights) for a few prompts.
type Reference struct {
	Model            string    `json:"model"`
	Architecture     string    `json:"architecture"`
	WeightsDType     string    `json:"weights_dtype"`
	InvFreq          []float32 `json:"inv_freq"`
	AttentionScaling float64   `json:"attention_scaling"`
	NativeMaxRelErr  float64   `json:"native_dtype_max_rel_err"`
	GenerateAgrees   bool      `json:"generate_agrees"`
	Prompts          []Prompt  `json:"prompts"`
}

// Prompt is one reference prompt.
type Prompt struct {
	IDs        []int32     `json:"ids"`
	LastLogits []float32   `json:"last_logits"` // [vocab] at the last prompt token
	Greedy     []int32     `json:"greedy"`      // greedy continuation, full recompute each step
	MinMargin  float64     `json:"min_margin"`  // smallest top1-top2 logit gap along Greedy
	AllLogits  [][]float32 `json:"all_logits"`  // [len(IDs)][vocab], for one prompt only
	// DecodeLogits[i] are the logits that chose Greedy[i] (DecodeLogits[0]
	// equals LastLogits), for one prompt only.
	DecodeLogits [][]float32 `json:"decode_logits"`
}

// LoadReference reads testdata/models/<name>/reference.json.gz.
func LoadReference(name string) (*Reference, error) {
	path := filepath.Join(ModelsDir(), name, "reference.json.gz")
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read reference: %w", err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	var r Reference
	if err := json.NewDecoder(zr).Decode(&r); err != nil {
		return nil, fmt.Errorf("parse %s: %w", path, err)
	}
	if len(r.Prompts) == 0 {
		return nil, fmt.Errorf("%s: no prompts", path)
	}
	return &r, nil
}

// RelErr is max|got-want| / max|want|: the error relative to the row's
// scale. Logits rows are compared this way because individual logits near
// zero make element-wise relative errors meaningless, while the row's
// largest magnitude is what decides sampling.
func RelErr(got, want []float32) float64 {
	if len(got) != len(want) {
		return math.Inf(1)
	}
	var maxDiff, maxRef float64
	for i := range want {
		d := math.Abs(float64(got[i]) - float64(want[i]))
		if d != d { // NaN
			return math.Inf(1)
		}
		maxDiff = max(maxDiff, d)
		maxRef = max(maxRef, math.Abs(float64(want[i])))
	}
	if maxRef == 0 {
		return maxDiff
	}
	return maxDiff / maxRef
}

// GGUFOptions choose the weight dtype of a conversion.
type GGUFOptions struct {
	// Matrices is the dtype of projections and embeddings. Quantized
	// types fall back to F32 for matrices whose rows are not whole blocks,
	// as llama.cpp falls back for such tensors. Norms and biases stay F32.
	Matrices backend.DType
	// KeepDType keeps every tensor in its stored dtype (Matrices unused).
	KeepDType bool
}

// ToGGUF converts a model to a GGUF file image with model's exported
// helpers: metadata from the config, names and Q/K rows mapped, dtypes
// converted on the host. It plays the part of `trigon convert` in tests.
func ToGGUF(cfg model.Config, w model.Weights, opts GGUFOptions) ([]byte, error) {
	kvs, err := cfg.GGUFMetadata()
	if err != nil {
		return nil, err
	}
	wr := gguf.NewWriter()
	for _, kv := range kvs {
		wr.AddKV(kv.Key, kv.Value)
	}
	if cfg.HasBOS {
		wr.AddKV("tokenizer.ggml.bos_token_id", gguf.Uint32Value(uint32(cfg.BOSTokenID)))
	}
	if len(cfg.EOSTokenIDs) > 0 {
		wr.AddKV("tokenizer.ggml.eos_token_id", gguf.Uint32Value(uint32(cfg.EOSTokenIDs[0])))
	}
	if t, ok, err := cfg.RopeFreqsTensor(); err != nil {
		return nil, err
	} else if ok {
		if err := wr.AddTensor(t.Name, t.Type, t.Dims, t.Data); err != nil {
			return nil, err
		}
	}
	for _, spec := range model.ExpectedWeights(cfg) {
		hw, ok := w.Tensor(spec.Name)
		if !ok {
			return nil, fmt.Errorf("tensor %s missing", spec.Name)
		}
		if !opts.KeepDType {
			target := backend.F32
			if spec.Matrix {
				target = opts.Matrices
			}
			if hw, err = convertWeight(hw, target); err != nil {
				return nil, err
			}
		}
		t, err := model.ToGGUFTensor(cfg, hw)
		if err != nil {
			return nil, err
		}
		if err := wr.AddTensor(t.Name, t.Type, t.Dims, t.Data); err != nil {
			return nil, fmt.Errorf("add %s: %w", t.Name, err)
		}
	}
	var buf bytes.Buffer
	if _, err := wr.WriteTo(&buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// convertWeight re-encodes w as dt through f32 (exact for widening).
func convertWeight(w model.Weight, dt backend.DType) (model.Weight, error) {
	if w.DType == dt {
		return w, nil
	}
	row := w.Shape[len(w.Shape)-1]
	if dt.Quantized() && row%dt.BlockSize() != 0 {
		dt = backend.F32
	}
	n, err := backend.NumElements(w.Shape)
	if err != nil {
		return model.Weight{}, err
	}
	vals := make([]float32, n)
	if err := backend.DequantizeRow(w.DType, w.Data, vals); err != nil {
		return model.Weight{}, fmt.Errorf("%s: %w", w.Name, err)
	}
	var data []byte
	switch dt {
	case backend.F32:
		data = make([]byte, 4*n)
		for i, v := range vals {
			putU32(data[4*i:], math.Float32bits(v))
		}
	case backend.F16, backend.BF16:
		data = make([]byte, 2*n)
		for i, v := range vals {
			h := backend.F32ToBF16(v)
			if dt == backend.F16 {
				h = backend.F32ToF16(v)
			}
			data[2*i], data[2*i+1] = byte(h), byte(h>>8)
		}
	case backend.Q8_0, backend.Q4_0, backend.Q4_K, backend.Q5_K, backend.Q6_K:
		data, err = backend.Quantize(dt, vals)
	default:
		err = fmt.Errorf("cannot convert to %v", dt)
	}
	if err != nil {
		return model.Weight{}, fmt.Errorf("%s: %w", w.Name, err)
	}
	return model.Weight{Name: w.Name, DType: dt, Shape: w.Shape, Data: data}, nil
}

func putU32(b []byte, v uint32) {
	b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
}
