package model_test

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/format/gguf"
	"github.com/trigon-llm/trigon/model"
	"github.com/trigon-llm/trigon/model/internal/modeltest"
)

// fullConfig has every optional tensor (biases, o bias, q/k norms, LM head).
func fullConfig() model.Config {
	return model.Config{
		Arch: model.ArchQwen3, VocabSize: 64, Hidden: 32, Intermediate: 48, NumLayers: 2,
		NumHeads: 4, NumKVHeads: 2, HeadDim: 16, RMSNormEps: 1e-6, RopeTheta: 1e6, MaxPositions: 128,
		Llama: model.LlamaConfig{AttentionBias: true, AttnOutputBias: true, QKNorm: true},
	}
}

func TestTensorNameMapping(t *testing.T) {
	known := map[string]string{
		"model.embed_tokens.weight":                      "token_embd.weight",
		"lm_head.weight":                                 "output.weight",
		"model.norm.weight":                              "output_norm.weight",
		"model.layers.1.self_attn.q_proj.weight":         "blk.1.attn_q.weight",
		"model.layers.0.self_attn.k_proj.bias":           "blk.0.attn_k.bias",
		"model.layers.1.self_attn.o_proj.weight":         "blk.1.attn_output.weight",
		"model.layers.0.input_layernorm.weight":          "blk.0.attn_norm.weight",
		"model.layers.0.post_attention_layernorm.weight": "blk.0.ffn_norm.weight",
		"model.layers.1.self_attn.k_norm.weight":         "blk.1.attn_k_norm.weight",
		"model.layers.1.mlp.gate_proj.weight":            "blk.1.ffn_gate.weight",
		"model.layers.1.mlp.down_proj.weight":            "blk.1.ffn_down.weight",
	}
	seen := map[string]bool{}
	for _, spec := range model.ExpectedWeights(fullConfig()) {
		g, err := model.GGUFTensorName(spec.Name)
		if err != nil {
			t.Fatal(err)
		}
		if seen[g] {
			t.Fatalf("GGUF name %s used twice", g)
		}
		seen[g] = true
		if want, ok := known[spec.Name]; ok && g != want {
			t.Errorf("%s -> %s, want %s", spec.Name, g, want)
		}
		back, ok := model.HFTensorName(g)
		if !ok || back != spec.Name {
			t.Errorf("%s -> %s -> %q, %v", spec.Name, g, back, ok)
		}
	}
	for _, bad := range []string{"model.layers.x.mlp.up_proj.weight", "model.layers.01.mlp.up_proj.weight", "model.layers.0.mlp.experts.weight", "foo"} {
		if g, err := model.GGUFTensorName(bad); err == nil {
			t.Errorf("%s mapped to %s", bad, g)
		}
	}
	for _, bad := range []string{"blk.0.ffn_gate_exps.weight", "blk.-1.attn_q.weight", "blk.01.attn_q.weight", "rope_freqs.weight", "blk."} {
		if h, ok := model.HFTensorName(bad); ok {
			t.Errorf("%s mapped to %s", bad, h)
		}
	}
}

// rotateHalf applies HF RoPE to one head: pairs (j, j+d/2).
func rotateHalf(x []float64, pos float64, inv []float64) []float64 {
	d := len(x)
	out := make([]float64, d)
	for j := range d / 2 {
		c, s := math.Cos(pos*inv[j]), math.Sin(pos*inv[j])
		out[j] = x[j]*c - x[j+d/2]*s
		out[j+d/2] = x[j+d/2]*c + x[j]*s
	}
	return out
}

// rotateInterleaved applies GGML's normal RoPE to one head: pairs (2j, 2j+1).
func rotateInterleaved(x []float64, pos float64, inv []float64) []float64 {
	out := make([]float64, len(x))
	for j := range len(x) / 2 {
		c, s := math.Cos(pos*inv[j]), math.Sin(pos*inv[j])
		out[2*j] = x[2*j]*c - x[2*j+1]*s
		out[2*j+1] = x[2*j+1]*c + x[2*j]*s
	}
	return out
}

