//go:build !windows

package cuda

import "github.com/ebitengine/purego"

// dlopen loads a shared library for its symbols.
func dlopen(path string) (uintptr, error) {
	return purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
}

// dlsym looks a symbol up in a library dlopen loaded.
func dlsym(h uintptr, name string) (uintptr, error) { return purego.Dlsym(h, name) }
