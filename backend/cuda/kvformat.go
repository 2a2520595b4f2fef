package cuda

import (
	"fmt"

	"github.com/trigon-llm/trigon/backend"
)

// The KV formats the kernels take (kernels/kv.cuh): unquantized caches,
// FP8 e4m3 with a scale per KV head (static from the checkpoint, or
// dynamic: set by the first tokens written, see rope_store_kv's scan
// pass), symmetric INT8 with an F16 scale per token and channel group,
// and INT4 in the KIVI manner (K per channel over a block, V per token
// and channel group, asymmetric, with a bf16 window; backend.KVSpec).
// rope_store_kv quantizes on write (for INT4 it writes the window and V,
// and kivi_seal_k then quantizes the K of the blocks the launch filled);
// attn_decode_mma and attn_prefill dequantize the tiles they read before
// the same tensor-core arithmetic as a BF16 cache. The other kernels (the
// CUDA-core decode kernel, the wgmma prefill kernel, the fused QKV+RoPE
// GEMV) read and write BF16 caches only, and the planners do not pick
// them for quantized ones.

// fp8ScanHeads is the most KV heads an FP8 cache's scan pass takes: the
// backend's scan buffer holds two maxima a head and a counter.
const fp8ScanHeads = 1024

// CheckKVSpec implements backend.KVSpecChecker: the runner asks it before
// it allocates a cache, so a format the kernels cannot run is refused at
// load instead of failing every step. The CPU backend runs every format
// (it is the reference the kernels are checked against). The quantized
// formats need blocks of a multiple of 16 tokens (the decode kernel's
// tile, which lies inside one block).
func (b *Backend) CheckKVSpec(spec backend.KVSpec) error {
	switch spec.Scales {
	case backend.KVNoScales:
		return nil
	case backend.KVScalePerHead, backend.KVScaleGroups, backend.KVScaleKIVI:
		if spec.BlockSize%decodeTile != 0 {
			return fmt.Errorf("cuda: the %s KV cache needs a block size that is a multiple of %d, not %d", spec.Name(), decodeTile, spec.BlockSize)
		}
		if spec.Scales == backend.KVScaleKIVI && spec.Window > maxInt32 {
			return fmt.Errorf("cuda: the int4 KV cache's window of %d tokens exceeds int32", spec.Window)
		}
		return nil
	}
	return fmt.Errorf("cuda: no kernels for the %s KV cache (--kv-cache-dtype %s): use --kv-cache-dtype auto, bf16, fp8, int8 or int4, or --device cpu", spec.Name(), spec.Name())
}

// kvSide is a cache's device tensors besides its pools (backend.KVAux),
// as the kernels take them: nil where the format has none.
type kvSide struct {
	ksc, vsc         *tensor // scales (and zero points)
	kwin, vwin, wmap *tensor // KVScaleKIVI: the bf16 window pools and the window map
	numWin, window   int     // KVScaleKIVI: window blocks; the spec's window in tokens
}

// checked is the caller's aux with s's tensors in place of those kvSides
// took, for the operand checks (backend.KVSpec.CheckPools): a side tensor
// the format does not have stays as the caller set it, which they refuse.
func (s kvSide) checked(aux backend.KVAux) backend.KVAux {
	aux.KScale, aux.VScale = orNil(s.ksc), orNil(s.vsc)
	if s.wmap != nil {
		aux.KWindow, aux.VWindow, aux.WindowMap = s.kwin, s.vwin, s.wmap
	}
	return aux
}

// winArgs are the window arguments (kv.cuh's KV_WIN_PARAMS) of a kernel
// over an int4 cache: none for the other formats, whose kernels take none.
func (s kvSide) winArgs() []uint64 {
	if s.wmap == nil {
		return nil
	}
	return []uint64{s.kwin.ptr, s.vwin.ptr, s.wmap.ptr, i32(s.numWin), i32(s.window)}
}

// kvSides returns the device tensors of a cache's side tensors for op
// (aux's, those the format names; nil for an unquantized spec); the
// operand checks (backend.KVSpec.CheckPools, on kvSide.checked) then hold
// them to the spec's shapes. A format CheckKVSpec refuses is refused here
// too.
func (b *Backend) kvSides(op string, spec backend.KVSpec, aux backend.KVAux) (kvSide, error) {
	var s kvSide
	if spec.Scales == backend.KVNoScales {
		return s, nil
	}
	if err := b.CheckKVSpec(spec); err != nil {
		return s, backend.ShapeError("cuda: "+op, "KV", "%v", err)
	}
	var err error
	if s.ksc, err = b.tensorOf(op, "KScale", aux.KScale); err != nil {
		return s, err
	}
	if s.vsc, err = b.tensorOf(op, "VScale", aux.VScale); err != nil {
		return s, err
	}
	if spec.Scales != backend.KVScaleKIVI {
		return s, nil
	}
	if s.kwin, err = b.tensorOf(op, "KWindow", aux.KWindow); err != nil {
		return s, err
	}
	if s.vwin, err = b.tensorOf(op, "VWindow", aux.VWindow); err != nil {
		return s, err
	}
	if s.wmap, err = b.tensorOf(op, "WindowMap", aux.WindowMap); err != nil {
		return s, err
	}
	// The shapes are CheckPools', after this; the kernels index the window
	// pool in int32 block ids.
	if len(s.kwin.shape) > 0 {
		s.numWin = s.kwin.shape[0]
	}
	if s.numWin > maxInt32 {
		return s, backend.ShapeError("cuda: "+op, "KWindow", "%v: more window blocks than int32 holds", s.kwin.shape)
	}
	s.window = spec.Window
	return s, nil
}
