package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/trigon-llm/trigon/backend"
)

type seqSpec struct{ seqLen, qLen int }

type attnCase struct {
	seqs                    []seqSpec
	heads, kvHeads, headDim int
	blockSize               int
	cacheDT                 backend.DType
	window                  int
	padRows                 int // extra rows after the last sequence's queries
}

// attnFixture is a paged cache filled from per-sequence dense K/V, with
// shuffled block ids and NaN everywhere no sequence owns.
type attnFixture struct {
	args backend.AttentionArgs
	q    []float32
	// k[s], v[s] are [seqLen, kvHeads, headDim] as stored (rounded to the
	// cache dtype), in f64.
	k, v [][]float64
}

func newAttnFixture(t *testing.T, r *rand.Rand, b *Backend, c attnCase) attnFixture {
	t.Helper()
	kv, d, bs := c.kvHeads, c.headDim, c.blockSize
	needed, maxBlocks, maxLen := 0, 0, 0
	for _, s := range c.seqs {
		nb := (s.seqLen + bs - 1) / bs
		needed += nb
		maxBlocks = max(maxBlocks, nb)
		maxLen = max(maxLen, s.seqLen)
	}
	maxBlocks++ // a spare column, filled with garbage ids never to be read
	numBlocks := needed + 3
	perm := r.Perm(numBlocks)
	el := c.cacheDT.BlockBytes()
	kc := alloc(t, b, c.cacheDT, numBlocks, kv, bs, d) // NaN-filled
	vc := alloc(t, b, c.cacheDT, numBlocks, kv, bs, d)
	tables := make([]int32, len(c.seqs)*maxBlocks)
	for i := range tables {
		tables[i] = int32(numBlocks + 1000 + i) // out of range: must never be read
	}
	f := attnFixture{k: make([][]float64, len(c.seqs)), v: make([][]float64, len(c.seqs))}
	lens, starts := make([]int32, len(c.seqs)), []int32{0}
	for si, s := range c.seqs {
		nb := (s.seqLen + bs - 1) / bs
		for j := range nb {
			tables[si*maxBlocks+j], perm = int32(perm[0]), perm[1:]
		}
		kb := encode(t, c.cacheDT, randFloats(r, s.seqLen*kv*d, 1))
		vb := encode(t, c.cacheDT, randFloats(r, s.seqLen*kv*d, 1))
		f.k[si] = decodeRef(t, c.cacheDT, kb, s.seqLen*kv*d)
		f.v[si] = decodeRef(t, c.cacheDT, vb, s.seqLen*kv*d)
		for p := range s.seqLen {
			blk := int(tables[si*maxBlocks+p/bs])
			for h := range kv {
				src := (p*kv + h) * d * el
				dst := ((blk*kv+h)*bs + p%bs) * d * el
				copy(kc.(*tensor).data[dst:dst+d*el], kb[src:src+d*el])
				copy(vc.(*tensor).data[dst:dst+d*el], vb[src:src+d*el])
			}
		}
		lens[si] = int32(s.seqLen)
		starts = append(starts, starts[si]+int32(s.qLen))
	}
	numTokens := int(starts[len(c.seqs)]) + c.padRows
	f.q = randFloats(r, numTokens*c.heads*d, 1)
	f.args = backend.AttentionArgs{
		Out:           alloc(t, b, backend.F32, numTokens, c.heads*d),
		Q:             uploadF32(t, b, f.q, numTokens, c.heads*d),
		KCache:        kc,
		VCache:        vc,
		KV:            backend.PlainKV(c.cacheDT, bs),
		BlockTables:   uploadI32(t, b, tables, len(c.seqs), maxBlocks),
		SeqLens:       uploadI32(t, b, lens, len(c.seqs)),
		QueryStart:    uploadI32(t, b, starts, len(c.seqs)+1),
		NumSeqs:       len(c.seqs),
		MaxSeqLen:     maxLen,
		NumHeads:      c.heads,
		NumKVHeads:    kv,
		HeadDim:       d,
		Scale:         float32(1 / math.Sqrt(float64(d))),
		SlidingWindow: c.window,
	}
	return f
}

