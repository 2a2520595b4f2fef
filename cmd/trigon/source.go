package main

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/trigon-llm/trigon/bench"
	"github.com/trigon-llm/trigon/engine"
	"github.com/trigon-llm/trigon/model"
	"github.com/trigon-llm/trigon/models"
	"github.com/trigon-llm/trigon/tokenizer"
)

// --load-format values, vLLM's names for them.
const (
	loadAuto  = "auto"  // the checkpoint's weights
	loadDummy = "dummy" // random weights of the architecture, made on the device
)

// modelSource is what --model, --load-format and --tokenizer resolve to,
// once per command: serve reads the tokenizer before it loads the weights.
type modelSource struct {
	path  string // auto: the checkpoint
	label string // names the model in messages
	dummy bool
	cfg   model.Config         // dummy: the architecture
	tok   *tokenizer.Tokenizer // nil (auto without --tokenizer): the checkpoint's own
}

// source resolves the model flags. A dummy model's architecture is
// --model: a preset name (bench.ArchNames), an HF directory or its
// config.json, a .gguf file (its header), or nothing for the embedded
// model's. Its tokenizer is --tokenizer, else the one beside the
// architecture (the HF directory's, the GGUF's, the embedded model's),
// else a synthetic byte-level tokenizer over the architecture's
// vocabulary (bench.SyntheticTokenizer), with a warning: a preset ships
// no tokenizer, and the embedded model's covers only its own small
// vocabulary. Random weights sample every id, so a tokenizer smaller than
// the vocabulary (a padded one, or another model's) is extended with
// made-up words (bench.PadTokenizer); a larger one is refused at load.
func (f *modelFlags) source(log *slog.Logger) (*modelSource, error) {
	if f.src != nil {
		return f.src, nil
	}
	var tok *tokenizer.Tokenizer
	if f.tokenizer != "" {
		t, err := engine.LoadTokenizer(f.tokenizer)
		if err != nil {
			return nil, fmt.Errorf("--tokenizer: %w", err)
		}
		tok = t
	}
	var src *modelSource
	switch f.loadFormat {
	case loadAuto, "":
		path, err := f.modelPath()
		if err != nil {
			return nil, err
		}
		src = &modelSource{path: path, label: path, tok: tok}
	case loadDummy:
		arch := f.model
		if arch == "" {
			arch = bench.ArchDefault
		}
		cfg, err := bench.Arch(arch)
		if err != nil {
			return nil, fmt.Errorf("--load-format dummy: %w", err)
		}
		src = &modelSource{label: bench.ArchLabel(arch) + " (dummy weights)", dummy: true, cfg: cfg, tok: tok}
		if tok == nil {
			if src.tok, err = archTokenizer(f.model); err != nil {
				return nil, err
			}
		}
		if src.tok != nil && src.tok.VocabSize() < cfg.VocabSize {
			// Random weights sample every id: each must decode.
			have := src.tok.VocabSize()
			if src.tok, err = bench.PadTokenizer(src.tok, cfg.VocabSize); err != nil {
				return nil, fmt.Errorf("--load-format dummy: %w", err)
			}
			log.Info("the tokenizer covers fewer ids than the dummy model's vocabulary; the others decode to made-up words",
				"tokens", have, "vocab", cfg.VocabSize)
		}
		if src.tok == nil {
			if src.tok, err = bench.SyntheticTokenizer(cfg); err != nil {
				return nil, fmt.Errorf("--load-format dummy: %w; pass --tokenizer", err)
			}
			log.Warn("no tokenizer for the dummy model: using a synthetic byte-level one over its vocabulary "+
				"(text is encoded a byte a token, other ids decode to made-up words); pass --tokenizer for a real one",
				"model", arch, "vocab", cfg.VocabSize)
		}
	default:
		return nil, fmt.Errorf("--load-format %q: want auto or dummy", f.loadFormat)
	}
	f.src = src
	return src, nil
}

// archTokenizer is the tokenizer that comes with a dummy model's
// architecture: the embedded model's for none, an HF directory's when it
// has tokenizer.json, a GGUF's; nil for a preset or a bare config.json.
func archTokenizer(arch string) (*tokenizer.Tokenizer, error) {
	path := arch
	switch {
	case arch == "" || strings.EqualFold(arch, bench.ArchDefault):
		p, err := models.DefaultPath()
		if err != nil {
			return nil, err
		}
		path = p
	case strings.HasSuffix(strings.ToLower(arch), ".gguf"):
	default:
		if _, err := os.Stat(filepath.Join(arch, "tokenizer.json")); err != nil {
			return nil, nil
		}
	}
	tok, err := engine.LoadTokenizer(path)
	if err != nil {
		return nil, fmt.Errorf("--load-format dummy: %w", err)
	}
	return tok, nil
}

// describe is what serve needs before the weights load: the tokenizer and
// the context length served.
func (f *modelFlags) describe(log *slog.Logger) (*tokenizer.Tokenizer, int, error) {
	src, err := f.source(log)
	if err != nil {
		return nil, 0, err
	}
	if src.dummy {
		ctxLen, err := engine.ContextOf(src.cfg, f.maxContext)
		if err != nil {
			return nil, 0, err
		}
		return src.tok, ctxLen, nil
	}
	tok := src.tok
	if tok == nil {
		if tok, err = engine.LoadTokenizer(src.path); err != nil {
			return nil, 0, err
		}
	}
	ctxLen, err := engine.ContextLength(src.path, f.maxContext)
	if err != nil {
		return nil, 0, err
	}
	return tok, ctxLen, nil
}
