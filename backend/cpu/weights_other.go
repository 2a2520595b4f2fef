//go:build !linux

package cpu

// adviseHuge is a no-op where the OS has no transparent huge page request.
func adviseHuge([]byte) {}
