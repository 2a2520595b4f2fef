package engine_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/collective"
	"github.com/trigon-llm/trigon/backend/cpu"
	"github.com/trigon-llm/trigon/engine"
	"github.com/trigon-llm/trigon/format/safetensors"
	"github.com/trigon-llm/trigon/models"
	"github.com/trigon-llm/trigon/runner"
)

// loadTP loads the model at path split over n CPU ranks (n = 1: the whole
// model, no tensor parallelism), its engine running until the test ends.
func loadTP(t *testing.T, path string, n int) *engine.Loaded {
	t.Helper()
	bs := make([]backend.Backend, n)
	for i := range bs {
		bs[i] = cpu.New(cpu.Options{Threads: 1})
	}
	opts := engine.LoadOptions{Model: path, Backend: bs[0], MaxSeqs: 4, MaxBatchedTokens: 256, KVBlocks: 64}
	if n > 1 {
		comms, err := collective.New(bs)
		if err != nil {
			t.Fatal(err)
		}
		tp := &engine.TensorParallel{Backends: bs, Abort: comms[0].Group()}
		for _, c := range comms {
			tp.Comms = append(tp.Comms, c)
		}
		opts.TensorParallel = tp
	}
	l, err := engine.Load(opts)
	if err != nil {
		t.Fatalf("load %s at TP=%d: %v", path, n, err)
	}
	t.Cleanup(l.Close)
	return l
}

// prefillLogits runs prompt as one prefill step through l's runner (the
// engine not running) and returns the last token's logits.
func prefillLogits(t *testing.T, l *engine.Loaded, prompt []int32) []float32 {
	t.Helper()
	table := make([]int32, (len(prompt)+15)/16)
	for i := range table {
		table[i] = int32(i + 1)
	}
	out, err := engine.RunnerOf(l).Execute(&runner.Step{Seqs: []runner.Seq{{Tokens: prompt, BlockTable: table, WantLogits: true}}})
	if err != nil {
		t.Fatal(err)
	}
	lg, err := out.Logits(0)
	if err != nil {
		t.Fatal(err)
	}
	return append([]float32(nil), lg...)
}

// maxRelErr is the largest |got - want| over the largest |want|.
func maxRelErr(got, want []float32) float64 {
	var d, m float64
	for i := range want {
		d = math.Max(d, math.Abs(float64(got[i]-want[i])))
		m = math.Max(m, math.Abs(float64(want[i])))
	}
	return d / m
}

// TestTensorParallelLogits: a model split over 2 and 4 CPU ranks gives the
// logits of the whole model within f32 rounding (the row-parallel sums
// add the ranks' partial products in another order). The models cover
// the ways heads split: whole KV groups per rank (unevenly: the default
// model's 5 KV heads over 2 and 4 ranks), a KV head replicated over ranks
// (llama3's 2 over 4, llama-tied's 1 over 2 and 4, with tied embeddings),
// attention biases (qwen2) and Q/K norms (qwen3).
//
// The embedded default model is Q8_0, whose products on the CPU round
// the activations to int8 per block of 32: an activation that moves by
// an ulp can round to the next int8 step, so its logits agree within the
// Q8_0 error (the tolerance of its own test against the bf16 weights,
// models_test's 3e-2) and its greedy text is checked up to near ties
// (TestTensorParallelGreedyQ8).
func TestTensorParallelLogits(t *testing.T) {
	def, err := models.DefaultPath()
	if err != nil {
		t.Fatal(err)
	}
	prompt := randomPrompt(rand.New(rand.NewPCG(7, 8)), 40)
	for _, c := range []struct {
		name, path string
		tol        float64
	}{
		{"default-bf16", defaultHF, 1e-5},
		{"default-q8_0", def, 3e-2},
		{"llama3", fixture, 1e-5},
		{"llama-tied", "../testdata/models/llama-tied", 1e-5},
		{"qwen2", "../testdata/models/qwen2", 1e-5},
		{"qwen3", "../testdata/models/qwen3", 1e-5},
	} {
		want := prefillLogits(t, loadTP(t, c.path, 1), prompt)
		for _, n := range []int{2, 4} {
			t.Run(fmt.Sprintf("%s/tp%d", c.name, n), func(t *testing.T) {
				got := prefillLogits(t, loadTP(t, c.path, n), prompt)
				if len(got) != len(want) {
					t.Fatalf("%d logits, want %d", len(got), len(want))
				}
				if e := maxRelErr(got, want); e > c.tol || math.IsNaN(e) {
					t.Errorf("relative logits error %.3g against TP=1, want at most %.0e", e, c.tol)
				}
			})
		}
	}
}