// project computes W x for F32 row bytes.
func project(w []byte, rows, cols int, x []float64) []float64 {
	out := make([]float64, rows)
	for r := range rows {
		for c := range cols {
			out[r] += float64(math.Float32frombits(binary.LittleEndian.Uint32(w[4*(r*cols+c):]))) * x[c]
		}
	}
	return out
}

// TestPermuteQKRowsPreservesAttention checks the permutation by what it is
// for: llama.cpp applies interleaved RoPE to the permuted projections, and
// every query-key score must equal the one HF's rotate-half gives on the
// original projections.
func TestPermuteQKRowsPreservesAttention(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, tc := range []struct{ heads, headDim, hidden int }{{1, 2, 3}, {4, 16, 24}, {2, 64, 8}, {3, 6, 5}} {
		rows := tc.heads * tc.headDim
		wq := make([]byte, 4*rows*tc.hidden)
		wk := make([]byte, 4*rows*tc.hidden)
		for i := 0; i < len(wq); i += 4 {
			binary.LittleEndian.PutUint32(wq[i:], math.Float32bits(float32(rng.NormFloat64())))
			binary.LittleEndian.PutUint32(wk[i:], math.Float32bits(float32(rng.NormFloat64())))
		}
		gq, err := model.PermuteQKRows(wq, tc.heads, tc.headDim, 4*tc.hidden, true)
		if err != nil {
			t.Fatal(err)
		}
		gk, err := model.PermuteQKRows(wk, tc.heads, tc.headDim, 4*tc.hidden, true)
		if err != nil {
			t.Fatal(err)
		}
		inv := make([]float64, tc.headDim/2)
		for j := range inv {
			inv[j] = math.Pow(10000, -float64(2*j)/float64(tc.headDim))
		}
		x1, x2 := make([]float64, tc.hidden), make([]float64, tc.hidden)
		for i := range x1 {
			x1[i], x2[i] = rng.NormFloat64(), rng.NormFloat64()
		}
		p1, p2 := float64(rng.IntN(100)), float64(rng.IntN(100))
		qh, kh := project(wq, rows, tc.hidden, x1), project(wk, rows, tc.hidden, x2)
		qg, kg := project(gq, rows, tc.hidden, x1), project(gk, rows, tc.hidden, x2)
		for h := range tc.heads {
			seg := func(v []float64) []float64 { return v[h*tc.headDim : (h+1)*tc.headDim] }
			var sh, sg float64
			a, b := rotateHalf(seg(qh), p1, inv), rotateHalf(seg(kh), p2, inv)
			c, d := rotateInterleaved(seg(qg), p1, inv), rotateInterleaved(seg(kg), p2, inv)
			for i := range a {
				sh += a[i] * b[i]
				sg += c[i] * d[i]
			}
			if math.Abs(sh-sg) > 1e-9*(1+math.Abs(sh)) {
				t.Errorf("%+v head %d: score %g with HF layout, %g with GGUF layout", tc, h, sh, sg)
			}
		}
	}
}

func TestPermuteQKRowsRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, tc := range []struct{ heads, headDim, rowBytes int }{{8, 128, 34 * 4}, {1, 2, 1}, {5, 10, 18}} {
		data := make([]byte, tc.heads*tc.headDim*tc.rowBytes)
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		g, err := model.PermuteQKRows(data, tc.heads, tc.headDim, tc.rowBytes, true)
		if err != nil {
			t.Fatal(err)
		}
		if tc.headDim > 2 && bytes.Equal(g, data) {
			t.Fatalf("%+v: permutation changed nothing", tc)
		}
		back, err := model.PermuteQKRows(g, tc.heads, tc.headDim, tc.rowBytes, false)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(back, data) {
			t.Fatalf("%+v: round trip differs", tc)
		}
	}
	if _, err := model.PermuteQKRows(make([]byte, 10), 2, 4, 1, true); err == nil {
		t.Error("no error for a size mismatch")
	}
	if _, err := model.PermuteQKRows(make([]byte, 6), 2, 3, 1, true); err == nil {
		t.Error("no error for an odd head dim")
	}
}

