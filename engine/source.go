package engine

import (
	"fmt"

	"github.com/trigon-llm/trigon/model"
	"github.com/trigon-llm/trigon/tokenizer"
)

// openModel returns what Load serves: LoadOptions.Weights and Config when
// Weights is set (no files are read), else the checkpoint at Model; and
// LoadOptions.Tokenizer when set, else Model's tokenizer. The caller owns
// the weights.
func openModel(opts LoadOptions) (model.Config, model.GenerationConfig, model.Weights, *tokenizer.Tokenizer, error) {
	var (
		cfg model.Config
		gen model.GenerationConfig
		w   model.Weights
	)
	if opts.Weights != nil {
		if err := opts.Config.Validate(); err != nil {
			return cfg, gen, nil, nil, fmt.Errorf("load %s: %w", opts.Model, err)
		}
		if opts.Tokenizer == nil {
			return cfg, gen, nil, nil, fmt.Errorf("load %s: weights without files need a tokenizer", opts.Model)
		}
		cfg, w = opts.Config, opts.Weights
	} else {
		var err error
		if cfg, gen, w, err = model.OpenWeights(opts.Model); err != nil {
			return cfg, gen, nil, nil, err
		}
	}
	qdt, err := QuantizationDType(opts.Quantization)
	if err != nil {
		w.Close()
		return cfg, gen, nil, nil, fmt.Errorf("load %s: %w", opts.Model, err)
	}
	if qdt != 0 {
		q, err := model.QuantizeWeights(w, qdt)
		if err != nil {
			w.Close()
			return cfg, gen, nil, nil, fmt.Errorf("load %s: %w", opts.Model, err)
		}
		w = q
	}
	tok := opts.Tokenizer
	if tok == nil {
		var err error
		if tok, err = LoadTokenizer(opts.Model); err != nil {
			w.Close()
			return cfg, gen, nil, nil, err
		}
	}
	return cfg, gen, w, tok, nil
}

// ContextOf is the context Load would serve for a model of config cfg with
// LoadOptions.MaxContext maxContext, or Load's error for it.
func ContextOf(cfg model.Config, maxContext int) (int, error) { return contextLength(cfg, maxContext) }
