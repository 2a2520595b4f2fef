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

// TestFuseMixedDTypes loads a model whose K projections are Q8_0 beside
// F32 Q and V (as GGUF mixes store some projections of a fused group in
// another type): the group is fused in F32, which holds Q8_0's values
// exactly, so the logits equal those of a twin whose K projections are
// those values stored as F32.
func TestFuseMixedDTypes(t *testing.T) {
	f := loadFixtures(t)[0]
	mixed, twin := memWeights{}, memWeights{}
	for _, n := range f.w.Names() {
		w, _ := f.w.Tensor(n)
		mixed[n], twin[n] = w, w
	}
	for l := range f.cfg.NumLayers {
		name := model.LayerName(l, model.SuffixK)
		w := twin[name]
		if w.DType != backend.F32 {
			t.Skipf("fixture %s stores %v", f.name, w.DType)
		}
		vals := make([]float32, len(w.Data)/4)
		if err := backend.DequantizeRow(backend.F32, w.Data, vals); err != nil {
			t.Fatal(err)
		}
		q, err := backend.Quantize(backend.Q8_0, vals)
		if err != nil {
			t.Fatal(err)
		}
		mixed[name] = model.Weight{Name: name, DType: backend.Q8_0, Shape: w.Shape, Data: q}
		if err := backend.DequantizeRow(backend.Q8_0, q, vals); err != nil {
			t.Fatal(err)
		}
		twin[name] = model.Weight{Name: name, DType: backend.F32, Shape: w.Shape, Data: f32Bytes(vals)}
	}
	b := cpu.New(cpu.Options{})
	p := f.ref.Prompts[len(f.ref.Prompts)-1]
	run := func(w model.Weights) []float32 {
		m := newModel(t, b, f.cfg, w)
		defer m.Close()
		h := newHarness(t, b, m, b.ActDType(), blockSize, numBlocks, rand.New(rand.NewPCG(6, 6)))
		defer h.close()
		return h.step([]work{{s: &seq{tokens: p.IDs}, n: len(p.IDs)}})[0][0]
	}
	got, want := run(mixed), run(twin)
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("logit %d: %v, want %v (the fused group should hold K's values exactly)", i, got[i], want[i])
		}
	}
}

// TestSameDType re-encodes a Q4_K part beside a Q6_K one as Q6_K: the
// values move by no more than Q6_K's rounding of the Q4_K values, and
// parts of one dtype are left alone.
func TestSameDType(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	vals := make([]float32, 4*512)
	for i := range vals {
		vals[i] = float32(r.NormFloat64())
	}
	q4, _ := backend.Quantize(backend.Q4_K, vals)
	q6, _ := backend.Quantize(backend.Q6_K, vals)
	a := model.Weight{Name: "a", DType: backend.Q4_K, Shape: []int{4, 512}, Data: q4}
	c := model.Weight{Name: "c", DType: backend.Q6_K, Shape: []int{4, 512}, Data: q6}
	out, err := sameDType([]model.Weight{a, c})
	if err != nil {
		t.Fatal(err)
	}
	if out[0].DType != backend.Q6_K || &out[1].Data[0] != &q6[0] {
		t.Fatalf("got %v and %v (Q6_K part copied: %v)", out[0].DType, out[1].DType, &out[1].Data[0] != &q6[0])
	}
	before, after := make([]float32, len(vals)), make([]float32, len(vals))
	if err := backend.DequantizeRow(backend.Q4_K, q4, before); err != nil {
		t.Fatal(err)
	}
	if err := backend.DequantizeRow(backend.Q6_K, out[0].Data, after); err != nil {
		t.Fatal(err)
	}
	var num, den float64
	for i := range before {
		d := float64(after[i] - before[i])
		num += d * d
		den += float64(before[i]) * float64(before[i])
	}
	if num/den > 0.03*0.03 {
		t.Errorf("re-encoding moved the values by %.4f relative", num/den)
	}
	same, err := sameDType([]model.Weight{a, a})
	if err != nil || &same[0].Data[0] != &q4[0] {
		t.Errorf("one dtype: parts re-encoded (%v)", err)
	}
}

