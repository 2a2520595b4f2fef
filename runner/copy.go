package runner

import (
	"encoding/binary"
	"fmt"

	"github.com/trigon-llm/trigon/backend"
)

// BlockCopy asks for block Src's K and V, in every layer, to be copied
// into block Dst (the scheduler's kvcache.BlockCopy, as block ids).
type BlockCopy struct {
	Src, Dst int32
}

// CopyBlocks copies blocks in every layer's K and V pool, in order. The
// copies are queued on the backend before anything queued after them, so
// a step that forks a partially filled block calls CopyBlocks before its
// Execute: the fork's writes land in its own copy.
//
// A quantized cache's blocks move with their scales and window block,
// through the host (copyQuantized). For a plain cache, as the Backend
// contract has no copy op, a copy is two gathers (Embed), the
// source block into a one-block scratch and the scratch into the
// destination, each pool viewed as [numBlocks, blockElems] (Embed's out
// may not overlap its table, so the scratch is needed).
func (r *Runner) CopyBlocks(copies []BlockCopy) error {
	if r.peers != nil {
		return r.eachRank(func(_ int, q *Runner) error { return q.copyBlocks(copies) })
	}
	return r.copyBlocks(copies)
}

func (r *Runner) copyBlocks(copies []BlockCopy) error {
	if len(copies) == 0 {
		return nil
	}
	for _, c := range copies {
		if c.Src <= 0 || int(c.Src) >= r.opts.NumBlocks || c.Dst <= 0 || int(c.Dst) >= r.opts.NumBlocks {
			return fmt.Errorf("runner: copy block %d to %d: ids outside [1, %d)", c.Src, c.Dst, r.opts.NumBlocks)
		}
	}
	if r.spec.Scales != backend.KVNoScales {
		for _, c := range copies {
			if err := r.copyQuantized(c); err != nil {
				return err
			}
		}
		return nil
	}
	b := r.b
	if r.copyIDs == nil {
		elems := r.opts.NumKVHeads * r.opts.BlockSize * r.opts.HeadDim
		ids, err := b.Alloc(backend.I32, 2)
		if err != nil {
			return fmt.Errorf("runner: block copy: %w", err)
		}
		scratch, err := b.Alloc(r.spec.DType, 1, elems)
		if err != nil {
			b.Free(ids)
			return fmt.Errorf("runner: block copy: %w", err)
		}
		r.copyIDs, r.copyScratch = ids, scratch
	}
	srcID, err := b.View(r.copyIDs, 0, 1)
	if err != nil {
		return err
	}
	zeroID, err := b.View(r.copyIDs, 1, 1)
	if err != nil {
		return err
	}
	var ids [8]byte // [src, 0]
	for _, c := range copies {
		binary.LittleEndian.PutUint32(ids[:], uint32(c.Src))
		if err := b.Write(r.copyIDs, ids[:]); err != nil {
			return fmt.Errorf("runner: block copy: %w", err)
		}
		for _, kv := range r.kv {
			for _, pool := range []backend.Tensor{kv.K, kv.V} {
				sh := pool.Shape()
				flat, err := b.Reshape(pool, sh[0], sh[1]*sh[2]*sh[3])
				if err != nil {
					return err
				}
				dst, err := b.View(flat, int(c.Dst), 1)
				if err != nil {
					return err
				}
				if err := b.Embed(r.copyScratch, flat, srcID); err != nil {
					return fmt.Errorf("runner: copy block %d to %d: %w", c.Src, c.Dst, err)
				}
				if err := b.Embed(dst, r.copyScratch, zeroID); err != nil {
					return fmt.Errorf("runner: copy block %d to %d: %w", c.Src, c.Dst, err)
				}
			}
		}
	}
	return nil
}
