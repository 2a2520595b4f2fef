package cuda

import (
	"math"
	"testing"

	"github.com/trigon-llm/trigon/backend"
)

// TestGraphVerifyAttention captures attention as a verify step of
// speculative decoding runs it from the runner's graph: every sequence 5
// query rows, MaxSeqLen fixed at what the block tables hold (past every
// context), MaxQueryLen 5. Between replays the contexts grow by what a
// step accepts and the tables change (fresh inputs in the captured
// tensors); each replay must equal an eager run with the same arguments
// byte for byte, and the CPU oracle run with the real MaxSeqLen within
// bf16 tolerance.
func TestGraphVerifyAttention(t *testing.T) {
	p := newPair(t)
	g := p.g
	const n, q, h, kv, d, bs, width = 4, 5, 8, 2, 128, 16, 64 // width blocks per sequence
	const maxLen = width * bs
	rows := n * q
	ck, kc := p.same(backend.BF16, []int{n*width + 1, kv, bs, d}, encode(backend.BF16, p.normal((n*width+1)*kv*bs*d, 1)))
	cv, vc := p.same(backend.BF16, []int{n*width + 1, kv, bs, d}, encode(backend.BF16, p.normal((n*width+1)*kv*bs*d, 1)))
	gq := p.poisoned(backend.BF16, rows, h*d)
	out := p.poisoned(backend.BF16, rows, h*d)
	bt := p.poisoned(backend.I32, n, width)
	sl := p.poisoned(backend.I32, n)
	qs := p.poisoned(backend.I32, n+1)
	starts := make([]int32, n+1)
	for i := range n {
		starts[i+1] = int32((i + 1) * q)
	}
	p.must("write query starts", g.Write(qs, i32Bytes(starts)))
	args := backend.AttentionArgs{Out: out, Q: gq, KCache: kc, VCache: vc, KV: kvOf(kc), BlockTables: bt, SeqLens: sl, QueryStart: qs,
		NumSeqs: n, MaxSeqLen: maxLen, MaxQueryLen: q, NumHeads: h, NumKVHeads: kv, HeadDim: d, Scale: float32(1 / math.Sqrt(d))}
	step := func() error { return g.Attention(args) }
	lens := []int32{600, 37, 5, 900}
	var tables []int32
	setInputs := func(round int) (qv []float32) {
		tables = tables[:0]
		for _, id := range p.r.Perm(n * width) {
			tables = append(tables, int32(id+1))
		}
		for i := range lens {
			lens[i] += int32(1 + (round+i)%q) // what the previous step accepted, and its bonus
		}
		qv = p.normal(rows*h*d, 1)
		p.must("write tables", g.Write(bt, i32Bytes(tables)))
		p.must("write lens", g.Write(sl, i32Bytes(lens)))
		p.must("write q", g.Write(gq, encode(backend.BF16, qv)))
		return qv
	}
	setInputs(0)
	p.must("eager warm-up", step())
	p.must("sync", g.Sync())
	graph, err := g.Capture(step)
	p.must("capture", err)
	defer graph.Close()
	for round := 1; round <= 3; round++ {
		qv := setInputs(round)
		p.must("eager", step())
		p.must("sync", g.Sync())
		want := readBytes(t, g, out)
		poison := make([]byte, len(want))
		for i := range poison {
			poison[i] = 0xff // bf16 0xffff is a NaN
		}
		p.must("poison", g.Write(out, poison))
		p.must("launch", graph.Launch())
		p.must("sync", g.Sync())
		if got := readBytes(t, g, out); string(got) != string(want) {
			t.Fatalf("round %d: the replayed verify attention differs from the eager one", round)
		}
		// The oracle, with the real longest context.
		realMax := int32(0)
		for _, l := range lens {
			realMax = max(realMax, l)
		}
		cq := p.cpuT(backend.F32, []int{rows, h * d}, encode(backend.F32, qv))
		co := p.cpuOut(rows, h*d)
		cargs := backend.AttentionArgs{Out: co, Q: cq, KCache: ck, VCache: cv, KV: kvOf(ck),
			BlockTables: p.cpuT(backend.I32, []int{n, width}, i32Bytes(tables)), SeqLens: p.cpuT(backend.I32, []int{n}, i32Bytes(lens)),
			QueryStart: p.cpuT(backend.I32, []int{n + 1}, i32Bytes(starts)),
			NumSeqs:    n, MaxSeqLen: int(realMax), MaxQueryLen: q, NumHeads: h, NumKVHeads: kv, HeadDim: d, Scale: args.Scale}
		p.must("cpu attention", p.c.Attention(cargs))
		p.expectClose("verify attention", read(t, g, out), read(t, p.c, co), bf16Tol)
	}
}
