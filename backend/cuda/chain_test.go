package cuda

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"unsafe"

	"github.com/trigon-llm/trigon/backend"
)

// TestChainArgsLayout checks that the Go mirror of the chain kernel's
// parameter has the size the kernel's struct has: 18 eight-byte fields an
// op.
func TestChainArgsLayout(t *testing.T) {
	if s := unsafe.Sizeof(chainOp{}); s != 18*8 {
		t.Fatalf("chainOp is %d bytes, want %d", s, 18*8)
	}
	if s := unsafe.Sizeof(chainArgs{}); s != chainArgsBytes {
		t.Fatalf("chainArgs is %d bytes, want %d", s, chainArgsBytes)
	}
	if off := unsafe.Offsetof(chainArgs{}.sync); off != chainArgsBytes-8 {
		t.Fatalf("chainArgs.sync at %d, want %d", off, chainArgsBytes-8)
	}
}

// chainOps is one layer boundary's run: the O projection's add, the MLP,
// and the next layer's QKV.
func chainOps(resid, attn, wo, act, gu, down, g2, g1, qkvW backend.Tensor, eps float32, rope backend.RoPEArgs) []backend.ChainOp {
	return []backend.ChainOp{
		{Kind: backend.ChainMatMulAdd, Out: resid, X: attn, W: wo},
		{Kind: backend.ChainNormGateUpSiLU, Out: act, X: resid, NormW: g2, Eps: eps, W: gu},
		{Kind: backend.ChainMatMulAdd, Out: resid, X: act, W: down},
		{Kind: backend.ChainNormQKVRoPE, X: resid, NormW: g1, Eps: eps, W: qkvW, RoPE: rope},
	}
}

// TestChainRefusals checks, without a GPU, what Chain decides on the
// caller's goroutine: a run it takes queues one task, one it does not
// take returns false with nothing queued, and operands the ops themselves
// refuse are ErrShape with nothing queued.
func TestChainRefusals(t *testing.T) {
	if !gemvEnabled {
		t.Skip("the GEMV is off (TRIGON_CUDA_GEMV=off): nothing fuses")
	}
	defer func(on bool) { chainEnabled = on }(chainEnabled)
	chainEnabled = true
	h := newHostOnly()
	h.b.chainSmem = 227 << 10
	bf, f32, i32 := backend.BF16, backend.F32, backend.I32
	const hidden, inter, heads, kvh, hd, blocks, bs = 512, 768, 8, 2, 64, 10, 16
	const width = (heads + 2*kvh) * hd
	type operands struct {
		resid, attn, wo, act, gu, down, g2, g1, qkvW backend.Tensor
		rope                                         backend.RoPEArgs
	}
	mk := func(n int) operands {
		return operands{
			resid: h.t(bf, n, hidden), attn: h.t(bf, n, heads*hd), wo: h.t(bf, hidden, heads*hd),
			act: h.t(bf, n, inter), gu: h.t(bf, 2*inter, hidden), down: h.t(bf, hidden, inter),
			g2: h.t(f32, hidden), g1: h.t(f32, hidden), qkvW: h.t(bf, width, hidden),
			rope: backend.RoPEArgs{Q: h.t(bf, n, heads*hd), QKV: h.t(bf, n, width), Positions: h.t(i32, n),
				SlotMapping: h.t(i32, n), KCache: h.t(bf, blocks, kvh, bs, hd), VCache: h.t(bf, blocks, kvh, bs, hd),
				InvFreq: h.t(f32, hd/2), NumHeads: heads, NumKVHeads: kvh, HeadDim: hd},
		}
	}
	ops := func(o operands) []backend.ChainOp {
		return chainOps(o.resid, o.attn, o.wo, o.act, o.gu, o.down, o.g2, o.g1, o.qkvW, 1e-5, o.rope)
	}
	four := ops(mk(4))
	for _, tc := range []struct {
		name string
		ops  func() []backend.ChainOp
		want int
	}{
		{"layer", func() []backend.ChainOp { return four }, fused},
		{"one row", func() []backend.ChainOp { return ops(mk(1)) }, fused},
		{"eight rows", func() []backend.ChainOp { return ops(mk(8)) }, fused},
		{"first layer's qkv alone", func() []backend.ChainOp { return four[3:] }, fused},
		{"nine rows", func() []backend.ChainOp { return ops(mk(9)) }, refused},
		{"no ops", func() []backend.ChainOp { return nil }, refused},
		{"five ops", func() []backend.ChainOp { return append(ops(mk(4)), four[0]) }, refused},
		{"rows differ", func() []backend.ChainOp { return append(ops(mk(2))[:3], four[3]) }, refused},
		{"epsilons differ", func() []backend.ChainOp {
			o := ops(mk(4))
			o[3].Eps = 1e-6
			return o
		}, refused},
		{"F32 residual", func() []backend.ChainOp {
			o := mk(4)
			return []backend.ChainOp{{Kind: backend.ChainMatMulAdd, Out: h.t(f32, 4, hidden), X: o.attn, W: o.wo}}
		}, refused},
		{"k not a multiple of 32", func() []backend.ChainOp {
			return []backend.ChainOp{{Kind: backend.ChainMatMulAdd, Out: h.t(bf, 4, hidden), X: h.t(bf, 4, 520), W: h.t(bf, hidden, 520)}}
		}, refused},
		{"add width not a multiple of 16", func() []backend.ChainOp {
			return []backend.ChainOp{{Kind: backend.ChainMatMulAdd, Out: h.t(bf, 4, 520), X: h.t(bf, 4, 512), W: h.t(bf, 520, 512)}}
		}, refused},
		{"norm input too big to stage", func() []backend.ChainOp {
			const k = 16384
			return []backend.ChainOp{{Kind: backend.ChainNormGateUpSiLU, Out: h.t(bf, 4, 64), X: h.t(bf, 4, k), NormW: h.t(f32, k),
				Eps: 1e-5, W: h.t(bf, 128, k)}}
		}, refused},
		{"switched off", func() []backend.ChainOp {
			chainEnabled = false
			return four
		}, refused},
		{"device without the kernel", func() []backend.ChainOp {
			h.b.chainSmem = 0
			return four
		}, refused},
		{"bad add operands", func() []backend.ChainOp {
			o := ops(mk(4))
			o[2].W = h.t(bf, hidden, inter+8)
			return o
		}, bad},
		{"bad norm weight", func() []backend.ChainOp {
			o := ops(mk(4))
			o[1].NormW = h.t(f32, hidden+8)
			return o
		}, bad},
		{"bad rope", func() []backend.ChainOp {
			o := ops(mk(4))
			o[3].RoPE.NumHeads = 7
			return o
		}, bad},
		{"unknown kind", func() []backend.ChainOp {
			o := ops(mk(4))
			o[1].Kind = 9
			return o
		}, bad},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func(on bool, smem int) { chainEnabled, h.b.chainSmem = on, smem }(chainEnabled, h.b.chainSmem)
			ok, err := h.b.Chain(tc.ops())
			checkFuseOutcome(t, tc.want, ok, err, h.queued())
		})
	}
}

