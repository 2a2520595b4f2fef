package cpu

import "golang.org/x/sys/unix"

// adviseHuge asks the kernel to back b (whole huge pages) by transparent
// huge pages. An error (a kernel without THP, or THP off) leaves b on
// small pages, which only costs speed.
func adviseHuge(b []byte) { _ = unix.Madvise(b, unix.MADV_HUGEPAGE) }
