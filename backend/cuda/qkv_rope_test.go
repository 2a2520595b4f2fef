package cuda

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/backend"
)

// What an optional fused op may do with operands, as the refusal tests
// expect it: fused (true, nil, one task queued), refused (false, nil,
// nothing queued) or bad (an ErrShape error, nothing queued).
const (
	fused = iota
	refused
	bad
)

// checkFuseOutcome fails t unless a fused op's result (ok, err, tasks
// queued) is the outcome want.
func checkFuseOutcome(t *testing.T, want int, ok bool, err error, queued int) {
	t.Helper()
	switch want {
	case fused:
		if !ok || err != nil || queued != 1 {
			t.Fatalf("got %v, %v with %d tasks queued; want true, nil with 1", ok, err, queued)
		}
	case refused:
		if ok || err != nil || queued != 0 {
			t.Fatalf("got %v, %v with %d tasks queued; want false, nil with none", ok, err, queued)
		}
	case bad:
		if ok || !errors.Is(err, backend.ErrShape) || queued != 0 {
			t.Fatalf("got %v, %v with %d tasks queued; want false, ErrShape with none", ok, err, queued)
		}
		t.Log(err)
	}
}

// TestFusedQKVRoPERefusals checks, without a GPU, what FusedQKVRoPE
// decides on the caller's goroutine: operands it does not fuse give
// false with nothing queued, operands MatMul or RoPEStoreKV would refuse
// give ErrShape with nothing queued, and fusable ones queue one task.
func TestFusedQKVRoPERefusals(t *testing.T) {
	h := newHostOnly()
	bf, f32, i32 := backend.BF16, backend.F32, backend.I32
	const n, hidden, heads, kvh, hd, blocks, bs = 3, 512, 8, 2, 64, 10, 16
	const width = (heads + 2*kvh) * hd
	x := h.t(bf, n, hidden)
	w := h.t(bf, width, hidden)
	q := h.t(bf, n, heads*hd)
	qkv := h.t(bf, n, width)
	pos, slots := h.t(i32, n), h.t(i32, n)
	kc, vc := h.t(bf, blocks, kvh, bs, hd), h.t(bf, blocks, kvh, bs, hd)
	invf := h.t(f32, hd/2)
	rope := func() backend.RoPEArgs {
		return backend.RoPEArgs{Q: q, QKV: qkv, Positions: pos, SlotMapping: slots, KCache: kc, VCache: vc, KV: kvOf(kc),
			InvFreq: invf, NumHeads: heads, NumKVHeads: kvh, HeadDim: hd}
	}
	// rows returns operands of the same step with r token rows.
	rows := func(r int) (backend.Tensor, backend.RoPEArgs) {
		a := rope()
		a.Q, a.QKV, a.Positions, a.SlotMapping = h.t(bf, r, heads*hd), h.t(bf, r, width), h.t(i32, r), h.t(i32, r)
		return h.t(bf, r, hidden), a
	}
	// qkNorms gives a Qwen3's per-head Q and K norms of dtype dt.
	qkNorms := func(a backend.RoPEArgs, dt backend.DType) backend.RoPEArgs {
		a.QNorm, a.KNorm, a.NormEps = h.t(dt, hd), h.t(dt, hd), 1e-6
		return a
	}
	// headDim24 is a step whose head dim is not a multiple of 16.
	headDim24 := func() (backend.Tensor, backend.Tensor, backend.RoPEArgs) {
		const d = 24
		a := backend.RoPEArgs{Q: h.t(bf, n, heads*d), QKV: h.t(bf, n, (heads+2*kvh)*d), Positions: pos, SlotMapping: slots,
			KCache: h.t(bf, blocks, kvh, bs, d), VCache: h.t(bf, blocks, kvh, bs, d), KV: backend.PlainKV(bf, bs), InvFreq: h.t(f32, d/2),
			NumHeads: heads, NumKVHeads: kvh, HeadDim: d}
		return x, h.t(bf, (heads+2*kvh)*d, hidden), a
	}
	for _, tc := range []struct {
		name string
		op   func() (bool, error)
		want int
	}{
		{"valid", func() (bool, error) { return h.b.fusedQKVRoPE(x, w, nil, rope()) }, fused},
		{"16 rows", func() (bool, error) { x, a := rows(16); return h.b.fusedQKVRoPE(x, w, nil, a) }, fused},
		{"one row", func() (bool, error) { x, a := rows(1); return h.b.fusedQKVRoPE(x, w, nil, a) }, fused},
		{"F32 bias", func() (bool, error) { return h.b.fusedQKVRoPE(x, w, h.t(f32, width), rope()) }, fused},
		{"BF16 bias", func() (bool, error) { return h.b.fusedQKVRoPE(x, w, h.t(bf, width), rope()) }, refused},
		{"bias overlaps Q", func() (bool, error) {
			qt := q.(*tensor)
			bq := &tensor{b: h.b, dt: f32, shape: []int{width}, ptr: qt.ptr, bytes: width * 4}
			return h.b.fusedQKVRoPE(x, w, bq, rope())
		}, refused},
		{"bias length", func() (bool, error) { return h.b.fusedQKVRoPE(x, w, h.t(f32, width+1), rope()) }, bad},
		{"bias dtype", func() (bool, error) { return h.b.fusedQKVRoPE(x, w, h.t(i32, width), rope()) }, bad},
		{"bias 2-d", func() (bool, error) { return h.b.fusedQKVRoPE(x, w, h.t(f32, 1, width), rope()) }, bad},

		{"17 rows", func() (bool, error) { x, a := rows(17); return h.b.fusedQKVRoPE(x, w, nil, a) }, refused},
		{"Q/K norms", func() (bool, error) { return h.b.fusedQKVRoPE(x, w, nil, qkNorms(rope(), bf)) }, fused},
		{"KNorm only", func() (bool, error) { a := rope(); a.KNorm = h.t(f32, hd); return h.b.fusedQKVRoPE(x, w, nil, a) }, fused},
		{"Q/K norms, 8 rows", func() (bool, error) { x, a := rows(8); return h.b.fusedQKVRoPE(x, w, nil, qkNorms(a, f32)) }, fused},
		{"Q/K norms, 9 rows", func() (bool, error) { x, a := rows(9); return h.b.fusedQKVRoPE(x, w, nil, qkNorms(a, f32)) }, refused},
		{"Q/K norms and a bias", func() (bool, error) { return h.b.fusedQKVRoPE(x, w, h.t(f32, width), qkNorms(rope(), bf)) }, refused},
		{"Q/K norm dtypes differ", func() (bool, error) {
			a := qkNorms(rope(), bf)
			a.KNorm = h.t(f32, hd)
			return h.b.fusedQKVRoPE(x, w, nil, a)
		}, bad},
		{"F32 caches", func() (bool, error) {
			a := rope()
			a.KCache, a.VCache, a.KV = h.t(f32, blocks, kvh, bs, hd), h.t(f32, blocks, kvh, bs, hd), backend.PlainKV(f32, bs)
			return h.b.fusedQKVRoPE(x, w, nil, a)
		}, refused},
		{"F32 x", func() (bool, error) { return h.b.fusedQKVRoPE(h.t(f32, n, hidden), w, nil, rope()) }, refused},
		{"Q8_0 w", func() (bool, error) { return h.b.fusedQKVRoPE(x, h.t(backend.Q8_0, width, hidden), nil, rope()) }, refused},
		{"F32 QKV and Q", func() (bool, error) {
			a := rope()
			a.QKV, a.Q = h.t(f32, n, width), h.t(f32, n, heads*hd)
			return h.b.fusedQKVRoPE(x, w, nil, a)
		}, refused},
		{"head dim 24", func() (bool, error) { x, w, a := headDim24(); return h.b.fusedQKVRoPE(x, w, nil, a) }, refused},
		{"k not a multiple of 8", func() (bool, error) {
			return h.b.fusedQKVRoPE(h.t(bf, n, hidden+4), h.t(bf, width, hidden+4), nil, rope())
		}, refused},
		{"x overlaps Q", func() (bool, error) {
			qt := q.(*tensor)
			xq := &tensor{b: h.b, dt: bf, shape: []int{n, hidden}, ptr: qt.ptr, bytes: n * hidden * 2}
			return h.b.fusedQKVRoPE(xq, w, nil, rope())
		}, refused},

		{"w rows", func() (bool, error) { return h.b.fusedQKVRoPE(x, h.t(bf, width+16, hidden), nil, rope()) }, bad},
		{"x inner dim", func() (bool, error) { return h.b.fusedQKVRoPE(h.t(bf, n, hidden+8), w, nil, rope()) }, bad},
		{"x rows", func() (bool, error) { return h.b.fusedQKVRoPE(h.t(bf, n+1, hidden), w, nil, rope()) }, bad},
		{"w 3-d", func() (bool, error) { return h.b.fusedQKVRoPE(x, h.t(bf, 1, width, hidden), nil, rope()) }, bad},
		{"w dtype", func() (bool, error) { return h.b.fusedQKVRoPE(x, h.t(i32, width, hidden), nil, rope()) }, bad},
		{"nil x", func() (bool, error) { return h.b.fusedQKVRoPE(nil, w, nil, rope()) }, bad},
		{"QKV is x", func() (bool, error) {
			a := rope()
			a.QKV = h.t(bf, n, width)
			return h.b.fusedQKVRoPE(a.QKV, h.t(bf, width, width), nil, a)
		}, bad},
		{"QKV width", func() (bool, error) { a := rope(); a.QKV = h.t(bf, n, heads*hd); return h.b.fusedQKVRoPE(x, w, nil, a) }, bad},
		{"heads not a multiple", func() (bool, error) { a := rope(); a.NumKVHeads = 3; return h.b.fusedQKVRoPE(x, w, nil, a) }, bad},
		{"positions length", func() (bool, error) { a := rope(); a.Positions = h.t(i32, n+1); return h.b.fusedQKVRoPE(x, w, nil, a) }, bad},
		{"slot mapping dtype", func() (bool, error) { a := rope(); a.SlotMapping = h.t(f32, n); return h.b.fusedQKVRoPE(x, w, nil, a) }, bad},
		{"cache heads", func() (bool, error) {
			a := rope()
			a.KCache = h.t(bf, blocks, kvh+1, bs, hd)
			return h.b.fusedQKVRoPE(x, w, nil, a)
		}, bad},
		{"V cache dtype", func() (bool, error) {
			a := rope()
			a.VCache = h.t(f32, blocks, kvh, bs, hd)
			return h.b.fusedQKVRoPE(x, w, nil, a)
		}, bad},
		{"inv freq length", func() (bool, error) { a := rope(); a.InvFreq = h.t(f32, hd); return h.b.fusedQKVRoPE(x, w, nil, a) }, bad},
		{"Q dtype", func() (bool, error) { a := rope(); a.Q = h.t(f32, n, heads*hd); return h.b.fusedQKVRoPE(x, w, nil, a) }, bad},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ok, err := tc.op()
			checkFuseOutcome(t, tc.want, ok, err, h.queued())
		})
	}
}

