package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/trigon-llm/trigon/backend"
)

// kvCache is one layer's cache of some format on the CPU backend, with
// every block in the window pool under its own id (KIVI).
type kvCache struct {
	spec backend.KVSpec
	k, v backend.Tensor
	aux  backend.KVAux
}

func newKVCache(t *testing.T, b *Backend, spec backend.KVSpec, numBlocks, kvh, d int) kvCache {
	t.Helper()
	c := kvCache{spec: spec, k: alloc(t, b, spec.DType, spec.PoolShape(numBlocks, kvh, d)...), v: alloc(t, b, spec.DType, spec.PoolShape(numBlocks, kvh, d)...)}
	ks, vs, sdt := spec.ScaleShapes(numBlocks, kvh, d)
	if ks != nil {
		c.aux.KScale, c.aux.VScale = alloc(t, b, sdt, ks...), alloc(t, b, sdt, vs...)
		if spec.Scales == backend.KVScalePerHead { // 0: set by the first write
			clear(c.aux.KScale.(*tensor).data)
			clear(c.aux.VScale.(*tensor).data)
		}
	}
	if spec.Scales == backend.KVScaleKIVI {
		c.aux.KWindow = alloc(t, b, backend.BF16, numBlocks, kvh, spec.BlockSize, d)
		c.aux.VWindow = alloc(t, b, backend.BF16, numBlocks, kvh, spec.BlockSize, d)
		ids := make([]int32, numBlocks)
		for i := range ids {
			ids[i] = int32(i)
		}
		c.aux.WindowMap = uploadI32(t, b, ids, numBlocks)
	}
	return c
}

// TestQuantizedAttention writes the same K and V (K with outlier
// channels 10-100x the others) into an f32 cache and a cache of each
// format, in a prefill chunk and then single-token decode steps as the
// engine does, and compares the attention of the last rows over each
// cache: the relative L2 distance of the outputs must be within what the
// format's precision allows, and the int4 cache with a window covering
// the whole sequence must match a bf16 cache.
func TestQuantizedAttention(t *testing.T) {
	const bs = 16
	formats := []struct {
		name string
		spec backend.KVSpec
		tol  float64 // relative L2 distance of the attention output to f32's
	}{
		// The outlier channels dominate the scores, so the error is set by
		// how finely each format resolves them: fp8's 3 mantissa bits
		// everywhere; int8's group step, which the outlier sets for its
		// whole group (finer groups, less error); int4's per-channel K,
		// whose step follows each channel's own range.
		{"bf16", backend.PlainKV(backend.BF16, bs), 0.01},
		{"fp8", backend.FP8KV(bs), 0.3},
		{"int8-g32", backend.Int8KV(bs, 32), 0.1},
		{"int8-g8", backend.Int8KV(bs, 8), 0.02},
		{"int4-w0", backend.Int4KV(bs, 32, 0), 0.2},
		{"int4-w32", backend.Int4KV(bs, 32, 32), 0.12},
		{"int4-wall", backend.Int4KV(bs, 32, 1024), 0.01}, // all in the window: bf16
	}
	shapes := []struct {
		name          string
		h, kvh, d     int
		prefill, tail int
	}{
		{"gqa-d64", 8, 2, 64, 45, 6},
		{"mqa-d128", 4, 1, 128, 33, 4},
	}
	for _, sh := range shapes {
		for _, f := range formats {
			t.Run(sh.name+"/"+f.name, func(t *testing.T) {
				b := New(Options{Threads: 2})
				r := rand.New(rand.NewPCG(uint64(sh.d), uint64(len(f.name))))
				got, want := quantAttention(t, b, r, f.spec, sh.h, sh.kvh, sh.d, sh.prefill, sh.tail)
				var num, den float64
				for i := range want {
					num += (float64(got[i]) - float64(want[i])) * (float64(got[i]) - float64(want[i]))
					den += float64(want[i]) * float64(want[i])
				}
				if rel := math.Sqrt(num / den); !(rel <= f.tol) {
					t.Errorf("relative L2 distance to f32 attention %.4g, want <= %g", rel, f.tol)
				}
			})
		}
	}
}

