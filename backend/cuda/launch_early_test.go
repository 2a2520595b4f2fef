package cuda

import (
	"math"
	"testing"

	"github.com/trigon-llm/trigon/backend"
)

// TestLaunchEarly runs the two chains whose first kernel lets its
// dependent launch at its start: the fused QKV product (qkv_rope_bf16)
// and a bulk product reading its Q, and gate/up with SiLU
// (gemvb_silu_bf16) then the down product adding its output into a
// residual (gemvb_add_bf16). An early dependent still waits for its
// predecessor to complete, so the chains must match the CPU's within
// bf16 rounding (fresh random inputs, so a dependent that read a stale or
// half-written output fails), and a second run must give the same bytes.
func TestLaunchEarly(t *testing.T) {
	b := needBulk(t)
	p := newPair(t)
	const n, k, inter = 4, 1024, 2048
	var c bulkConfig
	for _, v := range bulkConfigs {
		if k%v.ck == 0 && inter%v.ck == 0 {
			c = v
			break
		}
	}
	if c.cw == 0 {
		t.Fatal("no bulk variant fits k 1024 and 2048")
	}
	cx, gx := p.act(backend.BF16, []int{n, k}, p.normal(n*k, 1))
	cgu, ggu := p.same(backend.BF16, []int{2 * inter, k}, encode(backend.BF16, p.normal(2*inter*k, float32(2/math.Sqrt(k)))))
	cdown, gdown := p.same(backend.BF16, []int{k, inter}, encode(backend.BF16, p.normal(k*inter, float32(1/math.Sqrt(inter)))))
	resid0 := encode(backend.BF16, p.normal(n*k, 1))
	gresid := p.gpuT(backend.BF16, []int{n, k}, resid0)
	gact := p.poisoned(backend.BF16, n, inter)

	q := newQKVCase(p, 8, 2, 128, k, n)
	const m2 = 512
	cw2, gw2 := p.same(backend.BF16, []int{m2, 8 * 128}, encode(backend.BF16, p.normal(m2*8*128, float32(1/math.Sqrt(8*128)))))
	gy := p.poisoned(backend.F32, n, m2)

	ptr := func(x backend.Tensor) uint64 {
		tt, err := b.tensorOf("t", "x", x)
		p.must("tensor", err)
		return tt.ptr
	}
	type out struct{ act, resid, y []byte }
	run := func() out {
		t.Helper()
		p.must("reset residual", b.Write(gresid, resid0))
		q.reset()
		ok, err := b.fusedQKVRoPE(q.gx, q.gw, nil, q.gpuArgs())
		p.must("FusedQKVRoPE", err)
		if !ok {
			t.Fatal("FusedQKVRoPE refused a decode-sized product")
		}
		p.must("chains", b.call(func() error {
			if err := b.bulkCall(c, "gemvb_bf16", ptr(gy), int(dtF32), ptr(q.gq), ptr(gw2), n, m2, 8*128, true); err != nil {
				return err
			}
			if err := b.bulkCall(c, "gemvb_silu_bf16", ptr(gact), int(dtBF16), ptr(gx), ptr(ggu), n, inter, k, true); err != nil {
				return err
			}
			return b.bulkCall(c, "gemvb_add_bf16", ptr(gresid), int(dtBF16), ptr(gact), ptr(gdown), n, k, inter, true)
		}))
		p.must("sync", b.Sync())
		return out{readBytes(t, b, gact), readBytes(t, b, gresid), readBytes(t, b, gy)}
	}
	on, again := run(), run()
	if string(again.act) != string(on.act) || string(again.resid) != string(on.resid) || string(again.y) != string(on.y) {
		t.Fatal("a second run of the chains wrote other bytes")
	}

	// The CPU's chains: gate/up, SiLU x mul, the down product added to
	// the residual (rounded to bf16 first, as the kernel does); Q, then
	// the product reading it.
	cgate, cact := p.cpuOut(n, 2*inter), p.cpuOut(n, inter)
	p.must("cpu gate/up", p.c.MatMul(cgate, cx, cgu, nil))
	p.must("cpu silu", p.c.SiLUMul(cact, cgate))
	cdelta := p.cpuOut(n, k)
	p.must("cpu down", p.c.MatMul(cdelta, cact, cdown, nil))
	want := decode(backend.BF16, resid0)
	for i, d := range read(t, p.c, cdelta) {
		want[i] += decode(backend.BF16, encode(backend.BF16, []float32{d}))[0]
	}
	p.expectClose("gate/up+silu", decode(backend.BF16, on.act), read(t, p.c, cact), bf16Tol)
	p.expectClose("residual after down", decode(backend.BF16, on.resid), want, bf16Tol)
	p.must("cpu qkv", p.c.MatMul(q.cqkv, q.cx, q.cw, nil))
	p.must("cpu rope", p.c.RoPEStoreKV(q.cpuArgs()))
	cy := p.cpuOut(n, m2)
	p.must("cpu y", p.c.MatMul(cy, q.cq, cw2, nil))
	p.expectClose("product of Q", decode(backend.F32, on.y), read(t, p.c, cy), bf16Tol)
}
