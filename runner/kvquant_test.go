package runner

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/cpu"
)

// TestCopyBlocksQuantized fills every tensor of a quantized cache with
// random bytes and checks that a block copy moves the block's values,
// scales and zero points in every layer (and, for int4, gives the
// destination a window block holding the source's), touching no other
// block.
func TestCopyBlocksQuantized(t *testing.T) {
	for _, spec := range []backend.KVSpec{backend.Int8KV(4, 8), backend.Int4KV(4, 8, 8), backend.FP8KV(4)} {
		t.Run(spec.Name(), func(t *testing.T) {
			b := cpu.New(cpu.Options{Threads: 2})
			const numBlocks, layers = 9, 2
			r, err := New(b, &nopModel{b: b}, Options{
				NumBlocks: numBlocks, BlockSize: 4, MaxTokens: 8, MaxSeqs: 2, MaxSeqLen: 16,
				KV: spec, NumLayers: layers, NumKVHeads: 2, HeadDim: 16,
			})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			const src, dst = 3, 6
			if r.win != nil { // a partial block being written has a window block
				if err := r.win.prepare([]Seq{{Tokens: make([]int32, 2), BlockTable: []int32{src}}}); err != nil {
					t.Fatal(err)
				}
			}
			rng := rand.New(rand.NewPCG(1, 2))
			read := func(p backend.Tensor) []byte {
				n, _ := p.DType().Bytes(p.Shape())
				out := make([]byte, n)
				if err := b.Read(p, out); err != nil {
					t.Fatal(err)
				}
				return out
			}
			var blockIndexed []backend.Tensor
			for _, kv := range r.KV() {
				blockIndexed = append(blockIndexed, kv.K, kv.V)
				if spec.Scales != backend.KVScalePerHead {
					blockIndexed = append(blockIndexed, kv.Aux.KScale, kv.Aux.VScale)
				}
				for _, p := range []backend.Tensor{kv.K, kv.V, kv.Aux.KScale, kv.Aux.VScale, kv.Aux.KWindow, kv.Aux.VWindow} {
					if p == nil {
						continue
					}
					data := read(p)
					for i := range data {
						data[i] = byte(rng.Uint32())
					}
					if err := b.Write(p, data); err != nil {
						t.Fatal(err)
					}
				}
			}
			before := make([][]byte, len(blockIndexed))
			for i, p := range blockIndexed {
				before[i] = read(p)
			}
			var winBefore [][]byte
			for _, kv := range r.KV() {
				if kv.Aux.KWindow != nil {
					winBefore = append(winBefore, read(kv.Aux.KWindow), read(kv.Aux.VWindow))
				}
			}
			if err := r.CopyBlocks([]BlockCopy{{Src: src, Dst: dst}}); err != nil {
				t.Fatal(err)
			}
			for i, p := range blockIndexed {
				got, per := read(p), len(before[i])/numBlocks
				for blk := range numBlocks {
					want := before[i][blk*per : (blk+1)*per]
					if blk == dst {
						want = before[i][src*per : (src+1)*per]
					}
					if !bytes.Equal(got[blk*per:(blk+1)*per], want) {
						t.Errorf("tensor %d (%v %v): block %d differs", i, p.DType(), p.Shape(), blk)
					}
				}
			}
			if r.win == nil {
				return
			}
			from, to := r.win.of[src], r.win.of[dst]
			if from < 0 || to < 0 || from == to {
				t.Fatalf("window blocks %d -> %d after the copy", from, to)
			}
			i := 0
			for _, kv := range r.KV() {
				for _, p := range []backend.Tensor{kv.Aux.KWindow, kv.Aux.VWindow} {
					got, per := read(p), len(winBefore[i])/p.Shape()[0]
					if !bytes.Equal(got[int(to)*per:int(to+1)*per], winBefore[i][int(from)*per:int(from+1)*per]) {
						t.Errorf("window of layer %d: the copy's window block differs from the source's", i/2)
					}
					i++
				}
			}
		})
	}
}

// TestWindowPoolReuse checks the window assignment's rules: a block
// written from offset 0 gets a window block; one continued in a later
// step keeps it; when the pool is full, a full block not in this step
// is taken before a partial one; a partial block that lost its window
// block cannot be continued (an error, not wrong KV).
func TestWindowPoolReuse(t *testing.T) {
	spec := backend.Int4KV(4, 8, 4)
	w := newWindowPool(spec, 10, 3)
	step := func(seqs ...Seq) error { return w.prepare(seqs) }
	seq := func(start, n int, table ...int32) Seq {
		return Seq{Tokens: make([]int32, n), Start: start, BlockTable: table}
	}
	if err := step(seq(0, 4, 1), seq(0, 2, 2)); err != nil { // block 1 full, block 2 partial
		t.Fatal(err)
	}
	if err := step(seq(2, 1, 2)); err != nil { // block 2 continues
		t.Fatal(err)
	}
	if w.of[1] < 0 || w.of[2] < 0 {
		t.Fatalf("window map %v", w.of)
	}
	if err := step(seq(0, 1, 3)); err != nil { // the third window block
		t.Fatal(err)
	}
	if err := step(seq(0, 1, 4)); err != nil { // full: takes block 1's (full, least recently used)
		t.Fatal(err)
	}
	if w.of[1] >= 0 || w.of[2] < 0 || w.of[4] < 0 {
		t.Fatalf("took the wrong window block: map %v", w.of)
	}
	if err := step(seq(0, 1, 5)); err != nil { // no full block left: takes partial block 2's
		t.Fatal(err)
	}
	if err := step(seq(3, 1, 2)); err == nil {
		t.Fatal("continuing a block without its window block: no error")
	}
}
