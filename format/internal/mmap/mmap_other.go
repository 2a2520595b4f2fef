//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package mmap

import (
	"fmt"
	"io"
	"os"
)

// mapFile reads the whole file: the fallback where mmap is not wired up.
func mapFile(f *os.File, size int) ([]byte, bool, error) {
	data := make([]byte, size)
	if _, err := io.ReadFull(f, data); err != nil {
		return nil, false, fmt.Errorf("read: %w", err)
	}
	return data, false, nil
}

func unmap([]byte) error { return nil }
