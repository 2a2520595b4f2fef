//go:build windows

package cuda

import "golang.org/x/sys/windows"

// dlopen loads a DLL (nvcuda.dll and the toolkit's DLLs would go through
// here; the search names in lib.go are the Linux ones, so on Windows the
// backend reports CUDA as unavailable and trigon runs on the CPU).
func dlopen(path string) (uintptr, error) {
	h, err := windows.LoadLibrary(path)
	return uintptr(h), err
}

// dlsym looks a symbol up in a DLL dlopen loaded.
func dlsym(h uintptr, name string) (uintptr, error) {
	return windows.GetProcAddress(windows.Handle(h), name)
}