// qkvCase is one step's operands for FusedQKVRoPE on both backends: fresh
// random activations and weights, positions up to 8191 (one always past
// 4096), distinct random slots in a cache of random contents, and with
// more than one row a padding row (slot -1).
type qkvCase struct {
	p                  *pair
	h, kv, hd, k, n    int
	m, numBlocks       int
	initK, initV       []byte // the caches' bytes before each run
	slots              []int32
	cx, cw, cq, cqkv   backend.Tensor // CPU
	ckc, cvc           backend.Tensor
	cpos, cslots       backend.Tensor
	cinvf              backend.Tensor
	gx, gw, gq, gqkv   backend.Tensor // GPU
	gkc, gvc           backend.Tensor
	gpos, gslots       backend.Tensor
	ginvf              backend.Tensor
	cbias, gbias       backend.Tensor // F32 [m], or nil (withBias)
	cqn, gqn, ckn, gkn backend.Tensor // [hd] Q/K norm weights, or nil (withNorms)
	qPoison, qkvPoison []byte
}

// qkNormEps is the Q/K norms' epsilon in the tests (Qwen3's).
const qkNormEps = 1e-6

// withNorms gives the case Qwen3's per-head Q and K norms (weights of
// dtype dt around 1, fresh random values); q or k false leaves that one
// out.
func (c *qkvCase) withNorms(dt backend.DType, q, k bool) *qkvCase {
	weights := func() (backend.Tensor, backend.Tensor) {
		v := c.p.normal(c.hd, 0.3)
		for i := range v {
			v[i] += 1
		}
		return c.p.same(dt, []int{c.hd}, encode(dt, v))
	}
	if q {
		c.cqn, c.gqn = weights()
	}
	if k {
		c.ckn, c.gkn = weights()
	}
	return c
}