// quantAttention stores prefill+tail random tokens into an f32 cache and
// a spec cache through RoPEStoreKV (a prefill chunk, then one token a
// step) and returns the attention output of the last step's row over
// the spec cache and over the f32 cache, for every step's row.
func quantAttention(t *testing.T, b *Backend, r *rand.Rand, spec backend.KVSpec, h, kvh, d, prefill, tail int) (got, want []float32) {
	t.Helper()
	n := prefill + tail
	bs := spec.BlockSize
	numBlocks := (n+bs-1)/bs + 3
	perm := r.Perm(numBlocks - 1)
	table := make([]int32, (n+bs-1)/bs)
	for i := range table {
		table[i] = int32(perm[i] + 1)
	}
	width := (h + 2*kvh) * d
	qkv := randFloats(r, n*width, 1)
	// Outlier channels of K: a few channels (in both rotation halves) 10-100x.
	for _, c := range []int{3, 5, d/2 + 7} {
		gain := float32(10 + r.IntN(91))
		for tok := range n {
			for j := range kvh {
				qkv[tok*width+(h+j)*d+c] *= gain
			}
		}
	}
	invFreq := make([]float32, d/2)
	for i := range invFreq {
		invFreq[i] = float32(math.Pow(10000, -2*float64(i)/float64(d)))
	}
	ref, qc := newKVCache(t, b, backend.PlainKV(backend.F32, bs), numBlocks, kvh, d), newKVCache(t, b, spec, numBlocks, kvh, d)
	tables := uploadI32(t, b, table, 1, len(table))
	for _, step := range append([][2]int{{0, prefill}}, stepsOf(prefill, n)...) {
		lo, hi := step[0], step[1]
		m := hi - lo
		pos, slots := make([]int32, m), make([]int32, m)
		for i := range m {
			p := lo + i
			pos[i], slots[i] = int32(p), table[p/bs]*int32(bs)+int32(p%bs)
		}
		x := uploadF32(t, b, qkv[lo*width:hi*width], m, width)
		var outs [2][]float32
		for ci, c := range []kvCache{ref, qc} {
			q := alloc(t, b, backend.F32, m, h*d)
			err := b.RoPEStoreKV(backend.RoPEArgs{Q: q, QKV: x, Positions: uploadI32(t, b, pos, m), SlotMapping: uploadI32(t, b, slots, m),
				KCache: c.k, VCache: c.v, KV: c.spec, KVAux: c.aux, InvFreq: uploadF32(t, b, invFreq, d/2), NumHeads: h, NumKVHeads: kvh, HeadDim: d})
			if err != nil {
				t.Fatalf("ropestorekv %v: %v", c.spec, err)
			}
			out := alloc(t, b, backend.F32, m, h*d)
			err = b.Attention(backend.AttentionArgs{Out: out, Q: q, KCache: c.k, VCache: c.v, KV: c.spec, KVAux: c.aux,
				BlockTables: tables, SeqLens: uploadI32(t, b, []int32{int32(hi)}, 1), QueryStart: uploadI32(t, b, []int32{0, int32(m)}, 2),
				NumSeqs: 1, MaxSeqLen: hi, NumHeads: h, NumKVHeads: kvh, HeadDim: d, Scale: float32(1 / math.Sqrt(float64(d)))})
			if err != nil {
				t.Fatalf("attention %v: %v", c.spec, err)
			}
			outs[ci] = readF32(t, b, out)
		}
		if hi > prefill { // the decode rows
			want, got = append(want, outs[0]...), append(got, outs[1]...)
		}
	}
	return got, want
}

// stepsOf is one step per token of [lo, hi).
func stepsOf(lo, hi int) [][2]int {
	var s [][2]int
	for p := lo; p < hi; p++ {
		s = append(s, [2]int{p, p + 1})
	}
	return s
}

