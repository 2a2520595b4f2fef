package cuda

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Kernel cache files hold one compiled module:
//
//	+----------+-------------+------------------+----------------+
//	| magic 8B | length u64  | sha256(payload)  | payload        |
//	| TRGNKRN1 | little end. | 32 bytes         | CUBIN or PTX   |
//	+----------+-------------+------------------+----------------+
//
// named <hex sha256 of (sources, options, arch, NVRTC version)>.bin. A file
// that fails any check is treated as absent and overwritten.
const (
	cacheMagic  = "TRGNKRN1"
	cacheHeader = 8 + 8 + 32
)

// diskCache is the on-disk kernel cache. A zero dir disables it.
type diskCache struct{ dir string }

// defaultCacheDir is os.UserCacheDir()/trigon/kernels, or "" when the user
// has no cache directory (the cache is then off).
func defaultCacheDir() string {
	d, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(d, "trigon", "kernels")
}

// cacheKey hashes everything that determines a compiled module.
func cacheKey(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		var n [8]byte
		binary.LittleEndian.PutUint64(n[:], uint64(len(p)))
		h.Write(n[:])
		h.Write([]byte(p))
	}
	return hex.EncodeToString(h.Sum(nil))
}

func (c diskCache) path(key string) string { return filepath.Join(c.dir, key+".bin") }

// errCorrupt marks a cache entry that exists but fails validation.
var errCorrupt = errors.New("corrupt kernel cache entry")

// load returns the payload stored under key; os.ErrNotExist when absent,
// errCorrupt when present but damaged.
func (c diskCache) load(key string) ([]byte, error) {
	if c.dir == "" {
		return nil, os.ErrNotExist
	}
	b, err := os.ReadFile(c.path(key))
	if err != nil {
		return nil, err
	}
	if len(b) < cacheHeader || string(b[:8]) != cacheMagic {
		return nil, fmt.Errorf("%s: bad header: %w", c.path(key), errCorrupt)
	}
	n := binary.LittleEndian.Uint64(b[8:16])
	if n != uint64(len(b)-cacheHeader) {
		return nil, fmt.Errorf("%s: length %d, file holds %d: %w", c.path(key), n, len(b)-cacheHeader, errCorrupt)
	}
	payload := b[cacheHeader:]
	sum := sha256.Sum256(payload)
	if !bytes.Equal(sum[:], b[16:48]) {
		return nil, fmt.Errorf("%s: checksum mismatch: %w", c.path(key), errCorrupt)
	}
	return payload, nil
}

// store writes payload under key atomically: a temporary file in the same
// directory, synced, then renamed over the entry, so a crash or a
// concurrent process never leaves a half-written entry under the key.
func (c diskCache) store(key string, payload []byte) error {
	if c.dir == "" {
		return nil
	}
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return fmt.Errorf("kernel cache: %w", err)
	}
	f, err := os.CreateTemp(c.dir, key+".tmp*")
	if err != nil {
		return fmt.Errorf("kernel cache: %w", err)
	}
	tmp := f.Name()
	var hdr [cacheHeader]byte
	copy(hdr[:8], cacheMagic)
	binary.LittleEndian.PutUint64(hdr[8:16], uint64(len(payload)))
	sum := sha256.Sum256(payload)
	copy(hdr[16:], sum[:])
	_, err = f.Write(hdr[:])
	if err == nil {
		_, err = f.Write(payload)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, c.path(key))
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("kernel cache: write %s: %w", c.path(key), err)
	}
	return nil
}
