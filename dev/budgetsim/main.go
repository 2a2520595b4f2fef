// Command budgetsim replays a serving load through trigon's scheduler on a
// virtual clock, with each step's duration taken from a model of step time
// against the step's token count, to predict how the step token budget
// (--max-num-batched-tokens) trades inter-token latency against TTFT and
// throughput before a GPU run measures it.
//
//	go run ./dev/budgetsim -rate 8 -n 200 -in 1024 -out 128 -budgets 2048 -chunks 512,384,256
//
// The step-time model is piecewise linear through -steps, "tokens:ms"
// points (default: an 8B model on the H200 as `bench serve` reported its
// decode and mixed steps). It leaves out what the scheduler does not see:
// attention's growth with context, host time, queueing steps ahead. Only
// the differences between budgets are the prediction; the absolute figures
// are as good as the model.
package main

import (
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/trigon-llm/trigon/kvcache"
	"github.com/trigon-llm/trigon/sched"
)

func main() {
	rate := flag.Float64("rate", 8, "mean request rate (Poisson arrivals), requests/s; 0: all at once")
	n := flag.Int("n", 200, "requests")
	in := flag.Int("in", 1024, "prompt tokens")
	out := flag.Int("out", 128, "output tokens")
	conc := flag.Int("max-seqs", 256, "most sequences running")
	chunk := flag.Int("chunk", 512, "most prompt tokens of one sequence a step (the engine's ChunkSize); 0: the budget")
	budgets := flag.String("budgets", "2048", "step token budgets to compare")
	chunks := flag.String("chunks", "", "with one budget: chunk sizes to compare instead")
	steps := flag.String("steps", "1:4.5,7:4.62,256:9.6,519:14.36,8448:152", "step time model, tokens:ms points")
	seed := flag.Uint64("seed", 1, "seed of the arrivals")
	flag.Parse()
	model, err := parseModel(*steps)
	if err != nil {
		fmt.Fprintln(os.Stderr, "budgetsim:", err)
		os.Exit(2)
	}
	fmt.Printf("%d requests of %d+%d tokens at %g req/s, step model %s\n", *n, *in, *out, *rate, *steps)
	fmt.Printf("%8s %6s %10s %10s %8s %10s %10s %10s %11s %8s\n", "budget", "chunk", "ITL p50", "ITL p99", "p99/p50", "ITL max", "TTFT p50", "TTFT p99", "out tok/s", "mixed")
	type run struct{ budget, chunk int }
	var runs []run
	ints := func(list string) []int {
		var v []int
		for _, f := range strings.Split(list, ",") {
			x, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || x < 0 {
				fmt.Fprintf(os.Stderr, "budgetsim: %q: want token counts\n", list)
				os.Exit(2)
			}
			v = append(v, x)
		}
		return v
	}
	for _, b := range ints(*budgets) {
		if *chunks == "" {
			runs = append(runs, run{b, *chunk})
			continue
		}
		for _, c := range ints(*chunks) {
			runs = append(runs, run{b, c})
		}
	}
	for _, rc := range runs {
		if rc.budget < *conc {
			fmt.Fprintf(os.Stderr, "budgetsim: budget %d: want at least -max-seqs\n", rc.budget)
			os.Exit(2)
		}
		r, err := simulate(load{rate: *rate, n: *n, in: *in, out: *out, seed: *seed}, sched.Config{MaxNumSeqs: *conc, MaxNumBatchedTokens: rc.budget, ChunkSize: rc.chunk}, model)
		if err != nil {
			fmt.Fprintln(os.Stderr, "budgetsim:", err)
			os.Exit(1)
		}
		fmt.Printf("%8d %6d %10.2f %10.2f %8.2f %10.2f %10.1f %10.1f %11.0f %8d\n", rc.budget, rc.chunk, r.itlP50, r.itlP99, r.itlP99/r.itlP50, r.itlMax,
			r.ttftP50, r.ttftP99, r.tokPerS, r.mixed)
	}
}

// point is one (tokens, ms) knot of the step-time model.
type point struct{ tokens, ms float64 }

