package bench

import (
	"bytes"
	"encoding/json"
	"flag"
	"image/png"
	"os"
	"slices"
	"strings"
	"testing"
)

// sweepFixture is a sweep of five rates where the server saturates at 8
// requests/s: throughput levels off and TTFT grows by orders of magnitude.
func sweepFixture(goodput bool) *SweepResult {
	sw := &SweepResult{Benchmark: "serve-sweep"}
	for i, r := range []float64{2, 4, 8, 16, 32} {
		res := &ServeResult{Benchmark: "serve", RequestRate: Rate(r), NumPrompts: 100, InputLen: FixedLength(1024), OutputLen: FixedLength(128),
			Completed: 100, RequestsPerS: min(r, 8), OutputTokensPerS: 128 * min(r, 8),
			TTFTMS: Summary{Count: 100, P50: 60 * float64(1+i*i*i), P99: 200 * float64(1+i*i*i)},
			ITLMS:  Summary{Count: 12700, P50: 20 + float64(i), P99: 40 + 20*float64(i)}}
		if goodput {
			res.GoodputSLOMS = SLOs{"ttft": 1000, "itl": 85}
			g := min(r, 8) * float64(4-min(i, 4)) / 4
			n := int(g * 10)
			res.RequestGoodput, res.GoodRequests = &g, &n
		}
		sw.Rates = append(sw.Rates, Rate(r))
		sw.Points = append(sw.Points, res)
	}
	return sw
}

// plotOut, when set, writes the fixture's plot there, to look at.
var plotOut = flag.String("plot-out", "", "write TestWritePlot's PNG to this file")

func TestWritePlot(t *testing.T) {
	for _, goodput := range []bool{false, true} {
		var buf bytes.Buffer
		if err := sweepFixture(goodput).WritePlot(&buf); err != nil {
			t.Fatal(err)
		}
		if *plotOut != "" && goodput {
			if err := os.WriteFile(*plotOut, buf.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		img, err := png.Decode(&buf)
		if err != nil {
			t.Fatalf("not a PNG: %v", err)
		}
		b := img.Bounds()
		if b.Dx() < 800 || b.Dy() < 500 {
			t.Errorf("image %v: too small to read", b)
		}
		// Not blank: many distinct colours (lines, text, grid).
		seen := map[[4]uint32]bool{}
		for y := b.Min.Y; y < b.Max.Y; y += 3 {
			for x := b.Min.X; x < b.Max.X; x += 3 {
				r, g, bl, a := img.At(x, y).RGBA()
				seen[[4]uint32{r, g, bl, a}] = true
			}
		}
		if len(seen) < 20 {
			t.Errorf("goodput %v: %d distinct colours: the plot looks empty", goodput, len(seen))
		}
	}
	one := sweepFixture(false)
	one.Points = one.Points[:1]
	if err := one.WritePlot(&bytes.Buffer{}); err == nil {
		t.Error("a one-point curve plotted")
	}
}

func TestSweepText(t *testing.T) {
	sw := sweepFixture(true)
	var b strings.Builder
	if err := sw.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"sweep of 5 request rates", "goodput: completed requests per second that met ttft<=1000ms itl<=85ms"} {
		if !strings.Contains(out, want) {
			t.Errorf("text lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "prompts at rate"); n != 5 {
		t.Errorf("%d point reports in the text, want 5", n)
	}
	raw, err := json.Marshal(sw)
	if err != nil || !strings.Contains(string(raw), `"rates":[2,4,8,16,32]`) || strings.Count(string(raw), `"request_goodput"`) != 5 {
		t.Errorf("JSON %s: %v", raw, err)
	}
}

func TestParseRates(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []float64
		err  string
	}{
		{"4", []float64{4}, ""},
		{"2,4,8,16,32", []float64{2, 4, 8, 16, 32}, ""},
		{" 0.5, 1 ", []float64{0.5, 1}, ""},
		{"inf", nil, ""},
		{"2,inf", nil, "finite"},
		{"2,2", nil, "twice"},
		{"2,,4", nil, "request rate"},
		{"-1", nil, "request rate"},
	} {
		got, err := ParseRates(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: error %v, want one mentioning %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || (tc.want != nil && !slices.Equal(got, tc.want)) || (tc.want == nil && len(got) != 1) {
			t.Errorf("%q = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestNiceTicks(t *testing.T) {
	for _, tc := range []struct {
		lo, hi float64
		want   []string
	}{
		{0, 300, []string{"0", "50", "100", "150", "200", "250", "300"}},
		{0, 1.35, []string{"0.0", "0.2", "0.4", "0.6", "0.8", "1.0", "1.2"}},
		{0, 12000, []string{"0", "2000", "4000", "6000", "8000", "10000", "12000"}},
		{0, 8, []string{"0", "1", "2", "3", "4", "5", "6", "7", "8"}},
	} {
		var got []string
		for _, tk := range (niceTicks{}).Ticks(tc.lo, tc.hi) {
			if tk.Label != "" {
				got = append(got, tk.Label)
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("ticks of [%g, %g]: %v, want %v", tc.lo, tc.hi, got, tc.want)
		}
	}
}
