package cuda

import (
	"fmt"
	"math"
	"os"
	"strings"

	"github.com/trigon-llm/trigon/backend"
)

var _ backend.NormFuser = (*Backend)(nil)

// fuseNormOps says which NormFuser methods fuse (a benchmark sets it;
// TRIGON_CUDA_FUSE_NORM, read by New, overrides it): fuseAdd for
// MatMulAdd, fuseQKV for NormQKVRoPE, fuseMLP for NormGateUpSiLU.
//
// By default only MatMulAdd fuses. Measured on the H200 (Llama-3-8B,
// batch 4, docs/benchmarks.md): an add+RMSNorm kernel costs about a
// microsecond in a graph, while normalising x inside the GEMV costs every
// block the whole row's transform: NormGateUpSiLU took 73 us against 61
// for the norm, cuBLASLt's gate/up and SiLUMul, and NormQKVRoPE 18.9
// against 18.3. MatMulAdd, which leaves the norm only its scale to do,
// measured neutral to 1% faster over the step.
var fuseNormOps = fuseAdd

const (
	fuseAdd = 1 << iota
	fuseQKV
	fuseMLP
)

// fuseNormPost picks where the normalising kernels apply the norm's
// scale (the NP constant of kernels/gemv.cu): false, before the product
// from a first pass over x; true, after it, from sums gathered during the
// product (faster on the H200: 72.9 against 78.4 us for the gate/up
// kernel). TRIGON_CUDA_FUSE_NORM_SCALE=pre|post overrides it.
var fuseNormPost = true

// fuseNormEnv names fuseNormOps' override: "on" (all), "off" (none), or
// a comma-separated list of add, qkv and mlp. fuseNormScaleEnv names
// fuseNormPost's.
const (
	fuseNormEnv      = "TRIGON_CUDA_FUSE_NORM"
	fuseNormScaleEnv = "TRIGON_CUDA_FUSE_NORM_SCALE"
)

// applyFuseNormEnv reads fuseNormEnv and fuseNormScaleEnv.
func applyFuseNormEnv() error {
	switch v := os.Getenv(fuseNormEnv); v {
	case "":
	case "on":
		fuseNormOps = fuseAdd | fuseQKV | fuseMLP
	case "off":
		fuseNormOps = 0
	default:
		ops := 0
		for _, f := range strings.Split(v, ",") {
			switch strings.TrimSpace(f) {
			case "add":
				ops |= fuseAdd
			case "qkv":
				ops |= fuseQKV
			case "mlp":
				ops |= fuseMLP
			default:
				return fmt.Errorf("cuda: %s=%q: want on, off or a list of add, qkv and mlp", fuseNormEnv, v)
			}
		}
		fuseNormOps = ops
	}
	var err error
	fuseNormPost, err = envChoice(fuseNormScaleEnv, true, choice[bool]{"pre", false}, choice[bool]{"post", true})
	return err
}

// normModule is the GEMV module (kernels/gemv.cu) of a normalising kernel
// for n rows with variant c.
func normModule(n int, c gemvConfig) modSpec {
	np := 0
	if fuseNormPost {
		np = 1
	}
	return modSpec{file: "gemv", p: [6]int{(n + 7) / 8, c.nw, c.ur, dtBF16, np}}
}

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

// normWeight checks a NormFuser method's norm operands as AddRMSNorm
// checks them (ErrShape errors), and reports whether the kernels take the
// weight (F32, 16-byte aligned).
//
//	normW [k]
func (b *Backend) normWeight(op string, normW backend.Tensor, eps float32, k int) (*tensor, bool, error) {
	wt, err := b.tensorOf(op, "normW", normW)
	if err != nil {
		return nil, false, err
	}
	if err := checkDType(op, "normW", wt, floatDTypes...); err != nil {
		return nil, false, err
	}
	if err := checkShape(op, "normW", wt, k); err != nil {
		return nil, false, err
	}
	if !(eps >= 0) || math.IsInf(float64(eps), 0) {
		return nil, false, backend.ShapeError("cuda: "+op, "eps", "%v is not a finite non-negative number", eps)
	}
	return wt, wt.dt == backend.F32 && wt.ptr%16 == 0, nil
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
	if err := checkDType(op, "w", wt, weightDTypes...); err != nil {
		return nil, nil, false, err
	}
	if err := checkShape(op, "w", wt, m, -1); err != nil {
		return nil, nil, false, err
	}
	k := wt.shape[1]
	if err := checkDType(op, "x", xt, floatDTypes...); err != nil {
		return nil, nil, false, err
	}
	if err := checkShape(op, "x", xt, -1, k); err != nil {
		return nil, nil, false, err
	}
	n := xt.shape[0]
	if n > maxInt32 || m > maxInt32 || k > maxInt32 {
		return nil, nil, false, backend.ShapeError("cuda: "+op, "w", "%v x %v exceeds int32", xt.shape, wt.shape)
	}
	ok = gemvEnabled && xt.dt == backend.BF16 && wt.dt == backend.BF16 && gemvFits(n, k, xt.ptr, wt.ptr)
	return xt, wt, ok, nil
}