// withBias gives the case an F32 QKV bias (fresh random values, as large
// as the products), which every run then adds.
func (c *qkvCase) withBias() *qkvCase {
	c.cbias, c.gbias = c.p.same(backend.F32, []int{c.m}, encode(backend.F32, c.p.normal(c.m, 1)))
	return c
}

const qkvBlockSize = 16

func newQKVCase(p *pair, h, kv, hd, k, n int) *qkvCase {
	c := &qkvCase{p: p, h: h, kv: kv, hd: hd, k: k, n: n, m: (h + 2*kv) * hd, numBlocks: n + 3}
	c.cx, c.gx = p.act(backend.BF16, []int{n, k}, p.normal(n*k, 1))
	c.cw, c.gw = p.same(backend.BF16, []int{c.m, k}, encode(backend.BF16, p.normal(c.m*k, float32(1/math.Sqrt(float64(k))))))
	c.cq, c.cqkv = p.cpuOut(n, h*hd), p.cpuOut(n, c.m)
	c.gq, c.gqkv = p.poisoned(backend.BF16, n, h*hd), p.poisoned(backend.BF16, n, c.m)
	c.qPoison, c.qkvPoison = readBytes(p.t, p.g, c.gq), readBytes(p.t, p.g, c.gqkv)
	cache := []int{c.numBlocks, kv, qkvBlockSize, hd}
	c.initK = encode(backend.BF16, p.normal(c.numBlocks*kv*qkvBlockSize*hd, 1))
	c.initV = encode(backend.BF16, p.normal(c.numBlocks*kv*qkvBlockSize*hd, 1))
	// The CPU backend writes into uploaded bytes: it gets copies.
	c.ckc, c.gkc = p.cpuT(backend.BF16, cache, slices.Clone(c.initK)), p.gpuT(backend.BF16, cache, c.initK)
	c.cvc, c.gvc = p.cpuT(backend.BF16, cache, slices.Clone(c.initV)), p.gpuT(backend.BF16, cache, c.initV)
	pos := c.positions()
	c.cpos, c.gpos = p.same(backend.I32, []int{n}, i32Bytes(pos))
	c.slots = make([]int32, n)
	for i, s := range p.r.Perm(c.numBlocks * qkvBlockSize)[:n] {
		c.slots[i] = int32(s)
	}
	if n > 1 {
		c.slots[p.r.IntN(n)] = -1
	}
	c.cslots, c.gslots = p.same(backend.I32, []int{n}, i32Bytes(c.slots))
	invf := make([]float32, hd/2)
	for i := range invf {
		invf[i] = float32(math.Pow(500000, -2*float64(i)/float64(hd)))
	}
	c.cinvf, c.ginvf = p.same(backend.F32, []int{hd / 2}, encode(backend.F32, invf))
	return c
}

