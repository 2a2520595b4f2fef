package engine_test

import (
	"testing"
	"time"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/cpu"
	"github.com/trigon-llm/trigon/engine"
)

// perToken wraps a backend and makes each MatMul cost delay per row, so
// that steps take a known time per token (as a slow CPU's do) whatever
// the machine.
type perToken struct {
	backend.Backend
	delay time.Duration
}

func (p perToken) MatMul(out, x, w, bias backend.Tensor) error {
	time.Sleep(time.Duration(x.Shape()[0]) * p.delay)
	return p.Backend.MatMul(out, x, w, bias)
}

// TestLoadMeasuresBudget: with no MaxBatchedTokens, Load times steps on
// the backend and sizes the budget so a step takes about StepTime: on a
// backend whose steps cost a known time per token, the budget is that
// many tokens (less when the machine adds to the sleeps), never under
// MaxSeqs plus a block. A given MaxBatchedTokens is kept.
func TestLoadMeasuresBudget(t *testing.T) {
	const (
		delay    = 100 * time.Microsecond
		stepTime = 100 * time.Millisecond
		maxSeqs  = 8
	)
	// The fixture runs 8 products a token (QKV, O, gate-up and down in
	// each of its 2 layers; the LM head sees the logits rows only): 0.8 ms
	// a token, so 125 tokens fit a step.
	const want = int(stepTime / (8 * delay))
	b := perToken{Backend: cpu.New(cpu.Options{Threads: 1}), delay: delay}
	l, err := engine.Load(engine.LoadOptions{Model: fixture, Backend: b, MaxSeqs: maxSeqs, StepTime: stepTime})
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	if !l.BudgetMeasured || l.MaxBatchedTokens < maxSeqs+16 || l.MaxBatchedTokens > want*5/4 {
		t.Errorf("measured budget %d (measured %v), want %d or somewhat fewer, at least %d",
			l.MaxBatchedTokens, l.BudgetMeasured, want, maxSeqs+16)
	}
	t.Logf("measured budget %d tokens (a step of %d would take %v)", l.MaxBatchedTokens, want, stepTime)

	l, err = engine.Load(engine.LoadOptions{Model: fixture, Backend: b, MaxSeqs: maxSeqs, MaxBatchedTokens: 1000})
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	if l.BudgetMeasured || l.MaxBatchedTokens != 1000 {
		t.Errorf("given budget 1000: got %d (measured %v)", l.MaxBatchedTokens, l.BudgetMeasured)
	}
}
