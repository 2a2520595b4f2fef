package engine_test

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/cpu"
	"github.com/trigon-llm/trigon/engine"
)

// refusing is a backend whose kernels take no head dim but wantDim, as the
// CUDA backend takes only some; it counts uploads.
type refusing struct {
	backend.Backend
	wantDim int
	uploads *atomic.Int64
}

func (r refusing) CheckAttention(numHeads, numKVHeads, headDim int) error {
	if headDim != r.wantDim {
		return fmt.Errorf("fake: head dim %d: want %d", headDim, r.wantDim)
	}
	return nil
}

func (r refusing) Upload(dt backend.DType, shape []int, data []byte) (backend.Tensor, error) {
	r.uploads.Add(1)
	return r.Backend.Upload(dt, shape, data)
}

// TestLoadRefusesUnsupportedModel: a backend that cannot run the model's
// attention shapes makes Load fail before any weight is uploaded, with an
// error wrapping ErrUnsupportedModel that says why; a shape it takes
// loads and serves.
func TestLoadRefusesUnsupportedModel(t *testing.T) {
	var uploads atomic.Int64
	b := refusing{Backend: cpu.New(cpu.Options{Threads: 1}), wantDim: 24, uploads: &uploads}
	_, err := engine.Load(engine.LoadOptions{Model: fixture, Backend: b})
	if !errors.Is(err, engine.ErrUnsupportedModel) || !strings.Contains(err.Error(), "head dim 16: want 24") {
		t.Fatalf("Load: %v, want ErrUnsupportedModel with the backend's reason", err)
	}
	if n := uploads.Load(); n != 0 {
		t.Errorf("%d tensors uploaded before the refusal, want 0", n)
	}
	b.wantDim = 16 // the fixture's
	l := start(t, b, engine.LoadOptions{MaxBatchedTokens: 64})
	if got := submit(t, l, t.Context(), []int32{5, 6, 7}, 1, greedy(3))[0]; len(got.tokens) != 3 {
		t.Errorf("a model the backend takes: %d tokens (%s %v)", len(got.tokens), got.final.FinishReason, got.final.Err)
	}
}

// bf16Device claims BF16 activations (as the CUDA backend does) and
// fails every upload, so that Load stops after its checks.
type bf16Device struct{ backend.Backend }

func (bf16Device) ActDType() backend.DType { return backend.BF16 }
func (bf16Device) Upload(backend.DType, []int, []byte) (backend.Tensor, error) {
	return nil, errors.New("fake: no device")
}

// TestF32CheckpointNote: loading F32 weights on a backend that computes
// in BF16 says so in one warning; BF16 weights do not.
func TestF32CheckpointNote(t *testing.T) {
	for _, tc := range []struct {
		model string
		note  bool
	}{{fixture, true}, {"../testdata/models/llama3-bf16", false}} {
		var logs bytes.Buffer
		log := slog.New(slog.NewTextHandler(&logs, nil))
		_, err := engine.Load(engine.LoadOptions{Model: tc.model, Backend: bf16Device{cpu.New(cpu.Options{Threads: 1})}, Logger: log})
		if err == nil || !strings.Contains(err.Error(), "no device") {
			t.Fatalf("%s: Load: %v, want the upload's failure", tc.model, err)
		}
		got := strings.Count(logs.String(), "weights are F32; this backend computes activations and the KV cache in BF16")
		if want := map[bool]int{true: 1, false: 0}[tc.note]; got != want {
			t.Errorf("%s: %d notes, want %d; log:\n%s", tc.model, got, want, logs.String())
		}
	}
}

// wildSampler samples an id past the tokenizer's vocabulary, as a model
// whose vocabulary is padded beyond its tokenizer's can.
type wildSampler struct{ backend.Backend }

func (w wildSampler) Sample(args backend.SampleArgs) ([]int32, error) {
	ids := make([]int32, len(args.Rows))
	for i := range ids {
		ids[i] = 1 << 20
	}
	return ids, nil
}

// TestUndecodableTokenKeepsItsCause: a sampled id the tokenizer cannot
// decode ends the choice with FinishError and an error that says so (not
// an error without a cause, which the api can only call internal).
func TestUndecodableTokenKeepsItsCause(t *testing.T) {
	l := start(t, wildSampler{cpu.New(cpu.Options{Threads: 1})}, engine.LoadOptions{MaxBatchedTokens: 64})
	got := submit(t, l, t.Context(), []int32{5, 6, 7}, 1, greedy(4))[0]
	if got.final.FinishReason != engine.FinishError || got.final.Err == nil || !strings.Contains(got.final.Err.Error(), "sampled token 1048576 has no text") {
		t.Errorf("finish %q, err %v; want an error naming the token", got.final.FinishReason, got.final.Err)
	}
}
