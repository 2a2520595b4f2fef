//go:build external_default_model

package models

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

// A binary built with the external_default_model tag leaves the 12.7 MB
// model out and reads it from DefaultModelEnv's path, or from
// models/default/ under the working directory: tools/gpu/build.sh builds
// the GPU machine's trigon so, because the device tool carries the
// repository (which holds the file) and the binaries within 64 MiB.

// DefaultModelEnv names the file an external_default_model binary reads.
const DefaultModelEnv = "TRIGON_DEFAULT_MODEL_FILE"

var (
	loadOnce  sync.Once
	loaded    []byte
	loadedErr error
)

func defaultBytes() ([]byte, error) {
	loadOnce.Do(func() {
		path := os.Getenv(DefaultModelEnv)
		if path == "" {
			path = filepath.Join("models", "default", DefaultFile)
		}
		if loaded, loadedErr = os.ReadFile(path); loadedErr != nil {
			loadedErr = fmt.Errorf("this binary was built without the embedded model (tag external_default_model): %w", loadedErr)
		}
	})
	return loaded, loadedErr
}
