package cuda

import (
	"fmt"

	"github.com/trigon-llm/trigon/backend"
)

// The KV formats the kernels take (kernels/kv.cuh): unquantized caches,
// FP8 e4m3 with a scale per KV head (static from the checkpoint, or
// dynamic: set by the first tokens written, see rope_store_kv's scan
// pass) and symmetric INT8 with an F16 scale per token and channel group.
// rope_store_kv quantizes on write; attn_decode_mma and attn_prefill
// dequantize the tiles they read to BF16 before the same tensor-core
// arithmetic as a BF16 cache. The other kernels (the CUDA-core decode
// kernel, the wgmma prefill kernel, the fused QKV+RoPE GEMV) read and
// write BF16 caches only, and the planners do not pick them for
// quantized ones.

// fp8ScanHeads is the most KV heads an FP8 cache's scan pass takes: the
// backend's scan buffer holds two maxima a head and a counter.
const fp8ScanHeads = 1024

// CheckKVSpec implements backend.KVSpecChecker: the runner asks it before
// it allocates a cache, so a format the kernels cannot run is refused at
// load instead of failing every step. The CPU backend runs every format
// (it is the reference the kernels are checked against).
func (b *Backend) CheckKVSpec(spec backend.KVSpec) error {
	switch spec.Scales {
	case backend.KVNoScales:
		return nil
	case backend.KVScalePerHead, backend.KVScaleGroups:
		if spec.BlockSize%decodeTile != 0 {
			return fmt.Errorf("cuda: the %s KV cache needs a block size that is a multiple of %d, not %d", spec.Name(), decodeTile, spec.BlockSize)
		}
		return nil
	}
	return fmt.Errorf("cuda: no kernels for the %s KV cache (--kv-cache-dtype %s) yet: use --kv-cache-dtype auto, bf16, fp8 or int8, or --device cpu", spec.Name(), spec.Name())
}

// kvScales returns the device tensors of a cache's scales (aux's KScale
// and VScale) for op, nil for an unquantized spec; the operand checks
// (backend.KVSpec.CheckPools) then hold them to the spec's shapes. A
// format CheckKVSpec refuses is refused here too.
func (b *Backend) kvScales(op string, spec backend.KVSpec, aux backend.KVAux) (k, v *tensor, err error) {
	if spec.Scales == backend.KVNoScales {
		return nil, nil, nil
	}
	if err := b.CheckKVSpec(spec); err != nil {
		return nil, nil, backend.ShapeError("cuda: "+op, "KV", "%v", err)
	}
	if k, err = b.tensorOf(op, "KScale", aux.KScale); err != nil {
		return nil, nil, err
	}
	if v, err = b.tensorOf(op, "VScale", aux.VScale); err != nil {
		return nil, nil, err
	}
	return k, v, nil
}
