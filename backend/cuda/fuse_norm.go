package cuda

import (
	"github.com/trigon-llm/trigon/backend"
)

// defaultFusedGEMV is the GEMV variant a fused product runs before the
// tuner has timed its shape (a shape first seen while capturing).
var defaultFusedGEMV = gemvConfig{8, 2}

// fusedGEMV returns the GEMV variant for a fused product of the shape
// [n,k] x [m,k]^T: the fastest one the tuner timed for the plain product
// of that shape, whether or not it beat cuBLASLt (a fused product has no
// cuBLASLt form). On the shape's first eager call the plain product is
// tuned here, into a scratch output, on the call's x and w. CUDA thread
// only.
func (b *Backend) fusedGEMV(n, m, k int, x, w uint64) (gemvConfig, error) {
	key := gemmKey{m: m, n: n, k: k, wt: cudaR16BF, xt: cudaR16BF, yt: cudaR16BF}
	p, ok := b.blas.plans[key]
	if (!ok || p.candidates != nil) && !b.capturing {
		y, err := b.pool.get(n * m * 2)
		if err != nil {
			return gemvConfig{}, err
		}
		p, err = b.gemmPlanFor(y, cudaR16BF, x, w, n, m, k)
		b.pool.put(y)
		if err != nil {
			return gemvConfig{}, err
		}
	}
	if p != nil && p.gemvBest.nw > 0 {
		return p.gemvBest, nil
	}
	return defaultFusedGEMV, nil
}

// product checks x . w^T's operands as MatMul checks them, for a product
// whose output has m columns (ErrShape errors), and reports whether the
// GEMV takes them: BF16 x and w, at most gemvMaxRows rows, k a multiple
// of 8, aligned.
//
//	x [n, k];  w [m, k]
func (b *Backend) product(op string, x, w backend.Tensor, m int) (xt, wt *tensor, ok bool, err error) {
	if xt, err = b.tensorOf(op, "x", x); err != nil {
		return nil, nil, false, err
	}
	if wt, err = b.tensorOf(op, "w", w); err != nil {
		return nil, nil, false, err
	}
	d, err := backend.CheckProduct(op, xt, wt, m)
	if err != nil {
		return nil, nil, false, opErr(err)
	}
	n, k := d.N, d.In
	if n > maxInt32 || m > maxInt32 || k > maxInt32 {
		return nil, nil, false, backend.ShapeError("cuda: "+op, "w", "%v x %v exceeds int32", xt.shape, wt.shape)
	}
	ok = xt.dt == backend.BF16 && wt.dt == backend.BF16 && gemvFits(n, k, xt.ptr, wt.ptr)
	return xt, wt, ok, nil
}

// planMatMulAdd plans the lowering rule matmul_add (lower.go): resid +=
// x . w^T for BF16 operands. Decode batches (at most gemvMaxRows rows)
// run gemv_add_bf16 (kernels/gemv.cu) or its bulk-copy form, whose sum is
// rounded as MatMul into a BF16 buffer, then AddRMSNorm's residual add,
// round it. Larger batches (prefill) run cuBLASLt with beta = 1 and the
// residual as both C and D: the product and the add in one rounding, and
// the norm after it reads the residual alone instead of the residual and
// a product buffer and writes one tensor instead of two (half its
// traffic). It returns false where neither takes the operands; operands
// MatMul or AddRMSNorm would refuse are an ErrShape error. It queues
// nothing.
//
//	resid [n, m] BF16;  x [n, k] BF16;  w [m, k] BF16
func (b *Backend) planMatMulAdd(resid, x, w backend.Tensor) (addPlan, bool, error) {
	rt, xt, wt, ok, err := b.addOperands(resid, x, w)
	if err != nil {
		return addPlan{}, false, err
	}
	n, m, k := xt.shape[0], wt.shape[0], wt.shape[1]
	if !ok {
		if n <= gemvMaxRows || rt.dt != backend.BF16 || xt.dt != backend.BF16 || wt.dt != backend.BF16 ||
			k%8 != 0 || m%8 != 0 {
			return addPlan{}, false, nil
		}
		return addPlan{resid: rt, x: xt, w: wt, blas: true}, true, nil
	}
	return addPlan{resid: rt, x: xt, w: wt, pristine: earlyRead(wt)}, true, nil
}