// defaultHF is the default model's weights in bf16 (the embedded GGUF is
// their Q8_0 conversion).
const defaultHF = "../models/default/hf"

// greedyDecode decodes steps tokens greedily after prompt through l's
// runner (the engine not running), one sequence, and returns them with
// each step's logits.
func greedyDecode(t *testing.T, l *engine.Loaded, prompt []int32, steps int) ([]int32, [][]float32) {
	t.Helper()
	r := engine.RunnerOf(l)
	table := make([]int32, (len(prompt)+steps+15)/16)
	for i := range table {
		table[i] = int32(i + 1)
	}
	var toks []int32
	var logits [][]float32
	seq := runner.Seq{Tokens: prompt, BlockTable: table, WantLogits: true}
	for range steps {
		out, err := r.Execute(&runner.Step{Seqs: []runner.Seq{seq}})
		if err != nil {
			t.Fatal(err)
		}
		ids, err := out.Sample([]backend.SampleRow{{}})
		if err != nil {
			t.Fatal(err)
		}
		lg, err := out.Logits(0)
		if err != nil {
			t.Fatal(err)
		}
		toks, logits = append(toks, ids[0]), append(logits, append([]float32(nil), lg...))
		seq.Start += len(seq.Tokens)
		seq.Tokens = ids[:1]
	}
	return toks, logits
}

// TestTensorParallelGreedyQ8: the embedded (Q8_0) default model's greedy
// tokens over 2 and 4 ranks are those of one rank, up to a near tie: where
// they first differ, the whole model's logits of the two tokens lie
// within the Q8_0 tolerance of TestTensorParallelLogits.
func TestTensorParallelGreedyQ8(t *testing.T) {
	def, err := models.DefaultPath()
	if err != nil {
		t.Fatal(err)
	}
	ref := loadTP(t, def, 1)
	var prompts [][]int32
	for _, text := range []string{"func main() {\n", "package sort\n\n// ", "for i := 0; i < n; i++ {"} {
		ids, err := ref.Tokenizer.Encode(text, false)
		if err != nil {
			t.Fatal(err)
		}
		prompts = append(prompts, ids)
	}
	const steps = 24
	for _, n := range []int{2, 4} {
		l := loadTP(t, def, n)
		for i, p := range prompts {
			want, wantLogits := greedyDecode(t, ref, p, steps)
			got, _ := greedyDecode(t, l, p, steps)
			for j := range want {
				if got[j] == want[j] {
					continue
				}
				lg := wantLogits[j]
				var m float64
				for _, v := range lg {
					m = math.Max(m, math.Abs(float64(v)))
				}
				if gap := float64(lg[want[j]]-lg[got[j]]) / m; gap > 3e-2 {
					t.Errorf("TP=%d prompt %d token %d: %d, TP=1 %d, whose logit is ahead by %.3g of the largest, no near tie", n, i, j, got[j], want[j], gap)
				} else {
					t.Logf("TP=%d prompt %d: a near tie at token %d (gap %.3g)", n, i, j, gap)
				}
				break
			}
		}
	}
}

// TestTensorParallelGreedy: the default model's (bf16 weights) greedy
// continuations of a batch of prompts, served by the engine (one
// scheduler, one KV manager) over 2 and 4 ranks, are the text of one
// rank.
func TestTensorParallelGreedy(t *testing.T) {
	texts := []string{"func main() {\n", "package sort\n\n// ", "for i := 0; i < n; i++ {"}
	run := func(n int) []string {
		l := loadTP(t, defaultHF, n)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); l.Engine.Run(ctx) }()
		defer func() { cancel(); <-done }()
		type reply struct {
			i   int
			out string
		}
		replies := make(chan reply, len(texts))
		for i, text := range texts {
			ids, err := l.Tokenizer.Encode(text, false)
			if err != nil {
				t.Fatal(err)
			}
			ch, err := l.Engine.Submit(ctx, &engine.Request{ID: fmt.Sprint(i), Prompt: ids, N: 1, Params: greedy(24)})
			if err != nil {
				t.Fatal(err)
			}
			go func() {
				var sb strings.Builder
				for ev := range ch {
					sb.WriteString(ev.Text)
				}
				replies <- reply{i, sb.String()}
			}()
		}
		out := make([]string, len(texts))
		for range texts {
			r := <-replies
			out[r.i] = r.out
		}
		return out
	}
	want := run(1)
	for i, w := range want {
		if w == "" {
			t.Fatalf("prompt %d: empty TP=1 continuation", i)
		}
	}
	for _, n := range []int{2, 4} {
		got := run(n)
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("TP=%d prompt %d: %q, TP=1 %q", n, i, got[i], want[i])
			}
		}
	}
}