// positions returns fresh random positions, the last one past 4096.
func (c *qkvCase) positions() []int32 {
	pos := make([]int32, c.n)
	for i := range pos {
		pos[i] = int32(c.p.r.IntN(8192))
	}
	pos[c.n-1] = int32(4097 + c.p.r.IntN(4000))
	return pos
}

func (c *qkvCase) cpuArgs() backend.RoPEArgs {
	return backend.RoPEArgs{Q: c.cq, QKV: c.cqkv, Positions: c.cpos, SlotMapping: c.cslots, KCache: c.ckc, VCache: c.cvc, KV: kvOf(c.ckc),
		InvFreq: c.cinvf, NumHeads: c.h, NumKVHeads: c.kv, HeadDim: c.hd, QNorm: c.cqn, KNorm: c.ckn, NormEps: qkNormEps}
}

func (c *qkvCase) gpuArgs() backend.RoPEArgs {
	return backend.RoPEArgs{Q: c.gq, QKV: c.gqkv, Positions: c.gpos, SlotMapping: c.gslots, KCache: c.gkc, VCache: c.gvc, KV: kvOf(c.gkc),
		InvFreq: c.ginvf, NumHeads: c.h, NumKVHeads: c.kv, HeadDim: c.hd, QNorm: c.gqn, KNorm: c.gkn, NormEps: qkNormEps}
}

// qkvOut is what a run left on the GPU.
type qkvOut struct{ q, kc, vc, qkv []byte }

// reset restores the caches and poisons Q and QKV, so a run's writes (and
// the lack of them) show.
func (c *qkvCase) reset() {
	g := c.p.g
	c.p.must("reset K cache", g.Write(c.gkc, c.initK))
	c.p.must("reset V cache", g.Write(c.gvc, c.initV))
	c.p.must("poison Q", g.Write(c.gq, c.qPoison))
	c.p.must("poison QKV", g.Write(c.gqkv, c.qkvPoison))
}

func (c *qkvCase) read() qkvOut {
	t, g := c.p.t, c.p.g
	c.p.must("sync", g.Sync())
	return qkvOut{q: readBytes(t, g, c.gq), kc: readBytes(t, g, c.gkc), vc: readBytes(t, g, c.gvc), qkv: readBytes(t, g, c.gqkv)}
}