// refAttention is dense causal attention in f64 over each sequence's
// contiguous K/V; rows past the last query row come back as NaN (untouched).
func refAttention(c attnCase, f attnFixture) []float64 {
	h, kv, d := c.heads, c.kvHeads, c.headDim
	numTokens := len(f.q) / (h * d)
	out := make([]float64, numTokens*h*d)
	for i := range out {
		out[i] = math.NaN()
	}
	row := 0
	for si, s := range c.seqs {
		for i := range s.qLen {
			pos := s.seqLen - s.qLen + i
			for head := range h {
				kh := head / (h / kv)
				q := f.q[(row*h+head)*d : (row*h+head+1)*d]
				var keys []int
				for p := 0; p <= pos; p++ {
					if c.window == 0 || p > pos-c.window {
						keys = append(keys, p)
					}
				}
				scores := make([]float64, len(keys))
				m := math.Inf(-1)
				for j, p := range keys {
					var dot float64
					for e := range d {
						dot += float64(q[e]) * f.k[si][(p*kv+kh)*d+e]
					}
					scores[j] = dot * float64(f.args.Scale)
					m = max(m, scores[j])
				}
				var sum float64
				for j := range scores {
					scores[j] = math.Exp(scores[j] - m)
					sum += scores[j]
				}
				o := out[(row*h+head)*d : (row*h+head+1)*d]
				clear(o)
				for j, p := range keys {
					for e := range d {
						o[e] += scores[j] / sum * f.v[si][(p*kv+kh)*d+e]
					}
				}
			}
			row++
		}
	}
	return out
}

func checkAttention(t *testing.T, got []float32, want []float64) {
	t.Helper()
	for i, w := range want {
		g := float64(got[i])
		if math.IsNaN(w) {
			if !math.IsNaN(g) {
				t.Fatalf("out[%d] = %v: padding row written", i, g)
			}
			continue
		}
		if !(math.Abs(g-w) <= 2e-6+2e-6*math.Abs(w)) {
			t.Fatalf("out[%d] = %v, want %v", i, g, w)
		}
	}
}

func TestAttention(t *testing.T) {
	r := newRand(t)
	cases := []attnCase{
		{seqs: []seqSpec{{37, 1}}, heads: 2, kvHeads: 2, headDim: 16, blockSize: 16, cacheDT: backend.F32},
		// F32 decode rows read in place, a block's run of keys a kernel
		// call: blocks of 5 and a window cut the runs anywhere.
		{seqs: []seqSpec{{100, 1}, {33, 3}, {6, 1}}, heads: 4, kvHeads: 2, headDim: 32, blockSize: 5, cacheDT: backend.F32, window: 40},
		{seqs: []seqSpec{{20, 20}, {33, 1}, {50, 7}, {1, 1}}, heads: 8, kvHeads: 2, headDim: 64, blockSize: 16, cacheDT: backend.BF16, padRows: 2},
		{seqs: []seqSpec{{45, 45}, {17, 1}, {9, 3}}, heads: 8, kvHeads: 1, headDim: 32, blockSize: 5, cacheDT: backend.F16},
		{seqs: []seqSpec{{40, 40}, {70, 1}, {64, 10}, {3, 2}}, heads: 8, kvHeads: 2, headDim: 8, blockSize: 16, cacheDT: backend.F32, window: 8},
		{seqs: []seqSpec{{12, 0}, {30, 4}, {16, 16}, {5, 0}}, heads: 4, kvHeads: 4, headDim: 24, blockSize: 4, cacheDT: backend.BF16},
		{seqs: []seqSpec{{300, 129}, {129, 1}, {200, 200}}, heads: 4, kvHeads: 1, headDim: 128, blockSize: 16, cacheDT: backend.BF16, window: 64},
		{seqs: []seqSpec{{1, 1}}, heads: 1, kvHeads: 1, headDim: 1, blockSize: 1, cacheDT: backend.F32},
	}
	// A 16-wide head (D=16, D=32, D=128 are whole panels of some set) runs
	// the GEMM path where the set has one; the others the pure-Go loop.
	cases = append(cases, attnCase{seqs: []seqSpec{{90, 90}, {7, 2}}, heads: 2, kvHeads: 1, headDim: 16, blockSize: 8, cacheDT: backend.F16, window: 20})
	for _, set := range kernelSets() {
		for _, c := range cases {
			name := fmt.Sprintf("%s/seqs=%v/H=%d/KV=%d/D=%d/bs=%d/%v/window=%d", set.name, c.seqs, c.heads, c.kvHeads, c.headDim, c.blockSize, c.cacheDT, c.window)
			t.Run(name, func(t *testing.T) {
				b := newWithKernels(Options{Threads: 3}, set)
				f := newAttnFixture(t, r, b, c)
				if err := b.Attention(f.args); err != nil {
					t.Fatal(err)
				}
				checkAttention(t, readF32(t, b, f.args.Out), refAttention(c, f))
			})
		}
		t.Run(set.name+"/out is Q", func(t *testing.T) {
			c := cases[1]
			c.padRows = 0
			b := newWithKernels(Options{Threads: 2}, set)
			f := newAttnFixture(t, r, b, c)
			f.args.Out = f.args.Q
			if err := b.Attention(f.args); err != nil {
				t.Fatal(err)
			}
			checkAttention(t, readF32(t, b, f.args.Q), refAttention(c, f))
		})
	}
}

