package runner

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/cpu"
	"github.com/trigon-llm/trigon/model"
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

// TestFP8CheckpointScales gives the runner an FP8 cache's checkpoint
// scales (model.ReadKVScales' form: one per layer or one per KV head)
// and checks that every layer's scale tensors hold them, that a write
// through the layer's cache encodes each value as e4m3(x/scale) with
// those scales, which it leaves as they were (no dynamic scale), and
// that scales the cache cannot take are refused at New.
func TestFP8CheckpointScales(t *testing.T) {
	const kvh, hd, bs, layers = 2, 8, 4, 2
	for _, c := range []struct {
		name   string
		scales []model.KVScales
		k, v   [layers][kvh]float32 // the per-head scales expected
		err    string
	}{
		{name: "per layer", scales: []model.KVScales{{K: []float32{1.0 / 64}, V: []float32{1.0 / 32}}, {K: []float32{0.5}, V: []float32{2}}},
			k: [layers][kvh]float32{{1.0 / 64, 1.0 / 64}, {0.5, 0.5}}, v: [layers][kvh]float32{{1.0 / 32, 1.0 / 32}, {2, 2}}},
		{name: "per head", scales: []model.KVScales{{K: []float32{1.0 / 64, 1.0 / 16}, V: []float32{0.25, 1.0 / 128}}, {K: []float32{3, 0.5}, V: []float32{1, 4}}},
			k: [layers][kvh]float32{{1.0 / 64, 1.0 / 16}, {3, 0.5}}, v: [layers][kvh]float32{{0.25, 1.0 / 128}, {1, 4}}},
		{name: "three for two heads", scales: []model.KVScales{{K: []float32{1, 1, 1}, V: []float32{1}}, {K: []float32{1}, V: []float32{1}}}, err: "3 scales for 2 KV heads"},
		{name: "zero", scales: []model.KVScales{{K: []float32{1}, V: []float32{0}}, {K: []float32{1}, V: []float32{1}}}, err: "not a positive"},
		{name: "nan", scales: []model.KVScales{{K: []float32{1}, V: []float32{1}}, {K: []float32{float32(math.NaN())}, V: []float32{1}}}, err: "not a positive"},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := cpu.New(cpu.Options{Threads: 2})
			r, err := New(b, &nopModel{b: b}, Options{
				NumBlocks: 4, BlockSize: bs, MaxTokens: 8, MaxSeqs: 1, MaxSeqLen: 12,
				KV: backend.FP8KV(bs), KVScales: c.scales, NumLayers: layers, NumKVHeads: kvh, HeadDim: hd,
			})
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("New = %v, want an error containing %q", err, c.err)
				}
				if r != nil {
					r.Close()
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			readF32 := func(x backend.Tensor) []float32 {
				n, _ := backend.NumElements(x.Shape())
				raw := make([]byte, 4*n)
				if err := b.Read(x, raw); err != nil {
					t.Fatal(err)
				}
				out := make([]float32, len(raw)/4)
				for i := range out {
					out[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
				}
				return out
			}
			upload := func(dt backend.DType, raw []byte, shape ...int) backend.Tensor {
				x, err := b.Alloc(dt, shape...)
				if err != nil {
					t.Fatal(err)
				}
				if err := b.Write(x, raw); err != nil {
					t.Fatal(err)
				}
				return x
			}
			// Two tokens at slots 5 and 6 (block 1), values in [-1, 1]: a
			// dynamic scale would be max|x|/112, none of the scales above.
			const m, nh = 2, kvh
			width := (nh + 2*kvh) * hd
			rng := rand.New(rand.NewPCG(3, 4))
			qkv := make([]float32, m*width)
			for i := range qkv {
				qkv[i] = 2*rng.Float32() - 1
			}
			f32 := func(v []float32) []byte {
				out := make([]byte, 4*len(v))
				for i, f := range v {
					binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(f))
				}
				return out
			}
			i32 := func(v ...int32) []byte {
				out := make([]byte, 4*len(v))
				for i, x := range v {
					binary.LittleEndian.PutUint32(out[4*i:], uint32(x))
				}
				return out
			}
			slots := []int32{5, 6}
			for l, kv := range r.KV() {
				for h := range kvh {
					if got := readF32(kv.Aux.KScale)[h]; got != c.k[l][h] {
						t.Errorf("layer %d head %d: K scale %v, want %v", l, h, got, c.k[l][h])
					}
					if got := readF32(kv.Aux.VScale)[h]; got != c.v[l][h] {
						t.Errorf("layer %d head %d: V scale %v, want %v", l, h, got, c.v[l][h])
					}
				}
				q, err := b.Alloc(backend.F32, m, nh*hd)
				if err != nil {
					t.Fatal(err)
				}
				// InvFreq 0: no rotation, so the pools hold the K values as given.
				err = b.RoPEStoreKV(backend.RoPEArgs{Q: q, QKV: upload(backend.F32, f32(qkv), m, width),
					Positions: upload(backend.I32, i32(0, 1), m), SlotMapping: upload(backend.I32, i32(slots...), m),
					KCache: kv.K, VCache: kv.V, KV: kv.Spec, KVAux: kv.Aux, InvFreq: upload(backend.F32, make([]byte, 4*hd/2), hd/2),
					NumHeads: nh, NumKVHeads: kvh, HeadDim: hd})
				if err != nil {
					t.Fatal(err)
				}
				for pi, p := range []struct {
					pool  backend.Tensor
					off   int // of K or V in a QKV row
					scale [kvh]float32
				}{{kv.K, nh * hd, c.k[l]}, {kv.V, (nh + kvh) * hd, c.v[l]}} {
					n, _ := backend.NumElements(p.pool.Shape())
					raw := make([]byte, n)
					if err := b.Read(p.pool, raw); err != nil {
						t.Fatal(err)
					}
					for ti, slot := range slots {
						blk, off := int(slot)/bs, int(slot)%bs
						for h := range kvh {
							for d := range hd {
								x := qkv[ti*width+p.off+h*hd+d]
								got := raw[((blk*kvh+h)*bs+off)*hd+d]
								if want := backend.F32ToE4M3(x / p.scale[h]); got != want {
									t.Fatalf("layer %d pool %d token %d head %d ch %d: code %#x (%v), want e4m3(%v/%v) = %#x",
										l, pi, ti, h, d, got, backend.E4M3ToF32(got)*p.scale[h], x, p.scale[h], want)
								}
							}
						}
					}
				}
				if got := readF32(kv.Aux.KScale); got[0] != c.k[l][0] || got[1] != c.k[l][1] {
					t.Errorf("layer %d: K scales %v after a write, want %v", l, got, c.k[l])
				}
			}
		})
	}
}
