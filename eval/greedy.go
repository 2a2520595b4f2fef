package eval

import (
	"fmt"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/model"
	"github.com/trigon-llm/trigon/model/arch"
	"github.com/trigon-llm/trigon/runner"
)

// GreedyOptions of a greedy decode.
type GreedyOptions struct {
	// Tokens is how many tokens each prompt is continued by (default 256);
	// end-of-sequence tokens do not stop it, so every continuation has
	// exactly Tokens tokens and position i of two runs compares the same
	// step.
	Tokens int
	// KVCacheDType, KVWindow, KVGroup and Quantization: Options.
	KVCacheDType string
	KVWindow     int
	KVGroup      int
	Quantization backend.DType
}

// Greedy continues every prompt by argmax decoding with the model at path
// on b, all prompts in one batch: one prefill step of every prompt, then
// decode steps of one token per prompt. The cache holds every sequence
// whole, so nothing is preempted; an FP8 cache without checkpoint scales
// takes them from the prefill of all the prompts together, as a server's
// first batch would. It returns the continuations, in prompt order.
func Greedy(b backend.Backend, path string, prompts [][]int32, opts GreedyOptions) ([][]int32, error) {
	if opts.Tokens < 0 {
		return nil, fmt.Errorf("greedy: %d tokens per prompt: want at least 1 (0: the default)", opts.Tokens)
	}
	if opts.Tokens == 0 {
		opts.Tokens = 256
	}
	if len(prompts) == 0 {
		return nil, fmt.Errorf("greedy: no prompts")
	}
	cfg, w, err := openWeights(path, opts.Quantization)
	if err != nil {
		return nil, err
	}
	defer w.Close()
	longest, total := 0, 0
	for i, p := range prompts {
		if len(p) == 0 {
			return nil, fmt.Errorf("greedy: prompt %d is empty", i)
		}
		longest, total = max(longest, len(p)), total+len(p)
	}
	seqLen := longest + opts.Tokens
	if seqLen > cfg.MaxPositions {
		return nil, fmt.Errorf("greedy: %d prompt tokens and %d generated exceed the model's context of %d", longest, opts.Tokens, cfg.MaxPositions)
	}
	n := len(prompts)
	m, err := arch.New(b, cfg, w, model.Options{MaxTokens: total, MaxLogits: n})
	if err != nil {
		return nil, err
	}
	defer m.Close()
	const blockSize = 16
	perSeq := (seqLen + blockSize - 1) / blockSize
	spec, scales, err := kvFormat(b, opts.KVCacheDType, opts.KVWindow, opts.KVGroup, blockSize, cfg.NumLayers, w)
	if err != nil {
		return nil, fmt.Errorf("greedy: %w", err)
	}
	r, err := runner.New(b, m, runner.Options{
		NumBlocks: n*perSeq + 1, BlockSize: blockSize, MaxTokens: total, MaxSeqs: n,
		MaxSeqLen: seqLen, NumLayers: cfg.NumLayers, NumKVHeads: cfg.NumKVHeads, HeadDim: cfg.HeadDim,
		KV: spec, KVScales: scales,
	})
	if err != nil {
		return nil, err
	}
	defer r.Close()
	seqs := make([]runner.Seq, n)
	for i, p := range prompts {
		table := make([]int32, perSeq)
		for j := range table {
			table[j] = int32(1 + i*perSeq + j)
		}
		seqs[i] = runner.Seq{Tokens: p, BlockTable: table, WantLogits: true}
	}
	out := make([][]int32, n)
	rows := make([]backend.SampleRow, n) // Temperature 0: argmax
	for step := range opts.Tokens {
		res, err := r.Execute(&runner.Step{Seqs: seqs})
		if err != nil {
			return nil, fmt.Errorf("greedy: step %d: %w", step, err)
		}
		ids, err := res.Sample(rows)
		if err != nil {
			return nil, fmt.Errorf("greedy: step %d: %w", step, err)
		}
		for i, id := range ids {
			out[i] = append(out[i], id)
			seqs[i].Start += len(seqs[i].Tokens)
			seqs[i].Tokens = []int32{id}
		}
	}
	return out, nil
}

// Agreement compares continuations got with base, prompt by prompt (equal
// counts and lengths): Prefix is the mean share of positions before the
// first divergence, Overall the mean share of positions whose tokens are
// equal, Identical the prompts with no divergence. A divergence early in
// a continuation changes what follows it, so Overall mostly counts
// re-converged text and Prefix is the stricter figure.
type Agreement struct {
	Prefix, Overall float64
	Identical       int
	Prompts         int
}

// Compare is the Agreement of got with base.
func Compare(base, got [][]int32) (Agreement, error) {
	if len(base) != len(got) || len(base) == 0 {
		return Agreement{}, fmt.Errorf("compare: %d continuations against %d", len(got), len(base))
	}
	a := Agreement{Prompts: len(base)}
	for i := range base {
		if len(base[i]) != len(got[i]) || len(base[i]) == 0 {
			return Agreement{}, fmt.Errorf("compare: prompt %d: %d tokens against %d", i, len(got[i]), len(base[i]))
		}
		first, same := len(base[i]), 0
		for j := range base[i] {
			if base[i][j] == got[i][j] {
				same++
			} else if first == len(base[i]) {
				first = j
			}
		}
		if first == len(base[i]) {
			a.Identical++
		}
		a.Prefix += float64(first) / float64(len(base[i]))
		a.Overall += float64(same) / float64(len(base[i]))
	}
	a.Prefix /= float64(len(base))
	a.Overall /= float64(len(base))
	return a, nil
}

// Slices are count prompts of length tokens each, cut from tokens at
// evenly spaced offsets: prompt i starts at i*(len(tokens)-length)/count.
func Slices(tokens []int32, count, length int) ([][]int32, error) {
	switch {
	case count <= 0 || length <= 0:
		return nil, fmt.Errorf("slices: %d prompts of %d tokens: want at least one prompt of at least one token", count, length)
	case len(tokens) < length:
		return nil, fmt.Errorf("slices: the text's %d tokens are fewer than one prompt of %d", len(tokens), length)
	}
	out := make([][]int32, count)
	for i := range out {
		off := i * (len(tokens) - length) / count
		out[i] = tokens[off : off+length]
	}
	return out, nil
}
