package main

import (
	"context"
	"encoding/json"
	"image/png"
	"io"
	"log/slog"
	"maps"
	"math"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/api"
	"github.com/trigon-llm/trigon/backend/cpu"
	"github.com/trigon-llm/trigon/bench"
	"github.com/trigon-llm/trigon/engine"
	"github.com/trigon-llm/trigon/telemetry"
)

// startMetricsServer serves opts.Model (empty: the fixture model) over
// loopback HTTP with one telemetry.Metrics shared by the API and the
// engine, labelled with the name the API serves, as trigon serve has.
func startMetricsServer(t *testing.T, opts engine.LoadOptions) (*httptest.Server, *engine.Loaded) {
	t.Helper()
	m := telemetry.NewMetricsFor("fixture")
	if opts.Model == "" {
		opts.Model = fixtureModel
	}
	opts.Backend, opts.Metrics = cpu.New(cpu.Options{Threads: 2}), m
	l, err := engine.Load(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.Engine.Run(ctx) }()
	eng := &apiEngine{}
	eng.l.Store(l)
	srv, err := api.New(api.Options{Engine: eng, Tokenizer: apiTokenizer{l.Tokenizer},
		Model: api.ModelInfo{ID: "fixture", MaxContext: l.Context}, Metrics: m, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() { hs.Close(); cancel(); <-done; l.Close() })
	return hs, l
}

// TestBenchServeSweepLoopback sweeps two rates against the real server
// (vLLM's --request-rate spelling), with goodput objectives every request
// meets (given in vLLM's space-separated form, comma-separated and
// repeated), and checks the JSON of both points, the engine-step section read
// from /metrics, the plot and the JSON saved beside it.
func TestBenchServeSweepLoopback(t *testing.T) {
	hs, _ := startMetricsServer(t, engine.LoadOptions{MaxSeqs: 8, MaxBatchedTokens: 256, ChunkSize: 64, QueueAhead: true})
	plot := filepath.Join(t.TempDir(), "curve.png")
	out, err := runBench(t, "serve", "--url", hs.URL, "--num-prompts", "6", "--request-rate", "100,400",
		"--input-len", "uniform:4-40", "--output-len", "fixed:5", "--seed", "3", "--goodput", "ttft:600000,itl:600000",
		"--goodput", "e2el:600000", "tpot:600000", "--plot", plot, "--save-result", "--json", "--progress=false")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var sw struct {
		Benchmark string    `json:"benchmark"`
		Rates     []float64 `json:"rates"`
		Points    []struct {
			RequestRate    float64            `json:"request_rate"`
			Completed      int                `json:"completed"`
			OutputTokens   int                `json:"output_tokens"`
			RequestsPerS   float64            `json:"request_throughput"`
			GoodRequests   *int               `json:"good_requests"`
			RequestGoodput *float64           `json:"request_goodput"`
			SLOs           map[string]float64 `json:"goodput_slo_ms"`
			Steps          *struct {
				Groups []struct {
					Kind     string              `json:"kind"`
					Mode     string              `json:"mode"`
					HostMS   struct{ Count int } `json:"host_ms"`
					DeviceMS struct{ Count int } `json:"device_ms"`
				} `json:"groups"`
				Tokens struct {
					Count int     `json:"count"`
					Mean  float64 `json:"mean"`
				} `json:"tokens_per_step"`
				PrefixCache *struct {
					Query int `json:"query_tokens"`
					Hit   int `json:"hit_tokens"`
				} `json:"prefix_cache"`
			} `json:"steps"`
		} `json:"points"`
	}
	if err := json.Unmarshal([]byte(out), &sw); err != nil {
		t.Fatalf("not the sweep JSON: %v\n%s", err, out)
	}
	// --save-result without a directory or name: the same JSON beside the plot.
	if saved, err := os.ReadFile(strings.TrimSuffix(plot, ".png") + ".json"); err != nil || string(saved) != out {
		t.Errorf("--save-result beside the plot: %q (%v), want the sweep's JSON", saved, err)
	}
	if sw.Benchmark != "serve-sweep" || len(sw.Points) != 2 || sw.Rates[0] != 100 || sw.Rates[1] != 400 {
		t.Fatalf("sweep %+v", sw)
	}
	for _, p := range sw.Points {
		if p.Completed != 6 || p.OutputTokens != 30 {
			t.Errorf("rate %g: completed %d with %d tokens, want 6 with 30", p.RequestRate, p.Completed, p.OutputTokens)
		}
		if p.GoodRequests == nil || *p.GoodRequests != 6 || math.Abs(*p.RequestGoodput-p.RequestsPerS) > 1e-9 ||
			!maps.Equal(p.SLOs, map[string]float64{"ttft": 600000, "itl": 600000, "e2el": 600000, "tpot": 600000}) {
			t.Errorf("rate %g: goodput %v of %v, SLOs %v; want every request good", p.RequestRate, p.GoodRequests, p.RequestGoodput, p.SLOs)
		}
		if p.Steps == nil || p.Steps.Tokens.Count == 0 {
			t.Fatalf("rate %g: no engine steps read from /metrics", p.RequestRate)
		}
		steps, decode := 0, 0
		for _, g := range p.Steps.Groups {
			if g.HostMS.Count != g.DeviceMS.Count {
				t.Errorf("rate %g, %s %s: %d host and %d device times", p.RequestRate, g.Kind, g.Mode, g.HostMS.Count, g.DeviceMS.Count)
			}
			steps += g.DeviceMS.Count
			if g.Kind == "decode" {
				decode += g.DeviceMS.Count
			}
		}
		// Each request needs one step with its last prompt chunk and 4
		// decode steps (shared with the others), so at least 4 decode steps.
		if steps != p.Steps.Tokens.Count || decode < 4 {
			t.Errorf("rate %g: %d steps timed (%d decode), %d counted", p.RequestRate, steps, decode, p.Steps.Tokens.Count)
		}
		// The points' prompts are their own: none of the second's is in
		// the prefix cache from the first.
		if pc := p.Steps.PrefixCache; pc == nil || pc.Query == 0 || pc.Hit != 0 {
			t.Errorf("rate %g: prefix cache %+v, want lookups and no hits", p.RequestRate, pc)
		}
	}
	f, err := os.Open(plot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Errorf("--plot wrote no PNG: %v", err)
	}
}

func TestBenchServeSweepFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--rate", "4", "--plot", "x.png"}, "--plot needs a sweep"},
		{[]string{"--rate", "2,inf"}, "finite"},
		{[]string{"--goodput", "latency:5"}, "--goodput"},
	} {
		_, err := runBench(t, append([]string{"serve", "--url", "http://127.0.0.1:1", "--progress=false"}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one mentioning %q", tc.args, err, tc.want)
		}
	}
}