// sameQKV fails the test unless the fused kernel's Q and cache bytes
// (got) equal MatMul + RoPEStoreKV's (want) on the same GEMV variant.
func sameQKV(t *testing.T, label string, got, want qkvOut) {
	t.Helper()
	for _, o := range []struct {
		name      string
		got, want []byte
	}{{"Q", got.q, want.q}, {"K cache", got.kc, want.kc}, {"V cache", got.vc, want.vc}} {
		if string(o.got) != string(o.want) {
			t.Fatalf("%s: fused %s differs from MatMul + RoPEStoreKV", label, o.name)
		}
	}
}

// unfused runs MatMul then RoPEStoreKV.
func (c *qkvCase) unfused() qkvOut {
	c.reset()
	c.p.must("matmul", c.p.g.MatMul(c.gqkv, c.gx, c.gw, c.gbias))
	c.p.must("rope", c.p.g.RoPEStoreKV(c.gpuArgs()))
	return c.read()
}

// fused runs FusedQKVRoPE, which must accept the operands.
func (c *qkvCase) fused() qkvOut {
	c.p.t.Helper()
	c.reset()
	ok, err := c.p.g.fusedQKVRoPE(c.gx, c.gw, c.gbias, c.gpuArgs())
	c.p.must("fused", err)
	if !ok {
		c.p.t.Fatal("FusedQKVRoPE returned false for operands it fuses")
	}
	return c.read()
}

// pinnedTo is the tuning that pins FusedQKVRoPE's GEMV variant to v.
func pinnedTo(v gemvConfig) Tuning { return Tuning{QKVGEMV: GEMVVariant{Warps: v.nw, Spans: v.ur}} }

// forceGEMV makes the plan of the case's product run GEMV variant v (the
// zero value: cuBLASLt) and returns what it ran before. The plan must
// exist (an eager MatMul of the shape made and tuned it). A bulk-copy
// GEMV the tuner kept for the plain product is dropped from the plan:
// the fused kernel is the register GEMV's, whose bytes the test compares.
func (c *qkvCase) forceGEMV(v gemvConfig) gemvConfig {
	c.p.t.Helper()
	g := c.p.g
	var old gemvConfig
	c.p.must("force GEMV variant", g.call(func() error {
		p, ok := g.blas.plans[gemmKey{m: c.m, n: c.n, k: c.k, wt: cudaR16BF, xt: cudaR16BF, yt: cudaR16BF}]
		if !ok {
			return fmt.Errorf("no plan for [%d,%d]x[%d,%d]^T", c.n, c.k, c.m, c.k)
		}
		old, p.gemv, p.bulk = p.gemv, v, bulkConfig{}
		return nil
	}))
	return old
}

// splitCache returns the rows of a [numBlocks, KV, bs, hd] cache that the
// case's slots write, in (token, head) order, and every other value.
func (c *qkvCase) splitCache(v []float32) (written, rest []float32) {
	at := map[int]bool{} // first element of each written row
	for _, s := range c.slots {
		if s < 0 {
			continue
		}
		blk, off := int(s)/qkvBlockSize, int(s)%qkvBlockSize
		for head := range c.kv {
			o := ((blk*c.kv+head)*qkvBlockSize + off) * c.hd
			written = append(written, v[o:o+c.hd]...)
			at[o] = true
		}
	}
	for o := 0; o < len(v); o += c.hd {
		if !at[o] {
			rest = append(rest, v[o:o+c.hd]...)
		}
	}
	return written, rest
}

// checkCPU compares a GPU run with the CPU backend's MatMul and
// RoPEStoreKV: Q and the written cache rows within bf16 tolerance, the
// rest of the caches unchanged.
func (c *qkvCase) checkCPU(what string, got qkvOut) {
	p := c.p
	p.expectClose(what+" Q", decode(backend.BF16, got.q), read(p.t, p.c, c.cq), bf16Tol)
	for _, kv := range []struct {
		name string
		got  []byte
		cpu  backend.Tensor
	}{{"K cache", got.kc, c.ckc}, {"V cache", got.vc, c.cvc}} {
		gw, gr := c.splitCache(decode(backend.BF16, kv.got))
		cw, cr := c.splitCache(read(p.t, p.c, kv.cpu))
		p.expectClose(what+" "+kv.name, gw, cw, bf16Tol)
		for i := range gr {
			if math.Float32bits(gr[i]) != math.Float32bits(cr[i]) {
				p.t.Fatalf("%s %s: value %d of the rows no slot names changed: %v, want %v", what, kv.name, i, gr[i], cr[i])
			}
		}
	}
}

