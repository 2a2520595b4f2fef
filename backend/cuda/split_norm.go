package cuda

import (
	"math"

	"github.com/trigon-llm/trigon/backend"
)

var _ backend.SplitNormFuser = (*Backend)(nil)

// The split norm (backend.SplitNormFuser): the product that adds into the
// residual stream before an RMS norm leaves the norm's first half, and
// the product after the norm finishes it, so no norm kernel runs between
// them. On the bulk GEMV (sm_90):
//
//	O or down: gemvb_add_scaled_bf16   resid += x . w^T; xs = bf16(resid * g);
//	                                   ss[row][tile] = sum of resid^2 over the tile's 16 features
//	gate/up:   gemvb_silu_scaled_bf16  rs = rsqrt(sum(ss[row]) / k + eps) from ss,
//	                                   SiLU x mul of bf16(rs * (xs . w^T))
//	QKV:       qkv_rope_bf16 with ss (the register GEMV), or with bulkQKV
//	           gemvb_qkv_rope_scaled_bf16: RoPE and the KV write on bf16(rs * (xs . w^T))
//
// A norm kernel costs 2.7 us in the decode chain (BenchmarkGEMVBulk,
// layer_tuned against layer_nonorm); normalising x inside the consuming
// product instead (a whole row's scaling in every stage of every block)
// cost 19-29 us a layer (ninth session). Here the consumer's stream is the
// plain product's: its only extra work is ss's few KiB, loaded under the
// first tile's stream, and one scale per output. Off until measured:
// bulkNorm (TRIGON_CUDA_GEMV_BULK_NORM=on).

// ssShape is the shape of the sums of squares of a residual [n, m]: one
// per row and 16-feature tile.
func ssShape(n, m int) []int { return []int{n, (m + 15) / 16} }

// splitNormOperands checks xs [n, k] and ss (ssShape(n, k), F32) for op
// (ErrShape errors) and reports whether the kernels take them (BF16 xs).
func (b *Backend) splitNormOperands(op string, xs, ss backend.Tensor, n, k int) (xt, st *tensor, ok bool, err error) {
	if xt, err = b.tensorOf(op, "xs", xs); err != nil {
		return nil, nil, false, err
	}
	if err := checkDType(op, "xs", xt, floatDTypes...); err != nil {
		return nil, nil, false, err
	}
	if err := checkShape(op, "xs", xt, n, k); err != nil {
		return nil, nil, false, err
	}
	if st, err = b.tensorOf(op, "ss", ss); err != nil {
		return nil, nil, false, err
	}
	if err := checkDType(op, "ss", st, backend.F32); err != nil {
		return nil, nil, false, err
	}
	if err := checkShape(op, "ss", st, ssShape(n, k)...); err != nil {
		return nil, nil, false, err
	}
	if overlaps(xt, st) {
		return nil, nil, false, backend.ShapeError("cuda: "+op, "ss", "overlaps xs")
	}
	return xt, st, xt.dt == backend.BF16 && xt.ptr%16 == 0, nil
}

// checkEps is the norm epsilon check AddRMSNorm makes.
func checkEps(op string, eps float32) error {
	if !(eps >= 0) || math.IsInf(float64(eps), 0) {
		return backend.ShapeError("cuda: "+op, "eps", "%v is not a finite non-negative number", eps)
	}
	return nil
}

// MatMulAddScaled implements backend.SplitNormFuser: MatMulAdd on
// gemvb_add_scaled_bf16, which also writes xs and ss. It fuses where
// MatMulAdd would run the bulk GEMV (decode batches on sm_90) and g is an
// F32 norm weight.
//
//	resid [n, m] BF16;  x [n, k];  w [m, k];  g [m] F32;  xs [n, m] BF16;
//	ss [n, ceil(m/16)] F32
func (b *Backend) MatMulAddScaled(resid, x, w, g, xs, ss backend.Tensor) (bool, error) {
	const op = "matmuladdscaled"
	rt, xt, wt, ok, err := b.addOperands(resid, x, w)
	if err != nil {
		return false, err
	}
	n, m, k := xt.shape[0], wt.shape[0], wt.shape[1]
	gt, gok, err := b.normWeight(op, g, 0, m)
	if err != nil {
		return false, err
	}
	xst, st, sok, err := b.splitNormOperands(op, xs, ss, n, m)
	if err != nil {
		return false, err
	}
	for _, o := range []*tensor{rt, xt, wt, gt} {
		if overlaps(xst, o) || overlaps(st, o) {
			return false, backend.ShapeError("cuda: "+op, "xs", "xs or ss overlaps resid, x, w or g")
		}
	}
	c := bulkPickScaled(m, k, b.sms)
	if !ok || !gok || !sok || !bulkNorm || fuseNormOps&fuseAdd == 0 || !b.bulkFits(c, n, k, xt.ptr, wt.ptr) {
		return false, nil
	}
	pristine := wt.owner != nil && wt.owner.pristine.Load()
	if err := b.post(func() error {
		f, err := b.fnSmem(fnKey{c.spec(n, int(dtBF16)), "gemvb_add_scaled_bf16"}, c.smem())
		if err != nil {
			return err
		}
		return b.launch(f, [3]int{b.bulkGrid(f, c, (m+15)/16), 1, 1}, (c.cw+1)*32, c.smem(), rt.ptr, xt.ptr, wt.ptr,
			i32(n), i32(m), i32(k), flag(pristine), gt.ptr, xst.ptr, st.ptr)
	}); err != nil {
		return false, err
	}
	return true, nil
}

