package llama

import (
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/cpu"
	"github.com/trigon-llm/trigon/model"
)

// rowsDequantized copies w with every tensor decoded to F32 row by row
// (F8E4M3Row rows are their own units).
func rowsDequantized(t *testing.T, w model.Weights) memWeights {
	t.Helper()
	out := memWeights{}
	for _, n := range w.Names() {
		x, _ := w.Tensor(n)
		rows, cols := 1, x.Shape[len(x.Shape)-1]
		if len(x.Shape) == 2 {
			rows = x.Shape[0]
		}
		vals, err := backend.DequantizeRows(x.DType, x.Data, rows, cols)
		if err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		out[n] = model.Weight{Name: n, DType: backend.F32, Shape: x.Shape, Data: f32Bytes(vals)}
	}
	return out
}

// TestDefaultModelQuantizedCPU runs the default model quantized at load on
// the CPU over 100 held-out tokens, prefill and decode. AWQ4 must give the
// logits of a twin holding the same weights decoded to F32 (W4A16: only
// the weight encoding differs, so f32 accuracy is required); FP8, whose
// products quantize the activations to e4m3, must stay near the twin and
// near the BF16 model.
func TestDefaultModelQuantizedCPU(t *testing.T) {
	raw, err := os.ReadFile(heldoutIDsFile)
	if err != nil {
		t.Fatal(err)
	}
	var ids []int32
	for _, f := range strings.Fields(string(raw))[:100] {
		v, err := strconv.Atoi(strings.Trim(f, "[],"))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, int32(v))
	}
	b := cpu.New(cpu.Options{})
	run := func(cfg model.Config, w model.Weights) [][]float32 {
		m := newModel(t, b, cfg, w)
		h := newHarness(t, b, m, b.ActDType(), blockSize, numBlocks, rand.New(rand.NewPCG(1, 2)))
		defer h.close()
		s := &seq{tokens: append([]int32(nil), ids[:90]...)}
		out := [][]float32{append([]float32(nil), h.step([]work{{s: s, n: 90}})[0][0]...)}
		for _, id := range ids[90:] {
			s.tokens = append(s.tokens, id)
			out = append(out, append([]float32(nil), h.step([]work{{s: s, n: 1}})[0][0]...))
		}
		return out
	}
	cfg, _, w, err := model.OpenWeights(defaultHFDir)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	base := run(cfg, w)
	for _, c := range []struct {
		dt             backend.DType
		twinTol, bfTol float64
	}{{backend.AWQ4G32, 1e-4, 0.25}, {backend.F8E4M3Row, 0.1, 0.1}} {
		t.Run(c.dt.String(), func(t *testing.T) {
			q, err := model.QuantizeWeights(w, c.dt)
			if err != nil {
				t.Fatal(err)
			}
			got, twin := run(cfg, q), run(cfg, rowsDequantized(t, q))
			worstTwin, worstBF := 0.0, 0.0
			for i := range got {
				worstTwin = max(worstTwin, checkLogits(t, "vs the dequantized twin", got[i], twin[i], c.twinTol))
				worstBF = max(worstBF, checkLogits(t, "vs bf16", got[i], base[i], c.bfTol))
			}
			t.Logf("%v: worst relative logits error %.3g against the dequantized twin, %.3g against bf16", c.dt, worstTwin, worstBF)
		})
	}
}