// TestFusedQKVRoPE compares the fused projection + RoPE + KV write with
// MatMul then RoPEStoreKV on the same GEMV variant (byte for byte) and
// with the CPU backend (bf16 tolerance), with a QKV bias (Qwen2's) too,
// at Llama-3-8B's and small shapes. Past qkvGEMVMaxRows rows it follows
// the plan: every GEMV variant forced in turn, then the cuBLASLt fallback.
// Up to it the pinned variant runs whatever the plan holds;
// TestFusedQKVRoPEPinned pins each variant in turn.
func TestFusedQKVRoPE(t *testing.T) {
	g := sharedBackend(t, true)
	type shape struct{ h, kv, hd, k int }
	type qkvTest struct {
		shape
		n    int
		bias bool
	}
	var cases []qkvTest
	for _, s := range []shape{{32, 8, 128, 4096}, {8, 2, 64, 1024}, {4, 4, 16, 1000}, {16, 2, 256, 2048}} {
		for _, n := range []int{1, 3, 4, 9, 16} {
			cases = append(cases, qkvTest{s, n, false})
		}
	}
	for _, s := range []shape{{28, 4, 128, 3584}, {8, 2, 64, 1024}} { // Qwen2.5-7B's heads and hidden size first
		for _, n := range []int{1, 4, 9} {
			cases = append(cases, qkvTest{s, n, true})
		}
	}
	for _, tc := range cases {
		s, n := tc.shape, tc.n
		name := fmt.Sprintf("h%d_kv%d_hd%d_k%d_n%d", s.h, s.kv, s.hd, s.k, n)
		if tc.bias {
			name += "_bias"
		}
		t.Run(name, func(t *testing.T) {
			p := newPair(t)
			c := newQKVCase(p, s.h, s.kv, s.hd, s.k, n)
			if tc.bias {
				c.withBias()
			}
			p.must("cpu matmul", p.c.MatMul(c.cqkv, c.cx, c.cw, c.cbias))
			p.must("cpu rope", p.c.RoPEStoreKV(c.cpuArgs()))
			c.checkCPU("unfused", c.unfused()) // makes and tunes the shape's plan
			tuned := c.forceGEMV(gemvConfig{})
			t.Cleanup(func() { c.forceGEMV(tuned) })
			t.Logf("tuner's choice: %+v", tuned)
			if n <= qkvGEMVMaxRows {
				// The pinned variant, with the plan on cuBLASLt and on
				// another variant: the pinned variant's bytes either way.
				pin := g.tune.qkvGEMV
				c.forceGEMV(pin)
				want := c.unfused()
				for _, v := range []gemvConfig{{}, gemvConfigs[0]} {
					c.forceGEMV(v)
					got := c.fused()
					if string(got.qkv) != string(c.qkvPoison) {
						t.Fatalf("plan %+v: QKV was written: the plan's path ran, not the pinned kernel", v)
					}
					sameQKV(t, fmt.Sprintf("pinned %+v, plan %+v", pin, v), got, want)
					c.checkCPU(fmt.Sprintf("pinned %+v", pin), got)
				}
				return
			}
			for _, v := range gemvConfigs {
				c.forceGEMV(v)
				want, got := c.unfused(), c.fused()
				sameQKV(t, fmt.Sprintf("GEMV %+v", v), got, want)
				if string(got.qkv) != string(c.qkvPoison) {
					t.Fatalf("GEMV %+v: QKV was written: the unfused fallback ran, not the fused kernel", v)
				}
				c.checkCPU(fmt.Sprintf("fused %+v", v), got)
			}
			c.forceGEMV(gemvConfig{})
			got := c.fused()
			if string(got.qkv) == string(c.qkvPoison) {
				t.Fatal("cuBLASLt plan: QKV unwritten, the fallback did not run")
			}
			c.checkCPU("fallback", got)
		})
	}
}