// chainCase is one layer boundary's operands on both backends: the QKV
// case's residual stream and QKV operands, plus an attention output, the
// O, gate/up and down weights and the two norm weights.
type chainCase struct {
	p                *pair
	q                *qkvCase
	n, hidden, inter int
	cattn, gattn     backend.Tensor
	cwo, gwo         backend.Tensor
	cgu, ggu         backend.Tensor
	cdown, gdown     backend.Tensor
	cg2, gg2         backend.Tensor
	cg1, gg1         backend.Tensor
	gact             backend.Tensor
	hBytes, actBytes []byte // the residual's and act's bytes before each run
}

const chainEps = 1e-5

func newChainCase(p *pair, heads, kvh, hd, hidden, inter, n int) *chainCase {
	bf := backend.BF16
	c := &chainCase{p: p, q: newQKVCase(p, heads, kvh, hd, hidden, n), n: n, hidden: hidden, inter: inter}
	c.cattn, c.gattn = p.act(bf, []int{n, heads * hd}, p.normal(n*heads*hd, 1))
	ws := func(m, k int) (backend.Tensor, backend.Tensor) {
		return p.same(bf, []int{m, k}, encode(bf, p.normal(m*k, float32(1/math.Sqrt(float64(k))))))
	}
	c.cwo, c.gwo = ws(hidden, heads*hd)
	c.cgu, c.ggu = ws(2*inter, hidden)
	c.cdown, c.gdown = ws(hidden, inter)
	c.cg2, c.gg2 = p.same(backend.F32, []int{hidden}, encode(backend.F32, p.normWeights(hidden)))
	c.cg1, c.gg1 = p.same(backend.F32, []int{hidden}, encode(backend.F32, p.normWeights(hidden)))
	c.gact = p.poisoned(bf, n, inter)
	c.hBytes, c.actBytes = readBytes(p.t, p.g, c.q.gx), readBytes(p.t, p.g, c.gact)
	return c
}

