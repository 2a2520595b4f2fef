package model

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/format/safetensors"
)

func TestParseQuantization(t *testing.T) {
	for _, c := range []struct {
		name string
		json string
		want Quantization
		err  string
	}{
		{"none", `null`, Quantization{}, ""},
		{"awq", `{"quant_method":"awq","bits":4,"group_size":128,"zero_point":true,"version":"gemm"}`, Quantization{Method: "awq", Group: 128}, ""},
		{"awq w_bit", `{"quant_method":"awq","w_bit":4,"q_group_size":32,"zero_point":true}`, Quantization{Method: "awq", Group: 32}, ""},
		{"awq 8 bits", `{"quant_method":"awq","bits":8,"group_size":128,"zero_point":true}`, Quantization{}, "only 4-bit"},
		{"awq group 16", `{"quant_method":"awq","bits":4,"group_size":16,"zero_point":true}`, Quantization{}, "group_size 16"},
		{"awq no zero", `{"quant_method":"awq","bits":4,"group_size":128,"zero_point":false}`, Quantization{}, "zero_point"},
		{"awq gemv", `{"quant_method":"awq","bits":4,"group_size":128,"zero_point":true,"version":"gemv"}`, Quantization{}, "GEMM layout"},
		{"fp8", `{"quant_method":"fp8","activation_scheme":"dynamic"}`, Quantization{Method: "fp8"}, ""},
		{"fp8 static", `{"quant_method":"fp8","activation_scheme":"static"}`, Quantization{}, "dynamic"},
		{"fp8 blocks", `{"quant_method":"fp8","activation_scheme":"dynamic","weight_block_size":[128,128]}`, Quantization{}, "block-wise"},
		{"fbgemm", `{"quant_method":"fbgemm_fp8"}`, Quantization{Method: "fp8"}, ""},
		{"ct fp8", ctFP8("channel", "true"), Quantization{Method: "fp8"}, ""},
		{"ct static acts", ctFP8("tensor", "false"), Quantization{}, "input_activations"},
		{"ct int4", `{"quant_method":"compressed-tensors","config_groups":{"g":{"weights":{"num_bits":4,"type":"int","strategy":"group"}}}}`, Quantization{}, "8-bit float weights"},
		{"gptq", `{"quant_method":"gptq","bits":4}`, Quantization{}, `"gptq" is not supported`},
		{"no method", `{"bits":4}`, Quantization{}, "no quant_method"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseQuantization(json.RawMessage(c.json))
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want one containing %q", err, c.err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, c.want)
			}
		})
	}
}

func ctFP8(strategy, dynamic string) string {
	return `{"quant_method":"compressed-tensors","config_groups":{"group_0":{"weights":{"num_bits":8,"type":"float","strategy":"` + strategy +
		`"},"input_activations":{"num_bits":8,"type":"float","strategy":"token","dynamic":` + dynamic + `}}}}`
}

// defaultHF is the default model's Hugging Face directory; its widths
// (320, 864) take AWQ groups of 32 only.
const defaultHF = "../models/default/hf"

// syntheticHF writes a two-layer Llama of the default model's config with
// widths that are multiples of 128 (hidden 256 as 4 heads of 64 and 2 KV
// heads, MLP 384), weights BF16 uniform in [-1, 1) from seed, and returns
// its directory: a source for AWQ groups of 64 and 128.
func syntheticHF(t *testing.T, seed uint64) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(defaultHF, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var hf map[string]any
	if err := json.Unmarshal(raw, &hf); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]any{"hidden_size": 256, "intermediate_size": 384, "num_attention_heads": 4,
		"num_key_value_heads": 2, "head_dim": 64, "num_hidden_layers": 2, "vocab_size": 512} {
		hf[k] = v
	}
	raw, _ = json.Marshal(hf)
	cfg, err := ParseHFConfig(raw)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, 1))
	var ts []safetensors.TensorInfo
	for _, s := range ExpectedWeights(cfg) {
		n, _ := backend.NumElements(s.Shape)
		b := make([]byte, 2*n)
		for i := range n {
			binary.LittleEndian.PutUint16(b[2*i:], backend.F32ToBF16(2*rng.Float32()-1))
		}
		ts = append(ts, safetensors.TensorInfo{Name: s.Name, DType: "BF16", Shape: s.Shape, Data: b})
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := safetensors.Write(filepath.Join(dir, "model.safetensors"), ts, nil); err != nil {
		t.Fatal(err)
	}
	return dir
}

