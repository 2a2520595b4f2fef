// Package eval measures model quality on text: perplexity, computed by the
// same runner and kernels that serve, so it doubles as an end-to-end check
// of the forward pass against the training-side figure.
package eval

import (
	"fmt"
	"math"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/model"
	"github.com/trigon-llm/trigon/model/arch"
	"github.com/trigon-llm/trigon/runner"
)

// Options of a perplexity run.
type Options struct {
	// Window is the context of each scored window (0: 1024; at least 2): the
	// token stream is cut into consecutive non-overlapping windows, each
	// scored from an empty cache.
	Window int
	// Chunk is the tokens per forward step (0: 256).
	Chunk int
	// KVCacheDType is the KV cache's format (--kv-cache-dtype; "": auto)
	// and KVWindow the int4 window in tokens (0: the default,
	// backend.KVNoWindow: none; see KVSpec.WithWindowOption).
	KVCacheDType string
	KVWindow     int
	// KVGroup is the int8/int4 cache's channels per scale (0: the default).
	KVGroup int
	// Quantization is the weight dtype the checkpoint's projections are
	// quantized to at load (model.QuantizeWeights: backend.F8E4M3Row is
	// --quantization fp8); 0 loads them as stored.
	Quantization backend.DType
}

// Result of a perplexity run.
type Result struct {
	Tokens    int     // tokens in the stream
	Predicted int     // positions scored (tokens minus one per window)
	NLL       float64 // mean negative log-likelihood per predicted token, nats
	PPL       float64 // exp(NLL)
}

// Perplexity scores tokens with the model at path on b: every token after
// the first of each window is predicted from the tokens before it in that
// window.
func Perplexity(b backend.Backend, path string, tokens []int32, opts Options) (Result, error) {
	switch {
	case opts.Window < 0 || opts.Window == 1:
		// A window's first token is never predicted: one of a single
		// token scores nothing.
		return Result{}, fmt.Errorf("perplexity: window %d: want at least 2 tokens (0: the default)", opts.Window)
	case opts.Chunk < 0:
		return Result{}, fmt.Errorf("perplexity: chunk %d: want at least 1 token (0: the default)", opts.Chunk)
	}
	if opts.Window == 0 {
		opts.Window = 1024
	}
	if opts.Chunk == 0 {
		opts.Chunk = 256
	}
	if len(tokens) < 2 {
		return Result{}, fmt.Errorf("perplexity: need at least 2 tokens, have %d", len(tokens))
	}
	cfg, w, err := openWeights(path, opts.Quantization)
	if err != nil {
		return Result{}, err
	}
	defer w.Close()
	if opts.Window > cfg.MaxPositions {
		return Result{}, fmt.Errorf("perplexity: window %d exceeds the model's context of %d", opts.Window, cfg.MaxPositions)
	}
	opts.Chunk = min(opts.Chunk, opts.Window)
	m, err := arch.New(b, cfg, w, model.Options{MaxTokens: opts.Chunk, MaxLogits: opts.Chunk})
	if err != nil {
		return Result{}, err
	}
	defer m.Close()
	const blockSize = 16
	nBlocks := (opts.Window + blockSize - 1) / blockSize
	spec, scales, err := kvFormat(b, opts.KVCacheDType, opts.KVWindow, opts.KVGroup, blockSize, cfg.NumLayers, w)
	if err != nil {
		return Result{}, fmt.Errorf("perplexity: %w", err)
	}
	r, err := runner.New(b, m, runner.Options{
		NumBlocks: nBlocks + 1, BlockSize: blockSize, MaxTokens: opts.Chunk, MaxSeqs: 1,
		MaxSeqLen: opts.Window, NumLayers: cfg.NumLayers, NumKVHeads: cfg.NumKVHeads, HeadDim: cfg.HeadDim,
		KV: spec, KVScales: scales,
	})
	if err != nil {
		return Result{}, err
	}
	defer r.Close()
	table := make([]int32, nBlocks)
	for i := range table {
		table[i] = int32(i + 1)
	}
	res := Result{Tokens: len(tokens)}
	var sum float64
	for ws := 0; ws < len(tokens); ws += opts.Window {
		win := tokens[ws:min(ws+opts.Window, len(tokens))]
		for cs := 0; cs < len(win); cs += opts.Chunk {
			chunk := win[cs:min(cs+opts.Chunk, len(win))]
			out, err := r.Execute(&runner.Step{Seqs: []runner.Seq{{Tokens: chunk, Start: cs, BlockTable: table, AllLogits: true}}})
			if err != nil {
				return res, fmt.Errorf("perplexity: window at token %d: %w", ws, err)
			}
			for i := range chunk {
				next := cs + i + 1
				if next >= len(win) {
					break
				}
				logits, err := out.Logits(i)
				if err != nil {
					return res, err
				}
				sum -= logSoftmaxAt(logits, win[next])
				res.Predicted++
			}
		}
	}
	if res.Predicted == 0 {
		return res, fmt.Errorf("perplexity: no token predicted in %d tokens of windows of %d", len(tokens), opts.Window)
	}
	res.NLL = sum / float64(res.Predicted)
	res.PPL = math.Exp(res.NLL)
	return res, nil
}

// openWeights opens the checkpoint at path, its projections quantized to
// quant at load unless quant is 0.
func openWeights(path string, quant backend.DType) (model.Config, model.Weights, error) {
	cfg, _, w, err := model.OpenWeights(path)
	if err != nil || quant == 0 {
		return cfg, w, err
	}
	q, err := model.QuantizeWeights(w, quant)
	if err != nil {
		w.Close()
		return cfg, nil, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, q, nil
}

// kvFormat is the cache format of the options --kv-cache-dtype,
// --kv-cache-window and --kv-cache-group set, and an FP8 cache's
// checkpoint scales (nil: dynamic).
func kvFormat(b backend.Backend, dtype string, window, group, blockSize, numLayers int, w model.Weights) (backend.KVSpec, []model.KVScales, error) {
	spec, err := backend.ParseKVCacheDType(dtype, b.ActDType(), blockSize)
	if err != nil {
		return spec, nil, err
	}
	if spec, err = spec.WithWindowOption(window); err != nil {
		return spec, nil, err
	}
	switch {
	case group < 0:
		return spec, nil, fmt.Errorf("kv cache group %d: want channels per scale, or 0 for the default", group)
	case group > 0 && spec.GroupSize == 0:
		// Only the int8 and int4 formats scale groups of channels.
		return spec, nil, fmt.Errorf("kv cache group %d: the %s cache has no channel groups (int8 and int4 have)", group, spec.Name())
	case group > 0:
		spec.GroupSize = group
	}
	if spec.Scales != backend.KVScalePerHead {
		return spec, nil, nil
	}
	scales, err := model.ReadKVScales(w, numLayers)
	return spec, scales, err
}

// logSoftmaxAt is log(softmax(logits)[id]) in float64.
func logSoftmaxAt(logits []float32, id int32) float64 {
	mx := math.Inf(-1)
	for _, v := range logits {
		mx = math.Max(mx, float64(v))
	}
	var s float64
	for _, v := range logits {
		s += math.Exp(float64(v) - mx)
	}
	return float64(logits[id]) - mx - math.Log(s)
}
