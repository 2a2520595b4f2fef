package cpu

import (
	"math/rand/v2"
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/samplerule"
)

func TestSampleOp(t *testing.T) {
	r := newRand(t)
	b := New(Options{Threads: 3})
	const n, vocab = 9, 1000
	logits := randFloats(r, n*vocab, 3)
	rows := make([]backend.SampleRow, n)
	for i := range rows {
		rows[i] = randomRow(r, vocab)
	}
	got, err := b.Sample(backend.SampleArgs{Logits: uploadF32(t, b, logits, n, vocab), Rows: rows})
	if err != nil {
		t.Fatal(err)
	}
	for i, row := range rows {
		want, err := samplerule.Pick(logits[i*vocab:(i+1)*vocab], row, nil)
		if err != nil || got[i] != want {
			t.Errorf("row %d: Sample = %d, Pick = %d (%v)", i, got[i], want, err)
		}
	}
	if _, err := b.Sample(backend.SampleArgs{Logits: uploadF32(t, b, logits, n, vocab), Rows: rows[:3]}); !isShapeErr(err) {
		t.Errorf("row count mismatch: error %v, want a shape error", err)
	}
	bad := append([]backend.SampleRow(nil), rows...)
	bad[4].U = 2
	if _, err := b.Sample(backend.SampleArgs{Logits: uploadF32(t, b, logits, n, vocab), Rows: bad}); err == nil {
		t.Error("row with U = 2: no error")
	}
}

// randomRow is a sampling rule with random filters, a quarter of them
// greedy.
func randomRow(r *rand.Rand, vocab int) backend.SampleRow {
	row := backend.SampleRow{Temperature: float32(0.05 + 2*r.Float64()), U: r.Float32()}
	if r.IntN(4) == 0 {
		row.Temperature = 0
	}
	if r.IntN(2) == 0 {
		row.TopK = 1 + r.IntN(min(vocab, 100)+1)
	}
	if r.IntN(2) == 0 {
		row.TopP = float32(0.05 + 0.9*r.Float64())
	}
	if r.IntN(3) == 0 {
		row.MinP = float32(0.3 * r.Float64())
	}
	return row
}
