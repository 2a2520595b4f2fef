package runner

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/model"
)

// allocKV allocates every layer's pools and the side tensors the spec
// names (backend.KVSpec): scales, zero points, the KIVI window pool and
// its map. Scales start at 0 ("not set" for FP8, and a zero block's
// decode otherwise) or at the checkpoint's FP8 scales.
func (r *Runner) allocKV() error {
	b, o, spec := r.b, r.opts, r.spec
	shape := spec.PoolShape(o.NumBlocks, o.NumKVHeads, o.HeadDim)
	ks, vs, sdt := spec.ScaleShapes(o.NumBlocks, o.NumKVHeads, o.HeadDim)
	numWin := spec.WindowBlocks(o.MaxSeqs, o.MaxTokens)
	if numWin > 0 {
		r.win = newWindowPool(spec, o.NumBlocks, numWin)
		var err error
		if r.winMap, err = b.Alloc(backend.I32, o.NumBlocks); err != nil {
			return fmt.Errorf("runner: allocate the KV window map: %w", err)
		}
		if err := r.syncWindowMap(); err != nil {
			return err
		}
	}
	for l := 0; l < o.NumLayers; l++ {
		r.kv = append(r.kv, model.LayerKV{Spec: spec})
		lk := &r.kv[l] // Close frees what is set
		ws := []int{numWin, o.NumKVHeads, spec.BlockSize, o.HeadDim}
		for _, a := range []struct {
			what  string
			dst   *backend.Tensor
			dt    backend.DType
			shape []int
		}{
			{"K pool", &lk.K, spec.DType, shape}, {"V pool", &lk.V, spec.DType, shape},
			{"K scales", &lk.Aux.KScale, sdt, ks}, {"V scales", &lk.Aux.VScale, sdt, vs},
			{"K window", &lk.Aux.KWindow, backend.BF16, ws}, {"V window", &lk.Aux.VWindow, backend.BF16, ws},
		} {
			if a.shape == nil || (numWin == 0 && a.dst == &lk.Aux.KWindow) || (numWin == 0 && a.dst == &lk.Aux.VWindow) {
				continue
			}
			t, err := b.Alloc(a.dt, a.shape...)
			if err != nil {
				return fmt.Errorf("runner: allocate %s of layer %d (%d blocks): %w", a.what, l, o.NumBlocks, err)
			}
			*a.dst = t
		}
		lk.Aux.WindowMap = r.winMap
		if ks != nil {
			for _, t := range []backend.Tensor{lk.Aux.KScale, lk.Aux.VScale} {
				if err := zero(b, t); err != nil {
					return fmt.Errorf("runner: KV scales of layer %d: %w", l, err)
				}
			}
		}
		if o.KVScales != nil {
			if err := r.writeFP8Scales(*lk, o.KVScales[l]); err != nil {
				return fmt.Errorf("runner: KV scales of layer %d: %w", l, err)
			}
		}
	}
	return nil
}

// ForgetDynamicKVScales unsets an fp8 cache's dynamic scales (a scale of
// 0 is "not set": the next KV write sets it from that step's values), so
// that steps run on made-up tokens (a load's budget probe and warm-up) do
// not leave their values' range as the cache's: the first real prompt
// sets it. Checkpoint scales (Options.KVScales) and caches whose scales
// are per block stay as they are.
func (r *Runner) ForgetDynamicKVScales() error {
	if r.peers != nil {
		return r.eachRank(func(_ int, q *Runner) error { return q.forgetDynamicKVScales() })
	}
	return r.forgetDynamicKVScales()
}

func (r *Runner) forgetDynamicKVScales() error {
	if r.spec.Scales != backend.KVScalePerHead || r.opts.KVScales != nil {
		return nil
	}
	for l, kv := range r.kv {
		for _, t := range []backend.Tensor{kv.Aux.KScale, kv.Aux.VScale} {
			if err := zero(r.b, t); err != nil {
				return fmt.Errorf("runner: KV scales of layer %d: %w", l, err)
			}
		}
	}
	return nil
}

