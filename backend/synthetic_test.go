package backend

import (
	"math"
	"testing"
)

// TestSyntheticNormal checks the synthetic distribution: deterministic,
// different streams for different seeds, unit variance, zero mean, within
// the Irwin-Hall support, and SyntheticValue's scaling.
func TestSyntheticNormal(t *testing.T) {
	const n = 1 << 20
	var sum, sq float64
	same := 0
	for i := int64(0); i < n; i++ {
		z := SyntheticNormal(42, i)
		if z != SyntheticNormal(42, i) {
			t.Fatalf("element %d: not deterministic", i)
		}
		if math.Abs(float64(z)) > 2*math.Sqrt(3)+1e-6 {
			t.Fatalf("element %d: %v outside the support +-2*sqrt(3)", i, z)
		}
		if SyntheticNormal(43, i) == z {
			same++
		}
		sum += float64(z)
		sq += float64(z) * float64(z)
	}
	mean, variance := sum/n, sq/n-(sum/n)*(sum/n)
	if math.Abs(mean) > 0.005 || math.Abs(variance-1) > 0.01 {
		t.Errorf("mean %.4f variance %.4f, want 0 and 1", mean, variance)
	}
	// Seeds 42 and 43 agree only by chance (about 1/300 of values collide
	// in a distribution over ~2^18 levels concentrated near 0).
	if same > n/50 {
		t.Errorf("seeds 42 and 43 agree on %d of %d elements", same, n)
	}
	for _, tc := range []struct {
		mean, std float32
	}{{0, 1}, {1, 0.05}, {0, 0.02}, {-3, 7}} {
		for i := int64(0); i < 1000; i++ {
			// Two float32 roundings away from the exact value.
			z := float64(SyntheticNormal(9, i))
			want := float64(tc.mean) + float64(tc.std)*z
			tol := 2 * math.Pow(2, -24) * (math.Abs(float64(tc.mean)) + math.Abs(float64(tc.std)*z))
			if got := float64(SyntheticValue(9, i, tc.mean, tc.std)); math.Abs(got-want) > tol {
				t.Fatalf("SyntheticValue(9, %d, %v, %v) = %v, want %v (+-%g)", i, tc.mean, tc.std, got, want, tol)
			}
		}
	}
}
