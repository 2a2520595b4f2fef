package cpu

import (
	"math"
	"testing"
)

func TestMeasureCopyBandwidth(t *testing.T) {
	b := New(Options{Threads: 2})
	bw, err := b.MeasureCopyBandwidth(64 << 20)
	if err != nil {
		t.Fatal(err)
	}
	// Any machine that runs the tests copies between 100 MB/s and 10 TB/s.
	if math.IsNaN(bw) || bw < 1e8 || bw > 1e13 {
		t.Fatalf("copy bandwidth %g B/s is implausible", bw)
	}
	if _, err := b.MeasureCopyBandwidth(1000); err == nil {
		t.Error("a 1000-byte probe: no error, want one")
	}
}
