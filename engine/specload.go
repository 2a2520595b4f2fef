package engine

import (
	"bytes"
	"fmt"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/kvcache"
	"github.com/trigon-llm/trigon/model"
	"github.com/trigon-llm/trigon/model/arch"
	"github.com/trigon-llm/trigon/runner"
	"github.com/trigon-llm/trigon/specdec"
	"github.com/trigon-llm/trigon/tokenizer"
)

// newProposer builds the proposer of a speculative config (nil when off).
// A draft model is loaded on b with its own runner and KV pools, sized for
// the engine's sequences: it must be loaded before the target's KV cache
// is sized from what the device has left.
func newProposer(opts LoadOptions, b backend.Backend, target model.Config, tok *tokenizer.Tokenizer, ctxLen int) (specdec.Proposer, error) {
	c := opts.Speculative
	if err := c.Validate(); err != nil {
		return nil, err
	}
	switch c.Method {
	case "":
		return nil, nil
	case specdec.MethodNGram:
		return specdec.NewNGram(c)
	case specdec.MethodDraftModel:
		return loadDraft(opts, b, target, tok, ctxLen)
	}
	return nil, fmt.Errorf("speculative method %q", c.Method)
}

// loadDraft loads the draft model of opts.Speculative. Its vocabulary must
// be the target's, token for token: a draft's guesses are token ids the
// target judges.
func loadDraft(opts LoadOptions, b backend.Backend, target model.Config, tok *tokenizer.Tokenizer, ctxLen int) (_ specdec.Proposer, err error) {
	path := opts.Speculative.Model
	cfg, _, w, err := model.OpenWeights(path)
	if err != nil {
		return nil, fmt.Errorf("draft model: %w", err)
	}
	var closers []func()
	defer func() {
		if err != nil {
			for i := len(closers) - 1; i >= 0; i-- {
				closers[i]()
			}
		}
	}()
	closers = append(closers, func() { w.Close() })
	if cfg.VocabSize != target.VocabSize {
		return nil, fmt.Errorf("draft model %s: vocabulary of %d tokens, the target's has %d", path, cfg.VocabSize, target.VocabSize)
	}
	dtok, err := LoadTokenizer(path)
	if err != nil {
		return nil, fmt.Errorf("draft model: %w", err) // it names path
	}
	if err := sameVocab(tok, dtok); err != nil {
		return nil, fmt.Errorf("draft model %s: %w", path, err)
	}
	if c, ok := b.(AttentionChecker); ok {
		if err := c.CheckAttention(cfg.NumHeads, cfg.NumKVHeads, cfg.HeadDim); err != nil {
			return nil, fmt.Errorf("draft model %s on %s: %w: %w", path, b.Name(), ErrUnsupportedModel, err)
		}
	}
	// A catch-up of the 1..k+1 tokens the target added since wants all
	// its rows' logits where it replays from a graph (specdec.Draft), as
	// the target's verify steps do.
	k := opts.Speculative.NumSpeculativeTokens
	maxLogits := min(opts.MaxSeqs*(1+k), opts.MaxBatchedTokens)
	m, err := arch.New(b, cfg, w, model.Options{MaxTokens: opts.MaxBatchedTokens, MaxLogits: maxLogits})
	if err != nil {
		return nil, fmt.Errorf("draft model %s: %w", path, err)
	}
	closers = append(closers, m.Close)
	seqLen := min(ctxLen, cfg.MaxPositions)
	blocks := draftBlocks(opts, b.ActDType(), cfg, seqLen, k)
	r, err := runner.New(b, m, runner.Options{
		NumBlocks: blocks, BlockSize: kvcache.DefaultBlockSize,
		MaxTokens: opts.MaxBatchedTokens, MaxSeqs: opts.MaxSeqs, MaxSeqLen: seqLen,
		NumLayers: cfg.NumLayers, NumKVHeads: cfg.NumKVHeads, HeadDim: cfg.HeadDim,
		Graphs: runner.GraphOptions{Enabled: opts.Graphs, MemoryBudget: opts.GraphMemory, VerifyTokens: k},
	})
	if err != nil {
		return nil, fmt.Errorf("draft model %s: %w", path, err)
	}
	closers = append(closers, r.Close)
	pool, err := kvcache.NewPool(kvcache.Options{NumBlocks: blocks, BlockSize: kvcache.DefaultBlockSize})
	if err != nil {
		return nil, fmt.Errorf("draft model %s: %w", path, err)
	}
	return specdec.NewDraft(r, pool, func() { r.Close(); m.Close(); w.Close() })
}

// draftBlocks sizes the draft's KV pools: every running sequence up to
// 2048 tokens of context plus a draft, at most a quarter of KVMemory (the
// draft is the small model; a sequence it has no room for gets no draft),
// at least one sequence of the whole context.
func draftBlocks(opts LoadOptions, act backend.DType, cfg model.Config, seqLen, k int) int {
	bs := kvcache.DefaultBlockSize
	perSeq := (min(seqLen, 2048) + k + bs - 1) / bs
	want := opts.MaxSeqs*perSeq + 1
	perBlock := backend.PlainKV(act, bs).CacheBlockBytes(cfg.NumLayers, cfg.NumKVHeads, cfg.HeadDim)
	limit := int(min(opts.KVMemory/4/max(perBlock, 1), 1<<30))
	return max(min(want, limit), (seqLen+k+bs-1)/bs+1)
}

// sameVocab checks that two tokenizers map every id to the same bytes.
func sameVocab(a, b *tokenizer.Tokenizer) error {
	if a.VocabSize() != b.VocabSize() {
		return fmt.Errorf("its tokenizer has %d tokens, the target's %d", b.VocabSize(), a.VocabSize())
	}
	for id := range int32(a.VocabSize()) {
		x, okx := a.TokenBytes(id)
		y, oky := b.TokenBytes(id)
		if okx != oky || !bytes.Equal(x, y) || a.IsSpecial(id) != b.IsSpecial(id) {
			return fmt.Errorf("its tokenizer differs from the target's at token %d (%q, %q)", id, x, y)
		}
	}
	return nil
}