// TestTensorParallelRefused: a model whose heads do not split over the
// ranks is refused at load, naming the shape.
func TestTensorParallelRefused(t *testing.T) {
	bs := []backend.Backend{cpu.New(cpu.Options{Threads: 1}), cpu.New(cpu.Options{Threads: 1}), cpu.New(cpu.Options{Threads: 1})}
	comms, err := collective.New(bs)
	if err != nil {
		t.Fatal(err)
	}
	tp := &engine.TensorParallel{Backends: bs}
	for _, c := range comms {
		tp.Comms = append(tp.Comms, c)
	}
	// llama3 has 2 KV heads: 3 ranks can neither split nor replicate them.
	_, err = engine.Load(engine.LoadOptions{Model: fixture, Backend: bs[0], MaxSeqs: 2, MaxBatchedTokens: 64, KVBlocks: 8, TensorParallel: tp})
	if err == nil || !strings.Contains(err.Error(), "tensor parallel size 3") || !strings.Contains(err.Error(), "2 KV heads") {
		t.Fatalf("load at TP=3: %v, want a refusal naming the size and the KV heads", err)
	}
	tp.Comms = tp.Comms[:2]
	if _, err = engine.Load(engine.LoadOptions{Model: fixture, Backend: bs[0], TensorParallel: tp}); err == nil || !strings.Contains(err.Error(), "communicators") {
		t.Fatalf("load with a communicator missing: %v", err)
	}
}

// TestTensorParallelPerTensorFP8Scales: a checkpoint with one k_scale and
// one v_scale per layer (compressed-tensors' per-tensor form, not one per
// KV head) loads with an fp8 KV cache split over 2 ranks, each rank's
// heads taking the layer's scale, and its logits are those of the whole
// model on one rank with the same scales. The scales are fixed, so the
// two differ only where a value that the ranks' partial sums round
// differently crosses an e4m3 rounding boundary.
func TestTensorParallelPerTensorFP8Scales(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"} {
		b, err := os.ReadFile(filepath.Join(fixture, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f, err := safetensors.Open(filepath.Join(fixture, safetensors.SingleFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tensors := f.Tensors()
	scalar := func(v float32) []byte { return binary.LittleEndian.AppendUint32(nil, math.Float32bits(v)) }
	for l := range 2 { // llama3 has 2 layers of 2 KV heads
		tensors = append(tensors,
			safetensors.TensorInfo{Name: fmt.Sprintf("model.layers.%d.self_attn.k_scale", l), DType: "F32", Data: scalar(0.01 * float32(l+1))},
			safetensors.TensorInfo{Name: fmt.Sprintf("model.layers.%d.self_attn.v_scale", l), DType: "F32", Data: scalar(0.005 * float32(l+1))})
	}
	if err := safetensors.Write(filepath.Join(dir, safetensors.SingleFile), tensors, nil); err != nil {
		t.Fatal(err)
	}
	load := func(n int) *engine.Loaded {
		bs := make([]backend.Backend, n)
		for i := range bs {
			bs[i] = cpu.New(cpu.Options{Threads: 1})
		}
		opts := engine.LoadOptions{Model: dir, Backend: bs[0], MaxSeqs: 4, MaxBatchedTokens: 256, KVBlocks: 64, KVCacheDType: "fp8"}
		if n > 1 {
			comms, err := collective.New(bs)
			if err != nil {
				t.Fatal(err)
			}
			tp := &engine.TensorParallel{Backends: bs, Abort: comms[0].Group()}
			for _, c := range comms {
				tp.Comms = append(tp.Comms, c)
			}
			opts.TensorParallel = tp
		}
		l, err := engine.Load(opts)
		if err != nil {
			t.Fatalf("load at TP=%d: %v", n, err)
		}
		t.Cleanup(l.Close)
		if got := engine.RunnerOf(l).KVSpec().Name(); got != "fp8" {
			t.Fatalf("TP=%d: KV cache %q, want fp8", n, got)
		}
		return l
	}
	prompt := randomPrompt(rand.New(rand.NewPCG(9, 10)), 40)
	want := prefillLogits(t, load(1), prompt)
	got := prefillLogits(t, load(2), prompt)
	if len(got) != len(want) {
		t.Fatalf("%d logits, want %d", len(got), len(want))
	}
	if e := maxRelErr(got, want); e > 1e-3 || math.IsNaN(e) {
		t.Errorf("relative logits error %.3g against TP=1, want at most 1e-3", e)
	}
}