// TestKQuantModel runs a model of K-quant weights (widths of whole
// 256-value super-blocks; the 64-wide attention output is Q8_0, as
// convert falls back) whose
// first layer's V projection is Q6_K beside Q4_K Q and K, as llama.cpp's
// Q4_K_M stores it, and the LM head Q6_K: prefill and two decode steps
// (the CPU's Q8_K decode products) against a twin holding the decoded
// values in F32 (Q and K of the first layer as the fused group holds
// them: re-encoded as Q6_K). The tolerance is for the Q8_K rounding of
// the decode products (the LM head's in every step): max|x|/254 per
// element over 256-value blocks, about 2% of these random logits after
// two layers, where a wrong layout gives errors of order 1.
func TestKQuantModel(t *testing.T) {
	f := loadFixtures(t)[0]
	cfg := f.cfg
	cfg.Hidden, cfg.Intermediate, cfg.NumLayers, cfg.TieEmbeddings = 256, 512, 2, false
	r := rand.New(rand.NewPCG(8, 8))
	kq, twin := memWeights{}, memWeights{}
	for _, s := range model.ExpectedWeights(cfg) {
		n, err := backend.NumElements(s.Shape)
		if err != nil {
			t.Fatal(err)
		}
		vals := make([]float32, n)
		for i := range vals {
			if s.Matrix {
				vals[i] = float32(r.NormFloat64() / math.Sqrt(float64(s.Shape[len(s.Shape)-1])))
			} else {
				vals[i] = 1 + float32(r.NormFloat64()*0.1)
			}
		}
		w := model.Weight{Name: s.Name, DType: backend.F32, Shape: s.Shape, Data: f32Bytes(vals)}
		twin[s.Name] = w
		dt := backend.Q4_K
		if s.Name == model.NameLMHead || s.Name == model.LayerName(0, model.SuffixV) {
			dt = backend.Q6_K
		}
		if !s.Matrix {
			kq[s.Name] = w
			continue
		}
		if s.Shape[len(s.Shape)-1]%backend.QK_K != 0 {
			dt = backend.Q8_0 // as convert falls back
		}
		q, err := backend.Quantize(dt, vals)
		if err != nil {
			t.Fatal(err)
		}
		kq[s.Name] = model.Weight{Name: s.Name, DType: dt, Shape: s.Shape, Data: q}
		if err := backend.DequantizeRow(dt, q, vals); err != nil {
			t.Fatal(err)
		}
		twin[s.Name] = model.Weight{Name: s.Name, DType: backend.F32, Shape: s.Shape, Data: f32Bytes(vals)}
	}
	// The fused first-layer group holds Q and K re-encoded as Q6_K.
	for _, suffix := range []string{model.SuffixQ, model.SuffixK} {
		name := model.LayerName(0, suffix)
		w := twin[name]
		vals := make([]float32, len(w.Data)/4)
		if err := backend.DequantizeRow(backend.F32, w.Data, vals); err != nil {
			t.Fatal(err)
		}
		q, err := backend.Quantize(backend.Q6_K, vals)
		if err != nil {
			t.Fatal(err)
		}
		if err := backend.DequantizeRow(backend.Q6_K, q, vals); err != nil {
			t.Fatal(err)
		}
		twin[name] = model.Weight{Name: name, DType: backend.F32, Shape: w.Shape, Data: f32Bytes(vals)}
	}
	b := cpu.New(cpu.Options{})
	prompt := make([]int32, 40)
	for i := range prompt {
		prompt[i] = int32(r.IntN(cfg.VocabSize))
	}
	run := func(w model.Weights) [][]float32 {
		m := newModel(t, b, cfg, w)
		defer m.Close()
		h := newHarness(t, b, m, b.ActDType(), blockSize, numBlocks, rand.New(rand.NewPCG(9, 9)))
		defer h.close()
		s := &seq{tokens: append(append([]int32(nil), prompt...), 7, 11)}
		out := [][]float32{h.step([]work{{s: s, n: len(prompt)}})[0][0]}
		for range 2 {
			out = append(out, h.step([]work{{s: s, n: 1}})[0][0])
		}
		return out
	}
	got, want := run(kq), run(twin)
	for i := range want {
		t.Logf("step %d: relative error %.3g", i, checkLogits(t, fmt.Sprintf("step %d", i), got[i], want[i], 5e-2))
	}
}
