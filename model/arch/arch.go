// Package arch is the model registry: the one place that maps a Config's
// architecture to the package that runs it. The engine, eval and bench
// construct every model through New and hold it as a model.Model, so a new
// family is a new entry in families and nothing else changes for them.
//
//	cfg, _, w, err := model.OpenWeights(path)
//	m, err := arch.New(b, cfg, w, model.Options{MaxTokens: 2048, MaxLogits: 64})
//	defer m.Close()
package arch

import (
	"fmt"
	"slices"
	"strings"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/model"
	"github.com/trigon-llm/trigon/model/llama"
)

// family is one package's constructor and the architectures it runs.
type family struct {
	archs []string
	build func(b backend.Backend, cfg model.Config, w model.Weights, opts model.Options) (model.Model, error)
}

// families lists every family trigon runs. It is a function, not a
// variable, so the registry cannot be changed at run time.
func families() []family {
	return []family{
		{archs: []string{model.ArchLlama, model.ArchMistral, model.ArchQwen2, model.ArchQwen3}, build: newLlama},
	}
}

func newLlama(b backend.Backend, cfg model.Config, w model.Weights, opts model.Options) (model.Model, error) {
	m, err := llama.New(b, cfg, w, opts)
	if err != nil {
		return nil, err // not a nil *llama.Model in a non-nil interface
	}
	return m, nil
}

// New loads w onto b with the constructor of cfg.Arch's family. Backends
// may alias w's memory, so w must stay open while the model lives.
func New(b backend.Backend, cfg model.Config, w model.Weights, opts model.Options) (model.Model, error) {
	for _, f := range families() {
		if slices.Contains(f.archs, cfg.Arch) {
			return f.build(b, cfg, w, opts)
		}
	}
	return nil, fmt.Errorf("architecture %q is not supported (supported: %s)", cfg.Arch, strings.Join(Supported(), ", "))
}

// Supported lists the architectures New constructs, for messages.
func Supported() []string {
	var out []string
	for _, f := range families() {
		out = append(out, f.archs...)
	}
	return out
}
