package engine

import (
	"io"
	"log/slog"
	"testing"

	"github.com/trigon-llm/trigon/backend/cpu"
	"github.com/trigon-llm/trigon/backend/cuda"
	"github.com/trigon-llm/trigon/sched"
	"github.com/trigon-llm/trigon/telemetry"
)

// The CUDA backend is the device clock the step metrics read.
var _ deviceClock = (*cuda.Backend)(nil)

// benchClock is a device clock whose intervals live in one reused slice,
// so the benchmark measures the timer, not the clock.
type benchClock struct {
	*cpu.Backend
	marks int
	iv    []float64
}

func (c *benchClock) MarkStep() error { c.marks++; return nil }

func (c *benchClock) StepIntervals() ([]float64, error) {
	n := max(c.marks-1, 0)
	c.marks = 0
	for len(c.iv) < n {
		c.iv = append(c.iv, 1)
	}
	return c.iv[:n], nil
}

// BenchmarkStepTimer is what the step metrics add to one engine step of
// 64 decode rows: the loop iteration's and the step's hooks and, every
// harvestSteps steps, reading the device clock. It must not allocate.
func BenchmarkStepTimer(b *testing.B) {
	plan := &sched.Plan{NumTokens: 64}
	for i := range 64 {
		plan.Seqs = append(plan.Seqs, sched.ScheduledSeq{ID: sched.SeqID(i), Tokens: []int32{1}})
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, mode := range []string{"clock", "calls"} {
		b.Run(mode, func(b *testing.B) {
			be := cpu.New(cpu.Options{Threads: 1})
			var t *stepTimer
			if mode == "clock" {
				t = newStepTimer(telemetry.NewMetrics(), &benchClock{Backend: be}, log)
			} else {
				t = newStepTimer(telemetry.NewMetrics(), be, log)
			}
			b.ReportAllocs()
			for b.Loop() {
				t.beginIter()
				t.phaseSince(telemetry.PhaseSchedule, t.now())
				t.beginStep(plan)
				t0 := t.now()
				t.ranBackend(t0)
				t0 = t.now()
				t.waitedDevice(t0)
				t.endStep(true)
				t.phaseSince(telemetry.PhaseOutput, t.now())
				t.phaseSince(telemetry.PhaseUpdate, t.now())
				t.deliveredCurrent()
				t.endIter(false)
			}
		})
	}
}