func TestOpenWeightsFixtures(t *testing.T) {
	names, err := modeltest.Fixtures()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			cfg, gen, w, err := model.OpenWeights(filepath.Join(modeltest.ModelsDir(), name))
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			if len(gen.EOSTokenIDs) == 0 || gen.Temperature == nil || *gen.Temperature != 0.7 {
				t.Errorf("generation config not read: %+v", gen)
			}
			names := w.Names()
			if !slices.IsSorted(names) {
				t.Error("names not sorted")
			}
			_, hasHead := w.Tensor(model.NameLMHead)
			if hasHead == cfg.TieEmbeddings {
				t.Errorf("tied %v but lm_head present %v", cfg.TieEmbeddings, hasHead)
			}
			want := "F32"
			if strings.HasSuffix(name, "-bf16") {
				want = "BF16"
			}
			for _, n := range names {
				tw, _ := w.Tensor(n)
				if tw.DType.String() != want {
					t.Fatalf("%s is %v, want %s", n, tw.DType, want)
				}
			}
		})
	}
}

// TestGGUFRoundTrip writes every fixture as GGUF with the exported mapping
// helpers and reads it back through OpenWeights: the config must survive
// and every tensor come back byte for byte under its HF name, Q/K rows of
// llama-arch models included (permuted on write, restored on read).
func TestGGUFRoundTrip(t *testing.T) {
	names, err := modeltest.Fixtures()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			cfg, _, w, err := model.OpenWeights(filepath.Join(modeltest.ModelsDir(), name))
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			img, err := modeltest.ToGGUF(cfg, w, modeltest.GGUFOptions{KeepDType: true})
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), name+".gguf")
			if err := os.WriteFile(path, img, 0o644); err != nil {
				t.Fatal(err)
			}
			gcfg, gen, gw, err := model.OpenWeights(path)
			if err != nil {
				t.Fatal(err)
			}
			defer gw.Close()

			want := cfg
			want.Arch, _ = model.GGUFArch(cfg.Arch)
			want.TorchDType = ""
			want.EOSTokenIDs = cfg.EOSTokenIDs[:1]
			if cfg.RopeScaling != nil && cfg.RopeScaling.Type == model.RopeLlama3 {
				want.RopeScaling = nil
				want.RopeFreqFactors, _ = cfg.Llama3FreqFactors()
			}
			if got := gcfg; !configsEqual(got, want) {
				t.Errorf("config from GGUF\n got  %+v\n want %+v", got, want)
			}
			if !slices.Equal(gen.EOSTokenIDs, want.EOSTokenIDs) {
				t.Errorf("GGUF stop ids %v, want %v", gen.EOSTokenIDs, want.EOSTokenIDs)
			}
			a, b := cfg.InvFreq(), gcfg.InvFreq()
			for i := range a {
				if d := math.Abs(float64(a[i]-b[i])) / float64(a[i]); d > 3e-7 {
					t.Errorf("inv_freq[%d]: %g from HF, %g from GGUF", i, a[i], b[i])
				}
			}
			if !slices.Equal(w.Names(), gw.Names()) {
				t.Fatalf("names differ:\n%v\n%v", w.Names(), gw.Names())
			}
			for _, n := range w.Names() {
				x, _ := w.Tensor(n)
				y, _ := gw.Tensor(n)
				if x.DType != y.DType || !slices.Equal(x.Shape, y.Shape) || !bytes.Equal(x.Data, y.Data) {
					t.Errorf("%s: HF %v %v, GGUF %v %v, bytes equal %v", n, x.DType, x.Shape, y.DType, y.Shape, bytes.Equal(x.Data, y.Data))
				}
			}
		})
	}
}