// MatMulAdd implements backend.NormFuser: resid += x . w^T for BF16
// operands. Decode batches (at most gemvMaxRows rows) run gemv_add_bf16
// (kernels/gemv.cu), whose sum is rounded as MatMul into a BF16 buffer,
// then AddRMSNorm's residual add, round it. Larger batches (prefill) run
// cuBLASLt with beta = 1 and the residual as both C and D: the product
// and the add in one rounding, and the norm after it reads the residual
// alone instead of the residual and a product buffer and writes one
// tensor instead of two (half its traffic).
//
//	resid [n, m] BF16;  x [n, k] BF16;  w [m, k] BF16
func (b *Backend) MatMulAdd(resid, x, w backend.Tensor) (bool, error) {
	rt, xt, wt, ok, err := b.addOperands(resid, x, w)
	if err != nil || fuseNormOps&fuseAdd == 0 {
		return false, err
	}
	n, m, k := xt.shape[0], wt.shape[0], wt.shape[1]
	if !ok {
		if n <= gemvMaxRows || !blasAdd || rt.dt != backend.BF16 || xt.dt != backend.BF16 || wt.dt != backend.BF16 ||
			k%8 != 0 || m%8 != 0 {
			return false, nil
		}
		if err := b.post(func() error { return b.gemmAdd(rt.ptr, xt.ptr, wt.ptr, n, m, k) }); err != nil {
			return false, err
		}
		return true, nil
	}
	pristine := earlyRead(wt)
	if err := b.post(func() error {
		if bc := bulkPick(m, k, b.sms); b.bulkFused(bc, n, k, xt.ptr, wt.ptr) {
			return b.bulkCall(bc, "gemvb_add_bf16", rt.ptr, int(dtBF16), xt.ptr, wt.ptr, n, m, k, pristine)
		}
		c, err := b.fusedGEMV(n, m, k, xt.ptr, wt.ptr)
		if err != nil {
			return err
		}
		f, err := b.fn(fnKey{modSpec{file: "gemv", p: [6]int{(n + 7) / 8, c.nw, c.ur, dtBF16}}, "gemv_add_bf16"})
		if err != nil {
			return err
		}
		return b.launch(f, [3]int{(m + 15) / 16, 1, 1}, c.nw*32, 0, rt.ptr, xt.ptr, wt.ptr, i32(n), i32(m), i32(k), flag(pristine))
	}); err != nil {
		return false, err
	}
	return true, nil
}

// blasAdd lets MatMulAdd take prefill-sized batches through cuBLASLt;
// blasAddEnv ("off", read by New) turns it off, for comparison.
var blasAdd = true

// blasAddEnv names blasAdd's setting.
const blasAddEnv = "TRIGON_CUDA_BLAS_ADD"

// applyBLASAddEnv reads blasAddEnv.
func applyBLASAddEnv() (err error) {
	blasAdd, err = envSwitch(blasAddEnv, true)
	return err
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
	if err := checkDType(op, "resid", rt, floatDTypes...); err != nil {
		return nil, nil, nil, false, err
	}
	if err := checkShape(op, "resid", rt, -1, -1); err != nil {
		return nil, nil, nil, false, err
	}
	m := rt.shape[1]
	xt, wt, ok, err = b.product(op, x, w, m)
	if err != nil {
		return nil, nil, nil, false, err
	}
	if err := checkShape(op, "resid", rt, xt.shape[0], m); err != nil {
		return nil, nil, nil, false, err
	}
	if overlaps(rt, xt) || overlaps(rt, wt) {
		return nil, nil, nil, false, backend.ShapeError("cuda: "+op, "resid", "overlaps x or w")
	}
	return rt, xt, wt, ok && rt.dt == backend.BF16, nil
}