// TestKIVIBlockFill checks the int4 K block layout directly: after a
// block's last token is written, each channel's 16 values decode from
// its (scale, zero point) pair within half a step, and until then the
// block is read from its window copy exactly (bf16).
func TestKIVIBlockFill(t *testing.T) {
	const bs, kvh, d = 16, 2, 32
	b := New(Options{Threads: 2})
	spec := backend.Int4KV(bs, 16, 0)
	c := newKVCache(t, b, spec, 3, kvh, d)
	kp := newKVPool(c.k.(*tensor), spec, c.aux, true, kvh, d)
	vp := newKVPool(c.v.(*tensor), spec, c.aux, false, kvh, d)
	r := rand.New(rand.NewPCG(7, 8))
	vals := make([][]float32, bs)
	table := []int32{0, 2}
	for off := range bs {
		vals[off] = randFloats(r, d, 3)
		kp.store(2*bs+off, 1, vals[off])
		vp.store(2*bs+off, 1, vals[off])
		if off == bs-1 {
			break
		}
		got := make([]float32, d)
		kp.load(table, bs+off, bs+off+1, 1, got) // block 1 of the sequence, not full
		for i, x := range got {
			if x != backend.BF16ToF32(backend.F32ToBF16(vals[off][i])) {
				t.Fatalf("offset %d channel %d: partial block read %v, want the bf16 of %v", off, i, x, vals[off][i])
			}
		}
	}
	kp.quantizeBlock(2, 1, make([]float32, 2*bs))
	sc := kp.channelScales(2, 1)
	for off := range bs {
		got := make([]float32, d)
		kp.load(table, bs+off, 2*bs, 1, got)
		for i, x := range got {
			s := float64(backend.F16ToF32(sc[i]))
			want := float64(backend.BF16ToF32(backend.F32ToBF16(vals[off][i])))
			if e := math.Abs(float64(x) - want); e > s/2*1.01+1e-6 {
				t.Errorf("offset %d channel %d: int4 %v, want %v within %v", off, i, x, want, s/2)
			}
		}
	}
}

