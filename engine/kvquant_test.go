package engine_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/trigon-llm/trigon/backend/cpu"
	"github.com/trigon-llm/trigon/engine"
)

// TestQuantizedKVServing runs the default model through the engine with
// each quantized KV cache and checks that the engine's block moves keep
// the greedy outputs: preemption and recompute, prefix-cache hits, and
// forks (n > 1).
//
// Each engine first serves a warm-up request alone. An fp8 cache's
// dynamic scales are set by the first step that writes the cache and
// never change after (docs/kv-cache.md), so two engines whose first
// steps hold different tokens quantize every later token with different
// scales, and their outputs need not agree: the warm-up makes every
// engine's first step the same, and from then on fp8, like int8, maps
// each token's K and V to bytes that depend on those values alone. A
// recomputed or prefix-hit token is then stored or read exactly as the
// first time, and the outputs must be equal. The int8 and int4 caches
// have no state beyond their blocks, so the warm-up changes nothing for
// them.
//
// int4 reads position p of a sequence of length L (the step's, for every
// query row of a prefill chunk) from its bf16 window copy when p >= L -
// window, else from int4: which positions a row reads in int4 depends on
// where the step ends, so K and V recomputed in a prefill chunk after a
// preemption differ from those the decode steps wrote wherever the window
// is shorter than the sequence, and equal outputs cannot be required
// there. The preemption case therefore keeps int4's default window (128),
// which covers its sequences (the blocks are still sealed into int4 and
// copied, only never read in int4); the prefix and fork cases use a
// 16-token window, so that most of each sequence is read in int4, and
// make the steps that compute a shared prefix end where the reference's
// do (below).
func TestQuantizedKVServing(t *testing.T) {
	for _, c := range []struct {
		dtype  string
		window int // the prefix and fork cases' KVWindow (int4)
	}{
		{"fp8", 0},
		{"int8", 0},
		{"int4", 16},
	} {
		t.Run(c.dtype, func(t *testing.T) {
			load := func(opts engine.LoadOptions) *engine.Loaded {
				t.Helper()
				opts.Model, opts.Backend, opts.KVCacheDType = defaultHF, cpu.New(cpu.Options{Threads: 2}), c.dtype
				l, err := engine.Load(opts)
				if err != nil {
					t.Fatal(err)
				}
				if got := engine.RunnerOf(l).KVSpec().Name(); got != c.dtype {
					t.Fatalf("KV cache %q, want %q", got, c.dtype)
				}
				l = runLoaded(t, l)
				warm := randomPrompt(rand.New(rand.NewPCG(99, 1)), 24)
				submit(t, l, context.Background(), warm, 1, greedy(2))
				return l
			}
			t.Run("preemption", func(t *testing.T) {
				// The same step budget and chunk size on both engines, only
				// the pool differs: 14 blocks for 8 sequences of up to 6.
				sized := engine.LoadOptions{MaxSeqs: 8, ChunkSize: 32, MaxBatchedTokens: 64}
				ref := load(sized)
				sized.KVBlocks = 14
				tiny := load(sized)
				rng := rand.New(rand.NewPCG(3, 4))
				prompts := make([][]int32, 8)
				want := make([][]int32, len(prompts))
				for i := range prompts {
					prompts[i] = randomPrompt(rng, 20+rng.IntN(40))
					want[i] = submit(t, ref, context.Background(), prompts[i], 1, greedy(32))[0].tokens
				}
				before := tiny.Engine.Stats().Preemptions
				var wg sync.WaitGroup
				for i := range prompts {
					wg.Add(1)
					go func() {
						defer wg.Done()
						got := submit(t, tiny, context.Background(), prompts[i], 1, greedy(32))[0]
						if !slices.Equal(got.tokens, want[i]) {
							t.Errorf("request %d under preemption: %v (%s %v), alone on a large pool %v",
								i, got.tokens, got.final.FinishReason, got.final.Err, want[i])
						}
					}()
				}
				wg.Wait()
				if tiny.Engine.Stats().Preemptions == before {
					t.Error("no preemption happened: the pool is not small enough to test it")
				}
			})
			// A prompt of a shared 80-token prefix (5 full blocks) and a
			// 16-token suffix, prefilled in one step: with equal suffix
			// lengths the step that computes the prefix ends at the same
			// length with the other suffix as in the reference, so an int4
			// row reads the same positions in int4 either way.
			opts := engine.LoadOptions{MaxSeqs: 4, MaxBatchedTokens: 256, KVWindow: c.window}
			rng := rand.New(rand.NewPCG(5, 6))
			prefix := randomPrompt(rng, 80)
			first := append(slices.Clone(prefix), randomPrompt(rng, 16)...)
			second := append(slices.Clone(prefix), randomPrompt(rng, 16)...)
			fresh := load(opts)
			t.Run("prefix", func(t *testing.T) {
				hits := func(l *engine.Loaded, prompt []int32) ([]int32, uint64) {
					before := l.Engine.Stats().PrefixHits
					got := submit(t, l, context.Background(), prompt, 1, greedy(24))[0].tokens
					waitIdle(t, l)
					return got, l.Engine.Stats().PrefixHits - before
				}
				want, n := hits(fresh, second)
				if n != 0 {
					t.Fatalf("a fresh engine served %d prompt tokens from its prefix cache, want 0", n)
				}
				cached := load(opts)
				if _, n := hits(cached, first); n != 0 {
					t.Fatalf("the first prompt: %d tokens from the prefix cache, want 0", n)
				}
				got, n := hits(cached, second)
				if n != uint64(len(prefix)) {
					t.Errorf("the second prompt: %d tokens from the prefix cache, want the %d of the shared prefix", n, len(prefix))
				}
				if !slices.Equal(got, want) {
					t.Errorf("after a prefix hit: %v; on a fresh engine: %v", got, want)
				}
			})
			t.Run("fork", func(t *testing.T) {
				// 41 tokens: the last block is partial, so the choices'
				// first decode steps write copies of it.
				prompt := randomPrompt(rand.New(rand.NewPCG(7, 8)), 41)
				one := submit(t, fresh, context.Background(), prompt, 1, greedy(24))[0].tokens
				two := submit(t, fresh, context.Background(), prompt, 2, greedy(24))
				for i, r := range two {
					if !slices.Equal(r.tokens, one) {
						t.Errorf("choice %d of n=2: %v; n=1: %v", i, r.tokens, one)
					}
				}
				if len(one) != 24 {
					t.Errorf("n=1: %d tokens, want 24", len(one))
				}
			})
		})
	}
}