// quantCheckpoint writes the HF directory src as a quantized checkpoint
// under a temp dir: every projection through pack (returning the tensors
// that replace it), the rest as stored. It returns the directory and src's
// weights.
func quantCheckpoint(t *testing.T, src, qc string, pack func(name string, vals []float32, out, in int) []safetensors.TensorInfo) (string, Weights) {
	t.Helper()
	_, _, w, err := OpenWeights(src)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	var ts []safetensors.TensorInfo
	for _, name := range w.Names() {
		x, _ := w.Tensor(name)
		if !IsProjection(name) {
			ts = append(ts, safetensors.TensorInfo{Name: name, DType: x.DType.String(), Shape: x.Shape, Data: x.Data})
			continue
		}
		vals, err := backend.DequantizeRows(x.DType, x.Data, x.Shape[0], x.Shape[1])
		if err != nil {
			t.Fatal(err)
		}
		ts = append(ts, pack(name, vals, x.Shape[0], x.Shape[1])...)
	}
	dir := t.TempDir()
	raw, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var hf map[string]any
	if err := json.Unmarshal(raw, &hf); err != nil {
		t.Fatal(err)
	}
	hf["quantization_config"] = json.RawMessage(qc)
	raw, _ = json.Marshal(hf)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := safetensors.Write(filepath.Join(dir, "model.safetensors"), ts, nil); err != nil {
		t.Fatal(err)
	}
	return dir, w
}

