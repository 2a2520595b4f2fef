package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/cpu"
	"github.com/trigon-llm/trigon/engine"
)

// picky stands in for a GPU backend whose kernels take no head dim of
// the fixture's (as the CUDA backend refuses a head dim of 24).
type picky struct {
	backend.Backend
	closed *bool
}

func (picky) Name() string { return "fakegpu:0" }
func (picky) CheckAttention(numHeads, numKVHeads, headDim int) error {
	return fmt.Errorf("fakegpu: head dim %d is not supported", headDim)
}
func (p picky) Close() error { *p.closed = true; return nil }

// TestLoadFallsBackToCPU: with --device auto a model the chosen backend
// refuses loads on the CPU after one warning naming the reason; with
// --device cuda the refusal is the error, with the way out.
func TestLoadFallsBackToCPU(t *testing.T) {
	for _, device := range []string{"auto", "cuda"} {
		t.Run(device, func(t *testing.T) {
			var logs bytes.Buffer
			log := slog.New(slog.NewTextHandler(&logs, nil))
			closed := false
			f := &modelFlags{deviceFlags: deviceFlags{device: device, threads: 1}, graphs: "auto"}
			l, b, err := f.loadOn(picky{Backend: cpu.New(cpu.Options{Threads: 1}), closed: &closed}, log,
				engine.LoadOptions{Model: fixtureModel, MaxBatchedTokens: 64})
			if device == "cuda" {
				if !errors.Is(err, engine.ErrUnsupportedModel) || !strings.Contains(err.Error(), "head dim 16 is not supported") ||
					!strings.Contains(err.Error(), "--device cpu") {
					t.Fatalf("loadOn: %v, want the refusal and --device cpu", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			if b.Name() != "cpu" {
				t.Errorf("loaded on %s, want the CPU", b.Name())
			}
			if !closed {
				t.Error("the refusing backend was not closed")
			}
			if n := strings.Count(logs.String(), "level=WARN"); n != 1 || !strings.Contains(logs.String(), "fakegpu:0 backend cannot run this model; using the CPU backend") ||
				!strings.Contains(logs.String(), "head dim 16 is not supported") {
				t.Errorf("want one warning with the reason; log:\n%s", logs.String())
			}
		})
	}
}

// TestLoadMixedStepRatio: serve's --max-mixed-step-ratio reaches the
// engine: the load caps the prefill beside decodes and says so; without
// it there is no cap.
func TestLoadMixedStepRatio(t *testing.T) {
	for _, ratio := range []float64{0, 2} {
		var logs bytes.Buffer
		log := slog.New(slog.NewTextHandler(&logs, nil))
		mf := parseModelFlags(t, "--model", fixtureModel, "--device", "cpu", "--max-seqs", "4")
		mf.mixedRatio = ratio // as serve sets it from its flag
		l, stop, err := mf.load(context.Background(), log, nil)
		if err != nil {
			t.Fatal(err)
		}
		stop()
		capped := strings.Contains(logs.String(), "mixed-step prefill capped")
		if (l.MixedCap != nil) != (ratio > 0) || capped != (ratio > 0) {
			t.Errorf("ratio %v: caps %v, logged %v; want caps and the log line exactly when the ratio is set", ratio, l.MixedCap, capped)
		}
	}
}
