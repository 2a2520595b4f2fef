package cuda

import (
	"fmt"

	"github.com/trigon-llm/trigon/backend"
)

// CheckKVSpec implements backend.KVSpecChecker: the kernels read and
// write only unquantized caches, so the runner refuses a quantized one
// when it loads instead of failing every step. The CPU backend runs
// every format (it is the reference the kernels will be checked
// against).
func (b *Backend) CheckKVSpec(spec backend.KVSpec) error {
	if spec.Scales != backend.KVNoScales {
		return fmt.Errorf("cuda: no kernels for the %s KV cache (--kv-cache-dtype %s) yet: use --kv-cache-dtype auto or bf16, or --device cpu", spec.Name(), spec.Name())
	}
	return nil
}
