package main

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/trigon-llm/trigon/engine"
)

// runBench runs `trigon bench ARGS...` and returns its stdout.
func runBench(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := benchCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

// TestBenchLatencyJSON runs bench latency end to end on the embedded
// model's architecture and checks the report's fields.
func TestBenchLatencyJSON(t *testing.T) {
	out, err := runBench(t, "latency", "--device", "cpu", "--threads", "2", "--arch", "default",
		"--batch", "2", "--input-len", "32", "--output-len", "4", "--warmup", "0", "--iters", "1", "--sustained-probe", "100ms", "--json")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var r map[string]any
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("not one JSON object: %v\n%s", err, out)
	}
	for _, key := range []string{
		"benchmark", "arch", "backend", "batch", "input_len", "output_len", "cuda_graphs", "params", "weight_bytes",
		"prefill_ms", "itl_ms", "e2e_ms", "decode_tokens_per_s", "decode_bytes_per_step", "achieved_bytes_per_s",
		"copy_ceiling_bytes_per_s", "decode_floor_ms", "prefill_gemm_floor_ms", "prefill_gemm_floor_sustained_ms", "notes",
	} {
		if _, ok := r[key]; !ok {
			t.Errorf("field %s missing", key)
		}
	}
	num := func(path ...string) float64 {
		var v any = r
		for _, p := range path {
			v = v.(map[string]any)[p]
		}
		f, ok := v.(float64)
		if !ok {
			t.Fatalf("%s = %v, not a number", strings.Join(path, "."), v)
		}
		return f
	}
	if r["benchmark"] != "latency" || r["backend"] != "cpu" || r["arch"] != "default" || r["cuda_graphs"] != "off" {
		t.Errorf("header fields %v %v %v %v", r["benchmark"], r["backend"], r["arch"], r["cuda_graphs"])
	}
	if num("batch") != 2 || num("input_len") != 32 || num("output_len") != 4 {
		t.Errorf("run shape %v/%v/%v, want 2/32/4", r["batch"], r["input_len"], r["output_len"])
	}
	// The default model: 11,720,000 parameters (docs/default-model.md).
	if num("params") != 11_720_000 {
		t.Errorf("params %v, want 11720000", r["params"])
	}
	if n := num("itl_ms", "count"); n != 3 {
		t.Errorf("%v decode steps timed, want 3 (output 4: one token from the prefill)", n)
	}
	p50, p90, p99, mx := num("itl_ms", "p50"), num("itl_ms", "p90"), num("itl_ms", "p99"), num("itl_ms", "max")
	if !(p50 > 0 && p50 <= p90 && p90 <= p99 && p99 <= mx) {
		t.Errorf("ITL percentiles not ordered: %v", r["itl_ms"])
	}
	if f := num("prefill_gemm_floor_sustained_ms"); !(f > 0) || num("matmul_flops_per_s_sustained") <= 0 {
		t.Errorf("sustained GEMM floor %v at %v FLOP/s: want both positive", f, r["matmul_flops_per_s_sustained"])
	}
	if pre, e2e := num("prefill_ms", "p50"), num("e2e_ms", "p50"); !(pre > 0 && e2e > pre) {
		t.Errorf("prefill %v ms, end to end %v ms", pre, e2e)
	}
	// The CPU backend measures its own copy ceiling.
	if r["ceiling_source"] != "measured" || !(num("copy_ceiling_bytes_per_s") > 1e8) || !(num("decode_floor_ms") > 0) {
		t.Errorf("CPU ceiling %v (%v) and floor %v, want a measured ceiling and a positive floor",
			r["copy_ceiling_bytes_per_s"], r["ceiling_source"], r["decode_floor_ms"])
	}
	if bw := num("achieved_bytes_per_s"); !(bw > 1e6) {
		t.Errorf("achieved %v B/s", bw)
	}
	if num("decode_bytes_per_step") <= num("weight_bytes")/2 {
		t.Errorf("decode reads %v bytes, weights are %v", r["decode_bytes_per_step"], r["weight_bytes"])
	}
	if !(num("prefill_gemm_floor_ms") > 0) {
		t.Errorf("prefill GEMM floor %v", r["prefill_gemm_floor_ms"])
	}
}

func TestBenchLatencyFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"graphs value", []string{"--cuda-graphs", "maybe"}, "on, off, both or auto"},
		{"graphs both on cpu", []string{"--cuda-graphs", "both"}, "cannot capture"},
		{"graphs on cpu", []string{"--cuda-graphs", "on"}, "cannot capture"},
		{"dtype", []string{"--dtype", "int3"}, "--dtype"},
		{"arch", []string{"--arch", "gpt-5"}, "not a known architecture"},
		{"too long", []string{"--input-len", "1020", "--output-len", "8"}, "context"},
		{"arch with model", []string{"--model", fixtureModel}, "--arch is not used with --model"},
		{"dtype with model", []string{"--model", fixtureModel, "--dtype", "q8_0"}, "--dtype is not used with --model"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"latency", "--device", "cpu", "--arch", "default", "--input-len", "4", "--output-len", "2", "--iters", "1"}, tc.args...)
			out, err := runBench(t, args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v (output %q), want one mentioning %q", err, out, tc.want)
			}
		})
	}
}

// TestBenchServeLoopback drives the real API and engine on the fixture
// model over loopback HTTP.
func TestBenchServeLoopback(t *testing.T) {
	hs, l := startServer(t, engine.LoadOptions{MaxSeqs: 8, MaxBatchedTokens: 256, ChunkSize: 64})
	freeBefore := freeBlocks(t, l)
	for _, tc := range []struct {
		name string
		rate string
		// --save-result's file: its name under the result directory (a
		// glob), or none.
		save string
	}{{"all at once", "inf", ""}, {"poisson", "200", "serve-200qps-*.json"}} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"serve", "--url", hs.URL, "--num-prompts", "10", "--rate", tc.rate,
				"--input-len", "uniform:4-16", "--output-len", "fixed:4", "--seed", "3", "--json", "--progress=false"}
			results := filepath.Join(t.TempDir(), "results") // not there yet: made by the run
			if tc.save != "" {
				args = append(args, "--save-result", "--result-dir", results)
			}
			out, err := runBench(t, args...)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if tc.save != "" {
				files, _ := filepath.Glob(filepath.Join(results, tc.save))
				if len(files) != 1 {
					t.Fatalf("--save-result files %q, want one %s", files, tc.save)
				}
				if saved, err := os.ReadFile(files[0]); err != nil || string(saved) != out {
					t.Errorf("--save-result wrote %q (%v), want the JSON report printed", saved, err)
				}
			}
			var r struct {
				Completed    int                `json:"completed"`
				Failed       int                `json:"failed"`
				Errors       []string           `json:"errors"`
				InputTokens  int                `json:"input_tokens"`
				OutputTokens int                `json:"output_tokens"`
				TTFT         map[string]float64 `json:"ttft_ms"`
				ITL          map[string]float64 `json:"itl_ms"`
				TPOT         map[string]float64 `json:"tpot_ms"`
				E2E          map[string]float64 `json:"e2e_ms"`
			}
			if err := json.Unmarshal([]byte(out), &r); err != nil {
				t.Fatalf("not the JSON report: %v\n%s", err, out)
			}
			if r.Completed != 10 || r.Failed != 0 {
				t.Fatalf("completed %d, failed %d: %v", r.Completed, r.Failed, r.Errors)
			}
			if r.OutputTokens != 40 {
				t.Errorf("%d output tokens, want 10 x 4 (ignore_eos, max_tokens 4)", r.OutputTokens)
			}
			if r.InputTokens < 40 || r.InputTokens > 160 {
				t.Errorf("%d input tokens, want 10 prompts of 4..16", r.InputTokens)
			}
			for name, s := range map[string]map[string]float64{"ttft": r.TTFT, "itl": r.ITL, "tpot": r.TPOT, "e2e": r.E2E} {
				vals := []float64{s["min"], s["p50"], s["p90"], s["p99"], s["max"]}
				if !slices.IsSorted(vals) || !(s["min"] > 0) || s["count"] == 0 {
					t.Errorf("%s summary %v: not ordered or empty", name, s)
				}
			}
			if !(r.E2E["min"] >= r.TTFT["min"]) {
				t.Errorf("E2E %v shorter than TTFT %v", r.E2E, r.TTFT)
			}
		})
	}
	deadline := time.Now().Add(10 * time.Second)
	for l.Engine.Busy() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := freeBlocks(t, l); got != freeBefore {
		t.Errorf("free KV blocks after the benchmark: %d, before: %d", got, freeBefore)
	}
}

