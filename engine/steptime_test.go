package engine_test

import (
	"context"
	"math"
	"math/rand/v2"
	"sync"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/trigon-llm/trigon/backend/cpu"
	"github.com/trigon-llm/trigon/engine"
	"github.com/trigon-llm/trigon/telemetry"
)

// stepSeries is one scraped step histogram, by its label pair.
type stepSeries map[[2]string]*dto.Histogram

func gatherSteps(t *testing.T, m *telemetry.Metrics) map[string]stepSeries {
	t.Helper()
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]stepSeries{}
	for _, f := range fams {
		switch f.GetName() {
		case telemetry.StepHostMetric, telemetry.StepDeviceMetric, telemetry.StepGapMetric, telemetry.StepTokensMetric, telemetry.StepPhaseMetric:
		default:
			continue
		}
		s := stepSeries{}
		for _, m := range f.GetMetric() {
			var key [2]string
			for _, lp := range m.GetLabel() {
				switch lp.GetName() {
				case telemetry.StepKindLabel, telemetry.StepPhaseLabel:
					key[0] = lp.GetValue()
				case telemetry.StepModeLabel:
					key[1] = lp.GetValue()
				}
			}
			s[key] = m.GetHistogram()
		}
		out[f.GetName()] = s
	}
	return out
}

// count is the observations of the series whose labels match kind and mode
// ("" matches any).
func (s stepSeries) count(kind, mode string) (n uint64, sum float64) {
	for k, h := range s {
		if (kind == "" || k[0] == kind) && (mode == "" || k[1] == mode) {
			n += h.GetSampleCount()
			sum += h.GetSampleSum()
		}
	}
	return n, sum
}

// phase is the observations of one host phase.
func (s stepSeries) phase(name string) (uint64, float64) { return s.count(name, "") }

// fakeClock is the CPU backend with a device clock whose intervals are
// 5 ms from an even mark to the next and 1 ms from an odd one, so a step
// read in the right phase (start to end) is 5 ms and a gap 1 ms.
type fakeClock struct {
	*cpu.Backend
	mu           sync.Mutex
	marks, reads int
}

func (c *fakeClock) MarkStep() error {
	c.mu.Lock()
	c.marks++
	c.mu.Unlock()
	return nil
}

func (c *fakeClock) StepIntervals() ([]float64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reads++
	var iv []float64
	for i := 1; i < c.marks; i++ {
		if i%2 == 1 {
			iv = append(iv, 5)
		} else {
			iv = append(iv, 1)
		}
	}
	c.marks = 0
	return iv, nil
}

// TestStepMetrics runs one request of a known shape and checks what the
// step series hold: one prefill step and then decode steps, their tokens,
// host times for every delivered step, and device times and gaps measured
// the way the backend allows (its clock, or its calls).
func TestStepMetrics(t *testing.T) {
	const promptLen, maxTokens = 40, 6
	for _, tc := range []struct {
		name  string
		clock bool
		ahead bool
	}{{"calls", false, false}, {"calls/ahead", false, true}, {"clock", true, false}, {"clock/ahead", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			m := telemetry.NewMetrics()
			var fc *fakeClock
			opts := engine.LoadOptions{MaxSeqs: 4, MaxBatchedTokens: 256, ChunkSize: 64, Metrics: m, QueueAhead: tc.ahead}
			var l *engine.Loaded
			if tc.clock {
				fc = &fakeClock{Backend: cpu.New(cpu.Options{Threads: 2})}
				l = start(t, fc, opts)
			} else {
				l = start(t, nil, opts)
			}
			rng := rand.New(rand.NewPCG(3, 4))
			got := submit(t, l, context.Background(), randomPrompt(rng, promptLen), 1, greedy(maxTokens))[0]
			if len(got.tokens) != maxTokens {
				t.Fatalf("%d tokens, want %d", len(got.tokens), maxTokens)
			}
			waitIdle(t, l)
			s := gatherSteps(t, m)
			const steps = maxTokens // one prefill step (it samples the first token), then maxTokens-1 decode steps
			for _, series := range []string{telemetry.StepHostMetric, telemetry.StepDeviceMetric} {
				if n, _ := s[series].count("prefill", "eager"); n != 1 {
					t.Errorf("%s: %d prefill steps, want 1", series, n)
				}
				if n, _ := s[series].count("decode", "eager"); n != steps-1 {
					t.Errorf("%s: %d decode steps, want %d", series, n, steps-1)
				}
				if n, _ := s[series].count("", ""); n != steps {
					t.Errorf("%s: %d steps in all, want %d", series, n, steps)
				}
			}
			if n, sum := s[telemetry.StepTokensMetric].count("", ""); n != steps || sum != promptLen+steps-1 {
				t.Errorf("tokens: %d steps summing to %g, want %d summing to %d", n, sum, steps, promptLen+steps-1)
			}
			n, hostSum := s[telemetry.StepHostMetric].count("", "")
			if hostSum <= 0 {
				t.Errorf("host time: %d steps of %g s in all", n, hostSum)
			}
			// The phases split each step's host time: as many
			// observations each, summing to the host time.
			var phaseSum float64
			for p := range telemetry.NumStepPhases {
				n, sum := s[telemetry.StepPhaseMetric].phase(p.String())
				if n != steps {
					t.Errorf("phase %s: %d observations, want %d", p, n, steps)
				}
				phaseSum += sum
			}
			if math.Abs(phaseSum-hostSum) > 1e-6*hostSum+1e-9 {
				t.Errorf("phases sum to %g s, host time %g s", phaseSum, hostSum)
			}
			if n, sum := s[telemetry.StepPhaseMetric].phase("output"); n == 0 || sum <= 0 {
				t.Errorf("no output phase: %d, %g", n, sum)
			}
			if n, sum := s[telemetry.StepPhaseMetric].phase("launch"); tc.clock != (sum > 0) {
				t.Errorf("launch phase %g s over %d steps: want time only with a device clock", sum, n)
			}
			// Every step but the first follows another within the busy period.
			gaps, gapSum := s[telemetry.StepGapMetric].count("", "")
			if gaps != steps-1 {
				t.Errorf("%d gaps, want %d", gaps, steps-1)
			}
			_, devSum := s[telemetry.StepDeviceMetric].count("", "")
			if tc.clock {
				if fc.reads != 1 {
					t.Errorf("device clock read %d times, want once (when the engine went idle)", fc.reads)
				}
				if want := float64(steps) * 0.005; math.Abs(devSum-want) > 1e-9 {
					t.Errorf("device time %g s, want %g (every step read start to end)", devSum, want)
				}
				if want := float64(steps-1) * 0.001; math.Abs(gapSum-want) > 1e-9 {
					t.Errorf("gaps %g s, want %g", gapSum, want)
				}
			} else if devSum <= 0 {
				t.Errorf("device time %g s: the CPU's backend calls were not timed", devSum)
			}
		})
	}
}

