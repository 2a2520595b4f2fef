package mmap

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

func TestOpen(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, size := range []int{0, 1, 4095, 4096, 4097, 1 << 20} {
		t.Run("", func(t *testing.T) {
			want := make([]byte, size)
			for i := range want {
				want[i] = byte(rng.Uint32())
			}
			path := filepath.Join(t.TempDir(), "f")
			if err := os.WriteFile(path, want, 0o644); err != nil {
				t.Fatal(err)
			}
			m, err := Open(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(m.Bytes(), want) {
				t.Fatalf("size %d: mapped bytes differ from the file", size)
			}
			if err := m.Close(); err != nil {
				t.Fatal(err)
			}
			if m.Bytes() != nil {
				t.Fatal("Bytes after Close is not nil")
			}
			if err := m.Close(); err != nil {
				t.Fatalf("second Close: %v", err)
			}
		})
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	for name, path := range map[string]string{
		"missing":   filepath.Join(dir, "nope"),
		"directory": dir,
	} {
		t.Run(name, func(t *testing.T) {
			if m, err := Open(path); err == nil {
				m.Close()
				t.Fatalf("Open(%s) succeeded", path)
			}
		})
	}
}