func TestAttentionErrors(t *testing.T) {
	r := newRand(t)
	b := New(Options{})
	c := attnCase{seqs: []seqSpec{{20, 3}, {9, 1}}, heads: 4, kvHeads: 2, headDim: 8, blockSize: 4, cacheDT: backend.F32}
	for _, e := range []struct {
		name   string
		mutate func(a *backend.AttentionArgs)
	}{
		{"block id out of range", func(a *backend.AttentionArgs) {
			tb := a.BlockTables.(*tensor).i32()
			tb[1] = 1 << 20
		}},
		{"negative block id", func(a *backend.AttentionArgs) { a.BlockTables.(*tensor).i32()[0] = -1 }},
		{"seq shorter than its queries", func(a *backend.AttentionArgs) { a.SeqLens.(*tensor).i32()[1] = 0 }},
		{"seq past the block table", func(a *backend.AttentionArgs) {
			a.SeqLens.(*tensor).i32()[0] = 40
			a.MaxSeqLen = 40
		}},
		{"seq past MaxSeqLen", func(a *backend.AttentionArgs) { a.MaxSeqLen = 10 }},
		{"rows past MaxQueryLen", func(a *backend.AttentionArgs) { a.MaxQueryLen = 1 }},
		{"QueryStart[0]", func(a *backend.AttentionArgs) { a.QueryStart.(*tensor).i32()[0] = 1 }},
		{"QueryStart decreasing", func(a *backend.AttentionArgs) { a.QueryStart.(*tensor).i32()[1] = 5 }},
		{"QueryStart past the rows", func(a *backend.AttentionArgs) { a.QueryStart.(*tensor).i32()[2] = 9 }},
		{"NumSeqs", func(a *backend.AttentionArgs) { a.NumSeqs = 3 }},
		{"GQA ratio", func(a *backend.AttentionArgs) { a.NumKVHeads = 3 }},
		{"Q width", func(a *backend.AttentionArgs) { a.Q = alloc(t, b, backend.F32, 4, 31) }},
		{"Out overlaps Q at an offset", func(a *backend.AttentionArgs) {
			v, err := b.View(a.Q, 1, 3)
			if err != nil {
				t.Fatal(err)
			}
			q, err := b.View(a.Q, 0, 3)
			if err != nil {
				t.Fatal(err)
			}
			a.Out, a.Q = v, q
			a.QueryStart.(*tensor).i32()[2] = 3
		}},
		{"negative window", func(a *backend.AttentionArgs) { a.SlidingWindow = -1 }},
		{"NaN scale", func(a *backend.AttentionArgs) { a.Scale = float32(math.NaN()) }},
	} {
		t.Run(e.name, func(t *testing.T) {
			f := newAttnFixture(t, r, b, c)
			e.mutate(&f.args)
			if err := b.Attention(f.args); !isShapeErr(err) {
				t.Fatalf("error %v, want a shape error", err)
			}
		})
	}
}
