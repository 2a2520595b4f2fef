package bench

import (
	"bytes"
	"context"
	"encoding/binary"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/cpu"
	"github.com/trigon-llm/trigon/model"
	"github.com/trigon-llm/trigon/model/llama"
	"github.com/trigon-llm/trigon/runner"
)

func f32s(t *testing.T, w model.Weight) []float32 {
	t.Helper()
	if w.DType != backend.F32 {
		t.Fatalf("%s is %v, want F32", w.Name, w.DType)
	}
	out := make([]float32, len(w.Data)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(w.Data[4*i:]))
	}
	return out
}

// TestSyntheticDeterministic: the bytes depend on (config, dtype, seed,
// name) only, not on the number of goroutines or on call order.
func TestSyntheticDeterministic(t *testing.T) {
	// Intermediate 2176 makes the MLP matrices span several generation
	// chunks with a partial last one.
	cfg := tinyConfig(false, true)
	cfg.Intermediate = 2176
	for _, dt := range []backend.DType{backend.BF16, backend.F32, backend.Q8_0} {
		t.Run(dt.String(), func(t *testing.T) {
			one, err := newSynthetic(cfg, dt, 7, 1)
			if err != nil {
				t.Fatal(err)
			}
			three, err := newSynthetic(cfg, dt, 7, 3)
			if err != nil {
				t.Fatal(err)
			}
			other, err := newSynthetic(cfg, dt, 8, 3)
			if err != nil {
				t.Fatal(err)
			}
			names := one.Names()
			slices.Reverse(names) // a different generation order
			for _, name := range names {
				a, _ := one.Tensor(name)
				b, _ := three.Tensor(name)
				c, _ := other.Tensor(name)
				if !bytes.Equal(a.Data, b.Data) {
					t.Errorf("%s differs between 1 and 3 workers", name)
				}
				if bytes.Equal(a.Data, c.Data) {
					t.Errorf("%s is the same under seeds 7 and 8", name)
				}
			}
			q1, _ := one.Tensor(model.LayerName(0, model.SuffixQ))
			k1, _ := one.Tensor(model.LayerName(1, model.SuffixQ))
			if bytes.Equal(q1.Data, k1.Data) {
				t.Error("layers 0 and 1 got the same q_proj")
			}
		})
	}
}

// TestSyntheticEncodings: BF16 and quantized weights are the F32 weights
// of the same seed run through the CPU backend's reference encoders.
func TestSyntheticEncodings(t *testing.T) {
	cfg := tinyConfig(false, false)
	cfg.Intermediate = 2176
	// The K-quants need rows of whole 256-value blocks: every width 256.
	kcfg := tinyConfig(false, false)
	kcfg.Hidden, kcfg.Intermediate, kcfg.NumHeads, kcfg.NumKVHeads, kcfg.HeadDim = 256, 512, 4, 4, 64
	for _, dt := range []backend.DType{backend.BF16, backend.F16, backend.Q8_0, backend.Q4_0, backend.Q4_K, backend.Q5_K, backend.Q6_K} {
		cfg := cfg
		if dt.BlockSize() == backend.QK_K {
			cfg = kcfg
		}
		ref := mustSynthetic(t, cfg, backend.F32, 3)
		t.Run(dt.String(), func(t *testing.T) {
			w := mustSynthetic(t, cfg, dt, 3)
			for _, spec := range model.ExpectedWeights(cfg) {
				if !spec.Matrix {
					continue
				}
				r, _ := ref.Tensor(spec.Name)
				got, ok := w.Tensor(spec.Name)
				if !ok {
					t.Fatalf("%s missing", spec.Name)
				}
				vals := f32s(t, r)
				var want []byte
				switch dt {
				case backend.BF16, backend.F16:
					want = make([]byte, 2*len(vals))
					for i, v := range vals {
						h := backend.F32ToBF16(v)
						if dt == backend.F16 {
							h = backend.F32ToF16(v)
						}
						binary.LittleEndian.PutUint16(want[2*i:], h)
					}
				case backend.Q8_0:
					want, _ = backend.QuantizeQ8_0(vals)
				case backend.Q4_0:
					want, _ = backend.QuantizeQ4_0(vals)
				default:
					want, _ = backend.Quantize(dt, vals)
				}
				if got.DType != dt || !bytes.Equal(got.Data, want) {
					t.Errorf("%s (%v): bytes differ from the reference encoding of the F32 weights", spec.Name, got.DType)
				}
			}
		})
	}
}

