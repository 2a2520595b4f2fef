// Package mmap maps model files read-only into memory, so that weights of
// many gigabytes are paged in by the kernel on first touch and shared with the
// page cache instead of being copied onto the Go heap.
//
// On platforms without mmap the whole file is read into memory instead; the
// API is the same.
package mmap

import (
	"errors"
	"fmt"
	"math"
	"os"
)

// Mapping is a read-only view of a whole file.
//
// The bytes stay valid until Close. Reading them after Close faults; a file
// truncated by another process while mapped raises SIGBUS on access, as with
// any mapped file.
type Mapping struct {
	data   []byte
	mapped bool // data came from mmap and must be unmapped
}

// Open maps the file at path.
func Open(path string) (*Mapping, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err // an *fs.PathError, naming path
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file", path)
	}
	size := st.Size()
	if size < 0 || uint64(size) > math.MaxInt {
		return nil, fmt.Errorf("%s: size %d does not fit in memory", path, size)
	}
	if size == 0 {
		// mmap of length 0 is an error; an empty mapping is not.
		return &Mapping{}, nil
	}
	data, mapped, err := mapFile(f, int(size))
	if err != nil {
		return nil, fmt.Errorf("map %s: %w", path, err)
	}
	return &Mapping{data: data, mapped: mapped}, nil
}

// Bytes returns the file's contents. Callers must not write to them.
func (m *Mapping) Bytes() []byte { return m.data }

// Close releases the mapping. Further calls do nothing.
func (m *Mapping) Close() error {
	if m == nil || m.data == nil {
		return nil
	}
	data, mapped := m.data, m.mapped
	m.data, m.mapped = nil, false
	if !mapped {
		return nil
	}
	if err := unmap(data); err != nil {
		return errors.Join(errors.New("munmap"), err)
	}
	return nil
}