// addPlan is a product added into the residual, as planMatMulAdd took it:
// through cuBLASLt (blas) or a GEMV.
type addPlan struct {
	resid, x, w *tensor
	blas        bool
	pristine    bool
}

// runMatMulAdd queues p. CUDA thread only.
func (b *Backend) runMatMulAdd(p *addPlan) error {
	n, m, k := p.x.shape[0], p.w.shape[0], p.w.shape[1]
	rt, xt, wt := p.resid, p.x, p.w
	if p.blas {
		return b.gemmAdd(rt.ptr, xt.ptr, wt.ptr, n, m, k)
	}
	if bc := bulkPick(m, k, b.sms); b.bulkFused(bc, n, k, xt.ptr, wt.ptr) {
		return b.bulkCall(bc, "gemvb_add_bf16", rt.ptr, int(dtBF16), xt.ptr, wt.ptr, n, m, k, p.pristine)
	}
	c, err := b.fusedGEMV(n, m, k, xt.ptr, wt.ptr)
	if err != nil {
		return err
	}
	f, err := b.fn(fnKey{modSpec{file: "gemv", p: [8]int{(n + 7) / 8, c.nw, c.ur, dtBF16}}, "gemv_add_bf16"})
	if err != nil {
		return err
	}
	return b.launch(f, [3]int{(m + 15) / 16, 1, 1}, c.nw*32, 0, rt.ptr, xt.ptr, wt.ptr, i32(n), i32(m), i32(k), flag(p.pristine))
}

// gemmAdd queues y += x . w^T (y [n, m], BF16 throughout) as a cuBLASLt
// product with beta = 1, y its C and D. The shape's first eager call
// tunes the plan on a scratch output first: the tuner's runs write their
// output with beta = 0 and would overwrite y. CUDA thread only.
func (b *Backend) gemmAdd(y, x, w uint64, n, m, k int) error {
	key := gemmKey{m: m, n: n, k: k, wt: cudaR16BF, xt: cudaR16BF, yt: cudaR16BF}
	if p, ok := b.blas.plans[key]; (!ok || p.candidates != nil) && !b.capturing {
		tmp, err := b.tmpGet(n * m * 2)
		if err != nil {
			return err
		}
		_, err = b.gemmPlanFor(tmp, cudaR16BF, x, w, n, m, k)
		b.tmpPut(tmp)
		if err != nil {
			return err
		}
	}
	p, err := b.gemmPlanFor(y, cudaR16BF, x, w, n, m, k)
	if err != nil {
		return err
	}
	return b.blas.lib.check("cublasLtMatmul", b.gemmCallBeta(p, p.algo, y, x, w, true))
}

// addOperands checks MatMulAdd's operands (ErrShape errors) and reports
// whether the GEMV takes them: BF16 throughout, few rows, aligned.
func (b *Backend) addOperands(resid, x, w backend.Tensor) (rt, xt, wt *tensor, ok bool, err error) {
	const op = "matmuladd"
	if rt, err = b.tensorOf(op, "resid", resid); err != nil {
		return nil, nil, nil, false, err
	}
	// AddRMSNorm's residual: a float activation (backend.CheckAddRMSNorm).
	if err := opErr(backend.CheckActivation(op, "resid", rt, -1, -1)); err != nil {
		return nil, nil, nil, false, err
	}
	m := rt.shape[1]
	xt, wt, ok, err = b.product(op, x, w, m)
	if err != nil {
		return nil, nil, nil, false, err
	}
	if err := opErr(backend.CheckShape(op, "resid", rt, xt.shape[0], m)); err != nil {
		return nil, nil, nil, false, err
	}
	if overlaps(rt, xt) || overlaps(rt, wt) {
		return nil, nil, nil, false, backend.ShapeError("cuda: "+op, "resid", "overlaps x or w")
	}
	return rt, xt, wt, ok && rt.dt == backend.BF16, nil
}

// flag is a kernel's int flag argument.
func flag(v bool) uint64 {
	if v {
		return 1
	}
	return 0
}

// launchEarlyBit is bit 1 of the flag word of the kernels that can let
// their dependent launch at their start (qkv_rope_bf16, gemvb_silu_bf16):
// the lowering's early attribute. Every kernel waits for its
// predecessor's data, so the bit changes when the next kernel starts,
// never what it computes.
func launchEarlyBit(v bool) uint64 {
	if v {
		return 2
	}
	return 0
}
