package runner

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/collective"
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

// TestShardedFP8CheckpointScales: NewSharded gives each rank of a
// tensor-parallel group the checkpoint's FP8 scales of its own KV heads.
// A layer's single scale (compressed-tensors' per-tensor k_scale and
// v_scale) goes to every head of every rank, per-head scales are cut at
// the ranks' head ranges (a replicated KV head's on each rank that holds
// it), and other counts are refused.
func TestShardedFP8CheckpointScales(t *testing.T) {
	const hd, bs = 8, 4
	for _, c := range []struct {
		name   string
		kvh    int            // the model's KV heads
		shards [][2]int       // each rank's KVHead, NumKVHeads
		scales model.KVScales // of layer 0; layer 1 has twice them
		k, v   [][]float32    // each rank's per-head scales of layer 0
		err    string
	}{
		{name: "per tensor, 4 heads over 2 ranks", kvh: 4, shards: [][2]int{{0, 2}, {2, 2}},
			scales: model.KVScales{K: []float32{0.25}, V: []float32{1.0 / 8}},
			k:      [][]float32{{0.25, 0.25}, {0.25, 0.25}}, v: [][]float32{{1.0 / 8, 1.0 / 8}, {1.0 / 8, 1.0 / 8}}},
		{name: "per tensor, 3 heads over 2 ranks", kvh: 3, shards: [][2]int{{0, 2}, {2, 1}},
			scales: model.KVScales{K: []float32{3}, V: []float32{0.5}},
			k:      [][]float32{{3, 3}, {3}}, v: [][]float32{{0.5, 0.5}, {0.5}}},
		{name: "per tensor, a head replicated on 2 ranks", kvh: 1, shards: [][2]int{{0, 1}, {0, 1}},
			scales: model.KVScales{K: []float32{0.75}, V: []float32{2}},
			k:      [][]float32{{0.75}, {0.75}}, v: [][]float32{{2}, {2}}},
		{name: "per head, 4 heads over 2 ranks", kvh: 4, shards: [][2]int{{0, 2}, {2, 2}},
			scales: model.KVScales{K: []float32{1, 2, 3, 4}, V: []float32{5, 6, 7, 8}},
			k:      [][]float32{{1, 2}, {3, 4}}, v: [][]float32{{5, 6}, {7, 8}}},
		{name: "per head, 2 heads each replicated on 2 ranks", kvh: 2, shards: [][2]int{{0, 1}, {0, 1}, {1, 1}, {1, 1}},
			scales: model.KVScales{K: []float32{1, 2}, V: []float32{3, 4}},
			k:      [][]float32{{1}, {1}, {2}, {2}}, v: [][]float32{{3}, {3}, {4}, {4}}},
		{name: "3 scales for 4 heads", kvh: 4, shards: [][2]int{{0, 2}, {2, 2}},
			scales: model.KVScales{K: []float32{1, 2, 3}, V: []float32{1}}, err: "3 k_scale values for 4 KV heads"},
		{name: "no v_scale values", kvh: 4, shards: [][2]int{{0, 2}, {2, 2}},
			scales: model.KVScales{K: []float32{1}, V: []float32{}}, err: "0 v_scale values for 4 KV heads"},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := len(c.shards)
			bs0 := make([]backend.Backend, n)
			models := make([]Model, n)
			shards := make([]model.Shard, n)
			for i, s := range c.shards {
				bs0[i] = cpu.New(cpu.Options{Threads: 1})
				models[i] = &nopModel{b: bs0[i]}
				shards[i] = model.Shard{Rank: i, Size: n, KVHead: s[0], NumKVHeads: s[1]}
			}
			comms, err := collective.New(bs0)
			if err != nil {
				t.Fatal(err)
			}
			twice := func(v []float32) []float32 {
				out := make([]float32, len(v))
				for i, x := range v {
					out[i] = 2 * x
				}
				return out
			}
			g, err := NewSharded(bs0, models, shards, Options{
				NumBlocks: 4, BlockSize: bs, MaxTokens: 8, MaxSeqs: 1, MaxSeqLen: 12,
				KV: backend.FP8KV(bs), NumLayers: 2, NumKVHeads: c.kvh, HeadDim: hd,
				KVScales: []model.KVScales{c.scales, {K: twice(c.scales.K), V: twice(c.scales.V)}},
			}, comms[0].Group())
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("NewSharded = %v, want an error containing %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			ranks := append([]*Runner{g}, g.peers...)
			if len(ranks) != n {
				t.Fatalf("%d ranks, want %d", len(ranks), n)
			}
			for i, r := range ranks {
				for l, kv := range r.KV() {
					for _, p := range []struct {
						name string
						x    backend.Tensor
						want []float32
					}{{"K", kv.Aux.KScale, c.k[i]}, {"V", kv.Aux.VScale, c.v[i]}} {
						want := p.want
						if l == 1 {
							want = twice(want)
						}
						raw := make([]byte, 4*len(want))
						if got := p.x.Shape(); len(got) != 1 || got[0] != len(want) {
							t.Fatalf("rank %d layer %d: %s scales of shape %v, want [%d]", i, l, p.name, got, len(want))
						}
						if err := bs0[i].Read(p.x, raw); err != nil {
							t.Fatal(err)
						}
						for h, w := range want {
							if got := math.Float32frombits(binary.LittleEndian.Uint32(raw[4*h:])); got != w {
								t.Errorf("rank %d layer %d head %d: %s scale %v, want %v", i, l, h, p.name, got, w)
							}
						}
					}
				}
			}
		})
	}
}
