package model_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/trigon-llm/trigon/model/internal/modeltest"
)

// TestFixtureFiles checks the invariants tools/refgen promises about its
// output, so a regenerated fixture set that breaks them fails here rather
// than as a puzzling numerical mismatch elsewhere.
func TestFixtureFiles(t *testing.T) {
	names, err := modeltest.Fixtures()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(modeltest.ModelsDir(), name)
			for _, f := range []string{"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} {
				if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
					t.Error(err)
				}
			}
			ref, err := modeltest.LoadReference(name)
			if err != nil {
				t.Fatal(err)
			}
			if ref.Model != name || !ref.GenerateAgrees {
				t.Errorf("reference for %q, generate agrees %v", ref.Model, ref.GenerateAgrees)
			}
			var all, decode, lengths []int
			for i, p := range ref.Prompts {
				lengths = append(lengths, len(p.IDs))
				if len(p.LastLogits) != 512 || len(p.Greedy) != 32 || p.MinMargin < 2e-3 {
					t.Errorf("prompt %d: %d logits, %d greedy tokens, margin %g", i, len(p.LastLogits), len(p.Greedy), p.MinMargin)
				}
				if p.AllLogits != nil {
					all = append(all, i)
					if len(p.AllLogits) != len(p.IDs) || !slices.Equal(p.AllLogits[len(p.IDs)-1], p.LastLogits) {
						t.Errorf("prompt %d: all_logits has %d rows or a last row unlike last_logits", i, len(p.AllLogits))
					}
				}
				if p.DecodeLogits != nil {
					decode = append(decode, i)
					if len(p.DecodeLogits) != len(p.Greedy) || !slices.Equal(p.DecodeLogits[0], p.LastLogits) {
						t.Errorf("prompt %d: decode_logits has %d rows or a first row unlike last_logits", i, len(p.DecodeLogits))
					}
				}
			}
			if len(all) != 1 || len(decode) != 1 {
				t.Errorf("all_logits on prompts %v and decode_logits on %v, want one each", all, decode)
			}
			if !slices.IsSorted(lengths) || lengths[0] != 1 || lengths[len(lengths)-1] < 64 {
				t.Errorf("prompt lengths %v: want 1 up to past the 40-token sliding window plus a block", lengths)
			}
		})
	}
	t.Run("tokenizer reference", func(t *testing.T) {
		data, err := os.ReadFile(filepath.Join(modeltest.ModelsDir(), "..", "tokenizer", "reference.json"))
		if err != nil {
			t.Fatal(err)
		}
		var r struct {
			Cases []struct {
				Text string  `json:"text"`
				IDs  []int32 `json:"ids"`
			} `json:"cases"`
		}
		if err := json.Unmarshal(data, &r); err != nil {
			t.Fatal(err)
		}
		if len(r.Cases) < 10 {
			t.Fatalf("%d tokenizer cases", len(r.Cases))
		}
	})
}
