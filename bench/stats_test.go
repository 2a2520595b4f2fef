package bench

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestPercentileKnown compares with Python's statistics.quantiles(data,
// n=100, method="inclusive"), the same definition as numpy's default.
func TestPercentileKnown(t *testing.T) {
	for _, tc := range []struct {
		name          string
		data          []float64
		p50, p90, p99 float64
	}{
		{"odd count", []float64{15, 20, 35, 40, 50}, 35, 46, 49.6},
		{"even count unsorted", []float64{3.5, 1, 2, 10}, 2.75, 8.05, 9.805},
		{"single", []float64{7}, 7, 7, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := Summarize(tc.data)
			for _, c := range []struct {
				name      string
				got, want float64
			}{{"p50", s.P50, tc.p50}, {"p90", s.P90, tc.p90}, {"p99", s.P99, tc.p99}} {
				if math.Abs(c.got-c.want) > 1e-9 {
					t.Errorf("%s = %g, want %g", c.name, c.got, c.want)
				}
			}
		})
	}
	if !math.IsNaN(Percentile(nil, 50)) || !math.IsNaN(Percentile([]float64{1}, math.NaN())) {
		t.Error("Percentile of nothing (or at NaN) is not NaN")
	}
	if s := Summarize(nil); s.Count != 0 || s.Mean != 0 {
		t.Errorf("Summarize(nil) = %+v", s)
	}
}

// TestPercentileProperties checks, on random samples, what linear
// interpolation between order statistics implies: exact ranks give the
// order statistic, results are monotone in p and bounded by the
// neighbouring order statistics, and the input order does not matter.
func TestPercentileProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 50 {
		n := 1 + rng.IntN(300)
		data := make([]float64, n)
		for i := range data {
			data[i] = rng.NormFloat64()*10 + float64(rng.IntN(3))
		}
		orig := slices.Clone(data)
		s := Summarize(data)
		if !slices.Equal(data, orig) {
			t.Fatal("Summarize modified its input")
		}
		sorted := slices.Clone(data)
		slices.Sort(sorted)
		for i := range n {
			if n == 1 {
				break
			}
			p := 100 * float64(i) / float64(n-1)
			if got := Percentile(sorted, p); math.Abs(got-sorted[i]) > 1e-9*(1+math.Abs(sorted[i])) {
				t.Fatalf("trial %d: p%g = %g, want order statistic %d = %g", trial, p, got, i, sorted[i])
			}
		}
		prev := math.Inf(-1)
		for p := 0.0; p <= 100; p += 0.5 {
			v := Percentile(sorted, p)
			if v < prev {
				t.Fatalf("trial %d: p%g = %g < previous %g", trial, p, v, prev)
			}
			r := p / 100 * float64(n-1)
			lo, hi := sorted[int(math.Floor(r))], sorted[int(math.Ceil(r))]
			if v < lo || v > hi {
				t.Fatalf("trial %d: p%g = %g outside its neighbours [%g, %g]", trial, p, v, lo, hi)
			}
			prev = v
		}
		var sum float64
		for _, x := range data {
			sum += x
		}
		if math.Abs(s.Mean-sum/float64(n)) > 1e-9 || s.Min != sorted[0] || s.Max != sorted[n-1] || s.Count != n {
			t.Fatalf("trial %d: summary %+v disagrees with the data", trial, s)
		}
		if !(s.Min <= s.P50 && s.P50 <= s.P90 && s.P90 <= s.P99 && s.P99 <= s.Max) {
			t.Fatalf("trial %d: summary not ordered: %+v", trial, s)
		}
		rng.Shuffle(n, func(i, j int) { data[i], data[j] = data[j], data[i] })
		if Summarize(data) != s {
			t.Fatalf("trial %d: summary depends on the input order", trial)
		}
	}
}