// zero fills t with zero bytes.
func zero(b backend.Backend, t backend.Tensor) error {
	n, err := t.DType().Bytes(t.Shape())
	if err != nil {
		return err
	}
	return b.Write(t, make([]byte, n))
}

// writeFP8Scales sets a layer's FP8 scales from the checkpoint's: one per
// layer (broadcast to every head) or one per KV head.
func (r *Runner) writeFP8Scales(lk model.LayerKV, sc model.KVScales) error {
	kvh := r.opts.NumKVHeads
	for _, p := range []struct {
		t backend.Tensor
		v []float32
	}{{lk.Aux.KScale, sc.K}, {lk.Aux.VScale, sc.V}} {
		if len(p.v) != 1 && len(p.v) != kvh {
			return fmt.Errorf("%d scales for %d KV heads", len(p.v), kvh)
		}
		raw := make([]byte, 4*kvh)
		for h := range kvh {
			s := p.v[min(h, len(p.v)-1)]
			if !(s > 0) || math.IsInf(float64(s), 0) {
				return fmt.Errorf("scale %v is not a positive finite number", s)
			}
			binary.LittleEndian.PutUint32(raw[4*h:], math.Float32bits(s))
		}
		if err := r.b.Write(p.t, raw); err != nil {
			return err
		}
	}
	return nil
}

// syncWindowMap writes the window assignment to the device when it
// changed.
func (r *Runner) syncWindowMap() error {
	if !r.win.dirty {
		return nil
	}
	if err := r.b.Write(r.winMap, r.bytes(r.win.of)); err != nil {
		return fmt.Errorf("runner: write the KV window map: %w", err)
	}
	r.win.dirty = false
	return nil
}

// copyRows copies row src of t to row dst through the host: quantized
// pools and their side tensors are not float tensors, which the Embed
// gathers of CopyBlocks take.
func (r *Runner) copyRows(t backend.Tensor, src, dst int) error {
	from, err := r.b.View(t, src, 1)
	if err != nil {
		return err
	}
	to, err := r.b.View(t, dst, 1)
	if err != nil {
		return err
	}
	n, err := t.DType().Bytes(from.Shape())
	if err != nil {
		return err
	}
	buf := make([]byte, n)
	if err := r.b.Read(from, buf); err != nil {
		return err
	}
	return r.b.Write(to, buf)
}

// copyQuantized is CopyBlocks for a quantized cache: per layer the K and
// V pools, their block-indexed scales, and the source's window block
// into one of the destination's.
func (r *Runner) copyQuantized(c BlockCopy) error {
	wFrom, wTo := int32(-1), int32(-1)
	if r.win != nil {
		var err error
		if wFrom, wTo, err = r.win.fork(c.Src, c.Dst); err != nil {
			return err
		}
		if err := r.syncWindowMap(); err != nil {
			return err
		}
	}
	for l, kv := range r.kv {
		ts := []backend.Tensor{kv.K, kv.V}
		if r.spec.Scales != backend.KVScalePerHead { // per-head scales are not per block
			ts = append(ts, kv.Aux.KScale, kv.Aux.VScale)
		}
		for _, t := range ts {
			if err := r.copyRows(t, int(c.Src), int(c.Dst)); err != nil {
				return fmt.Errorf("runner: copy block %d to %d in layer %d: %w", c.Src, c.Dst, l, err)
			}
		}
		if wFrom >= 0 {
			for _, t := range []backend.Tensor{kv.Aux.KWindow, kv.Aux.VWindow} {
				if err := r.copyRows(t, int(wFrom), int(wTo)); err != nil {
					return fmt.Errorf("runner: copy block %d to %d in layer %d: window: %w", c.Src, c.Dst, l, err)
				}
			}
		}
	}
	return nil
}