// NormGateUpSiLU implements backend.NormFuser through gemv_norm_silu_bf16
// (kernels/gemv.cu): one kernel for the post-attention norm, the gate/up
// projection and SiLUMul, for BF16 operands of at most gemvMaxRows rows and
// an F32 norm weight.
//
//	out [n, inter] BF16;  h [n, k] BF16;  normW [k] F32;  w [2*inter, k] BF16
func (b *Backend) NormGateUpSiLU(out, h, normW backend.Tensor, eps float32, w backend.Tensor) (bool, error) {
	o, ht, wt, gt, ok, err := b.siluOperands(out, h, normW, eps, w)
	if err != nil || !ok || fuseNormOps&fuseMLP == 0 {
		return false, err
	}
	n, inter, k := ht.shape[0], o.shape[1], wt.shape[1]
	pristine := earlyRead(wt)
	if err := b.post(func() error {
		c, err := b.fusedGEMV(n, 2*inter, k, ht.ptr, wt.ptr)
		if err != nil {
			return err
		}
		f, err := b.fn(fnKey{normModule(n, c), "gemv_norm_silu_bf16"})
		if err != nil {
			return err
		}
		return b.launch(f, [3]int{inter / 8, 1, 1}, c.nw*32, 0, o.ptr, ht.ptr, gt.ptr, f32bits(eps), wt.ptr,
			i32(n), i32(inter), i32(k), flag(pristine))
	}); err != nil {
		return false, err
	}
	return true, nil
}

// siluOperands checks NormGateUpSiLU's operands (ErrShape errors) and
// reports whether the kernels take them: BF16 operands of few rows, an F32
// norm weight, inter a multiple of 8.
func (b *Backend) siluOperands(out, h, normW backend.Tensor, eps float32, w backend.Tensor) (o, ht, wt, gt *tensor, ok bool, err error) {
	const op = "normgateupsilu"
	if o, err = b.tensorOf(op, "out", out); err != nil {
		return nil, nil, nil, nil, false, err
	}
	if err := checkDType(op, "out", o, floatDTypes...); err != nil {
		return nil, nil, nil, nil, false, err
	}
	if err := checkShape(op, "out", o, -1, -1); err != nil {
		return nil, nil, nil, nil, false, err
	}
	inter := o.shape[1]
	if ht, wt, ok, err = b.product(op, h, w, 2*inter); err != nil {
		return nil, nil, nil, nil, false, err
	}
	n, k := ht.shape[0], wt.shape[1]
	if err := checkShape(op, "out", o, n, inter); err != nil {
		return nil, nil, nil, nil, false, err
	}
	gt, gok, err := b.normWeight(op, normW, eps, k)
	if err != nil {
		return nil, nil, nil, nil, false, err
	}
	if overlaps(o, ht) || overlaps(o, wt) || overlaps(o, gt) {
		return nil, nil, nil, nil, false, backend.ShapeError("cuda: "+op, "out", "overlaps h, w or normW")
	}
	return o, ht, wt, gt, ok && gok && o.dt == backend.BF16 && inter%8 == 0, nil
}

// NormQKVRoPE implements backend.NormFuser: FusedQKVRoPE whose kernel
// (qkv_rope_bf16 with a norm weight) normalises h itself. It fuses where
// FusedQKVRoPE does without Q/K norms and the norm weight is F32, and then always runs the
// GEMV (the tuner's fastest variant for the shape, even where cuBLASLt
// won the plain product), leaving args.QKV unwritten.
//
//	h [n, k] BF16;  normW [k] F32;  w, args as for FusedQKVRoPE
func (b *Backend) NormQKVRoPE(h, normW backend.Tensor, eps float32, w backend.Tensor, args backend.RoPEArgs) (bool, error) {
	const op = "normqkvrope"
	ht, wt, r, ok, err := b.qkvRoPEOperands(h, w, args)
	if err != nil {
		return false, err
	}
	gt, gok, err := b.normWeight(op, normW, eps, wt.shape[1])
	if err != nil {
		return false, err
	}
	// Q/K norms (Qwen3) take FusedQKVRoPE's pair after a separate input norm.
	if !ok || !gok || fuseNormOps&fuseQKV == 0 || r.qn != nil || r.kn != nil ||
		overlaps(gt, r.q) || overlaps(gt, r.kc) || overlaps(gt, r.vc) {
		return false, nil
	}
	k := wt.shape[1]
	pristine := earlyRead(wt)
	if err := b.post(func() error {
		c, err := b.fusedGEMV(r.n, r.qkv.shape[1], k, ht.ptr, wt.ptr)
		if err != nil {
			return err
		}
		return b.qkvRoPECall(c, ht.ptr, wt.ptr, r, k, pristine, 0, gt.ptr, eps)
	}); err != nil {
		return false, err
	}
	return true, nil
}

// flag is a kernel's int flag argument.
func flag(v bool) uint64 {
	if v {
		return 1
	}
	return 0
}