func configsEqual(a, b model.Config) bool { return reflect.DeepEqual(a, b) }

// writeGGUF builds a GGUF image from metadata and tensors.
func writeGGUF(t *testing.T, kvs []gguf.KV, tensors []model.GGUFTensor) string {
	t.Helper()
	wr := gguf.NewWriter()
	for _, kv := range kvs {
		wr.AddKV(kv.Key, kv.Value)
	}
	for _, tt := range tensors {
		if err := wr.AddTensor(tt.Name, tt.Type, tt.Dims, tt.Data); err != nil {
			t.Fatal(err)
		}
	}
	var buf bytes.Buffer
	if _, err := wr.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "m.gguf")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// smallGGUF returns metadata and F32 tensors of a tiny valid llama model.
func smallGGUF(t *testing.T) (model.Config, []gguf.KV, []model.GGUFTensor) {
	t.Helper()
	cfg := model.Config{Arch: model.ArchLlama, VocabSize: 8, Hidden: 32, Intermediate: 32, NumLayers: 1,
		NumHeads: 2, NumKVHeads: 1, HeadDim: 16, RMSNormEps: 1e-5, RopeTheta: 1e4, MaxPositions: 64, TieEmbeddings: true}
	kvs, err := cfg.GGUFMetadata()
	if err != nil {
		t.Fatal(err)
	}
	var ts []model.GGUFTensor
	for _, s := range model.ExpectedWeights(cfg) {
		n, _ := backend.NumElements(s.Shape)
		w := model.Weight{Name: s.Name, DType: backend.F32, Shape: s.Shape, Data: make([]byte, 4*n)}
		gt, err := model.ToGGUFTensor(cfg, w)
		if err != nil {
			t.Fatal(err)
		}
		ts = append(ts, gt)
	}
	return cfg, kvs, ts
}

