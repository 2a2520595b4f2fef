package bench

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/cpu"
)

// TestRunOverlapTokens runs the three strategies on the CPU and checks
// every strategy's greedy tokens (the decode rows' and the prompt's first)
// against a from-scratch greedy run of each sequence, and the step counts
// each strategy must make.
func TestRunOverlapTokens(t *testing.T) {
	for _, tc := range []struct {
		name                          string
		batch, context, prompt, chunk int
		graphs                        bool
	}{
		{"one row, one chunk", 1, 9, 12, 16, false},
		{"chunked", 3, 17, 40, 16, false},
		{"chunked graphs", 2, 20, 33, 8, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tinyConfig(false, false)
			w := mustSynthetic(t, cfg, backend.BF16, 5)
			var main backend.Backend = cpu.New(cpu.Options{Threads: 1})
			rb := &replayBackend{Backend: cpu.New(cpu.Options{Threads: 1})}
			if tc.graphs {
				main = rb
			}
			res, err := RunOverlap(context.Background(), OverlapOptions{
				Backend: main, Second: cpu.New(cpu.Options{Threads: 1}), Config: cfg, Weights: w, Arch: "tiny",
				Batch: tc.batch, Context: tc.context, PromptLen: tc.prompt, Chunk: tc.chunk,
				Warmup: 1, Iters: 2, Seed: 9, CUDAGraphs: tc.graphs,
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Rows) != 3 {
				t.Fatalf("%d rows, want mixed, serial and overlap", len(res.Rows))
			}
			chunks := (tc.prompt + tc.chunk - 1) / tc.chunk
			wantFirst := referenceGreedy(t, cfg, w, res.Prompt, 1)[0]
			longest := 0
			for _, row := range res.Rows {
				longest = max(longest, len(row.Tokens[0]))
			}
			var wantDecode [][]int32
			for s := range tc.batch {
				// The first greedy token is the decode's start; the rows'
				// tokens are the ones after it.
				wantDecode = append(wantDecode, referenceGreedy(t, cfg, w, res.Contexts[s], longest+1)[1:])
			}
			for i, row := range res.Rows {
				if want := []string{"mixed", "serial", "overlap"}[i]; row.Strategy != want {
					t.Fatalf("row %d is %q, want %q", i, row.Strategy, want)
				}
				if row.First != wantFirst {
					t.Errorf("%s: prompt's first token %d, reference %d", row.Strategy, row.First, wantFirst)
				}
				for s := range tc.batch {
					got := row.Tokens[s]
					if !slices.Equal(got, wantDecode[s][:len(got)]) {
						t.Errorf("%s: row %d tokens %v, reference %v", row.Strategy, s, got, wantDecode[s][:len(got)])
					}
				}
				if !row.TokensAgree {
					t.Errorf("%s: tokens_agree false", row.Strategy)
				}
				if row.PrefillMS.Count != 2 || !(row.PrefillMS.Min > 0) {
					t.Errorf("%s: prefill summary %+v, want 2 positive times", row.Strategy, row.PrefillMS)
				}
				if len(row.Tokens[0]) == 0 {
					t.Errorf("%s: no decode step", row.Strategy)
				}
				if row.Strategy != "overlap" && (row.DecodeSteps != float64(chunks) || len(row.Tokens[0]) != chunks) {
					t.Errorf("%s: %v decode steps (%d tokens), want one per chunk: %d", row.Strategy, row.DecodeSteps, len(row.Tokens[0]), chunks)
				}
			}
			if tc.graphs && len(rb.graphs) != 1 {
				t.Errorf("%d graphs captured, want 1 (the decode bucket)", len(rb.graphs))
			}
			var buf bytes.Buffer
			if err := res.WriteText(&buf); err != nil {
				t.Fatal(err)
			}
			for _, s := range []string{"mixed", "serial", "overlap", "prompt TTFT"} {
				if !strings.Contains(buf.String(), s) {
					t.Errorf("text report lacks %q:\n%s", s, buf.String())
				}
			}
		})
	}
}

func TestOverlapOptionErrors(t *testing.T) {
	cfg := tinyConfig(false, false)
	w := mustSynthetic(t, cfg, backend.BF16, 5)
	b := cpu.New(cpu.Options{Threads: 1})
	good := OverlapOptions{Backend: b, Config: cfg, Weights: w, Batch: 1, Context: 8, PromptLen: 8, Chunk: 4, Iters: 1}
	for _, tc := range []struct {
		name string
		mod  func(*OverlapOptions)
		want string
	}{
		{"no backend", func(o *OverlapOptions) { o.Backend = nil }, "backend and weights"},
		{"batch 0", func(o *OverlapOptions) { o.Batch = 0 }, "batch"},
		{"context 0", func(o *OverlapOptions) { o.Context = 0 }, "context"},
		{"context too long", func(o *OverlapOptions) { o.Context = cfg.MaxPositions }, "positions"},
		{"prompt too long", func(o *OverlapOptions) { o.PromptLen = cfg.MaxPositions + 1 }, "positions"},
		{"no iters", func(o *OverlapOptions) { o.Iters = 0 }, "iters"},
		{"graphs without capture", func(o *OverlapOptions) { o.CUDAGraphs = true }, "cannot capture"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := good
			tc.mod(&o)
			_, err := RunOverlap(context.Background(), o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
	// Without a second backend the overlap row is left out, with a note.
	res, err := RunOverlap(context.Background(), good)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != 2 || len(res.Notes) == 0 {
		t.Errorf("rows %d, notes %v: want mixed and serial and a note", len(res.Rows), res.Notes)
	}
}
