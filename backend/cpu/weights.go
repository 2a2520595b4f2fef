package cpu

import "unsafe"

// A decode step reads every weight once, a stream far larger than the
// caches' reach on a big model and still most of L3's on a small one. On
// 4 KiB pages that stream walks the page tables every 4 KiB and stops the
// hardware prefetchers at each page boundary, so one core reads it well
// below what it can load. Upload therefore copies weights of at least
// hugeMinBytes into runs of memory aligned to hugePageBytes that the
// kernel is asked to back by transparent huge pages (adviseHuge; a no-op
// where the OS has no such request, and a hint the kernel may refuse):
// the weights then cost their size in anonymous memory, while the file
// pages they were copied from stay reclaimable page cache.

// hugePageBytes is the x86-64 and arm64 (4 KiB granule) transparent
// huge page size.
const hugePageBytes = 2 << 20

// hugeMinBytes is the smallest weight worth copying: norm vectors and
// biases are read once a layer from cache and stay where they are.
const hugeMinBytes = 64 << 10

// weightRunBytes is the size of the runs small weights are packed into;
// a weight of at least half of it gets a run of its own.
const weightRunBytes = 32 << 20

// weightArena hands out the memory Upload copies weights into. Its runs
// are Go memory: a run is freed once no tensor (view or base) holds a
// slice of it, so freeing tensors needs no bookkeeping here.
type weightArena struct {
	rest []byte // the unused tail of the current run
}

// alloc returns n bytes, 64-byte aligned, from a huge-page run.
func (a *weightArena) alloc(n int) []byte {
	padded := (n + 63) &^ 63
	if padded >= weightRunBytes/2 {
		return hugeRun(n)[:n:n]
	}
	if padded > len(a.rest) {
		a.rest = hugeRun(weightRunBytes)
	}
	p := a.rest[:n:n]
	a.rest = a.rest[padded:]
	return p
}

// hugeRun returns n bytes rounded up to whole huge pages, starting on a
// huge-page boundary, advised for transparent huge pages before anything
// touches them (fresh Go memory is not yet faulted in, so the first
// write can map each huge page at once).
func hugeRun(n int) []byte {
	size := (n + hugePageBytes - 1) &^ (hugePageBytes - 1)
	buf := alignedBytes(size + hugePageBytes)
	off := int(-uintptr(unsafe.Pointer(unsafe.SliceData(buf))) & (hugePageBytes - 1))
	run := buf[off : off+size : off+size]
	adviseHuge(run)
	return run
}