// ScaledGateUpSiLU implements backend.SplitNormFuser on
// gemvb_silu_scaled_bf16 (sm_90, decode batches).
//
//	out [n, inter] BF16;  xs [n, k] BF16;  ss [n, ceil(k/16)] F32;
//	w [2*inter, k] BF16
func (b *Backend) ScaledGateUpSiLU(out, xs, ss backend.Tensor, eps float32, w backend.Tensor) (bool, error) {
	const op = "scaledgateupsilu"
	ot, err := b.tensorOf(op, "out", out)
	if err != nil {
		return false, err
	}
	if len(ot.shape) != 2 {
		return false, backend.ShapeError("cuda: "+op, "out", "shape %v, want [n, inter]", ot.shape)
	}
	inter := ot.shape[1]
	xt, wt, ok, err := b.product(op, xs, w, 2*inter)
	if err != nil {
		return false, err
	}
	n, k := xt.shape[0], wt.shape[1]
	if err := checkShape(op, "out", ot, n, inter); err != nil {
		return false, err
	}
	_, st, sok, err := b.splitNormOperands(op, xs, ss, n, k)
	if err != nil {
		return false, err
	}
	if err := checkEps(op, eps); err != nil {
		return false, err
	}
	if overlaps(ot, xt) || overlaps(ot, wt) || overlaps(ot, st) {
		return false, backend.ShapeError("cuda: "+op, "out", "overlaps xs, ss or w")
	}
	c := bulkPickScaled(2*inter, k, b.sms)
	if !ok || !sok || !bulkNorm || ot.dt != backend.BF16 || inter%8 != 0 || !b.bulkFits(c, n, k, xt.ptr, wt.ptr) {
		return false, nil
	}
	pristine := wt.owner != nil && wt.owner.pristine.Load()
	if err := b.post(func() error {
		f, err := b.fnSmem(fnKey{c.spec(n, int(dtBF16)), "gemvb_silu_scaled_bf16"}, c.smem())
		if err != nil {
			return err
		}
		return b.launch(f, [3]int{b.bulkGrid(f, c, inter/8), 1, 1}, (c.cw+1)*32, c.smem(), ot.ptr, xt.ptr, wt.ptr,
			i32(n), i32(inter), i32(k), flag(pristine), st.ptr, f32bits(eps))
	}); err != nil {
		return false, err
	}
	return true, nil
}

// ScaledQKVRoPE implements backend.SplitNormFuser: FusedQKVRoPE's kernel
// on xs with ss (qkv_rope_bf16, the tuner's fastest GEMV variant for the
// shape; with bulkQKV gemvb_qkv_rope_scaled_bf16). It fuses where
// FusedQKVRoPE's kernel takes the operands, leaving args.QKV unwritten.
//
//	xs [n, k] BF16;  ss [n, ceil(k/16)] F32;  w, args as for FusedQKVRoPE
func (b *Backend) ScaledQKVRoPE(xs, ss backend.Tensor, eps float32, w backend.Tensor, args backend.RoPEArgs) (bool, error) {
	const op = "scaledqkvrope"
	xt, wt, r, fuse, err := b.qkvRoPEOperands(xs, w, args)
	if err != nil {
		return false, err
	}
	k := wt.shape[1]
	_, st, sok, err := b.splitNormOperands(op, xs, ss, r.n, k)
	if err != nil {
		return false, err
	}
	if err := checkEps(op, eps); err != nil {
		return false, err
	}
	if overlaps(st, r.q) || overlaps(st, r.kc) || overlaps(st, r.vc) || overlaps(st, wt) {
		return false, backend.ShapeError("cuda: "+op, "ss", "overlaps Q, the caches or w")
	}
	if !fuse || !sok || !bulkNorm {
		return false, nil
	}
	m := r.qkv.shape[1]
	pristine := wt.owner != nil && wt.owner.pristine.Load()
	if err := b.post(func() error {
		if c := bulkPickQKV(bulkPickScaled, m, k, b.sms); bulkQKV && b.bulkFits(c, r.n, k, xt.ptr, wt.ptr) {
			return b.bulkQKVCall(c, xt.ptr, wt.ptr, r, k, pristine, st.ptr, eps)
		}
		c, err := b.fusedGEMV(r.n, m, k, xt.ptr, wt.ptr)
		if err != nil {
			return err
		}
		return b.qkvRoPECall(c, xt.ptr, wt.ptr, r, k, pristine, 0, eps, st.ptr)
	}); err != nil {
		return false, err
	}
	return true, nil
}
