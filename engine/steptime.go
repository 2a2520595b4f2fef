package engine

import (
	"log/slog"
	"time"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/sched"
	"github.com/trigon-llm/trigon/telemetry"
)

// deviceClock is an optional backend interface: timestamps queued on the
// device's stream. MarkStep queues one after the work queued so far;
// StepIntervals waits for the marks queued since its last call and returns
// the milliseconds between successive ones, then forgets them. The CUDA
// backend has it (bench.StepClock names the same methods).
type deviceClock interface {
	MarkStep() error
	StepIntervals() ([]float64, error)
}

const (
	// harvestSteps is how many device-clocked steps wait before their
	// times are read, at a point where the host has read every marked
	// step's results: the read then waits for nothing, and it is paid once
	// for many steps.
	harvestSteps = 64
	// maxMarkedSteps bounds the steps whose marks wait to be read (two
	// marks a step, well under the CUDA backend's 16,384). Steps beyond it
	// go unmarked until the next read: reading with a step in flight would
	// wait for it and could take a deferred error of its work.
	maxMarkedSteps = 2048
)

// How a stepTimer knows the device's part of a step.
const (
	devClock = iota // timestamps on the device's stream (deviceClock)
	devCalls        // the backend computes within its calls (the CPU): time them
	devOff          // the device clock failed: no device times
)

// stepLabel is what a step's series are labelled with.
type stepLabel struct {
	kind    telemetry.StepKind
	graph   bool
	dropped bool // the step failed before its end was marked
}

// stepTimer splits the step loop's time into host and device parts for the
// step metrics (telemetry.Metrics.ObserveStepHost and the rest). Owned by
// the step loop; a nil *stepTimer (no metrics) does nothing and costs a nil
// check. It allocates nothing per step.
//
// Host time of a step is the loop's time between the deliveries of two
// steps' results, less what it spent waiting for the device (and, on a
// backend without a clock, computing in backend calls). Device time is
// clocked on the device where the backend can (two marks a step,
// read in batches); elsewhere it is the time the step's backend calls
// took. Gaps are the device's idle time between two steps while the loop
// is busy.
type stepTimer struct {
	m     *telemetry.Metrics
	log   *slog.Logger
	clock deviceClock
	mode  int

	// The loop iteration under way.
	iterStart time.Time
	waited    time.Duration // of it, spent waiting on the device (not host work)
	done      bool          // it delivered a step's results
	doneLabel stepLabel
	host      time.Duration                          // host time since the last delivered step
	phases    [telemetry.NumStepPhases]time.Duration // of it, by phase

	// The step under way (between beginStep and endStep).
	inStep  bool
	marking bool // its start is marked on the device clock
	cur     stepLabel
	tokens  int
	dev     time.Duration // devCalls: its backend time so far
	lastEnd time.Time     // devCalls: when the last step's backend work ended; zero after idle

	marked  [maxMarkedSteps]stepLabel // devClock: the steps whose marks wait to be read
	nMarked int
}

func newStepTimer(m *telemetry.Metrics, b backend.Backend, log *slog.Logger) *stepTimer {
	if m == nil {
		return nil
	}
	t := &stepTimer{m: m, log: log, mode: devCalls}
	if c, ok := b.(deviceClock); ok {
		t.clock, t.mode = c, devClock
	}
	return t
}

// now is time.Now, or nothing without a timer.
func (t *stepTimer) now() time.Time {
	if t == nil {
		return time.Time{}
	}
	return time.Now()
}

// beginIter starts a loop iteration.
func (t *stepTimer) beginIter() {
	if t == nil {
		return
	}
	t.iterStart = time.Now()
	t.waited, t.done = 0, false
}

// endIter ends a loop iteration. Without a step in flight the host has
// read every marked step's results, so their device times can be read
// without waiting.
func (t *stepTimer) endIter(inFlight bool) {
	if t == nil {
		return
	}
	t.host += time.Since(t.iterStart) - t.waited
	if t.done {
		t.m.ObserveStepHost(t.doneLabel.kind, t.doneLabel.graph, t.host)
		other := t.host
		for p := range telemetry.PhaseOther {
			t.m.ObserveStepHostPhase(p, t.phases[p])
			other -= t.phases[p]
		}
		t.m.ObserveStepHostPhase(telemetry.PhaseOther, max(other, 0))
		t.host, t.phases = 0, [telemetry.NumStepPhases]time.Duration{}
	}
	if !inFlight && t.nMarked >= harvestSteps {
		t.harvest()
	}
}

// idle says the loop has no work: marked steps are read, and neither the
// host time nor the gap runs on across the idle time.
func (t *stepTimer) idle() {
	if t == nil {
		return
	}
	t.harvest()
	t.host, t.done, t.phases = 0, false, [telemetry.NumStepPhases]time.Duration{}
	t.lastEnd = time.Time{}
}

// stalled counts time since t0 that the loop spent neither on the host's
// work nor on the device's (waiting for KV blocks).
func (t *stepTimer) stalled(t0 time.Time) {
	if t != nil {
		t.waited += time.Since(t0)
	}
}