// TestFusedQKVRoPEPinned runs FusedQKVRoPE up to qkvGEMVMaxRows rows with
// each GEMV variant pinned in turn (Tuning.QKVGEMV) and the plan on
// cuBLASLt: the fused kernel must run, with the bytes of MatMul on that
// variant then RoPEStoreKV, and match the CPU within bf16 tolerance; with
// and without Q/K norms (the pinned GEMV into QKV, then rope_store_kv).
func TestFusedQKVRoPEPinned(t *testing.T) {
	sharedBackend(t, true)
	for _, v := range gemvConfigs {
		g := backendWith(t, pinnedTo(v), "")
		for _, s := range []struct{ h, kv, hd, k int }{{8, 2, 64, 1024}, {4, 4, 16, 1000}} {
			for _, n := range []int{1, 4, 8} {
				for _, norms := range []bool{false, true} {
					t.Run(fmt.Sprintf("w%d_s%d_h%d_kv%d_hd%d_k%d_n%d_norms_%v", v.nw, v.ur, s.h, s.kv, s.hd, s.k, n, norms), func(t *testing.T) {
						p := newPairOn(t, g)
						c := newQKVCase(p, s.h, s.kv, s.hd, s.k, n)
						if norms {
							c.withNorms(backend.BF16, true, true)
						}
						p.must("cpu matmul", p.c.MatMul(c.cqkv, c.cx, c.cw, nil))
						p.must("cpu rope", p.c.RoPEStoreKV(c.cpuArgs()))
						c.unfused() // makes and tunes the plan
						tuned := c.forceGEMV(v)
						t.Cleanup(func() { c.forceGEMV(tuned) })
						want := c.unfused()
						c.forceGEMV(gemvConfig{})
						got := c.fused()
						sameQKV(t, fmt.Sprintf("pinned %+v", v), got, want)
						if norms {
							if string(got.qkv) != string(want.qkv) {
								t.Fatalf("pinned %+v: the pair's QKV differs from MatMul's", v)
							}
						} else if string(got.qkv) != string(c.qkvPoison) {
							t.Fatalf("pinned %+v: QKV was written: the cuBLASLt fallback ran, not the pinned kernel", v)
						}
						c.checkCPU(fmt.Sprintf("pinned %+v", v), got)
					})
				}
			}
		}
	}
}

// TestFusedQKVRoPEQKNorm checks FusedQKVRoPE with Qwen3's Q/K norms (the
// pinned GEMV into QKV, then rope_store_kv, both under PDL): byte for byte
// MatMul on the pinned variant then RoPEStoreKV, and within bf16
// tolerance of the CPU backend; at Qwen3-8B's heads and hidden size, a
// small shape, head dims 32 and 16, weights F32 and BF16, and the K norm
// alone. TestFusedQKVRoPEPinned pins the other variants.
func TestFusedQKVRoPEQKNorm(t *testing.T) {
	g := sharedBackend(t, true)
	type shape struct{ h, kv, hd, k int }
	for _, s := range []shape{{32, 8, 128, 4096}, {8, 2, 64, 1024}, {4, 2, 32, 512}, {4, 4, 16, 1000}} {
		for _, n := range []int{1, 4, 8} {
			for _, norms := range []string{"f32", "bf16", "k"} {
				t.Run(fmt.Sprintf("h%d_kv%d_hd%d_k%d_n%d_%s", s.h, s.kv, s.hd, s.k, n, norms), func(t *testing.T) {
					p := newPair(t)
					c := newQKVCase(p, s.h, s.kv, s.hd, s.k, n)
					switch norms {
					case "f32":
						c.withNorms(backend.F32, true, true)
					case "bf16":
						c.withNorms(backend.BF16, true, true)
					case "k":
						c.withNorms(backend.BF16, false, true)
					}
					p.must("cpu matmul", p.c.MatMul(c.cqkv, c.cx, c.cw, nil))
					p.must("cpu rope", p.c.RoPEStoreKV(c.cpuArgs()))
					c.unfused() // makes and tunes the plan
					pin := g.tune.qkvGEMV
					tuned := c.forceGEMV(pin)
					t.Cleanup(func() { c.forceGEMV(tuned) })
					want := c.unfused()
					c.forceGEMV(gemvConfig{}) // the pair ignores the plan
					got := c.fused()
					sameQKV(t, fmt.Sprintf("pinned %+v", pin), got, want)
					if string(got.qkv) != string(want.qkv) {
						t.Fatalf("pinned %+v: the pair's QKV differs from MatMul's", pin)
					}
					c.checkCPU(fmt.Sprintf("pinned %+v", pin), got)
				})
			}
		}
	}
}