func parseModel(s string) ([]point, error) {
	var pts []point
	for _, f := range strings.Split(s, ",") {
		a, b, ok := strings.Cut(f, ":")
		t, err1 := strconv.ParseFloat(a, 64)
		ms, err2 := strconv.ParseFloat(b, 64)
		if !ok || err1 != nil || err2 != nil || t < 1 || ms <= 0 {
			return nil, fmt.Errorf("step model point %q: want tokens:ms", f)
		}
		pts = append(pts, point{t, ms})
	}
	slices.SortFunc(pts, func(x, y point) int { return int(x.tokens - y.tokens) })
	if len(pts) < 2 {
		return nil, fmt.Errorf("step model %q: want two points or more", s)
	}
	return pts, nil
}

// stepMS interpolates the model at n tokens (extrapolating the end
// segments).
func stepMS(pts []point, n int) float64 {
	x := float64(n)
	i := 1
	for i < len(pts)-1 && x > pts[i].tokens {
		i++
	}
	a, b := pts[i-1], pts[i]
	return a.ms + (b.ms-a.ms)*(x-a.tokens)/(b.tokens-a.tokens)
}

type load struct {
	rate       float64
	n, in, out int
	seed       uint64
}

type result struct {
	itlP50, itlP99, itlMax float64
	ttftP50, ttftP99       float64
	tokPerS                float64
	mixed                  int
}

// simulate runs l through a scheduler of configuration cfg, every step
// taking stepMS of its tokens, and returns the latencies in ms. A
// sequence's token arrives when the step that sampled it ends.
func simulate(l load, cfg sched.Config, model []point) (result, error) {
	blocks := cfg.MaxNumSeqs*((l.in+l.out)/kvcache.DefaultBlockSize+2) + 2
	pool, err := kvcache.NewPool(kvcache.Options{NumBlocks: blocks})
	if err != nil {
		return result{}, err
	}
	s, err := sched.New(cfg, pool)
	if err != nil {
		return result{}, err
	}
	rng := rand.New(rand.NewPCG(l.seed, 0))
	arrive := make([]float64, l.n) // ms
	t := 0.0
	for i := range arrive {
		if l.rate > 0 {
			t += rng.ExpFloat64() / l.rate * 1e3
		}
		arrive[i] = t
	}
	last := make([]float64, l.n) // the time of each request's latest token (0: none yet)
	var itl, ttft []float64
	now, next, done, tokens, mixed := 0.0, 0, 0, 0, 0
	for done < l.n {
		for next < l.n && arrive[next] <= now {
			prompt := make([]int32, l.in)
			for j := range prompt {
				prompt[j] = int32(rng.IntN(100000) + 100) // distinct prompts: no prefix-cache hits
			}
			if err := s.Add(sched.Request{ID: sched.SeqID(next), Prompt: prompt, MaxTokens: l.out}); err != nil {
				return result{}, err
			}
			next++
		}
		if s.NumRunning()+s.NumWaiting() == 0 {
			now = arrive[next]
			continue
		}
		plan := s.Schedule()
		decode, prefill := 0, 0
		for _, q := range plan.Seqs {
			if q.Start >= l.in {
				decode++
			} else {
				prefill++
			}
		}
		if prefill > 0 && decode > 0 {
			mixed++
		}
		now += stepMS(model, plan.NumTokens)
		o := sched.StepOutput{Tokens: map[sched.SeqID]int32{}}
		for _, q := range plan.Seqs {
			if !q.Sample {
				continue
			}
			o.Tokens[q.ID] = 1
			id := int(q.ID)
			if last[id] == 0 {
				ttft = append(ttft, now-arrive[id])
			} else {
				itl = append(itl, now-last[id])
			}
			last[id] = now
			tokens++
		}
		fin, err := s.Update(plan, o)
		if err != nil {
			return result{}, err
		}
		done += len(fin)
	}
	return result{
		itlP50: quantile(itl, 0.5), itlP99: quantile(itl, 0.99), itlMax: quantile(itl, 1),
		ttftP50: quantile(ttft, 0.5), ttftP99: quantile(ttft, 0.99),
		tokPerS: float64(tokens) / (now - arrive[0]) * 1e3, mixed: mixed,
	}, nil
}

// quantile is the q-quantile of v by the nearest rank.
func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(i, 0)]
}
