package llama

import (
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/model"
)

// defaultHFDir is the default model's BF16 Hugging Face directory.
const defaultHFDir = "../../models/default/hf"

// TestDefaultModelQuantizedCUDAMatchesCPU is TestDefaultModelCUDAMatchesCPU
// for the default model's BF16 weights quantized at load (AWQ4 groups of
// 32, the widths' largest group; FP8 per output feature), against the CPU
// running the same quantized weights. FP8's tolerance is twice bf16's: the
// CPU quantizes its f32 activations to e4m3, the GPU its bf16 ones, and a
// value near a rounding boundary can land on the neighbouring code.
func TestDefaultModelQuantizedCUDAMatchesCPU(t *testing.T) {
	g := cudaBackend(t)
	for _, c := range []struct {
		dt  backend.DType
		tol float64
	}{{backend.AWQ4G32, logitsTol(g)}, {backend.F8E4M3Row, 2 * logitsTol(g)}} {
		t.Run(c.dt.String(), func(t *testing.T) {
			cfg, _, w, err := model.OpenWeights(defaultHFDir)
			if err != nil {
				t.Fatal(err)
			}
			q, err := model.QuantizeWeights(w, c.dt)
			if err != nil {
				w.Close()
				t.Fatal(err)
			}
			defer q.Close()
			matchDefaultModel(t, g, cfg, q, c.tol)
		})
	}
}