// TestFusedQKVRoPEDeviceChecks expects the fused kernel to report a
// negative position and a slot past the cache at Sync, as rope_store_kv
// does.
func TestFusedQKVRoPEDeviceChecks(t *testing.T) {
	for _, n := range []int{4, 9} { // the pinned variant, and the plan's forced to one
		t.Run(fmt.Sprintf("n%d", n), func(t *testing.T) {
			p := newPair(t)
			c := newQKVCase(p, 8, 2, 64, 1024, n)
			c.unfused() // makes and tunes the plan
			tuned := c.forceGEMV(gemvConfigs[0])
			t.Cleanup(func() { c.forceGEMV(tuned) })
			c.deviceChecks(t)
		})
	}
}

// deviceChecks runs FusedQKVRoPE with a negative position and then with a
// slot past the cache, and expects each reported at Sync (ErrShape naming
// it), as rope_store_kv reports them, and a clean Sync after.
func (c *qkvCase) deviceChecks(t *testing.T) {
	p := c.p
	good := slices.Clone(c.slots)
	for _, tc := range []struct {
		name  string
		pos   int32
		slot  int32
		wants string
	}{{"negative position", -5, 0, "negative position"}, {"slot past the cache", 7, int32(c.numBlocks * qkvBlockSize), "slot outside"}} {
		t.Run(tc.name, func(t *testing.T) {
			pos := c.positions()
			pos[1] = tc.pos
			slots := slices.Clone(good)
			slots[2] = tc.slot
			p.must("write positions", p.g.Write(c.gpos, i32Bytes(pos)))
			p.must("write slots", p.g.Write(c.gslots, i32Bytes(slots)))
			c.reset()
			ok, err := p.g.fusedQKVRoPE(c.gx, c.gw, nil, c.gpuArgs())
			if !ok || err != nil {
				t.Fatalf("FusedQKVRoPE: %v, %v", ok, err)
			}
			err = p.g.Sync()
			if !errors.Is(err, backend.ErrShape) || !strings.Contains(err.Error(), tc.wants) {
				t.Fatalf("Sync: %v, want ErrShape naming %q", err, tc.wants)
			}
			p.must("second sync", p.g.Sync())
		})
	}
	p.must("restore slots", p.g.Write(c.gslots, i32Bytes(good)))
}

// TestFusedQKVRoPEGraph captures FusedQKVRoPE on the pinned variant (4
// rows), on a plan's GEMV variant and on its cuBLASLt fallback (9 rows),
// and as the Q/K-norm pair, and replays it three times with fresh x and
// positions written between replays: each replay must match an eager run
// on the same inputs byte for byte.
func TestFusedQKVRoPEGraph(t *testing.T) {
	sharedBackend(t, true)
	for _, tc := range []struct {
		name  string
		n     int
		v     gemvConfig // the plan's variant
		norms bool       // Q/K norms: the pinned GEMV and rope_store_kv under PDL
		fused bool       // the fused kernel runs, leaving QKV unwritten
	}{
		{"pinned", 4, gemvConfig{}, false, true},
		{"fused", 9, gemvConfigs[2], false, true},
		{"cuBLASLt", 9, gemvConfig{}, false, false},
		{"Q/K-norm pair", 4, gemvConfig{}, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t)
			g := p.g
			c := newQKVCase(p, 8, 2, 64, 1024, tc.n)
			if tc.norms {
				c.withNorms(backend.F32, true, true)
			}
			c.unfused() // makes and tunes the plan
			tuned := c.forceGEMV(tc.v)
			t.Cleanup(func() { c.forceGEMV(tuned) })
			c.fused() // loads the kernels before capture
			step := func() error {
				ok, err := g.fusedQKVRoPE(c.gx, c.gw, nil, c.gpuArgs())
				if err == nil && !ok {
					err = errors.New("FusedQKVRoPE returned false")
				}
				return err
			}
			graph, err := g.Capture(step)
			p.must("capture", err)
			defer graph.Close()
			for round := range 3 {
				p.must("write x", g.Write(c.gx, encode(backend.BF16, p.normal(c.n*c.k, 1))))
				p.must("write positions", g.Write(c.gpos, i32Bytes(c.positions())))
				want := c.fused()
				c.reset()
				p.must("launch", graph.Launch())
				got := c.read()
				if string(got.q) != string(want.q) || string(got.kc) != string(want.kc) || string(got.vc) != string(want.vc) {
					t.Fatalf("round %d: the replay differs from the eager run", round)
				}
				if fusedKernel := string(got.qkv) == string(c.qkvPoison); fusedKernel != tc.fused {
					t.Fatalf("round %d: QKV unwritten %v, want %v", round, fusedKernel, tc.fused)
				}
				if string(want.kc) == string(c.initK) {
					t.Fatalf("round %d: the K cache was not written", round)
				}
			}
		})
	}
}
