// Package models holds the default model that ships inside the trigon
// binary, so `trigon run` works on a fresh machine with no download: a small
// Llama-architecture model trained on Go source (docs/default-model.md).
package models

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
)

// DefaultFile is the default model's file name.
const DefaultFile = "trigon-go.q8_0.gguf"

// Default returns the embedded GGUF bytes (read-only). Built with the
// external_default_model tag (models_external.go) it reads them from the
// repository's file instead, and returns nil if that fails.
func Default() []byte { b, _ := defaultBytes(); return b }

// DefaultPath writes the embedded model to the user cache directory (once,
// atomically, named by its hash) and returns the path, so the model is
// opened through the same mmap path as any other file.
func DefaultPath() (string, error) {
	defaultGGUF, err := defaultBytes()
	if err != nil {
		return "", fmt.Errorf("default model: %w", err)
	}
	sum := sha256.Sum256(defaultGGUF)
	dir, err := os.UserCacheDir()
	if err != nil {
		dir = os.TempDir()
	}
	dir = filepath.Join(dir, "trigon", "models")
	path := filepath.Join(dir, hex.EncodeToString(sum[:8])+"-"+DefaultFile)
	if b, err := os.ReadFile(path); err == nil && bytes.Equal(b, defaultGGUF) {
		return path, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("default model: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".default-*.gguf")
	if err != nil {
		return "", fmt.Errorf("default model: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(defaultGGUF); err != nil {
		tmp.Close()
		return "", fmt.Errorf("default model: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("default model: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return "", fmt.Errorf("default model: %w", err)
	}
	return path, nil
}