// TestSyntheticStatistics checks the scale rules the doc comment promises.
func TestSyntheticStatistics(t *testing.T) {
	cfg := tinyConfig(false, true)
	cfg.Hidden, cfg.Intermediate, cfg.HeadDim = 512, 1024, 128 // q bias: 512 values
	w := mustSynthetic(t, cfg, backend.F32, 11)
	for _, tc := range []struct {
		name      string
		mean, std float64
	}{
		{model.LayerName(0, model.SuffixGate), 0, 1 / math.Sqrt(512)},
		{model.LayerName(1, model.SuffixDown), 0, 1 / math.Sqrt(1024)},
		{model.NameEmbed, 0, 1 / math.Sqrt(512)},
		{model.LayerName(0, model.SuffixInputNorm), 1, 0.05},
		{model.NameFinalNorm, 1, 0.05},
		{model.LayerName(0, model.SuffixQBias), 0, 0.02},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wt, ok := w.Tensor(tc.name)
			if !ok {
				t.Fatal("missing")
			}
			vals := f32s(t, wt)
			var sum, sq float64
			for _, v := range vals {
				sum += float64(v)
			}
			mean := sum / float64(len(vals))
			for _, v := range vals {
				sq += (float64(v) - mean) * (float64(v) - mean)
			}
			std := math.Sqrt(sq / float64(len(vals)))
			n := float64(len(vals))
			// Five standard errors of the mean; 12% on the stddev (the
			// smallest tensor has 512 values).
			if math.Abs(mean-tc.mean) > 5*tc.std/math.Sqrt(n) {
				t.Errorf("mean %g, want %g", mean, tc.mean)
			}
			if math.Abs(std-tc.std) > 0.12*tc.std {
				t.Errorf("stddev %g, want %g", std, tc.std)
			}
		})
	}
}

// TestSyntheticRunsForward: synthetic weights pass the loader's checks
// and give finite, non-constant logits through the real model and runner.
func TestSyntheticRunsForward(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  model.Config
		dt   backend.DType
	}{
		{"llama-bf16", tinyConfig(false, false), backend.BF16},
		{"llama-tied-q8", tinyConfig(true, false), backend.Q8_0},
		{"qwen2-f32", tinyConfig(false, true), backend.F32},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := mustSynthetic(t, tc.cfg, tc.dt, 1)
			if err := model.ValidateWeights(tc.cfg, w); err != nil {
				t.Fatal(err)
			}
			b := cpu.New(cpu.Options{Threads: 2})
			m, err := llama.New(b, tc.cfg, w, model.Options{MaxTokens: 16})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			r, err := runner.New(b, m, runner.Options{NumBlocks: 4, BlockSize: 16, MaxTokens: 16, MaxSeqs: 1, MaxSeqLen: 32,
				NumLayers: tc.cfg.NumLayers, NumKVHeads: tc.cfg.NumKVHeads, HeadDim: tc.cfg.HeadDim})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			out, err := r.Execute(&runner.Step{Seqs: []runner.Seq{{Tokens: []int32{5, 17, 200, 3}, BlockTable: []int32{1}, WantLogits: true}}})
			if err != nil {
				t.Fatal(err)
			}
			logits, err := out.Logits(0)
			if err != nil {
				t.Fatal(err)
			}
			lo, hi := float32(math.Inf(1)), float32(math.Inf(-1))
			for _, v := range logits {
				if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					t.Fatalf("logit %v", v)
				}
				lo, hi = min(lo, v), max(hi, v)
			}
			if !(hi-lo > 1e-3) {
				t.Errorf("logits span only [%g, %g]", lo, hi)
			}
		})
	}
}

func TestSyntheticErrorsAndAccessors(t *testing.T) {
	odd := tinyConfig(false, false)
	odd.Intermediate = 100 // not a multiple of 32
	for _, tc := range []struct {
		name string
		cfg  model.Config
		dt   backend.DType
		want string
	}{
		{"int dtype", tinyConfig(false, false), backend.I32, "not supported"},
		{"q8 odd rows", odd, backend.Q8_0, "blocks"},
		{"invalid config", model.Config{Arch: "gpt2"}, backend.BF16, "architecture"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := SyntheticWeights(tc.cfg, tc.dt, 0)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one mentioning %q", err, tc.want)
			}
		})
	}
	t.Run("accessors", func(t *testing.T) {
		cfg := tinyConfig(true, false)
		w := mustSynthetic(t, cfg, backend.BF16, 0)
		names := w.Names()
		if !slices.IsSorted(names) || len(names) != len(model.ExpectedWeights(cfg)) {
			t.Errorf("Names() = %d names, sorted %v; want %d sorted", len(names), slices.IsSorted(names), len(model.ExpectedWeights(cfg)))
		}
		if _, ok := w.Tensor(model.NameLMHead); ok {
			t.Error("tied model has an lm_head tensor")
		}
		norm, _ := w.Tensor(model.NameFinalNorm)
		if norm.DType != backend.BF16 {
			t.Errorf("norm dtype %v, want BF16", norm.DType)
		}
		w.Close()
		if _, ok := w.Tensor(model.NameEmbed); ok || len(w.Names()) != 0 {
			t.Error("tensors still served after Close")
		}
	})
}