// TestBenchServeGoodputArgs: --goodput in vLLM's space-separated form
// (the objectives after the first are arguments to pflag), comma-separated
// and repeated, and the arguments refused.
func TestBenchServeGoodputArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bench.SLOs
		err  string
	}{
		{[]string{}, nil, ""},
		{[]string{"--goodput", "ttft:1000", "tpot:100", "e2el:5000"}, bench.SLOs{"ttft": 1000, "tpot": 100, "e2el": 5000}, ""},
		{[]string{"--goodput", "ttft:1000", "tpot:100", "--rate", "4"}, bench.SLOs{"ttft": 1000, "tpot": 100}, ""},
		{[]string{"--goodput=ttft:1000,tpot:100"}, bench.SLOs{"ttft": 1000, "tpot": 100}, ""},
		{[]string{"--goodput", "ttft:1000", "--goodput", "itl:85"}, bench.SLOs{"ttft": 1000, "itl": 85}, ""},
		{[]string{"--goodput", "ttft:1000 tpot:100"}, bench.SLOs{"ttft": 1000, "tpot": 100}, ""},
		{[]string{"--goodput", "ttft:1000,itl:85", "e2el:9"}, bench.SLOs{"ttft": 1000, "itl": 85, "e2el": 9}, ""},
		{[]string{"tpot:100"}, nil, `unexpected argument "tpot:100": bench serve takes flags only`},
		{[]string{"--rate", "4", "extra"}, nil, `unexpected argument "extra"`},
		{[]string{"--goodput", "ttft:1000", "fast"}, nil, `unexpected argument "fast"`},
		{[]string{"--goodput", "ttft:1000", "tpot:"}, nil, `unexpected argument "tpot:"`},
		{[]string{"--goodput", "ttft:1000", "latency:5"}, nil, "one of ttft, tpot, e2el, itl"},
		{[]string{"--goodput", "ttft:1000", "tpot:x"}, nil, "KEY:MILLISECONDS"},
		{[]string{"--goodput", "ttft:1000", "tpot:100", "ttft:5"}, nil, "ttft given twice"},
	} {
		cmd := benchServeCmd()
		if err := cmd.ParseFlags(tc.args); err != nil {
			t.Fatalf("%q: %v", tc.args, err)
		}
		args := cmd.Flags().Args()
		err := cmd.ValidateArgs(args)
		var got bench.SLOs
		if err == nil {
			vals, _ := cmd.Flags().GetStringSlice("goodput")
			got, err = goodputObjectives(vals, args)
		}
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: error %v, want one mentioning %q", tc.args, err, tc.err)
			}
			continue
		}
		if err != nil || !maps.Equal(got, tc.want) || (got == nil) != (tc.want == nil) {
			t.Errorf("%q = %v, %v; want %v", tc.args, got, err, tc.want)
		}
	}
}
