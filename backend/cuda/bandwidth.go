package cuda

import (
	"fmt"
	"math"
	"unsafe"
)

// MeasureCopyBandwidth times device-to-device copies of n bytes with CUDA
// events and returns the best rate of several, counting bytes read plus
// bytes written (as a copy's bandwidth is usually quoted). It is the
// memory-bandwidth ceiling benchmarks compare decode steps with
// (bench.BandwidthProber).
func (b *Backend) MeasureCopyBandwidth(n int) (float64, error) {
	if n < 1<<20 {
		return 0, fmt.Errorf("cuda: copy bandwidth: %d bytes is too small to time", n)
	}
	var best float64
	err := b.call(func() error {
		d := b.d
		src, err := b.pool.get(n)
		if err != nil {
			return err
		}
		defer b.pool.put(src)
		dst, err := b.pool.get(n)
		if err != nil {
			return err
		}
		defer b.pool.put(dst)
		var start, stop uintptr
		if err := d.check("cuEventCreate", d.call(d.cuEventCreate, uintptr(unsafe.Pointer(&start)), 0)); err != nil {
			return err
		}
		defer d.call(d.cuEventDestroy, start)
		if err := d.check("cuEventCreate", d.call(d.cuEventCreate, uintptr(unsafe.Pointer(&stop)), 0)); err != nil {
			return err
		}
		defer d.call(d.cuEventDestroy, stop)
		copyOnce := func() error {
			return d.check("cuMemcpyDtoDAsync", d.call(d.cuMemcpyDtoDAsync, uintptr(dst), uintptr(src), uintptr(n), b.stream))
		}
		if err := copyOnce(); err != nil { // warm-up
			return err
		}
		const reps = 10
		for range 3 {
			if err := d.check("cuEventRecord", d.call(d.cuEventRecord, start, b.stream)); err != nil {
				return err
			}
			for range reps {
				if err := copyOnce(); err != nil {
					return err
				}
			}
			if err := d.check("cuEventRecord", d.call(d.cuEventRecord, stop, b.stream)); err != nil {
				return err
			}
			if err := d.check("cuEventSynchronize", d.call(d.cuEventSynchronize, stop)); err != nil {
				return err
			}
			var ms float32
			if err := d.check("cuEventElapsedTime", d.call(d.cuEventElapsedTime, uintptr(unsafe.Pointer(&ms)), start, stop)); err != nil {
				return err
			}
			if ms > 0 {
				best = math.Max(best, 2*float64(n)*reps/(float64(ms)/1000))
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("cuda: copy bandwidth: %w", err)
	}
	return best, nil
}

// MemoryInfo reports the device's free and total memory in bytes
// (cuMemGetInfo), plus what trigon's own pool holds cached for reuse,
// which is free to trigon though not to the driver.
func (b *Backend) MemoryInfo() (free, total int64, err error) {
	err = b.call(func() error {
		var f, t uint64
		if err := b.d.check("cuMemGetInfo", b.d.call(b.d.cuMemGetInfo, uintptr(unsafe.Pointer(&f)), uintptr(unsafe.Pointer(&t)))); err != nil {
			return err
		}
		free, total = int64(f)+b.pool.cached, int64(t)
		return nil
	})
	return free, total, err
}

// ProfilerStart and ProfilerStop bracket the work a profiler started with
// collection off (`ncu --profile-from-start off`) records; outside a
// profiler they do nothing. Queued work before the call is not included:
// both wait for the stream first.
func (b *Backend) ProfilerStart() error { return b.profiler("cuProfilerStart", b.d.cuProfilerStart) }

// ProfilerStop: see ProfilerStart.
func (b *Backend) ProfilerStop() error { return b.profiler("cuProfilerStop", b.d.cuProfilerStop) }

func (b *Backend) profiler(name string, fn uintptr) error {
	if err := b.Sync(); err != nil {
		return err
	}
	return b.call(func() error { return b.d.check(name, b.d.call(fn)) })
}