func TestOpenGGUFErrors(t *testing.T) {
	replaceKV := func(kvs []gguf.KV, key string, v *gguf.Value) []gguf.KV {
		var out []gguf.KV
		for _, kv := range kvs {
			if kv.Key != key {
				out = append(out, kv)
			}
		}
		if v != nil {
			out = append(out, gguf.KV{Key: key, Value: *v})
		}
		return out
	}
	str := func(s string) *gguf.Value { v := gguf.StringValue(s); return &v }
	u32 := func(x uint32) *gguf.Value { v := gguf.Uint32Value(x); return &v }
	tests := []struct {
		name    string
		edit    func(kvs []gguf.KV, ts []model.GGUFTensor) ([]gguf.KV, []model.GGUFTensor)
		wantErr string
	}{
		{"valid", func(k []gguf.KV, ts []model.GGUFTensor) ([]gguf.KV, []model.GGUFTensor) { return k, ts }, ""},
		{"no architecture", func(k []gguf.KV, ts []model.GGUFTensor) ([]gguf.KV, []model.GGUFTensor) {
			return replaceKV(k, "general.architecture", nil), ts
		}, "general.architecture is missing"},
		{"unsupported architecture", func(k []gguf.KV, ts []model.GGUFTensor) ([]gguf.KV, []model.GGUFTensor) {
			return replaceKV(k, "general.architecture", str("gpt2")), ts
		}, `"gpt2" is not supported`},
		{"missing block count", func(k []gguf.KV, ts []model.GGUFTensor) ([]gguf.KV, []model.GGUFTensor) {
			return replaceKV(k, "llama.block_count", nil), ts
		}, "llama.block_count"},
		{"partial rotary", func(k []gguf.KV, ts []model.GGUFTensor) ([]gguf.KV, []model.GGUFTensor) {
			return replaceKV(k, "llama.rope.dimension_count", u32(8)), ts
		}, "partial rotary"},
		{"yarn", func(k []gguf.KV, ts []model.GGUFTensor) ([]gguf.KV, []model.GGUFTensor) {
			return replaceKV(k, "llama.rope.scaling.type", str("yarn")), ts
		}, `"yarn" is not supported`},
		{"mixed sliding window pattern", func(k []gguf.KV, ts []model.GGUFTensor) ([]gguf.KV, []model.GGUFTensor) {
			v := gguf.BoolsValue([]bool{true, false})
			return replaceKV(k, "llama.attention.sliding_window_pattern", &v), ts
		}, "sliding window on 1 of 2 layers"},
		{"unsupported tensor type", func(k []gguf.KV, ts []model.GGUFTensor) ([]gguf.KV, []model.GGUFTensor) {
			ts = slices.Clone(ts)
			for i, tt := range ts {
				if tt.Name == "blk.0.ffn_up.weight" { // [32, 32]: one Q2_K super-block needs 256 per row
					ts[i] = model.GGUFTensor{Name: tt.Name, Type: gguf.TypeQ2_K, Dims: []uint64{256, 32},
						Data: make([]byte, 32*gguf.TypeQ2_K.TypeSize())}
				}
			}
			return k, ts
		}, "Q2_K is not supported"},
		{"unknown tensor", func(k []gguf.KV, ts []model.GGUFTensor) ([]gguf.KV, []model.GGUFTensor) {
			return k, append(slices.Clone(ts), model.GGUFTensor{Name: "blk.0.ffn_gate_exps.weight", Type: gguf.TypeF32, Dims: []uint64{1}, Data: make([]byte, 4)})
		}, "unexpected tensor blk.0.ffn_gate_exps.weight"},
		{"missing tensor", func(k []gguf.KV, ts []model.GGUFTensor) ([]gguf.KV, []model.GGUFTensor) {
			return k, slices.DeleteFunc(slices.Clone(ts), func(tt model.GGUFTensor) bool { return tt.Name == "blk.0.ffn_down.weight" })
		}, "model.layers.0.mlp.down_proj.weight is missing"},
		{"wrong shape", func(k []gguf.KV, ts []model.GGUFTensor) ([]gguf.KV, []model.GGUFTensor) {
			ts = slices.Clone(ts)
			for i, tt := range ts {
				if tt.Name == "output_norm.weight" {
					ts[i] = model.GGUFTensor{Name: tt.Name, Type: gguf.TypeF32, Dims: []uint64{16}, Data: make([]byte, 64)}
				}
			}
			return k, ts
		}, "model.norm.weight has shape [16], the config needs [32]"},
		{"quantized norm", func(k []gguf.KV, ts []model.GGUFTensor) ([]gguf.KV, []model.GGUFTensor) {
			ts = slices.Clone(ts)
			for i, tt := range ts {
				if tt.Name == "output_norm.weight" {
					ts[i] = model.GGUFTensor{Name: tt.Name, Type: gguf.TypeQ8_0, Dims: []uint64{32}, Data: make([]byte, 34)}
				}
			}
			return k, ts
		}, "norms and biases must be"},
		{"bad rope_freqs", func(k []gguf.KV, ts []model.GGUFTensor) ([]gguf.KV, []model.GGUFTensor) {
			return k, append(slices.Clone(ts), model.GGUFTensor{Name: "rope_freqs.weight", Type: gguf.TypeF32, Dims: []uint64{3}, Data: make([]byte, 12)})
		}, "rope frequency factors"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, kvs, ts := smallGGUF(t)
			kvs, ts = tc.edit(kvs, ts)
			_, _, w, err := model.OpenWeights(writeGGUF(t, kvs, ts))
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				w.Close()
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("got %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestOpenWeightsErrors(t *testing.T) {
	dir := t.TempDir()
	notGGUF := filepath.Join(dir, "x.bin")
	if err := os.WriteFile(notGGUF, []byte("hello world"), 0o644); err != nil {
		t.Fatal(err)
	}
	emptyDir := filepath.Join(dir, "empty")
	if err := os.Mkdir(emptyDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, path, wantErr string }{
		{"missing", filepath.Join(dir, "nope"), "no such file"},
		{"not gguf", notGGUF, "bad magic"},
		{"dir without config", emptyDir, "config.json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, _, err := model.OpenWeights(tc.path)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("got %v, want %q", err, tc.wantErr)
			}
		})
	}
}

// fakeWeights is an in-memory Weights.
type fakeWeights map[string]model.Weight

func (f fakeWeights) Tensor(n string) (model.Weight, bool) { w, ok := f[n]; return w, ok }
func (f fakeWeights) Names() []string {
	var out []string
	for n := range f {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}
func (f fakeWeights) Close() error { return nil }

func TestValidateWeights(t *testing.T) {
	cfg := fullConfig()
	build := func() fakeWeights {
		f := fakeWeights{}
		for _, s := range model.ExpectedWeights(cfg) {
			n, _ := backend.NumElements(s.Shape)
			f[s.Name] = model.Weight{Name: s.Name, DType: backend.BF16, Shape: s.Shape, Data: make([]byte, 2*n)}
		}
		return f
	}
	if err := model.ValidateWeights(cfg, build()); err != nil {
		t.Fatalf("complete weights: %v", err)
	}
	tests := []struct {
		name    string
		edit    func(f fakeWeights)
		wantErr string
	}{
		{"missing bias", func(f fakeWeights) { delete(f, "model.layers.1.self_attn.v_proj.bias") }, "v_proj.bias is missing"},
		{"extra tensor", func(f fakeWeights) {
			f["model.layers.0.mlp.gate_proj.bias"] = model.Weight{DType: backend.F32, Shape: []int{48}, Data: make([]byte, 192)}
		}, "unexpected tensor model.layers.0.mlp.gate_proj.bias"},
		{"short data", func(f fakeWeights) {
			w := f["model.layers.0.mlp.up_proj.weight"]
			w.Data = w.Data[:10]
			f[w.Name] = w
		}, "holds 10 bytes"},
		{"I32 weight", func(f fakeWeights) {
			w := f["model.norm.weight"]
			w.DType, w.Data = backend.I32, make([]byte, 4*32)
			f[w.Name] = w
		}, "unsupported dtype I32"},
		{"transposed projection", func(f fakeWeights) {
			w := f["model.layers.0.mlp.down_proj.weight"]
			w.Shape = []int{48, 32}
			f[w.Name] = w
		}, "shape [48 32], the config needs [32 48]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := build()
			tc.edit(f)
			err := model.ValidateWeights(cfg, f)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("got %v, want %q", err, tc.wantErr)
			}
		})
	}
	t.Run("tied model may carry lm_head", func(t *testing.T) {
		c := cfg
		c.TieEmbeddings = true
		f := build()
		if err := model.ValidateWeights(c, f); err != nil {
			t.Fatal(err)
		}
	})
}

// TestOpenWeightsErrorsNameThePathOnce: a model that does not open is
// named once, after "open model", whichever layer failed (the file
// system, the GGUF parser).
func TestOpenWeightsErrorsNameThePathOnce(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing")
	notGGUF := filepath.Join(dir, "model.gguf")
	truncated := filepath.Join(dir, "truncated.gguf")
	head, err := os.ReadFile("../models/default/trigon-go.q8_0.gguf")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(notGGUF, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(truncated, head[:1000], 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path, want string // want: the message's start
	}{
		{"missing", missing, "open model " + missing + ": no such file or directory"},
		{"not GGUF", notGGUF, "open model " + notGGUF + ": not a GGUF file"},
		{"truncated GGUF", truncated, "open model " + truncated + ": gguf: invalid file at byte "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, _, err := model.OpenWeights(tc.path)
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Errorf("got %v, want an error starting %q", err, tc.want)
			}
		})
	}
}
