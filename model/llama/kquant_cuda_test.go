package llama

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/cpu"
	"github.com/trigon-llm/trigon/model"
)

// paddedDefaultModel is the default model padded with zeros to 512 hidden
// (16 query heads, 8 KV heads of 32) and 1024 MLP, as tools/padhf writes
// it (see there why the function is unchanged), with its matrices encoded
// by enc (name, f32 values) and its norms in F32.
func paddedDefaultModel(t *testing.T, enc func(name string, vals []float32) (backend.DType, []byte)) (model.Config, memWeights) {
	t.Helper()
	cfg, _, w, err := model.OpenWeights(defaultHFDir)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	const hidden, inter = 512, 1024
	heads := hidden / cfg.HeadDim
	kvHeads := heads * cfg.NumKVHeads / cfg.NumHeads
	dims := map[int]int{
		cfg.Hidden: hidden, cfg.NumKVHeads * cfg.HeadDim: kvHeads * cfg.HeadDim,
		cfg.Intermediate: inter, cfg.VocabSize: cfg.VocabSize,
	}
	if len(dims) != 4 || cfg.NumHeads*cfg.HeadDim != cfg.Hidden {
		t.Fatalf("the default model's sizes no longer pad this way: %+v", cfg)
	}
	ratio := float64(cfg.Hidden) / hidden
	out := memWeights{}
	for _, name := range w.Names() {
		src, _ := w.Tensor(name)
		n, err := backend.NumElements(src.Shape)
		if err != nil {
			t.Fatal(err)
		}
		vals := make([]float32, n)
		if err := backend.DequantizeRow(src.DType, src.Data, vals); err != nil {
			t.Fatal(err)
		}
		if len(src.Shape) == 1 {
			p := make([]float32, dims[src.Shape[0]])
			for i, v := range vals {
				p[i] = v * float32(math.Sqrt(ratio))
			}
			out[name] = model.Weight{Name: name, DType: backend.F32, Shape: []int{len(p)}, Data: f32Bytes(p)}
			continue
		}
		rows, cols := dims[src.Shape[0]], dims[src.Shape[1]]
		p := make([]float32, rows*cols)
		for r := range src.Shape[0] {
			copy(p[r*cols:], vals[r*src.Shape[1]:(r+1)*src.Shape[1]])
		}
		dt, data := enc(name, p)
		out[name] = model.Weight{Name: name, DType: dt, Shape: []int{rows, cols}, Data: data}
	}
	cfg.Hidden, cfg.Intermediate, cfg.NumHeads, cfg.NumKVHeads = hidden, inter, heads, kvHeads
	cfg.RMSNormEps = float32(float64(cfg.RMSNormEps) * ratio)
	return cfg, out
}

// TestKQuantPaddedDefaultModel checks paddedDefaultModel on the CPU: in F32
// it gives the default model's logits (prefill and decode), up to f32
// rounding of the rescaled norms.
func TestKQuantPaddedDefaultModel(t *testing.T) {
	cfg, _, w, err := model.OpenWeights(defaultHFDir)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	pcfg, pw := paddedDefaultModel(t, func(_ string, v []float32) (backend.DType, []byte) { return backend.F32, f32Bytes(v) })
	b := cpu.New(cpu.Options{})
	prompt := []int32{262, 981, 221, 1730, 19, 523, 693, 1044, 14, 972, 1010, 994}
	run := func(cfg model.Config, w model.Weights) [][]float32 {
		m := newModel(t, b, cfg, w)
		defer m.Close()
		h := newHarness(t, b, m, b.ActDType(), blockSize, numBlocks, rand.New(rand.NewPCG(3, 3)))
		defer h.close()
		s := &seq{tokens: append(append([]int32(nil), prompt...), 292, 262)}
		out := [][]float32{h.step([]work{{s: s, n: len(prompt)}})[0][0]}
		for range 2 {
			out = append(out, h.step([]work{{s: s, n: 1}})[0][0])
		}
		return out
	}
	want, got := run(cfg, w), run(pcfg, pw)
	for i := range want {
		checkLogits(t, fmt.Sprintf("step %d", i), got[i], want[i], 1e-4)
	}
}

// TestKQuantDefaultModelCUDAMatchesCPU runs the padded default model with
// K-quant weights (Q4_K, the tied embedding and the first layer's V
// projection Q6_K as in a Q4_K_M file, so that layer's fused QKV is
// re-encoded) on the GPU against the CPU over held-out text: the CUDA
// kernels' dequantizing GEMV, the dequantize-then-cuBLASLt prefill and the
// K-quant embedding rows. The CPU's decode products quantize x per 256
// values, hence twice the usual tolerance (as for FP8).
func TestKQuantDefaultModelCUDAMatchesCPU(t *testing.T) {
	g := cudaBackend(t)
	cfg, w := paddedDefaultModel(t, func(name string, v []float32) (backend.DType, []byte) {
		dt := backend.Q4_K
		if name == model.NameEmbed || name == model.LayerName(0, model.SuffixV) {
			dt = backend.Q6_K
		}
		q, err := backend.Quantize(dt, v)
		if err != nil {
			t.Fatal(err)
		}
		return dt, q
	})
	matchDefaultModel(t, g, cfg, w, 2*logitsTol(g))
}
