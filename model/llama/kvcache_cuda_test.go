package llama_test

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/trigon-llm/trigon/backend/cpu"
	"github.com/trigon-llm/trigon/backend/cuda"
	"github.com/trigon-llm/trigon/engine"
	"github.com/trigon-llm/trigon/eval"
)

var (
	kvCUDAOnce sync.Once
	kvCUDA     *cuda.Backend
	kvCUDAErr  error
)

// TestKVCacheDTypesCUDA scores the start of the default model's held-out
// text through the runner on the GPU with each KV cache format (windows
// of 160 tokens in chunks of 48: prefill chunks read a cached prefix and
// blocks fill, and int4 blocks are sealed, across steps) and checks each
// against the CPU backend scoring the same format (the GPU's bf16
// activations against the CPU's f32: within 2%), and against the GPU's
// own bf16 cache with the targets eval's TestPerplexityKVDTypes sets on
// the CPU (fp8 and int8 within 1%, int4 with a 16-token window within
// 5%, int4 with a window as long as the scoring window equal to bf16 but
// for the f16 arithmetic of the quantized kernels). Then greedy decoding
// (decode steps over every format's decode kernel, int4 blocks sealed as
// decode fills them): int4 with a window longer than the sequences agrees
// with the GPU's bf16 cache, and int4 with a 16-token window with the CPU
// reading the same format, on at least half of the positions before the
// first divergence (near ties between the two arithmetics aside, a wrong
// read of the cache diverges at once).
func TestKVCacheDTypesCUDA(t *testing.T) {
	kvCUDAOnce.Do(func() {
		if kvCUDAErr = cuda.Available(); kvCUDAErr == nil {
			kvCUDA, kvCUDAErr = cuda.New(cuda.Options{})
		}
	})
	if kvCUDAErr != nil {
		t.Skipf("no CUDA GPU: %v", kvCUDAErr)
	}
	// The repository's file, as the package's other GPU tests read it:
	// the test binaries the GPU machine runs are built without the
	// embedded model.
	path := filepath.Join("..", "..", "models", "default", "trigon-go.q8_0.gguf")
	text, err := os.ReadFile(filepath.Join("..", "..", "models", "default", "heldout.go.txt"))
	if err != nil {
		t.Skip("no held-out text:", err)
	}
	tok, err := engine.LoadTokenizer(path)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := tok.Encode(string(text[:3000]), false)
	if err != nil {
		t.Fatal(err)
	}
	c := cpu.New(cpu.Options{})
	score := func(t *testing.T, g bool, dtype string, window int) float64 {
		t.Helper()
		opts := eval.Options{Window: 160, Chunk: 48, KVCacheDType: dtype, KVWindow: window}
		var res eval.Result
		var err error
		if g {
			res, err = eval.Perplexity(kvCUDA, path, ids[:300], opts)
		} else {
			res, err = eval.Perplexity(c, path, ids[:300], opts)
		}
		if err != nil {
			t.Fatalf("%s (window %d, gpu %v): %v", dtype, window, g, err)
		}
		return res.PPL
	}
	base := score(t, true, "bf16", 0)
	for _, tc := range []struct {
		dtype  string
		window int
		tol    float64 // against the GPU's bf16 cache
	}{{"bf16", 0, 0}, {"fp8", 0, 0.01}, {"int8", 0, 0.01}, {"int4", 16, 0.05}, {"int4", 160, 2e-3}} {
		got, ref := score(t, true, tc.dtype, tc.window), score(t, false, tc.dtype, tc.window)
		t.Logf("%s (window %d): perplexity %.4f on the GPU, %.4f on the CPU, bf16 on the GPU %.4f", tc.dtype, tc.window, got, ref, base)
		if r := got/ref - 1; !(r <= 0.02 && r >= -0.02) {
			t.Errorf("%s (window %d): GPU perplexity %.4f against the CPU's %.4f: %+.2f%%, want within 2%%", tc.dtype, tc.window, got, ref, 100*r)
		}
		if r := got/base - 1; !(r <= tc.tol && r >= -tc.tol) {
			t.Errorf("%s (window %d): GPU perplexity %.4f against its bf16 cache's %.4f: %+.2f%%, want within %.1f%%", tc.dtype, tc.window, got, base, 100*r, 100*tc.tol)
		}
	}
	// Greedy decoding: 8 prompts of 32 tokens, 48 tokens each.
	const prompts, plen, gen = 8, 32, 48
	if len(ids) < 300+prompts*plen {
		t.Fatalf("%d held-out tokens, want %d", len(ids), 300+prompts*plen)
	}
	ps := make([][]int32, prompts)
	for i := range ps {
		ps[i] = ids[300+i*plen : 300+(i+1)*plen]
	}
	greedy := func(t *testing.T, g bool, dtype string, window int) [][]int32 {
		t.Helper()
		opts := eval.GreedyOptions{Tokens: gen, KVCacheDType: dtype, KVWindow: window}
		var out [][]int32
		var err error
		if g {
			out, err = eval.Greedy(kvCUDA, path, ps, opts)
		} else {
			out, err = eval.Greedy(c, path, ps, opts)
		}
		if err != nil {
			t.Fatalf("greedy %s (window %d, gpu %v): %v", dtype, window, g, err)
		}
		return out
	}
	for _, tc := range []struct {
		name         string
		got, against [][]int32
	}{
		{"int4 window 128 on the GPU against bf16 on the GPU", greedy(t, true, "int4", 128), greedy(t, true, "bf16", 0)},
		{"int4 window 16 on the GPU against the CPU", greedy(t, true, "int4", 16), greedy(t, false, "int4", 16)},
	} {
		a, err := eval.Compare(tc.against, tc.got)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("greedy %s: %.1f%% before the first divergence, %.1f%% overall, %d of %d prompts identical", tc.name, 100*a.Prefix, 100*a.Overall, a.Identical, a.Prompts)
		if a.Prefix < 0.5 {
			t.Errorf("greedy %s: %.1f%% of positions before the first divergence, want at least 50%%", tc.name, 100*a.Prefix)
		}
	}
}