func (c *chainCase) ops() []backend.ChainOp {
	return chainOps(c.q.gx, c.gattn, c.gwo, c.gact, c.ggu, c.gdown, c.gg2, c.gg1, c.q.gw, chainEps, c.q.gpuArgs())
}

// reset restores the caches, the residual and act, and poisons Q.
func (c *chainCase) reset() {
	c.q.reset()
	c.p.must("reset residual", c.p.g.Write(c.q.gx, c.hBytes))
	c.p.must("poison act", c.p.g.Write(c.gact, c.actBytes))
}

// chainOut is what a run left on the GPU.
type chainOut struct {
	q          qkvOut
	resid, act []byte
}

func (c *chainCase) read() chainOut {
	q := c.q.read() // syncs
	return chainOut{q: q, resid: readBytes(c.p.t, c.p.g, c.q.gx), act: readBytes(c.p.t, c.p.g, c.gact)}
}

func (o chainOut) equal(w chainOut) bool {
	return string(o.q.q) == string(w.q.q) && string(o.q.kc) == string(w.q.kc) && string(o.q.vc) == string(w.q.vc) &&
		string(o.resid) == string(w.resid) && string(o.act) == string(w.act)
}

// chain runs the case's ops through Chain, which must take them.
func (c *chainCase) chain() chainOut {
	c.p.t.Helper()
	c.reset()
	ok, err := c.p.g.Chain(c.ops())
	c.p.must("Chain", err)
	if !ok {
		c.p.t.Fatal("Chain returned false for operands it takes")
	}
	return c.read()
}

// separate runs the ops one by one as the model does without a chain
// (MatMulAdd where it fuses, norms, the gate/up product, SiLU, the fused
// QKV projection).
func (c *chainCase) separate() chainOut {
	c.p.t.Helper()
	g, bf := c.p.g, backend.BF16
	c.reset()
	normed, gu := c.p.poisoned(bf, c.n, c.hidden), c.p.poisoned(bf, c.n, 2*c.inter)
	delta := c.p.poisoned(bf, c.n, c.hidden)
	add := func(x, w backend.Tensor) {
		ok, err := g.MatMulAdd(c.q.gx, x, w)
		c.p.must("MatMulAdd", err)
		if !ok {
			c.p.must("matmul", g.MatMul(delta, x, w, nil))
			c.p.must("add", g.AddRMSNorm(normed, delta, c.q.gx, c.gg1, chainEps))
		}
	}
	add(c.gattn, c.gwo)
	c.p.must("post norm", g.AddRMSNorm(normed, c.q.gx, nil, c.gg2, chainEps))
	c.p.must("gate/up", g.MatMul(gu, normed, c.ggu, nil))
	c.p.must("silu", g.SiLUMul(c.gact, gu))
	add(c.gact, c.gdown)
	c.p.must("input norm", g.AddRMSNorm(normed, c.q.gx, nil, c.gg1, chainEps))
	ok, err := g.FusedQKVRoPE(normed, c.q.gw, nil, c.q.gpuArgs())
	c.p.must("FusedQKVRoPE", err)
	if !ok {
		c.p.must("qkv", g.MatMul(c.q.gqkv, normed, c.q.gw, nil))
		c.p.must("rope", g.RoPEStoreKV(c.q.gpuArgs()))
	}
	return c.read()
}

// cpu runs the ops on the CPU backend (its residual and caches change).
func (c *chainCase) cpu() (resid, act []float32) {
	p, cb := c.p, c.p.c
	normed, delta := p.cpuOut(c.n, c.hidden), p.cpuOut(c.n, c.hidden)
	gu, cact := p.cpuOut(c.n, 2*c.inter), p.cpuOut(c.n, c.inter)
	p.must("cpu o", cb.MatMul(delta, c.cattn, c.cwo, nil))
	p.must("cpu add+post norm", cb.AddRMSNorm(normed, delta, c.q.cx, c.cg2, chainEps))
	p.must("cpu gate/up", cb.MatMul(gu, normed, c.cgu, nil))
	p.must("cpu silu", cb.SiLUMul(cact, gu))
	p.must("cpu down", cb.MatMul(delta, cact, c.cdown, nil))
	p.must("cpu add+input norm", cb.AddRMSNorm(normed, delta, c.q.cx, c.cg1, chainEps))
	p.must("cpu qkv", cb.MatMul(c.q.cqkv, normed, c.q.cw, nil))
	p.must("cpu rope", cb.RoPEStoreKV(c.q.cpuArgs()))
	return read(p.t, cb, c.q.cx), read(p.t, cb, cact)
}