// TestLoadAWQ writes AutoAWQ GEMM checkpoints of each group size and
// checks that every projection loads as the group's AWQ4 dtype whose
// values are the checkpoint's (q - zero) * scale, unpacked here
// independently of the loader (AutoAWQ's order map: nibble i of word c
// holds output 8c + [0,2,4,6,1,3,5,7][i]; group k/g of input k). Groups
// of 32 on the default model; 64 and 128, which its widths do not take, on
// random weights of a config whose widths do.
func TestLoadAWQ(t *testing.T) {
	seed := rand.Uint64()
	for _, c := range []struct {
		g    int
		src  func(t *testing.T) string
		want backend.DType
	}{
		{32, func(*testing.T) string { return defaultHF }, backend.AWQ4G32},
		{64, func(t *testing.T) string { return syntheticHF(t, seed) }, backend.AWQ4G64},
		{128, func(t *testing.T) string { return syntheticHF(t, seed) }, backend.AWQ4G128},
	} {
		t.Run(fmt.Sprintf("group %d", c.g), func(t *testing.T) {
			g := c.g
			type awqParts struct{ qw, qz, sc []byte }
			parts := map[string]awqParts{}
			qc := fmt.Sprintf(`{"quant_method":"awq","bits":4,"group_size":%d,"zero_point":true,"version":"gemm"}`, g)
			dir, orig := quantCheckpoint(t, c.src(t), qc, func(name string, vals []float32, out, in int) []safetensors.TensorInfo {
				qw, qz, sc, err := PackAutoAWQ(vals, out, in, g)
				if err != nil {
					t.Fatal(err)
				}
				parts[name] = awqParts{qw, qz, sc}
				base := strings.TrimSuffix(name, ".weight")
				return []safetensors.TensorInfo{
					{Name: base + ".qweight", DType: "I32", Shape: []int{in, out / 8}, Data: qw},
					{Name: base + ".qzeros", DType: "I32", Shape: []int{in / g, out / 8}, Data: qz},
					{Name: base + ".scales", DType: "F16", Shape: []int{in / g, out}, Data: sc},
				}
			})
			cfg, _, w, err := OpenWeights(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			order := [8]int{0, 2, 4, 6, 1, 3, 5, 7}
			for name, p := range parts {
				got, ok := w.Tensor(name)
				if !ok || got.DType != c.want {
					t.Fatalf("%s: %v %v, want %v", name, ok, got.DType, c.want)
				}
				out, in := got.Shape[0], got.Shape[1]
				vals, err := backend.DequantizeRows(got.DType, got.Data, out, in)
				if err != nil {
					t.Fatal(err)
				}
				o0, _ := orig.Tensor(name)
				ov, _ := backend.DequantizeRows(o0.DType, o0.Data, out, in)
				var num, den float64
				for k := range in {
					for c := range out / 8 {
						word := binary.LittleEndian.Uint32(p.qw[4*(k*(out/8)+c):])
						zword := binary.LittleEndian.Uint32(p.qz[4*((k/g)*(out/8)+c):])
						for i := range 8 {
							o := 8*c + order[i]
							q := float64(word >> (4 * i) & 15)
							z := float64(zword >> (4 * i) & 15)
							s := float64(backend.F16ToF32(binary.LittleEndian.Uint16(p.sc[2*((k/g)*out+o):])))
							want := (q - z) * s
							if d := math.Abs(float64(vals[o*in+k]) - want); d > 1e-6*math.Abs(want) {
								t.Fatalf("%s[%d][%d] = %v, checkpoint says %v (seed %d)", name, o, k, vals[o*in+k], want, seed)
							}
							d := float64(vals[o*in+k] - ov[o*in+k])
							num, den = num+d*d, den+float64(ov[o*in+k])*float64(ov[o*in+k])
						}
					}
				}
				// Round to nearest with 4 bits: well under a tenth of the norm.
				if e := math.Sqrt(num / den); e > 0.1 {
					t.Errorf("%s: relative error %.3f against the bf16 weights (seed %d)", name, e, seed)
				}
			}
			if len(parts) != 7*cfg.NumLayers {
				t.Errorf("%d projections, want %d", len(parts), 7*cfg.NumLayers)
			}
		})
	}
}

// TestLoadFP8 writes FP8 checkpoints in each accepted scale layout and
// checks that every projection loads as F8_E4M3_ROW holding the
// checkpoint's codes and its scale for each row, and that the tensors the
// repack consumes (weight_scale, FBGEMM's input_scale_ub) are gone.
func TestLoadFP8(t *testing.T) {
	for _, c := range []struct {
		name      string
		qc        string
		perTensor bool
		shape     func(out int) []int
		dtype     string // of weight_scale
		ub        bool   // write an input_scale_ub
	}{
		// Scales stored as BF16, as llm-compressor writes them for bf16 models.
		{"channel [out 1]", ctFP8("channel", "true"), false, func(out int) []int { return []int{out, 1} }, "BF16", false},
		{"tensor []", ctFP8("tensor", "true"), true, func(int) []int { return []int{} }, "BF16", false},
		{"channel [out]", `{"quant_method":"fp8","activation_scheme":"dynamic"}`, false, func(out int) []int { return []int{out} }, "F32", false},
		// FBGEMM-FP8 as transformers writes it: [out, 1] F32 scales and a
		// one-value input_scale_ub beside each weight.
		{"fbgemm input_scale_ub", `{"quant_method":"fbgemm_fp8"}`, false, func(out int) []int { return []int{out, 1} }, "F32", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			scales := map[string][]float32{}
			codes := map[string][]byte{}
			dir, _ := quantCheckpoint(t, defaultHF, c.qc, func(name string, vals []float32, out, in int) []safetensors.TensorInfo {
				q, s, err := PackFP8(vals, out, in, c.perTensor)
				if err != nil {
					t.Fatal(err)
				}
				sb := F32Bytes(s)
				if c.dtype == "BF16" {
					sb = make([]byte, 2*len(s))
					for i, v := range s {
						binary.LittleEndian.PutUint16(sb[2*i:], backend.F32ToBF16(v))
						s[i] = backend.BF16ToF32(backend.F32ToBF16(v))
					}
				}
				scales[name], codes[name] = s, q
				base := strings.TrimSuffix(name, ".weight")
				ts := []safetensors.TensorInfo{
					{Name: name, DType: "F8_E4M3", Shape: []int{out, in}, Data: q},
					{Name: base + ".weight_scale", DType: c.dtype, Shape: c.shape(out), Data: sb},
				}
				if c.ub {
					ts = append(ts, safetensors.TensorInfo{Name: base + ".input_scale_ub", DType: "F32", Shape: []int{1}, Data: F32Bytes([]float32{1200})})
				}
				return ts
			})
			_, _, w, err := OpenWeights(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			for name, s := range scales {
				got, _ := w.Tensor(name)
				if got.DType != backend.F8E4M3Row {
					t.Fatalf("%s: %v", name, got.DType)
				}
				out, in := got.Shape[0], got.Shape[1]
				rb, _ := got.DType.RowBytes(in)
				for o := range out {
					row := got.Data[o*rb : (o+1)*rb]
					if want := s[min(o, len(s)-1)]; backend.F8RowScale(row) != want {
						t.Fatalf("%s row %d: scale %v, want %v", name, o, backend.F8RowScale(row), want)
					}
					if string(row[:in]) != string(codes[name][o*in:(o+1)*in]) {
						t.Fatalf("%s row %d: codes are not the checkpoint's", name, o)
					}
				}
			}
			for _, name := range w.Names() {
				if strings.HasSuffix(name, ".weight_scale") || strings.HasSuffix(name, ".input_scale_ub") {
					t.Errorf("%s is still listed after the repack", name)
				}
			}
		})
	}
}

func TestLoadQuantizedRefusals(t *testing.T) {
	// A static activation scale: the tensor is there, the config says
	// dynamic; refused rather than ignored.
	dir, _ := quantCheckpoint(t, defaultHF, ctFP8("channel", "true"), func(name string, vals []float32, out, in int) []safetensors.TensorInfo {
		q, s, _ := PackFP8(vals, out, in, false)
		base := strings.TrimSuffix(name, ".weight")
		return []safetensors.TensorInfo{
			{Name: name, DType: "F8_E4M3", Shape: []int{out, in}, Data: q},
			{Name: base + ".weight_scale", DType: "F32", Shape: []int{out}, Data: F32Bytes(s)},
			{Name: base + ".input_scale", DType: "F32", Shape: []int{}, Data: F32Bytes([]float32{1})},
		}
	})
	if _, _, _, err := OpenWeights(dir); err == nil || !strings.Contains(err.Error(), "input_scale") {
		t.Errorf("input_scale: %v", err)
	}
	// AWQ tensors whose shapes disagree.
	dir, _ = quantCheckpoint(t, defaultHF, `{"quant_method":"awq","bits":4,"group_size":32,"zero_point":true}`, func(name string, vals []float32, out, in int) []safetensors.TensorInfo {
		qw, qz, sc, _ := PackAutoAWQ(vals, out, in, 32)
		base := strings.TrimSuffix(name, ".weight")
		return []safetensors.TensorInfo{
			{Name: base + ".qweight", DType: "I32", Shape: []int{in, out / 8}, Data: qw},
			{Name: base + ".qzeros", DType: "I32", Shape: []int{in / 32, out / 8}, Data: qz},
			{Name: base + ".scales", DType: "F16", Shape: []int{out, in / 32}, Data: sc},
		}
	})
	if _, _, _, err := OpenWeights(dir); err == nil || !strings.Contains(err.Error(), "do not agree") {
		t.Errorf("transposed scales: %v", err)
	}
}

func TestQuantizeWeights(t *testing.T) {
	_, _, w, err := OpenWeights(defaultHF)
	if err != nil {
		t.Fatal(err)
	}
	for _, dt := range []backend.DType{backend.F8E4M3Row, backend.AWQ4G32} {
		q, err := QuantizeWeights(w, dt)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range q.Names() {
			x, _ := q.Tensor(name)
			o, _ := w.Tensor(name)
			if IsProjection(name) {
				if x.DType != dt {
					t.Errorf("%v: %s is %v", dt, name, x.DType)
				}
				row, _ := backend.DequantizeRows(o.DType, o.Data[:2*o.Shape[1]], 1, o.Shape[1])
				enc := encodeRow(t, dt, row)
				if string(enc) != string(x.Data[:len(enc)]) {
					t.Errorf("%v: %s row 0 is not its encoding", dt, name)
				}
			} else if x.DType != o.DType || &x.Data[0] != &o.Data[0] {
				t.Errorf("%v: %s changed (%v)", dt, name, x.DType)
			}
		}
	}
	if _, err := QuantizeWeights(w, backend.Q8_0); err == nil {
		t.Error("Q8_0: no error")
	}
	w.Close()
}

func encodeRow(t *testing.T, dt backend.DType, row []float32) []byte {
	var b []byte
	var err error
	if g := backend.AWQGroup(dt); g != 0 {
		b, err = backend.EncodeAWQ4(row, g)
	} else {
		b, err = backend.EncodeF8E4M3Row(row, 0)
	}
	if err != nil {
		t.Fatal(err)
	}
	return b
}