func TestParseLengthDist(t *testing.T) {
	for _, tc := range []struct {
		in, want string // want "" means an error
	}{
		{"512", "fixed:512"},
		{"fixed:64", "fixed:64"},
		{" Uniform:128-1024 ", "uniform:128-1024"},
		{"uniform:5-5", "uniform:5-5"},
		{"normal:512,128", "normal:512,128"},
		{"normal:10,0", "normal:10,0"},
		{"0", ""},
		{"-3", ""},
		{"fixed:abc", ""},
		{"uniform:9-3", ""},
		{"uniform:9", ""},
		{"uniform:0-3", ""},
		{"normal:512", ""},
		{"normal:0.5,1", ""},
		{"normal:100,-1", ""},
		{"normal:NaN,1", ""},
		{"zipf:3", ""},
		{"fixed:2000000", ""},
	} {
		t.Run(tc.in, func(t *testing.T) {
			d, err := ParseLengthDist(tc.in)
			if tc.want == "" {
				if err == nil {
					t.Errorf("accepted as %s", d)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d.String() != tc.want {
				t.Errorf("parsed as %s, want %s", d, tc.want)
			}
			again, err := ParseLengthDist(d.String())
			if err != nil || again != d {
				t.Errorf("String() %s does not parse back: %v", d, err)
			}
		})
	}
}

// TestLengthDistSampling checks each kind's range and moments on 20000
// draws, and that a seed fixes the sequence.
func TestLengthDistSampling(t *testing.T) {
	const n = 20000
	for _, tc := range []struct {
		spec      string
		mean, std float64
		lo, hi    int
	}{
		{"fixed:77", 77, 0, 77, 77},
		{"uniform:10-20", 15, math.Sqrt((11*11 - 1) / 12.0), 10, 20},
		{"normal:500,50", 500, 50, 1, MaxLength},
		{"normal:3,10", -1, -1, 1, MaxLength}, // clamped: only the range is checked
	} {
		t.Run(tc.spec, func(t *testing.T) {
			d, err := ParseLengthDist(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(5, 6))
			var sum, sq float64
			seen := map[int]bool{}
			xs := make([]int, n)
			for i := range xs {
				x := d.Sample(rng)
				if x < tc.lo || x > tc.hi || x > d.Max() {
					t.Fatalf("sample %d outside [%d, %d]", x, tc.lo, tc.hi)
				}
				xs[i] = x
				seen[x] = true
				sum += float64(x)
			}
			mean := sum / n
			for _, x := range xs {
				sq += (float64(x) - mean) * (float64(x) - mean)
			}
			std := math.Sqrt(sq / n)
			if tc.mean >= 0 {
				if math.Abs(mean-tc.mean) > 5*tc.std/math.Sqrt(n)+1e-9 {
					t.Errorf("mean %g, want %g", mean, tc.mean)
				}
				if math.Abs(std-tc.std) > 0.05*tc.std+1e-9 {
					t.Errorf("stddev %g, want %g", std, tc.std)
				}
			}
			if tc.spec == "uniform:10-20" && len(seen) != 11 {
				t.Errorf("%d distinct values, want all 11 of 10..20", len(seen))
			}
			rng2 := rand.New(rand.NewPCG(5, 6))
			for i := range 100 {
				if x := d.Sample(rng2); x != xs[i] {
					t.Fatalf("draw %d with the same seed: %d, first time %d", i, x, xs[i])
				}
			}
		})
	}
}

// TestArrivals: Poisson arrivals have exponential gaps of mean 1/rate
// (so about e^-1 of them exceed the mean); an infinite rate sends all at 0.
func TestArrivals(t *testing.T) {
	const n = 20000
	rng := rand.New(rand.NewPCG(9, 9))
	at := arrivals(n, 50, rng)
	if at[0] != 0 || !slices.IsSorted(at) {
		t.Fatal("arrivals do not start at 0 and increase")
	}
	mean := at[n-1].Seconds() / (n - 1)
	if math.Abs(mean-1.0/50) > 0.03/50 {
		t.Errorf("mean gap %g s, want %g", mean, 1.0/50)
	}
	long := 0
	for i := 1; i < n; i++ {
		if (at[i] - at[i-1]).Seconds() > 1.0/50 {
			long++
		}
	}
	if frac := float64(long) / (n - 1); math.Abs(frac-math.Exp(-1)) > 0.015 {
		t.Errorf("%.3f of gaps exceed the mean, want %.3f (exponential)", frac, math.Exp(-1))
	}
	for _, d := range arrivals(10, math.Inf(1), rng) {
		if d != time.Duration(0) {
			t.Fatal("infinite rate: a request not sent at once")
		}
	}
	for _, tc := range []struct {
		in string
		ok bool
	}{{"inf", true}, {"INF", true}, {"2.5", true}, {"0", false}, {"-1", false}, {"abc", false}, {"+Inf", false}} {
		r, err := ParseRate(tc.in)
		if (err == nil) != tc.ok || (tc.ok && !(r > 0)) {
			t.Errorf("ParseRate(%q) = %g, %v", tc.in, r, err)
		}
	}
}
