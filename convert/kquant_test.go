package convert_test

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/bench"
	"github.com/trigon-llm/trigon/convert"
	"github.com/trigon-llm/trigon/engine"
	"github.com/trigon-llm/trigon/format/gguf"
	"github.com/trigon-llm/trigon/model"
)

// kquantModel is the llama3 fixture's config widened so that its hidden
// and MLP widths are whole 256-value super-blocks (its 64-wide attention
// output is not: those rows fall back), with 8 layers for the _M rule,
// and random F32 weights.
func kquantModel(t *testing.T, tied bool) (model.Config, model.Weights) {
	t.Helper()
	cfg, _, w, err := model.OpenWeights("../testdata/models/llama3")
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	cfg.Hidden, cfg.Intermediate, cfg.NumLayers, cfg.TieEmbeddings = 256, 512, 8, tied
	sw, err := bench.SyntheticWeights(cfg, backend.F32, 7)
	if err != nil {
		t.Fatal(err)
	}
	return cfg, bench.HostOnly(sw)
}

// TestConvertKQuants writes the K-quant targets and reads them back:
// each matrix in the type llama.cpp's rule gives it (written out here per
// layer, not computed by the rule under test), Q8_0 where the rows are not
// whole super-blocks, general.file_type as llama.cpp numbers the target,
// and values within the format's error of the source.
func TestConvertKQuants(t *testing.T) {
	tok, err := engine.LoadTokenizer("../testdata/models/llama3")
	if err != nil {
		t.Fatal(err)
	}
	// llama.cpp's use_more_bits over 8 layers: 0 (first eighth), 7 (last
	// eighth), and 3 and 6 ((i-1)%3 == 2).
	moreBits := map[int]bool{0: true, 3: true, 6: true, 7: true}
	for _, c := range []struct {
		target   string
		tied     bool
		fileType uint32
	}{
		{"q4_k", false, 14}, {"q5_k", false, 16}, {"q6_k", true, 18},
		{"q4_k_m", false, 15}, {"q4_k_m", true, 15}, {"q5_k_m", false, 17},
	} {
		t.Run(fmt.Sprintf("%s/tied=%v", c.target, c.tied), func(t *testing.T) {
			cfg, src := kquantModel(t, c.tied)
			dt, kmix, err := convert.ParseTarget(c.target)
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			rep, err := convert.Write(&buf, cfg, src, tok, convert.Options{Type: dt, KMix: kmix, Name: "k"})
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "m.gguf")
			if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			f, err := gguf.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			if v, ok := f.Uint("general.file_type"); !ok || v != uint64(c.fileType) {
				t.Errorf("general.file_type %v, want %d", v, c.fileType)
			}
			f.Close()
			_, _, w, err := model.OpenWeights(path)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			fallback := 0
			for _, name := range src.Names() {
				sw, _ := src.Tensor(name)
				gw, ok := w.Tensor(name)
				if !ok {
					t.Fatalf("%s missing", name)
				}
				want := dt
				g, _ := model.GGUFTensorName(name)
				var layer int
				var suffix string
				fmt.Sscanf(g, "blk.%d.%s", &layer, &suffix)
				switch {
				case len(sw.Shape) == 1:
					want = backend.F32
				case sw.Shape[1]%256 != 0:
					want = backend.Q8_0
					fallback++
				case kmix && (g == "output.weight" || (c.tied && g == "token_embd.weight")):
					want = backend.Q6_K
				case kmix && (suffix == "attn_v.weight" || suffix == "ffn_down.weight") && moreBits[layer]:
					want = backend.Q6_K
				}
				if gw.DType != want {
					t.Errorf("%s (%s): %v, want %v", name, g, gw.DType, want)
				}
				if len(sw.Shape) == 1 {
					continue
				}
				n := len(sw.Data) / 4
				a, b := make([]float32, n), make([]float32, n)
				if err := backend.DequantizeRow(sw.DType, sw.Data, a); err != nil {
					t.Fatal(err)
				}
				if err := backend.DequantizeRow(gw.DType, gw.Data, b); err != nil {
					t.Fatal(err)
				}
				var num, den float64
				for i := range a {
					d := float64(a[i] - b[i])
					num += d * d
					den += float64(a[i]) * float64(a[i])
				}
				if e := math.Sqrt(num / den); e > 0.11 {
					t.Errorf("%s: %v relative error %.4f", name, gw.DType, e)
				}
			}
			if len(rep.Fallback) != fallback {
				t.Errorf("report lists %d fallbacks %v, want %d", len(rep.Fallback), rep.Fallback, fallback)
			}
		})
	}
	if _, _, err := convert.ParseTarget("q6_k_m"); err == nil {
		t.Error("q6_k_m: no error")
	}
}
