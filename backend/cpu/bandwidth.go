package cpu

import (
	"fmt"
	"time"
)

// copyProbeMaxBytes caps the buffer MeasureCopyBandwidth copies: far past
// any CPU cache, and small enough for a test machine.
const copyProbeMaxBytes = 256 << 20

// MeasureCopyBandwidth times copies of min(n, 256 MiB) bytes between two
// host buffers, split over the backend's threads as its ops are, and
// returns the best rate of five, counting bytes read plus bytes written
// (the convention of the CUDA backend's probe). It is the ceiling `bench
// latency` holds CPU decode steps against (bench.BandwidthProber).
func (b *Backend) MeasureCopyBandwidth(n int) (float64, error) {
	if n < 1<<20 {
		return 0, fmt.Errorf("cpu: copy bandwidth: %d bytes is too small to time", n)
	}
	n = min(n, copyProbeMaxBytes)
	src, dst := make([]byte, n), make([]byte, n)
	for i := range src { // touch every page, so no trial pays for faults
		src[i] = byte(i)
	}
	copy(dst, src)
	const grain = 1 << 20
	var best float64
	for range 5 {
		start := time.Now()
		b.parallel((n+grain-1)/grain, 1, func(_, lo, hi int) {
			copy(dst[lo*grain:min(n, hi*grain)], src[lo*grain:min(n, hi*grain)])
		})
		if s := time.Since(start).Seconds(); s > 0 {
			best = max(best, 2*float64(n)/s)
		}
	}
	if best == 0 {
		return 0, fmt.Errorf("cpu: copy bandwidth: no measurable time for %d bytes", n)
	}
	return best, nil
}
