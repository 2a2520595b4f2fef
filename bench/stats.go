package bench

import (
	"math"
	"slices"
)

// Summary describes a sample of durations or sizes. Percentiles use linear
// interpolation between order statistics (numpy's default, Python's
// statistics.quantiles method="inclusive"), so p50 of an even count is the
// mean of the middle two.
type Summary struct {
	Count int     `json:"count"`
	Mean  float64 `json:"mean"`
	Min   float64 `json:"min"`
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
	P99   float64 `json:"p99"`
	Max   float64 `json:"max"`
}

// Summarize returns the summary of xs (the zero Summary when xs is empty).
// xs is not modified.
func Summarize(xs []float64) Summary {
	if len(xs) == 0 {
		return Summary{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	sum := 0.0
	for _, x := range s {
		sum += x
	}
	return Summary{
		Count: len(s), Mean: sum / float64(len(s)), Min: s[0], Max: s[len(s)-1],
		P50: Percentile(s, 50), P90: Percentile(s, 90), P99: Percentile(s, 99),
	}
}

// Percentile returns the p-th percentile (0..100) of sorted, which must be
// in ascending order: the value at rank p/100*(n-1), interpolated between
// its neighbours. NaN for an empty slice or a NaN p.
func Percentile(sorted []float64, p float64) float64 {
	n := len(sorted)
	if n == 0 || math.IsNaN(p) {
		return math.NaN()
	}
	p = min(max(p, 0), 100)
	rank := p / 100 * float64(n-1)
	lo := int(math.Floor(rank))
	if lo >= n-1 {
		return sorted[n-1]
	}
	frac := rank - float64(lo)
	return sorted[lo] + frac*(sorted[lo+1]-sorted[lo])
}

// scaled returns s with every value multiplied by k (unit conversions).
func (s Summary) scaled(k float64) Summary {
	s.Mean *= k
	s.Min *= k
	s.P50 *= k
	s.P90 *= k
	s.P99 *= k
	s.Max *= k
	return s
}