func TestParseTokenIDs(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		fail bool
	}{
		{"auto", 0, false}, {"5-9", 5, false}, {"0-0", 1, false}, {"9-5", 0, true}, {"-1-5", 0, true},
		{"5", 0, true}, {"1-x", 0, true}, {"0-2000000", 0, true}, {"2147483640-2147483647", 8, false},
	} {
		ids, err := parseTokenIDs(tc.in)
		if (err != nil) != tc.fail || len(ids) != tc.n {
			t.Errorf("parseTokenIDs(%q) = %d ids, %v", tc.in, len(ids), err)
		}
	}
}

// TestResultPath: where --save-result, --result-dir and --result-filename
// put the JSON report.
func TestResultPath(t *testing.T) {
	tmp := t.TempDir()
	now := time.Date(2026, 12, 3, 9, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		name    string
		flags   resultFlags
		plot    string
		rates   []float64
		model   string
		maxConc int
		want    string // relative to tmp unless absolute; "" for none
	}{
		{name: "not asked", rates: []float64{4}, plot: filepath.Join(tmp, "sweep.png")},
		{name: "vLLM's name", flags: resultFlags{save: true, dir: "a"}, rates: []float64{4}, want: "a/serve-4qps-20261203-090405.json"},
		{name: "inf, concurrency and a model path", flags: resultFlags{save: true, dir: "b"}, rates: []float64{math.Inf(1)},
			model: "meta-llama/Llama-3.1-8B", maxConc: 32, want: "b/serve-infqps-concurrency32-Llama-3.1-8B-20261203-090405.json"},
		{name: "a sweep", flags: resultFlags{save: true, dir: "c"}, rates: []float64{2, 0.5, 8}, want: "c/serve-sweep-2_0.5_8qps-20261203-090405.json"},
		{name: "beside the plot", flags: resultFlags{save: true}, rates: []float64{2, 4}, plot: "plots/sweep.png", want: "plots/sweep.json"},
		{name: "beside the plot, own name", flags: resultFlags{save: true, name: "r.json"}, rates: []float64{2, 4}, plot: "plots/sweep.png", want: "plots/r.json"},
		{name: "own directory, plot's name", flags: resultFlags{save: true, dir: "d"}, rates: []float64{2, 4}, plot: "plots/sweep.png", want: "d/sweep.json"},
		{name: "a directory implies saving", flags: resultFlags{dir: "e/f"}, rates: []float64{4}, want: "e/f/serve-4qps-20261203-090405.json"},
		{name: "a name implies saving", flags: resultFlags{dir: "g", name: "run.json"}, rates: []float64{4}, want: "g/run.json"},
		{name: "an absolute name wins", flags: resultFlags{dir: "h", name: filepath.Join(tmp, "abs", "run.json")}, rates: []float64{4}, want: filepath.Join(tmp, "abs", "run.json")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.flags
			if f.dir != "" {
				f.dir = filepath.Join(tmp, f.dir)
			}
			plot := tc.plot
			if plot != "" && !filepath.IsAbs(plot) {
				plot = filepath.Join(tmp, plot)
			}
			got, err := f.path(plot, tc.rates, tc.model, tc.maxConc, now)
			want := tc.want
			if want != "" && !filepath.IsAbs(want) {
				want = filepath.Join(tmp, want)
			}
			if err != nil || got != want {
				t.Fatalf("path = %q, %v; want %q", got, err, want)
			}
			if want != "" {
				if st, err := os.Stat(filepath.Dir(want)); err != nil || !st.IsDir() {
					t.Errorf("the result directory was not made: %v", err)
				}
			}
		})
	}
	// A directory that cannot be made is an error before the run.
	file := filepath.Join(tmp, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := (resultFlags{save: true, dir: filepath.Join(file, "sub")}).path("", []float64{4}, "", 0, now); err == nil || !strings.Contains(err.Error(), "--result-dir") {
		t.Errorf("--result-dir under a file: %v, want an error naming --result-dir", err)
	}
}