// TestQuantizedAttention32k is decode attention at 32k context in each
// quantized format against f32 attention over the same K and V: one
// sequence of 32,768 random tokens (K with outlier channels 10-100x the
// others), stored in prefill chunks of 2,048 and then 4 single-token
// decode steps, the last ending at 32,768; each step's one query row per
// head (GQA 4:1, head dim 128, as Llama 3 8B) is compared. It logs each
// format's relative L2 distance to f32 and its largest element error
// relative to the largest |f32| output, on fresh inputs each run (the
// seed is logged).
//
// The distances vary with the values by about 2x from run to run (a
// row's softmax is dominated by the few tokens whose K outliers align
// with its query, and an error in those scores moves their weights), so
// each tolerance is about 1.5x the largest distance seen over many
// seeds; int8 reading each group with its neighbour's scale is at 1.5.
// The distance is set by how finely a format resolves the outlier
// channels: fp8's 3 mantissa bits under one scale per head (set by the
// first chunk); int8's step, which an outlier sets for its whole group
// of 32 channels; int4's per-channel K step, which follows each
// channel's own range, with 4-bit V over groups of 32 (all but the
// newest 128 tokens, which its window keeps in bf16).
func TestQuantizedAttention32k(t *testing.T) {
	const n, bs, h, kvh, d, chunk, decode = 32768, 16, 8, 2, 128, 2048, 4
	formats := []struct {
		name string
		spec backend.KVSpec
		tol  float64 // relative L2 distance to f32
	}{
		{"fp8", backend.FP8KV(bs), 0.7},
		{"int8-g32", backend.Int8KV(bs, backend.DefaultKVInt8Group), 0.3},
		{"int4-g32-w128", backend.Int4KV(bs, backend.DefaultKVInt4Group, backend.DefaultKVWindow), 0.35},
	}
	seed := rand.Uint64()
	t.Logf("random seed %d", seed)
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := New(Options{Threads: 2})
	numBlocks := n/bs + 1
	perm := r.Perm(numBlocks)
	table := make([]int32, n/bs)
	for i := range table {
		table[i] = int32(perm[i])
	}
	caches := []kvCache{newKVCache(t, b, backend.PlainKV(backend.F32, bs), numBlocks, kvh, d)}
	for _, f := range formats {
		caches = append(caches, newKVCache(t, b, f.spec, numBlocks, kvh, d))
	}
	invFreq := make([]float32, d/2)
	for i := range invFreq {
		invFreq[i] = float32(math.Pow(500000, -2*float64(i)/float64(d)))
	}
	width := (h + 2*kvh) * d
	// Outlier channels in both rotation halves, at both ends of 10-100x
	// and between, so that runs differ only in the values.
	gains := map[int]float32{3: 100, 5: 30, d/2 + 7: 10}
	tables := uploadI32(t, b, table, 1, len(table))
	steps := [][2]int{}
	for lo := 0; lo < n-decode; lo += chunk {
		steps = append(steps, [2]int{lo, min(lo+chunk, n-decode)})
	}
	steps = append(steps, stepsOf(n-decode, n)...)
	outs := make([][]float32, len(caches)) // the decode rows' outputs
	for _, step := range steps {
		lo, hi := step[0], step[1]
		m := hi - lo
		// Random K and V; Q only in the decode rows, the ones attended.
		qkv := make([]float32, m*width)
		for tok := range m {
			row := qkv[tok*width : (tok+1)*width]
			first := h * d
			if m == 1 {
				first = 0
			}
			copy(row[first:], randFloats(r, width-first, 1))
			for j := range kvh {
				for c, g := range gains {
					row[(h+j)*d+c] *= g
				}
			}
		}
		pos, slots := make([]int32, m), make([]int32, m)
		for i := range m {
			p := lo + i
			pos[i], slots[i] = int32(p), table[p/bs]*int32(bs)+int32(p%bs)
		}
		x := uploadF32(t, b, qkv, m, width)
		for ci, c := range caches {
			q := alloc(t, b, backend.F32, m, h*d)
			err := b.RoPEStoreKV(backend.RoPEArgs{Q: q, QKV: x, Positions: uploadI32(t, b, pos, m), SlotMapping: uploadI32(t, b, slots, m),
				KCache: c.k, VCache: c.v, KV: c.spec, KVAux: c.aux, InvFreq: uploadF32(t, b, invFreq, d/2), NumHeads: h, NumKVHeads: kvh, HeadDim: d})
			if err != nil {
				t.Fatalf("ropestorekv %v: %v", c.spec, err)
			}
			if m != 1 {
				continue // the prefill chunks only fill the caches
			}
			out := alloc(t, b, backend.F32, 1, h*d)
			err = b.Attention(backend.AttentionArgs{Out: out, Q: q, KCache: c.k, VCache: c.v, KV: c.spec, KVAux: c.aux,
				BlockTables: tables, SeqLens: uploadI32(t, b, []int32{int32(hi)}, 1), QueryStart: uploadI32(t, b, []int32{0, 1}, 2),
				NumSeqs: 1, MaxSeqLen: hi, NumHeads: h, NumKVHeads: kvh, HeadDim: d, Scale: float32(1 / math.Sqrt(float64(d)))})
			if err != nil {
				t.Fatalf("attention %v: %v", c.spec, err)
			}
			outs[ci] = append(outs[ci], readF32(t, b, out)...)
		}
	}
	want := outs[0]
	for i, f := range formats {
		got := outs[i+1]
		var num, den, maxErr, maxRef float64
		for j := range want {
			e := float64(got[j]) - float64(want[j])
			num, den = num+e*e, den+float64(want[j])*float64(want[j])
			maxErr, maxRef = math.Max(maxErr, math.Abs(e)), math.Max(maxRef, math.Abs(float64(want[j])))
		}
		rel := math.Sqrt(num / den)
		t.Logf("%s at %d tokens: relative L2 distance to f32 %.3g, largest error %.3g of the largest output", f.name, n, rel, maxErr/maxRef)
		if !(rel <= f.tol) {
			t.Errorf("%s at %d tokens: relative L2 distance to f32 attention %.4g, want <= %g", f.name, n, rel, f.tol)
		}
	}
}
