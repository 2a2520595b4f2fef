package arch_test

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/backend/cpu"
	"github.com/trigon-llm/trigon/model"
	"github.com/trigon-llm/trigon/model/arch"
	"github.com/trigon-llm/trigon/model/internal/modeltest"
)

// TestNewBuildsEveryFixture builds each fixture model through the registry
// and checks that every supported architecture has one.
func TestNewBuildsEveryFixture(t *testing.T) {
	names, err := modeltest.Fixtures()
	if err != nil {
		t.Fatal(err)
	}
	b := cpu.New(cpu.Options{Threads: 1})
	built := map[string]bool{}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			cfg, _, w, err := model.OpenWeights(filepath.Join(modeltest.ModelsDir(), name))
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			m, err := arch.New(b, cfg, w, model.Options{MaxTokens: 8})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if got := m.Config(); got.Arch != cfg.Arch || got.NumLayers != cfg.NumLayers {
				t.Errorf("model config %s with %d layers, loaded %s with %d", got.Arch, got.NumLayers, cfg.Arch, cfg.NumLayers)
			}
			built[cfg.Arch] = true
		})
	}
	for _, a := range arch.Supported() {
		if !built[a] {
			t.Errorf("no fixture of supported architecture %s", a)
		}
	}
}

func TestNewErrors(t *testing.T) {
	names, err := modeltest.Fixtures()
	if err != nil {
		t.Fatal(err)
	}
	cfg, _, w, err := model.OpenWeights(filepath.Join(modeltest.ModelsDir(), names[0]))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	b := cpu.New(cpu.Options{Threads: 1})

	unknown := cfg
	unknown.Arch = "gpt2"
	m, err := arch.New(b, unknown, w, model.Options{MaxTokens: 8})
	if err == nil || !strings.Contains(err.Error(), `"gpt2" is not supported`) {
		t.Errorf("unknown architecture: error %v", err)
	}
	for _, a := range arch.Supported() {
		if err != nil && !strings.Contains(err.Error(), a) {
			t.Errorf("error %q does not list %s", err, a)
		}
	}
	if m != nil {
		t.Errorf("unknown architecture: model %v, want nil", m)
	}

	// A constructor's error leaves a nil interface, not a nil pointer in one.
	m, err = arch.New(b, cfg, w, model.Options{})
	if err == nil || m != nil {
		t.Errorf("MaxTokens 0: model %v, error %v; want nil and an error", m, err)
	}
	if !slices.Contains(arch.Supported(), cfg.Arch) {
		t.Errorf("Supported %v lacks the fixture's %s", arch.Supported(), cfg.Arch)
	}
}
