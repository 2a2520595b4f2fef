package cuda

import (
	"fmt"
	"unsafe"
)

// maxStepMarks bounds the events MarkStep keeps between two StepIntervals
// calls (a benchmark iteration's decode steps).
const maxStepMarks = 1 << 14

// stepClock is MarkStep's timestamps: CUDA events recorded on the stream,
// made on first use and reused. CUDA thread only.
type stepClock struct {
	evs []uintptr // every event made so far
	n   int       // recorded since the last StepIntervals
}

// MarkStep queues a timestamp on the stream after the work queued so
// far (bench.StepClock). It does not wait; an error is reported by the
// next Sync or StepIntervals.
func (b *Backend) MarkStep() error {
	return b.post(func() error {
		d, c := b.d, &b.marks
		if c.n == maxStepMarks {
			return fmt.Errorf("cuda: step marks: more than %d without StepIntervals", maxStepMarks)
		}
		if c.n == len(c.evs) {
			var ev uintptr
			if err := d.check("cuEventCreate", d.call(d.cuEventCreate, uintptr(unsafe.Pointer(&ev)), 0)); err != nil {
				return err
			}
			c.evs = append(c.evs, ev)
		}
		if err := d.check("cuEventRecord", d.call(d.cuEventRecord, c.evs[c.n], b.stream)); err != nil {
			return err
		}
		c.n++
		return nil
	})
}

// StepIntervals waits for the marks queued since the last call and
// returns the milliseconds between successive ones (one fewer than the
// marks), then forgets them. Where the device has the next step queued
// before it finishes one, an interval is the device's time for a step.
func (b *Backend) StepIntervals() ([]float64, error) {
	var out []float64
	err := b.call(func() error {
		d, c := b.d, &b.marks
		n := c.n
		c.n = 0
		if err := b.deferred; err != nil {
			b.deferred = nil
			return err
		}
		if n == 0 {
			return nil
		}
		if err := d.check("cuEventSynchronize", d.call(d.cuEventSynchronize, c.evs[n-1])); err != nil {
			return err
		}
		out = make([]float64, 0, n-1)
		for i := 1; i < n; i++ {
			var ms float32
			if err := d.check("cuEventElapsedTime", d.call(d.cuEventElapsedTime, uintptr(unsafe.Pointer(&ms)), c.evs[i-1], c.evs[i])); err != nil {
				return err
			}
			out = append(out, float64(ms))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("cuda: step intervals: %w", err)
	}
	return out, nil
}

// destroyMarks releases MarkStep's events. CUDA thread only.
func (b *Backend) destroyMarks() {
	for _, ev := range b.marks.evs {
		b.d.call(b.d.cuEventDestroy, ev)
	}
	b.marks = stepClock{}
}
