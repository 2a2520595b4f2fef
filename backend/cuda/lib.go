package cuda

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"unsafe"
)

// libDirs lists the directories searched for CUDA libraries, most specific
// first: an explicit override, the toolkit named by CUDA_HOME, the default
// toolkit location. The dynamic loader's own search (LD_LIBRARY_PATH,
// ld.so.cache) comes last, through the bare names.
func libDirs() []string {
	var dirs []string
	if d := os.Getenv("TRIGON_CUDA_LIB_DIR"); d != "" {
		dirs = append(dirs, d)
	}
	for _, home := range []string{os.Getenv("CUDA_HOME"), os.Getenv("CUDA_PATH"), "/usr/local/cuda"} {
		if home == "" {
			continue
		}
		dirs = append(dirs, filepath.Join(home, "lib64"), filepath.Join(home, "targets", "x86_64-linux", "lib"))
	}
	return dirs
}

// openLib loads the first of names found in libDirs, then by bare name.
// The error lists every attempt so a user can see where we looked.
func openLib(names ...string) (uintptr, string, error) {
	var tried []string
	try := func(path string) (uintptr, bool) {
		h, err := dlopen(path)
		if err != nil {
			tried = append(tried, fmt.Sprintf("%s (%v)", path, err))
			return 0, false
		}
		return h, true
	}
	for _, dir := range libDirs() {
		for _, n := range names {
			p := filepath.Join(dir, n)
			if _, err := os.Stat(p); err != nil {
				continue
			}
			if h, ok := try(p); ok {
				return h, p, nil
			}
		}
	}
	for _, n := range names {
		if h, ok := try(n); ok {
			return h, n, nil
		}
	}
	if len(tried) > 2 {
		tried = append(tried[:2], fmt.Sprintf("%d more", len(tried)-2))
	}
	return 0, "", fmt.Errorf("load %s: not found (set TRIGON_CUDA_LIB_DIR or CUDA_HOME): %s", names[0], strings.Join(tried, "; "))
}

// symbols resolves every name in syms (a map from symbol name to the field
// that receives its address) in library h.
func symbols(h uintptr, lib string, syms map[string]*uintptr) error {
	var missing []string
	for name, dst := range syms {
		p, err := dlsym(h, name)
		if err != nil || p == 0 {
			missing = append(missing, name)
			continue
		}
		*dst = p
	}
	if len(missing) > 0 {
		return fmt.Errorf("%s lacks %s", lib, strings.Join(missing, ", "))
	}
	return nil
}

// goString copies the NUL-terminated C string at p.
func goString(p uintptr) string {
	if p == 0 {
		return ""
	}
	base := (*byte)(cptr(p))
	n := 0
	for n < 1<<16 && *(*byte)(unsafe.Add(unsafe.Pointer(base), n)) != 0 {
		n++
	}
	return string(unsafe.Slice(base, n))
}

// cptr turns an address returned by C into an unsafe.Pointer. The memory
// is C's (or the driver's), never the Go heap, so the GC ignores it; the
// double conversion keeps vet's uintptr check quiet without hiding a real
// Go-heap conversion.
func cptr(p uintptr) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&p)) }

// cString returns s as a NUL-terminated byte slice for C.
func cString(s string) []byte {
	b := make([]byte, len(s)+1)
	copy(b, s)
	return b
}

// errNoGPU is wrapped by Available's errors so callers can tell "no GPU
// here" from a broken installation.
var errNoGPU = errors.New("no usable CUDA device")
