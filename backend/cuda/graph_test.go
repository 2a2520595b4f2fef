package cuda

import (
	"errors"
	"math"
	"testing"

	"github.com/trigon-llm/trigon/backend"
)

// TestGraph captures a small decode-layer-like sequence (norm, matmul,
// SiLU, attention with split-KV partials) and checks that replays compute
// what the same ops compute eagerly, for fresh inputs written into the
// captured tensors between replays.
func TestGraph(t *testing.T) {
	p := newPair(t)
	g := p.g
	const n, hidden, inter, h, kv, d, bs, ctx = 4, 1024, 512, 8, 2, 128, 16, 1500
	x := p.poisoned(backend.BF16, n, hidden)
	_, nw := p.same(backend.BF16, []int{hidden}, encode(backend.BF16, p.normal(hidden, 1)))
	normed := p.poisoned(backend.BF16, n, hidden)
	_, w := p.same(backend.BF16, []int{2 * inter, hidden}, encode(backend.BF16, p.normal(2*inter*hidden, 0.03)))
	gu := p.poisoned(backend.BF16, n, 2*inter)
	act := p.poisoned(backend.BF16, n, inter)
	nb := (ctx + bs - 1) / bs
	_, kc := p.same(backend.BF16, []int{n*nb + 1, kv, bs, d}, encode(backend.BF16, p.normal((n*nb+1)*kv*bs*d, 1)))
	_, vc := p.same(backend.BF16, []int{n*nb + 1, kv, bs, d}, encode(backend.BF16, p.normal((n*nb+1)*kv*bs*d, 1)))
	q := p.poisoned(backend.BF16, n, h*d)
	ao := p.poisoned(backend.BF16, n, h*d)
	tables, lens, starts := make([]int32, n*nb), make([]int32, n), make([]int32, n+1)
	for i, id := range p.r.Perm(n * nb) {
		tables[i] = int32(id + 1)
	}
	for i := range n {
		lens[i] = int32(ctx - 100*i)
		starts[i+1] = int32(i + 1)
	}
	_, bt := p.same(backend.I32, []int{n, nb}, i32Bytes(tables))
	_, sl := p.same(backend.I32, []int{n}, i32Bytes(lens))
	_, qs := p.same(backend.I32, []int{n + 1}, i32Bytes(starts))
	step := func() error {
		if err := g.AddRMSNorm(normed, x, nil, nw, 1e-5); err != nil {
			return err
		}
		if err := g.MatMul(gu, normed, w, nil); err != nil {
			return err
		}
		if err := g.SiLUMul(act, gu); err != nil {
			return err
		}
		return g.Attention(backend.AttentionArgs{Out: ao, Q: q, KCache: kc, VCache: vc, KV: kvOf(kc), BlockTables: bt, SeqLens: sl, QueryStart: qs,
			NumSeqs: n, MaxSeqLen: ctx, NumHeads: h, NumKVHeads: kv, HeadDim: d, Scale: float32(1 / math.Sqrt(d))})
	}
	setInputs := func() {
		p.must("write x", g.Write(x, encode(backend.BF16, p.normal(n*hidden, 1))))
		p.must("write q", g.Write(q, encode(backend.BF16, p.normal(n*h*d, 1))))
	}
	outputs := func() [][]byte { return [][]byte{readBytes(t, g, act), readBytes(t, g, ao)} }

	setInputs()
	p.must("eager warm-up", step()) // loads every kernel before capture
	p.must("sync", g.Sync())
	graph, err := g.Capture(step)
	p.must("capture", err)
	defer graph.Close()
	for round := range 3 {
		setInputs()
		p.must("eager", step())
		want := outputs()
		for _, o := range []backend.Tensor{act, ao} {
			poison := readBytes(t, g, o)
			for i := range poison {
				poison[i] = 0xff // bf16 0xffff is a NaN
			}
			p.must("poison", g.Write(o, poison))
		}
		p.must("launch", graph.Launch())
		p.must("sync", g.Sync())
		got := outputs()
		for i := range want {
			if string(got[i]) != string(want[i]) {
				t.Fatalf("round %d: replayed output %d differs from the eager one", round, i)
			}
		}
	}
	// Calls that wait for results are refused inside a capture.
	_, err = g.Capture(func() error {
		_, err := g.Alloc(backend.BF16, 4)
		return err
	})
	if !errors.Is(err, errCapturing) {
		t.Fatalf("Alloc inside a capture: %v, want errCapturing", err)
	}
	p.must("sync after refused capture", g.Sync())
}

// TestGraphManyLayers captures several split-KV attentions in a row, as a
// decode step of a many-layer model does. Each needs a partials buffer; the
// capture must reuse one (an allocation inside a capture invalidates it),
// and replays must match eager runs.
func TestGraphManyLayers(t *testing.T) {
	p := newPair(t)
	g := p.g
	const n, h, kv, d, bs, ctx, layers = 4, 8, 2, 128, 16, 1500, 6
	nb := (ctx + bs - 1) / bs
	_, kc := p.same(backend.BF16, []int{n*nb + 1, kv, bs, d}, encode(backend.BF16, p.normal((n*nb+1)*kv*bs*d, 1)))
	_, vc := p.same(backend.BF16, []int{n*nb + 1, kv, bs, d}, encode(backend.BF16, p.normal((n*nb+1)*kv*bs*d, 1)))
	tables, lens, starts := make([]int32, n*nb), make([]int32, n), make([]int32, n+1)
	for i, id := range p.r.Perm(n * nb) {
		tables[i] = int32(id + 1)
	}
	for i := range n {
		lens[i] = int32(ctx - 100*i)
		starts[i+1] = int32(i + 1)
	}
	_, bt := p.same(backend.I32, []int{n, nb}, i32Bytes(tables))
	_, sl := p.same(backend.I32, []int{n}, i32Bytes(lens))
	_, qs := p.same(backend.I32, []int{n + 1}, i32Bytes(starts))
	q := p.poisoned(backend.BF16, n, h*d)
	outs := make([]backend.Tensor, layers)
	for i := range outs {
		outs[i] = p.poisoned(backend.BF16, n, h*d)
	}
	step := func() error {
		for _, o := range outs {
			if err := g.Attention(backend.AttentionArgs{Out: o, Q: q, KCache: kc, VCache: vc, KV: kvOf(kc), BlockTables: bt, SeqLens: sl, QueryStart: qs,
				NumSeqs: n, MaxSeqLen: ctx, NumHeads: h, NumKVHeads: kv, HeadDim: d, Scale: float32(1 / math.Sqrt(d))}); err != nil {
				return err
			}
		}
		return nil
	}
	p.must("write q", g.Write(q, encode(backend.BF16, p.normal(n*h*d, 1))))
	p.must("eager warm-up", step())
	p.must("sync", g.Sync())
	graph, err := g.Capture(step)
	p.must("capture", err)
	defer graph.Close()
	p.must("write q", g.Write(q, encode(backend.BF16, p.normal(n*h*d, 1))))
	p.must("eager", step())
	want := readBytes(t, g, outs[layers-1])
	poison := make([]byte, len(want))
	for i := range poison {
		poison[i] = 0xff // bf16 0xffff is a NaN
	}
	p.must("poison", g.Write(outs[layers-1], poison))
	p.must("launch", graph.Launch())
	p.must("sync", g.Sync())
	if got := readBytes(t, g, outs[layers-1]); string(got) != string(want) {
		t.Fatal("replayed attention differs from the eager one")
	}
}