// BenchmarkSyntheticBF16 measures generation speed (bytes of BF16 weights
// per second), which bounds how fast a synthetic 8B model can be set up.
func BenchmarkSyntheticBF16(b *testing.B) {
	cfg := tinyConfig(false, false)
	cfg.Hidden, cfg.Intermediate, cfg.NumLayers = 4096, 4096, 1
	b.ReportAllocs()
	var size int64
	for b.Loop() {
		w, err := SyntheticWeights(cfg, backend.BF16, 1)
		if err != nil {
			b.Fatal(err)
		}
		t, _ := w.Tensor(model.LayerName(0, model.SuffixGate))
		size = int64(len(t.Data))
		w.Close()
	}
	b.SetBytes(size)
}

// TestSyntheticFillMatchesTensor checks that the device path (Fill on a
// backend.RandomFiller, here the CPU backend) makes the same bytes as the
// host path (Tensor) for every BF16 and F32 tensor, refuses quantized
// tensors and backends without FillNormal, and that Spec agrees with
// Tensor.
func TestSyntheticFillMatchesTensor(t *testing.T) {
	cfg := tinyConfig(false, true)
	b := cpu.New(cpu.Options{Threads: 2})
	for _, dt := range []backend.DType{backend.BF16, backend.F32, backend.Q8_0} {
		w := mustSynthetic(t, cfg, dt, 11)
		f := w.(model.Filler)
		filled := 0
		for _, name := range w.Names() {
			host, ok := w.Tensor(name)
			sdt, shape, sok := f.Spec(name)
			if !ok || !sok || sdt != host.DType || !slices.Equal(shape, host.Shape) {
				t.Fatalf("%v %s: Spec %v %v %v against Tensor %v %v %v", dt, name, sdt, shape, sok, host.DType, host.Shape, ok)
			}
			dst, err := b.Alloc(sdt, shape...)
			if err != nil {
				t.Fatal(err)
			}
			ok, err = f.Fill(b, name, dst)
			if err != nil {
				t.Fatal(err)
			}
			if quant := sdt == backend.Q8_0; ok == quant {
				t.Fatalf("%v %s: Fill said %v", dt, name, ok)
			}
			if !ok {
				continue
			}
			filled++
			got := make([]byte, len(host.Data))
			if err := b.Read(dst, got); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, host.Data) {
				t.Fatalf("%v %s: filled bytes differ from Tensor's", dt, name)
			}
		}
		if filled == 0 {
			t.Fatalf("%v: nothing filled", dt)
		}
		// A backend without FillNormal is told no.
		dst, _ := b.Alloc(backend.BF16, 4)
		if ok, err := f.Fill(noFiller{b}, model.NameFinalNorm, dst); ok || err != nil {
			t.Errorf("Fill on a backend without FillNormal: %v, %v", ok, err)
		}
	}
}

// noFiller hides the CPU backend's FillNormal.
type noFiller struct{ backend.Backend }

// TestHostOnlySameTokens runs the latency benchmark with the weights made
// by the backend (Fill) and uploaded from the host (HostOnly): the same
// bytes, so the same greedy tokens.
func TestHostOnlySameTokens(t *testing.T) {
	cfg := tinyConfig(false, false)
	w := mustSynthetic(t, cfg, backend.BF16, 5)
	if _, ok := HostOnly(w).(model.Filler); ok {
		t.Fatal("HostOnly still exposes model.Filler")
	}
	var tokens [][][]int32
	for _, ws := range []model.Weights{w, HostOnly(w)} {
		res, err := RunLatency(context.Background(), LatencyOptions{
			Backend: cpu.New(cpu.Options{Threads: 2}), Config: cfg, Weights: ws, Arch: "tiny",
			Batch: 2, InputLen: 12, OutputLen: 5, Iters: 1, Seed: 4,
		})
		if err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, res.Tokens)
	}
	for s := range tokens[0] {
		if !slices.Equal(tokens[0][s], tokens[1][s]) {
			t.Errorf("sequence %d: %v filled, %v uploaded", s, tokens[0][s], tokens[1][s])
		}
	}
}
