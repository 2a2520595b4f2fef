package specdec_test

import (
	"maps"
	"slices"
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/cpu"
	"github.com/trigon-llm/trigon/kvcache"
	"github.com/trigon-llm/trigon/model"
	"github.com/trigon-llm/trigon/model/arch"
	"github.com/trigon-llm/trigon/runner"
	"github.com/trigon-llm/trigon/specdec"
)

const fixture = "../testdata/models/llama3"

// replayer stands in for a backend's graphs on the CPU: a graph replays
// by running its captured function again.
type replayer struct {
	backend.Backend
	captures int
	vocab    int
	lmRows   map[int]bool // row counts of the LM head's products (out width vocab)
}

func (r *replayer) MatMul(out, x, w, bias backend.Tensor) error {
	if out.Shape()[1] == r.vocab {
		r.lmRows[x.Shape()[0]] = true
	}
	return r.Backend.MatMul(out, x, w, bias)
}

type replay struct{ fn func() error }

func (g replay) Launch() error { return g.fn() }
func (g replay) Close()        {}

func (r *replayer) CaptureGraph(fn func() error) (backend.Graph, error) {
	r.captures++
	return replay{fn}, nil
}

// newRunner builds the fixture model's runner on b with numBlocks blocks,
// with decode and verify graphs (of up to 3 draft tokens) where graphs.
func newRunner(t *testing.T, b backend.Backend, cfg model.Config, w model.Weights, numBlocks int, graphs bool) *runner.Runner {
	t.Helper()
	m, err := arch.New(b, cfg, w, model.Options{MaxTokens: 64, MaxLogits: 16})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	r, err := runner.New(b, m, runner.Options{NumBlocks: numBlocks, BlockSize: kvcache.DefaultBlockSize, MaxTokens: 64, MaxSeqs: 4,
		MaxSeqLen: 256, NumLayers: cfg.NumLayers, NumKVHeads: cfg.NumKVHeads, HeadDim: cfg.HeadDim,
		Graphs: runner.GraphOptions{Enabled: graphs, VerifyTokens: 3}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

// TestDraftProposer: a draft model proposes its greedy continuation of
// each sequence, follows the sequence through accepted and rejected
// guesses (its cache keeps only what still matches), proposes nothing
// for a sequence its pool has no room for, and gives every block back on
// Forget; with graphs, where catch-ups of 2 to 4 tokens run as one
// verify-shaped step, as without.
func TestDraftProposer(t *testing.T) {
	for _, graphs := range []bool{false, true} {
		t.Run(map[bool]string{false: "eager", true: "graphs"}[graphs], func(t *testing.T) { testDraftProposer(t, graphs) })
	}
}

func testDraftProposer(t *testing.T, graphs bool) {
	cfg, _, w, err := model.OpenWeights(fixture)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	b := cpu.New(cpu.Options{Threads: 2})
	// greedy is the reference: n greedy tokens after tokens, computed from
	// scratch on a runner of its own.
	ref := newRunner(t, b, cfg, w, 20, false)
	greedy := func(tokens []int32, n int) []int32 {
		table := make([]int32, 16)
		for i := range table {
			table[i] = int32(i + 1)
		}
		var out []int32
		start := 0
		for len(tokens)-start > 64 { // the prompt in chunks the runner takes
			if _, err := ref.Execute(&runner.Step{Seqs: []runner.Seq{{Tokens: tokens[start : start+64], Start: start, BlockTable: table}}}); err != nil {
				t.Fatal(err)
			}
			start += 64
		}
		feed := tokens[start:]
		for range n {
			res, err := ref.Execute(&runner.Step{Seqs: []runner.Seq{{Tokens: feed, Start: start, BlockTable: table, WantLogits: true}}})
			if err != nil {
				t.Fatal(err)
			}
			ids, err := res.Sample([]backend.SampleRow{{TopP: 1}})
			if err != nil {
				t.Fatal(err)
			}
			start += len(feed)
			feed = ids
			out = append(out, ids[0])
		}
		return out
	}
	const blocks = 9 // 8 usable blocks of 16 tokens
	// Wrapped either way, so that both record the LM head's rows; only
	// the graphs case is given graphs.
	db := &replayer{Backend: b, vocab: cfg.VocabSize, lmRows: map[int]bool{}}
	r := newRunner(t, db, cfg, w, blocks, graphs)
	pool, err := kvcache.NewPool(kvcache.Options{NumBlocks: blocks, BlockSize: kvcache.DefaultBlockSize})
	if err != nil {
		t.Fatal(err)
	}
	d, err := specdec.NewDraft(r, pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	prompt := []int32{5, 9, 2, 44, 17, 3, 8, 8, 21, 60, 7, 1, 99, 12, 4, 30, 31, 2, 6}
	propose := func(tokens []int32, k int) []int32 {
		t.Helper()
		out, err := d.Propose([]specdec.Seq{{ID: 1, Tokens: tokens, K: k}})
		if err != nil || len(out) != 1 {
			t.Fatalf("Propose: %v, %v", out, err)
		}
		return out[0]
	}
	cont := greedy(prompt, 12)
	for _, tc := range []struct {
		name   string
		tokens []int32
		k      int
	}{
		{"first", prompt, 4},
		{"two accepted, one replaced", append(slices.Clone(prompt), cont[0], cont[1], (cont[2]+1)%int32(cfg.VocabSize)), 4},
		{"back on the greedy path", append(slices.Clone(prompt), cont[:5]...), 4},
		{"all accepted and a bonus", append(slices.Clone(prompt), cont[:9]...), 3},
		{"shorter again", append(slices.Clone(prompt), cont[:2]...), 5},
	} {
		want := greedy(tc.tokens, tc.k)
		if got := propose(tc.tokens, tc.k); !slices.Equal(got, want) {
			t.Errorf("%s: proposed %v, the greedy continuation is %v", tc.name, got, want)
		}
	}
	// A second sequence too long for what the pool has left gets no
	// draft, without an error; the first still gets its own.
	long := make([]int32, 100)
	for i := range long {
		long[i] = int32(3 + i%50)
	}
	out, err := d.Propose([]specdec.Seq{{ID: 2, Tokens: long, K: 4}, {ID: 1, Tokens: prompt, K: 2}})
	if err != nil || len(out) != 2 || out[0] != nil || !slices.Equal(out[1], cont[:2]) {
		t.Errorf("short pool: %v, %v; want no draft for 2 and %v for 1", out, err, cont[:2])
	}
	d.Forget(1)
	d.Forget(2)
	d.Forget(3) // unknown: nothing
	if pool.NumFree() != blocks-1 {
		t.Errorf("%d of %d blocks free after Forget", pool.NumFree(), blocks-1)
	}
	// Alone now, the long sequence fits (its catch-up takes two steps of
	// the runner's 64 tokens).
	if got := propose(long, 2); !slices.Equal(got, greedy(long, 2)) {
		t.Errorf("long sequence alone: %v, want %v", got, greedy(long, 2))
	}
	// A catch-up of several tokens wants all its rows' logits only where
	// it can replay from a graph.
	if all := db.lmRows[2] || db.lmRows[3] || db.lmRows[4]; all != graphs {
		t.Errorf("LM head row counts %v: an all-logits catch-up ran %v, want %v", slices.Sorted(maps.Keys(db.lmRows)), all, graphs)
	}
	if _, err := specdec.NewDraft(r, mustPool(t, blocks+1, false), nil); err == nil {
		t.Error("NewDraft took a pool of another size than the runner's")
	}
	if _, err := specdec.NewDraft(r, mustPool(t, blocks, true), nil); err == nil {
		t.Error("NewDraft took a pool with a prefix cache")
	}
}

func mustPool(t *testing.T, n int, prefix bool) *kvcache.Pool {
	t.Helper()
	p, err := kvcache.NewPool(kvcache.Options{NumBlocks: n, BlockSize: kvcache.DefaultBlockSize, EnablePrefixCache: prefix})
	if err != nil {
		t.Fatal(err)
	}
	return p
}
