package cuda

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/trigon-llm/trigon/backend"
)

// qgemvMaxRows is the largest batch the quantized GEMV kernel takes
// (MAXN in quant.cu); larger batches dequantize to BF16 and use cuBLASLt.
const qgemvMaxRows = 8

// shadowKey identifies an F32/F16 weight (by address and size) whose BF16
// copy cuBLASLt multiplies.
type shadowKey struct {
	ptr   uint64
	bytes int
}

// MatMul implements backend.Backend: out = x . w^T (+ bias), accumulating
// in f32.
//
// BF16 weights go straight to cuBLASLt (W row-major [out,in] as A with
// TRANSA=T). F32 and F16 weights are converted once, on first use, to a
// BF16 copy on the device that lives as long as the weight (cuBLASLt has
// no mixed-precision F32 x BF16 product; the copy costs half or all of the
// weight's size again). Q8_0/Q4_0 weights stay quantized: batches of up to
// 8 rows use a dequantizing GEMV kernel, larger ones dequantize into a
// pooled BF16 temporary for cuBLASLt. x of another float dtype is converted
// to BF16 in a temporary. The bias is added by a small kernel.
//
//	out  [n, outFeatures] BF16 or F32
//	x    [n, inFeatures] BF16 (F32, F16 converted)
//	w    [outFeatures, inFeatures] F32, F16, BF16, Q8_0, Q4_0
//	bias [outFeatures] F32, F16, BF16, or nil
func (b *Backend) MatMul(out, x, w, bias backend.Tensor) error {
	const op = "matmul"
	o, err := b.tensorOf(op, "out", out)
	if err != nil {
		return err
	}
	xt, err := b.tensorOf(op, "x", x)
	if err != nil {
		return err
	}
	wt, err := b.tensorOf(op, "w", w)
	if err != nil {
		return err
	}
	var bt *tensor
	if bias != nil {
		if bt, err = b.tensorOf(op, "bias", bias); err != nil {
			return err
		}
	}
	if err := checkDType(op, "w", wt, weightDTypes...); err != nil {
		return err
	}
	if err := checkShape(op, "w", wt, -1, -1); err != nil {
		return err
	}
	m, k := wt.shape[0], wt.shape[1]
	if err := checkDType(op, "x", xt, floatDTypes...); err != nil {
		return err
	}
	if err := checkShape(op, "x", xt, -1, k); err != nil {
		return err
	}
	n := xt.shape[0]
	if err := checkDType(op, "out", o, backend.BF16, backend.F32); err != nil {
		return err
	}
	if err := checkShape(op, "out", o, n, m); err != nil {
		return err
	}
	if bt != nil {
		if err := checkDType(op, "bias", bt, floatDTypes...); err != nil {
			return err
		}
		if err := checkShape(op, "bias", bt, m); err != nil {
			return err
		}
	}
	if overlaps(o, xt) || overlaps(o, wt) {
		return backend.ShapeError("cuda: "+op, "out", "overlaps x or w")
	}
	if n > maxInt32 || m > maxInt32 || k > maxInt32 {
		return backend.ShapeError("cuda: "+op, "w", "%v x %v exceeds int32", xt.shape, wt.shape)
	}
	return b.post(func() error { return b.matmul(o, xt, wt, bt, n, m, k) })
}