// TestChain compares Chain, on fresh random operands, with the CPU
// backend's unfused ops (bf16 tolerance for the residual, SiLU's output,
// Q and the written cache rows; the other cache rows unchanged) and with
// the GPU's ops run one by one (within the noise of the norms' and the
// products' summation order), and checks that a second launch gives the
// same bytes (the kernel's counters were reset). Shapes: Llama-3-8B's at
// 4 rows (the down projection's input read from L2, not staged), and
// small ones whose k is not a multiple of the ring tile's columns, at
// several tile widths and consumer warp counts.
func TestChain(t *testing.T) {
	g := sharedBackend(t, true)
	if g.chainSmem == 0 || !gemvEnabled {
		t.Skip("no chain kernel on this device (compute capability < 9.0) or the GEMV is off")
	}
	defer func(on bool) { chainEnabled = on }(chainEnabled)
	chainEnabled = true
	type variant struct{ kc, nc int }
	def := variant{chainKC, chainNC}
	for _, s := range []struct {
		heads, kvh, hd, hidden, inter int
		v                             variant
	}{
		{32, 8, 128, 4096, 14336, def}, {8, 2, 64, 512, 1376, def}, {4, 4, 32, 128, 5120, def},
		// Other tile widths and consumer warps.
		{8, 2, 64, 512, 1376, variant{512, 8}}, {8, 2, 64, 512, 1376, variant{256, 8}},
		{8, 2, 64, 512, 1376, variant{512, 16}},
	} {
		for _, n := range []int{1, 3, 4, 8} {
			if s.hidden == 4096 && n != 4 {
				continue // the CPU reference is slow
			}
			t.Run(fmt.Sprintf("h%d_kv%d_hd%d_hidden%d_inter%d_n%d_%+v", s.heads, s.kvh, s.hd, s.hidden, s.inter, n, s.v), func(t *testing.T) {
				defer func(v variant) { chainKC, chainNC = v.kc, v.nc }(def)
				chainKC, chainNC = s.v.kc, s.v.nc
				p := newPair(t)
				c := newChainCase(p, s.heads, s.kvh, s.hd, s.hidden, s.inter, n)
				sep := c.separate()
				got := c.chain()
				if again := c.chain(); !again.equal(got) {
					t.Fatal("a second launch on the same inputs gave other bytes")
				}
				wantResid, wantAct := c.cpu()
				bf := backend.BF16
				p.expectClose("residual vs cpu", decode(bf, got.resid), wantResid, bf16Tol)
				p.expectClose("act vs cpu", decode(bf, got.act), wantAct, bf16Tol)
				c.q.checkCPU("chain", got.q)
				p.expectClose("residual vs separate ops", decode(bf, got.resid), decode(bf, sep.resid), 5e-3)
				p.expectClose("act vs separate ops", decode(bf, got.act), decode(bf, sep.act), 5e-3)
				p.expectClose("Q vs separate ops", decode(bf, got.q.q), decode(bf, sep.q.q), 5e-3)
			})
		}
	}
}

// TestChainGraph captures a chain and replays it with fresh residuals and
// positions written between replays: each replay must give the bytes of
// an eager launch on the same inputs.
func TestChainGraph(t *testing.T) {
	g := sharedBackend(t, true)
	if g.chainSmem == 0 || !gemvEnabled {
		t.Skip("no chain kernel on this device (compute capability < 9.0) or the GEMV is off")
	}
	defer func(on bool) { chainEnabled = on }(chainEnabled)
	chainEnabled = true
	p := newPair(t)
	c := newChainCase(p, 8, 2, 64, 1024, 2048, 4)
	c.chain() // loads the kernel before capture
	graph, err := g.Capture(func() error {
		ok, err := g.Chain(c.ops())
		if err == nil && !ok {
			err = errors.New("Chain returned false")
		}
		return err
	})
	p.must("capture", err)
	defer graph.Close()
	for round := range 3 {
		c.hBytes = encode(backend.BF16, p.normal(c.n*c.hidden, 1))
		p.must("write positions", g.Write(c.q.gpos, i32Bytes(c.q.positions())))
		want := c.chain()
		c.reset()
		p.must("launch", graph.Launch())
		if got := c.read(); !got.equal(want) {
			t.Fatalf("round %d: the replay differs from the eager launch", round)
		}
		if string(want.resid) == string(c.hBytes) {
			t.Fatalf("round %d: the residual stream was not written", round)
		}
	}
}