// TestStepMetricsGraphMode: with graphs, decode steps that replayed a
// graph are counted as mode graph, the rest as eager.
func TestStepMetricsGraphMode(t *testing.T) {
	m := telemetry.NewMetrics()
	rb := &replayer{Backend: cpu.New(cpu.Options{Threads: 2})}
	l := start(t, rb, engine.LoadOptions{MaxSeqs: 4, Graphs: true, Metrics: m})
	rng := rand.New(rand.NewPCG(5, 6))
	const maxTokens = 8
	submit(t, l, context.Background(), randomPrompt(rng, 20), 1, greedy(maxTokens))
	waitIdle(t, l)
	st := l.Engine.Stats().Graphs
	s := gatherSteps(t, m)
	graph, _ := s[telemetry.StepDeviceMetric].count("decode", "graph")
	eager, _ := s[telemetry.StepDeviceMetric].count("decode", "eager")
	if graph != st.Replays || graph+eager != maxTokens-1 {
		t.Errorf("decode steps: %d graph, %d eager; the runner replayed %d of %d", graph, eager, st.Replays, maxTokens-1)
	}
	if n, _ := s[telemetry.StepDeviceMetric].count("prefill", "graph"); n != 0 {
		t.Errorf("%d prefill steps counted as graph replays", n)
	}
}

// TestStepMetricsMixed: a prompt arriving while another request decodes
// shares steps with its decode rows.
func TestStepMetricsMixed(t *testing.T) {
	m := telemetry.NewMetrics()
	l := start(t, nil, engine.LoadOptions{MaxSeqs: 4, MaxBatchedTokens: 64, ChunkSize: 16, Metrics: m})
	rng := rand.New(rand.NewPCG(7, 8))
	long, short := randomPrompt(rng, 8), randomPrompt(rng, 60)
	ch, err := l.Engine.Submit(context.Background(), &engine.Request{Prompt: long, N: 1, Params: greedy(200)})
	if err != nil {
		t.Fatal(err)
	}
	first := <-ch // decoding now
	if len(first.TokenIDs) == 0 {
		t.Fatalf("first event %+v", first)
	}
	submit(t, l, context.Background(), short, 1, greedy(2))
	collect(t, ch, 1)
	waitIdle(t, l)
	s := gatherSteps(t, m)
	if n, _ := s[telemetry.StepDeviceMetric].count("mixed", ""); n == 0 {
		t.Error("no mixed steps while a 60-token prompt was prefilled in 16-token chunks beside a decode")
	}
	if n, _ := s[telemetry.StepHostMetric].count("mixed", ""); n == 0 {
		t.Error("no host time of mixed steps")
	}
}