// matmul runs on the CUDA thread.
func (b *Backend) matmul(o, xt, wt, bt *tensor, n, m, k int) error {
	xptr := xt.ptr
	if xt.dt != backend.BF16 {
		tmp, err := b.tmpGet(n * k * 2)
		if err != nil {
			return err
		}
		defer b.tmpPut(tmp)
		if err := b.convert(tmp, backend.BF16, xt.ptr, xt.dt, n*k); err != nil {
			return err
		}
		xptr = tmp
	}
	yt := cudaR16BF
	if o.dt == backend.F32 {
		yt = cudaR32F
	}
	switch wt.dt {
	case backend.BF16:
		if err := b.gemm(o.ptr, yt, xptr, wt.ptr, n, m, k); err != nil {
			return err
		}
	case backend.F32, backend.F16:
		sk := shadowKey{wt.ptr, wt.bytes}
		sh, ok := b.shadows[sk]
		if !ok {
			var err error
			if sh, err = b.pool.get(m * k * 2); err != nil {
				return err
			}
			if err := b.convert(sh, backend.BF16, wt.ptr, wt.dt, m*k); err != nil {
				b.pool.put(sh)
				return err
			}
			b.shadows[sk] = sh
		}
		if err := b.gemm(o.ptr, yt, xptr, sh, n, m, k); err != nil {
			return err
		}
	case backend.Q8_0, backend.Q4_0:
		if n <= qgemvMaxRows {
			f, err := b.fn(fnKey{modSpec{file: "quant", p: [6]int{int(wt.dt), int(o.dt)}}, "qgemv"})
			if err != nil {
				return err
			}
			if err := b.launch(f, [3]int{(m + 7) / 8, 1, 1}, 256, 0, o.ptr, xptr, wt.ptr, i32(n), i32(m), i32(k)); err != nil {
				return err
			}
		} else {
			tmp, err := b.tmpGet(m * k * 2)
			if err != nil {
				return err
			}
			defer b.tmpPut(tmp)
			f, err := b.fn(fnKey{modSpec{file: "quant", p: [6]int{int(wt.dt), int(o.dt)}}, "dequant"})
			if err != nil {
				return err
			}
			if err := b.launch(f, [3]int{b.gridFor(m * k), 1, 1}, 256, 0, tmp, wt.ptr, i32(m), i32(k)); err != nil {
				return err
			}
			if err := b.gemm(o.ptr, yt, xptr, tmp, n, m, k); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("cuda: matmul: weight dtype %v", wt.dt)
	}
	if bt != nil {
		f, err := b.fn(fnKey{modSpec{file: "act", p: [6]int{int(bt.dt), int(o.dt)}}, "add_bias"})
		if err != nil {
			return err
		}
		return b.launch(f, [3]int{b.gridFor(n * m), 1, 1}, 256, 0, o.ptr, bt.ptr, i32(n), i32(m))
	}
	return nil
}

// dropShadows forgets the BF16 copies of weights in [lo, hi) (the weight
// was freed or overwritten). CUDA thread only.
func (b *Backend) dropShadows(lo, hi uint64) {
	for sk, sh := range b.shadows {
		if sk.ptr < hi && lo < sk.ptr+uint64(sk.bytes) {
			b.pool.put(sh)
			delete(b.shadows, sk)
		}
	}
}

// gemm computes y[n,m] = x[n,k] . w[m,k]^T with BF16 x and w through
// cuBLASLt, the plan cached per shape. CUDA thread only.
func (b *Backend) gemm(y uint64, yt int, x, w uint64, n, m, k int) error {
	g := &b.blas
	key := gemmKey{m: m, n: n, k: k, wt: cudaR16BF, xt: cudaR16BF, yt: yt}
	p, ok := g.plans[key]
	if !ok {
		slot := 1 + len(g.plans) // slot 0 holds alpha and beta
		if (slot+1)*64 > len(g.scalars) {
			// Many distinct shapes (prefill lengths): start over rather
			// than grow without bound. Matmuls already queued read their
			// algo at enqueue time, so the memory can be reused.
			g.close()
			if err := b.initBlasHandles(); err != nil {
				return err
			}
			slot = 1
		}
		var err error
		if p, err = g.plan(key, g.scalars[slot*64:(slot+1)*64]); err != nil {
			return err
		}
	}
	if p.candidates != nil && !b.capturing {
		b.tuneGemm(p, y, x, w)
	}
	return g.lib.check("cublasLtMatmul", b.gemmCall(p, p.algo, y, x, w))
}

// gemmCall queues y = x . w^T with plan p and algorithm algo (64 bytes),
// returning cuBLASLt's status. CUDA thread only.
func (b *Backend) gemmCall(p *gemmPlan, algo []byte, y, x, w uint64) int {
	g := &b.blas
	alpha := uintptr(unsafe.Pointer(&g.scalars[0]))
	beta := uintptr(unsafe.Pointer(&g.scalars[4]))
	return g.lib.call(g.lib.matmul, g.handle, p.desc, alpha, uintptr(w), p.a, uintptr(x), p.b, beta,
		uintptr(y), p.d, uintptr(y), p.d, uintptr(unsafe.Pointer(&algo[0])), uintptr(g.workspace), ltWorkspaceBytes, b.stream)
}

// tuneGemm times each of p's candidate algorithms on the call's own
// operands and keeps the fastest in p.algo. Each candidate runs once
// untimed, then three timed runs, each after a write of tuneFlushBytes
// that evicts the weight from L2: a decode product streams its weight from
// memory, and timing it from L2 favours the wrong kernel (the first
// version of this tuner, without the flush, picked a 1.5 TB/s kernel for
// the 4096x4096 projection). The heuristic's first choice is kept unless
// another is more than tuneMargin faster (timing noise). A candidate that
// fails is skipped; if timing itself fails, the first choice stays. It
// waits for the stream, so it runs once per plan, on an eager call (never
// while capturing). CUDA thread only.
func (b *Backend) tuneGemm(p *gemmPlan, y, x, w uint64) {
	cands := p.candidates
	p.candidates = nil
	d := b.d
	flush, err := b.pool.get(tuneFlushBytes)
	if err != nil {
		return
	}
	defer b.pool.put(flush)
	var start, stop uintptr
	if d.call(d.cuEventCreate, uintptr(unsafe.Pointer(&start)), 0) != 0 {
		return
	}
	defer d.call(d.cuEventDestroy, start)
	if d.call(d.cuEventCreate, uintptr(unsafe.Pointer(&stop)), 0) != 0 {
		return
	}
	defer d.call(d.cuEventDestroy, stop)
	run := func(algo []byte) bool { return b.gemmCall(p, algo, y, x, w) == 0 }
	// timed returns the best of three flushed runs of algo, in ms.
	timed := func(algo []byte) (float32, bool) {
		best := float32(math.MaxFloat32)
		for range 3 {
			if d.call(d.cuMemsetD8Async, uintptr(flush), 0, tuneFlushBytes, b.stream) != 0 ||
				d.call(d.cuEventRecord, start, b.stream) != 0 || !run(algo) ||
				d.call(d.cuEventRecord, stop, b.stream) != 0 || d.call(d.cuEventSynchronize, stop) != 0 {
				return 0, false
			}
			var ms float32
			if d.call(d.cuEventElapsedTime, uintptr(unsafe.Pointer(&ms)), start, stop) != 0 {
				return 0, false
			}
			best = min(best, ms)
		}
		return best, true
	}
	var first float32
	best, bestAt := float32(math.MaxFloat32), -1
	for i := 0; i+ltHeuristicResultBytes <= len(cands); i += ltHeuristicResultBytes {
		c := cands[i : i+ltHeuristicResultBytes]
		// state (offset 72) is the candidate's cublasStatus_t.
		if *(*int32)(unsafe.Pointer(&c[72])) != 0 || *(*uint64)(unsafe.Pointer(&c[64])) > ltWorkspaceBytes || !run(c[:64]) {
			continue
		}
		ms, ok := timed(c[:64])
		if !ok {
			if i == 0 {
				return
			}
			continue
		}
		if i == 0 {
			first = ms
		}
		if ms < best {
			best, bestAt = ms, i
		}
	}
	if bestAt > 0 && best < first*(1-tuneMargin) {
		copy(p.algo, cands[bestAt:bestAt+64])
		p.workspace = *(*uint64)(unsafe.Pointer(&cands[bestAt+64]))
	}
}