// ranBackend counts a backend call since t0 that queues device work
// (copies, the forward, device sampling). A backend without a device clock
// computes within it: the time is the device's, not the host's.
func (t *stepTimer) ranBackend(t0 time.Time) {
	if t == nil {
		return
	}
	d := time.Since(t0)
	if t.mode != devCalls {
		t.phases[telemetry.PhaseLaunch] += d
		return
	}
	t.waited += d
	if t.inStep {
		t.dev += d
	}
}

// phaseSince counts the host time since t0 toward phase p.
func (t *stepTimer) phaseSince(p telemetry.StepPhase, t0 time.Time) {
	if t != nil {
		t.phases[p] += time.Since(t0)
	}
}

// waitedDevice counts a call since t0 that waited for the device's results.
func (t *stepTimer) waitedDevice(t0 time.Time) {
	if t == nil {
		return
	}
	d := time.Since(t0)
	t.waited += d
	if t.inStep && t.mode == devCalls {
		t.dev += d
	}
}

// beginStep starts timing plan's step, before its first device work.
func (t *stepTimer) beginStep(plan *sched.Plan) {
	if t == nil {
		return
	}
	one, more, verify := false, false, false
	for i := range plan.Seqs {
		verify = verify || plan.Seqs[i].NumDraft > 0
		if len(plan.Seqs[i].Tokens) == 1 {
			one = true
		} else {
			more = true
		}
	}
	kind := telemetry.StepDecode
	switch {
	case one && more:
		kind = telemetry.StepMixed
	case more:
		kind = telemetry.StepPrefill
	}
	if verify {
		kind = telemetry.StepVerify
	}
	t.inStep, t.cur, t.tokens, t.marking = true, stepLabel{kind: kind}, plan.NumTokens, false
	switch t.mode {
	case devClock:
		if t.nMarked < maxMarkedSteps {
			t.marking = t.mark()
		}
	case devCalls:
		now := time.Now()
		if !t.lastEnd.IsZero() {
			t.m.ObserveStepGap(now.Sub(t.lastEnd))
		}
		t.dev = 0
	}
}

// endStep ends the step after its last device work is queued (or, on a
// backend without a clock, done); graph says it replayed a captured graph.
// It returns the step's label.
func (t *stepTimer) endStep(graph bool) stepLabel {
	if t == nil || !t.inStep {
		return stepLabel{}
	}
	t.inStep = false
	t.cur.graph = graph
	t.m.ObserveIterationTokens(t.tokens)
	switch t.mode {
	case devClock:
		if t.marking && t.mark() {
			t.marked[t.nMarked] = t.cur
			t.nMarked++
		}
	case devCalls:
		t.m.ObserveStepDevice(t.cur.kind, graph, t.dev)
		t.lastEnd = time.Now()
	}
	return t.cur
}

// dropStep ends a step that failed before endStep: its start mark gets a
// matching end, and no device time is recorded for it.
func (t *stepTimer) dropStep() {
	if t == nil || !t.inStep {
		return
	}
	t.inStep = false
	t.cur.dropped = true
	if t.mode == devClock && t.marking && t.mark() {
		t.marked[t.nMarked] = t.cur
		t.nMarked++
	}
	t.lastEnd = time.Time{}
}

// delivered says this iteration delivered the results of the step
// labelled l (the host time so far is that step's).
func (t *stepTimer) delivered(l stepLabel) {
	if t != nil {
		t.done, t.doneLabel = true, l
	}
}

// deliveredCurrent is delivered for the step begun last.
func (t *stepTimer) deliveredCurrent() {
	if t != nil {
		t.delivered(t.cur)
	}
}

// mark queues a timestamp; a failure turns device timing off.
func (t *stepTimer) mark() bool {
	if err := t.clock.MarkStep(); err != nil {
		t.off(err)
		return false
	}
	return true
}

func (t *stepTimer) off(err error) {
	t.log.Warn("step metrics: the device clock failed; device step times are no longer recorded", "err", err)
	t.mode, t.clock, t.nMarked = devOff, nil, 0
}

// harvest reads the marked steps' device times and the gaps between them.
// Marks come in pairs, a step's start and end, so interval 2i is step i's
// device time and interval 2i+1 the gap before step i+1. The gap across a
// harvest is not known (the clock forgets the marks it returned).
func (t *stepTimer) harvest() {
	if t.mode != devClock || t.nMarked == 0 {
		return
	}
	n := t.nMarked
	t.nMarked = 0
	iv, err := t.clock.StepIntervals()
	if err != nil {
		t.off(err)
		return
	}
	if len(iv) != 2*n-1 {
		t.log.Debug("step metrics: device intervals do not match the marked steps", "intervals", len(iv), "steps", n)
		return
	}
	ms := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
	for i := range n {
		s := t.marked[i]
		if s.dropped {
			continue
		}
		t.m.ObserveStepDevice(s.kind, s.graph, ms(iv[2*i]))
		if i+1 < n && !t.marked[i+1].dropped {
			t.m.ObserveStepGap(ms(iv[2*i+1]))
		}
	}
}
