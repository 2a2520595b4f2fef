package runner

import (
	"fmt"

	"github.com/trigon-llm/trigon/backend"
)

// windowPool assigns the blocks of a KIVI cache's bf16 window pool
// (backend.KVScaleKIVI) to KV blocks, on the host; the device sees the
// assignment as the WindowMap tensor. Every block a step writes must have
// a window block: its K is quantized from there once it is full, and
// until then it has no int4 form. A block's first write is at offset 0
// (full blocks are never written again, and a prefix hit shares only
// full blocks), so a write at offset 0 always starts a block's content
// afresh, whichever block it had.
//
// When no window block is free, one is taken from a block that this
// step neither writes nor reads in a window: the least recently used
// full one first (its int4 form stands in for it: accuracy, never
// correctness), else the least recently used partial one, which is
// either free in the kvcache pool or belongs to a sequence that has not
// run for longest; if that sequence runs again, its step fails with an
// error saying so. backend.KVSpec.WindowBlocks sizes the pool so that the
// running sequences' partial blocks always fit.
type windowPool struct {
	bs, window int
	of         []int32  // [numBlocks] a block's window block, or -1 (WindowMap)
	owner      []int32  // [numWindowBlocks] its block, or -1
	filled     []int    // [numWindowBlocks] tokens written from offset 0
	used       []uint64 // [numWindowBlocks] the step that last needed it
	step       uint64
	dirty      bool // of differs from the device's WindowMap
}

func newWindowPool(spec backend.KVSpec, numBlocks, numWindow int) *windowPool {
	w := &windowPool{bs: spec.BlockSize, window: spec.Window, of: make([]int32, numBlocks),
		owner: make([]int32, numWindow), filled: make([]int, numWindow), used: make([]uint64, numWindow), dirty: true}
	for i := range w.of {
		w.of[i] = -1
	}
	for i := range w.owner {
		w.owner[i] = -1
	}
	return w
}

// prepare assigns window blocks for a step: it marks the window blocks of
// every sequence's window as used, and gives every block the step writes
// one.
func (w *windowPool) prepare(seqs []Seq) error {
	w.step++
	bs := w.bs
	for _, s := range seqs {
		end := s.Start + len(s.Tokens)
		for j := max(0, end-w.window) / bs; j <= (end-1)/bs; j++ {
			if x := w.of[s.BlockTable[j]]; x >= 0 {
				w.used[x] = w.step
			}
		}
	}
	for i, s := range seqs {
		end := s.Start + len(s.Tokens)
		for j := s.Start / bs; j <= (end-1)/bs; j++ {
			blk := s.BlockTable[j]
			first, last := max(s.Start, j*bs)-j*bs, min(end, (j+1)*bs)-j*bs
			x := w.of[blk]
			if x < 0 {
				if first != 0 {
					return fmt.Errorf("runner: seq %d: block %d continues at offset %d, but its bf16 window block went to another block (more partially filled sequences than the int4 window pool holds)", i, blk, first)
				}
				var err error
				if x, err = w.take(blk); err != nil {
					return fmt.Errorf("runner: seq %d: %w", i, err)
				}
			}
			if first == 0 {
				w.filled[x] = 0
			}
			w.filled[x] = max(w.filled[x], last)
			w.used[x] = w.step
		}
	}
	return nil
}

// take gives blk a window block: a free one, else one taken from another
// block (see windowPool).
func (w *windowPool) take(blk int32) (int32, error) {
	best := int32(-1)
	for x := range w.owner {
		if w.owner[x] < 0 {
			best = int32(x)
			break
		}
		if w.used[x] == w.step {
			continue
		}
		if best < 0 || w.rank(int32(x)) < w.rank(best) {
			best = int32(x)
		}
	}
	if best < 0 {
		return -1, fmt.Errorf("the step needs more than the %d bf16 window blocks of the int4 cache", len(w.owner))
	}
	if o := w.owner[best]; o >= 0 {
		w.of[o] = -1
	}
	w.owner[best], w.of[blk], w.filled[best] = blk, best, 0
	w.dirty = true
	return best, nil
}

// rank orders the candidates to take: full blocks before partial ones,
// each least recently used first.
func (w *windowPool) rank(x int32) uint64 {
	r := w.used[x]
	if w.filled[x] < w.bs {
		r += 1 << 62
	}
	return r
}

// fork gives dst a window block holding src's (after the caller's copy):
// it returns both, or -1, -1 when src has none.
func (w *windowPool) fork(src, dst int32) (from, to int32, err error) {
	from = w.of[src]
	if from < 0 {
		return -1, -1, nil
	}
	w.used[from] = w.step + 1 // not taken for dst itself
	to = w.of[dst]
	if to < 0 {
		if to, err = w.take(dst); err != nil {
			return -1, -1, fmt.Errorf("runner: copy block %d to %d: %w", src, dst, err)
		}
	}
	w.filled[to] = w.filled[from]
	w.used[from], w.used[to] = w.step, w.step
	return from, to, nil
}
