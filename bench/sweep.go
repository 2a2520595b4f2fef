package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// SweepResult is one serving benchmark per request rate, in the order run:
// the throughput-latency curve of the server under that workload.
type SweepResult struct {
	Benchmark string         `json:"benchmark"` // "serve-sweep"
	Rates     []Rate         `json:"rates"`
	Points    []*ServeResult `json:"points"`
}

// ParseRates reads a request rate or a comma-separated list of them. A
// list (a sweep) must have distinct finite rates.
func ParseRates(s string) ([]float64, error) {
	parts := strings.Split(s, ",")
	rates := make([]float64, 0, len(parts))
	seen := map[float64]bool{}
	for _, p := range parts {
		r, err := ParseRate(p)
		if err != nil {
			return nil, err
		}
		if len(parts) > 1 && math.IsInf(r, 1) {
			return nil, fmt.Errorf("request rates %q: a sweep needs finite rates (inf cannot be plotted against the others)", s)
		}
		if seen[r] {
			return nil, fmt.Errorf("request rates %q: %g given twice", s, r)
		}
		seen[r] = true
		rates = append(rates, r)
	}
	return rates, nil
}

// RunSweep runs the benchmark o once at each rate, one after another (the
// server is idle between them: each run waits for its last request). Each
// point sends prompts of its own: point i draws its lengths, prompts and
// arrivals with seed o.Seed+i, and with a dataset (o.Prompts) starts
// i*o.NumPrompts prompts in. The same prompts at every point would be
// served from the server's prefix cache after the first, and the later
// points would measure no prefill. onPoint, when set, is called after
// each.
func RunSweep(ctx context.Context, o ServeOptions, rates []float64, onPoint func(*ServeResult)) (*SweepResult, error) {
	if len(rates) == 0 {
		return nil, errors.New("bench serve: no request rates")
	}
	base, err := checkServeOptions(&o)
	if err != nil {
		return nil, err
	}
	if len(o.TokenIDs) == 0 && o.Prompts == nil {
		// Asked once for every point's random prompts.
		client := o.Client
		if client == nil {
			client = &http.Client{Transport: &http.Transport{Proxy: nil}}
		}
		tctx, cancel := context.WithTimeout(ctx, time.Minute)
		o.TokenIDs, err = tokenPool(tctx, client, base, o)
		cancel()
		if err != nil {
			return nil, err
		}
	}
	sw := &SweepResult{Benchmark: "serve-sweep"}
	seed, prompts := o.Seed, o.Prompts
	for i, r := range rates {
		if err := ctx.Err(); err != nil {
			return sw, err
		}
		o.Rate, o.Seed = r, seed+uint64(i)
		if len(prompts) > 0 {
			k := i * o.NumPrompts % len(prompts)
			o.Prompts = append(slices.Clip(prompts[k:]), prompts[:k]...)
		}
		res, err := RunServe(ctx, o)
		if err != nil {
			return sw, fmt.Errorf("bench serve at %g req/s: %w", r, err)
		}
		sw.Rates = append(sw.Rates, Rate(r))
		sw.Points = append(sw.Points, res)
		if onPoint != nil {
			onPoint(res)
		}
	}
	return sw, nil
}

// WriteText prints every point's report, then the curve as a table.
func (s *SweepResult) WriteText(w io.Writer) error {
	var b strings.Builder
	for i, r := range s.Points {
		if i > 0 {
			b.WriteString("\n")
		}
		if err := r.WriteText(&b); err != nil {
			return err
		}
	}
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	p("")
	p("trigon bench serve: sweep of %d request rates", len(s.Points))
	p("%8s %9s %9s %9s %11s %10s %10s %9s %9s", "req/s", "completed", "req/s", "goodput", "out tok/s", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99")
	for _, r := range s.Points {
		good := "n/a"
		if r.RequestGoodput != nil {
			good = strconv.FormatFloat(*r.RequestGoodput, 'f', 2, 64)
		}
		p("%8s %9d %9.2f %9s %11.1f %10.1f %10.1f %9.1f %9.1f", strconv.FormatFloat(float64(r.RequestRate), 'g', -1, 64),
			r.Completed, r.RequestsPerS, good, r.OutputTokensPerS, r.TTFTMS.P50, r.TTFTMS.P99, r.ITLMS.P50, r.ITLMS.P99)
	}
	if len(s.Points) > 0 && s.Points[0].GoodputSLOMS != nil {
		p("goodput: completed requests per second that met %s", s.Points[0].GoodputSLOMS)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
