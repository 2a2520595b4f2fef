package cuda

import (
	"fmt"
	"math"
	"slices"
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
// weight's size again). Q8_0/Q4_0 and K-quant weights stay quantized:
// batches of up to 8 rows use a dequantizing GEMV kernel (quant.cu,
// kquant.cu), larger ones dequantize into a pooled BF16 temporary for
// cuBLASLt. x of another float dtype is converted to BF16 in a
// temporary. AWQ4 and F8E4M3Row weights: wquant.go. The bias is added by
// a small kernel.
//
//	out  [n, outFeatures] BF16 or F32
//	x    [n, inFeatures] BF16 (F32, F16 converted)
//	w    [outFeatures, inFeatures] F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, AWQ4_G*, F8_E4M3_ROW
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
	bt, err := b.optTensorOf(op, "bias", bias)
	if err != nil {
		return err
	}
	d, err := backend.CheckMatMul(o, xt, wt, orNil(bt))
	if err != nil {
		return opErr(err)
	}
	n, m, k := d.N, d.Out, d.In
	// cuBLASLt and the GEMVs write BF16 or F32 only.
	if err := opErr(backend.CheckDType(op, "out", o, backend.BF16, backend.F32)); err != nil {
		return err
	}
	if overlaps(o, xt) || overlaps(o, wt) {
		return backend.ShapeError("cuda: "+op, "out", "overlaps x or w")
	}
	if n > maxInt32 || m > maxInt32 || k > maxInt32 {
		return backend.ShapeError("cuda: "+op, "w", "%v x %v exceeds int32", xt.shape, wt.shape)
	}
	// Read now, in queue order: a later op may still make the weight non-pristine.
	pristine := earlyRead(wt)
	return b.post(func() error { return b.matmul(o, xt, wt, bt, n, m, k, pristine) })
}

// matmul runs on the CUDA thread. pristine: no kernel ever wrote w.
func (b *Backend) matmul(o, xt, wt, bt *tensor, n, m, k int, pristine bool) error {
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
		if err := b.gemm(o.ptr, yt, xptr, wt.ptr, n, m, k, pristine); err != nil {
			return err
		}
	case backend.F32, backend.F16:
		sk := shadowKey{wt.ptr, wt.bytes}
		sh, ok := b.shadows[sk]
		fresh := !ok // converted by this call: not safe to read early
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
		if err := b.gemm(o.ptr, yt, xptr, sh, n, m, k, pristine && !fresh); err != nil {
			return err
		}
	case backend.Q8_0, backend.Q4_0, backend.Q4_K, backend.Q5_K, backend.Q6_K:
		file, gemv, dequant := "quant", "qgemv", "dequant"
		if wt.dt.BlockSize() == backend.QK_K {
			file, gemv, dequant = "kquant", "kgemv", "kdequant"
		}
		if n <= qgemvMaxRows {
			f, err := b.fn(fnKey{modSpec{file: file, p: [8]int{int(wt.dt), int(o.dt)}}, gemv})
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
			f, err := b.fn(fnKey{modSpec{file: file, p: [8]int{int(wt.dt), int(o.dt)}}, dequant})
			if err != nil {
				return err
			}
			threads := m * k // one a value; kdequant takes one a 32-value piece
			if file == "kquant" {
				threads /= 32
			}
			if err := b.launch(f, [3]int{b.gridFor(threads), 1, 1}, 256, 0, tmp, wt.ptr, i32(m), i32(k)); err != nil {
				return err
			}
			if err := b.gemm(o.ptr, yt, xptr, tmp, n, m, k, false); err != nil {
				return err
			}
		}
	case backend.AWQ4G32, backend.AWQ4G64, backend.AWQ4G128, backend.F8E4M3Row:
		if err := b.matmulWQ(o, wt, xptr, n, m, k, pristine); err != nil {
			return err
		}
	default:
		return fmt.Errorf("cuda: matmul: weight dtype %v", wt.dt)
	}
	if bt != nil {
		f, err := b.fn(fnKey{modSpec{file: "act", p: [8]int{int(bt.dt), int(o.dt)}}, "add_bias"})
		if err != nil {
			return err
		}
		return b.launch(f, [3]int{b.gridFor(n * m), 1, 1}, 256, 0, o.ptr, bt.ptr, i32(n), i32(m))
	}
	return nil
}

// dropShadows forgets the BF16 copies of weights in [lo, hi), and the
// FP8 weights' scale vectors there (the weight was freed or overwritten).
// CUDA thread only.
func (b *Backend) dropShadows(lo, hi uint64) {
	for _, m := range []map[shadowKey]uint64{b.shadows, b.f8.scales} {
		for sk, sh := range m {
			if sk.ptr < hi && lo < sk.ptr+uint64(sk.bytes) {
				b.pool.put(sh)
				delete(m, sk)
			}
		}
	}
}

// gemm computes y[n,m] = x[n,k] . w[m,k]^T with BF16 x and w through
// cuBLASLt, or the GEMV where the shape's tuning chose it; the plan is
// cached per shape. CUDA thread only.
//
// earlyW says no kernel ever wrote w (false for a BF16 copy made by the
// call itself): under programmatic dependent launch the GEMV may then
// start streaming it before the previous kernel finishes.
func (b *Backend) gemm(y uint64, yt int, x, w uint64, n, m, k int, earlyW bool) error {
	p, err := b.gemmPlanFor(y, yt, x, w, n, m, k)
	if err != nil {
		return err
	}
	return b.gemmWith(p, y, yt, x, w, n, m, k, earlyW)
}

// gemmPlanFor returns the plan of y[n,m] = x[n,k] . w[m,k]^T with BF16 x
// and w, made on the shape's first use and tuned on its first eager call
// (which runs the candidates on these operands, y as scratch) unless
// tuning has ended (EndTuning). Ops that fuse work into the GEMV
// (FusedQKVRoPE) read its choice from the plan. CUDA thread only.
func (b *Backend) gemmPlanFor(y uint64, yt int, x, w uint64, n, m, k int) (*gemmPlan, error) {
	g := &b.blas
	key := gemmKey{m: m, n: n, k: k, wt: cudaR16BF, xt: cudaR16BF, yt: yt}
	p, ok := g.plans[key]
	if !ok {
		slot, err := b.planSlot()
		if err != nil {
			return nil, err
		}
		tuneRows := b.tune.tuneMaxRows
		if b.tuningEnded {
			tuneRows = 0
		}
		if p, err = g.plan(key, g.scalars[slot*64:(slot+1)*64], tuneRows); err != nil {
			g.free = append(g.free, slot)
			return nil, err
		}
		p.slot = slot
	}
	if p.candidates != nil && !b.capturing {
		b.tuneGemm(p, key, y, x, w)
	}
	return p, nil
}

// planSlot returns a free 64-byte slot of the pinned scalars for a new
// plan's algorithm (slot 0 holds alpha and beta). When all are taken
// (many distinct prefill lengths), the plans of more than TuneMaxRows
// rows give theirs back: the heuristic makes them again at the cost of
// one host call, where the tuned decode shapes kept would cost a timing
// pass each, or, once tuning has ended, their tuned choice for good.
// Matmuls already queued read their algorithm at enqueue time, so the
// memory can be reused. Only if no plan is large does the cache start
// over. CUDA thread only.
func (b *Backend) planSlot() (int, error) {
	g := &b.blas
	if n := len(g.free); n > 0 {
		slot := g.free[n-1]
		g.free = g.free[:n-1]
		return slot, nil
	}
	if slot := 1 + g.used; (slot+1)*64 <= len(g.scalars) {
		g.used++
		return slot, nil
	}
	for key, p := range g.plans {
		if key.n > b.tune.tuneMaxRows {
			g.drop(key)
			g.free = append(g.free, p.slot)
		}
	}
	if len(g.free) == 0 {
		g.close()
		if err := b.initBlasHandles(); err != nil {
			return 0, err
		}
	}
	return b.planSlot()
}

// EndTuning stops the GEMM tuner: from now on a product shape first seen
// takes cuBLASLt's heuristic choice without timing, and shapes made but
// not yet timed keep theirs. The tuner synchronises the stream and runs
// each candidate several times, which inside a step of a serving engine
// stalls every stream in it; the engine calls this once its warm-up steps
// have tuned the decode shapes it replays. It returns how many shapes
// were tuned.
func (b *Backend) EndTuning() int {
	tuned := 0
	_ = b.call(func() error {
		b.tuningEnded = true
		for _, p := range b.blas.plans {
			p.candidates = nil
			if p.tunedMs > 0 {
				tuned++
			}
		}
		return nil
	})
	return tuned
}

// gemmWith queues the product with plan p: the GEMV variant the tuner
// kept, where it takes the operands, else cuBLASLt. CUDA thread only.
func (b *Backend) gemmWith(p *gemmPlan, y uint64, yt int, x, w uint64, n, m, k int, earlyW bool) error {
	if p.bulk.cw > 0 && b.bulkFits(p.bulk, n, k, x, w) {
		ot := int(dtBF16)
		if yt == cudaR32F {
			ot = int(dtF32)
		}
		return b.bulkCall(p.bulk, "gemvb_bf16", y, ot, x, w, n, m, k, earlyW)
	}
	if p.gemv.nw > 0 && gemvFits(n, k, x, w) {
		return b.gemvCall(p.gemv, y, yt, x, w, n, m, k, earlyW)
	}
	return b.blas.lib.check("cublasLtMatmul", b.gemmCall(p, p.algo, y, x, w))
}

// gemvConfig is one variant of the tensor-core GEMV of kernels/gemv.cu:
// warps per block (they split k) and 32-wide k spans whose loads each
// warp issues together. The zero value means cuBLASLt.
type gemvConfig struct{ nw, ur int }

// gemvConfigs are the variants the tuner times against cuBLASLt: more
// warps per block for short k, more spans in flight for long k.
var gemvConfigs = []gemvConfig{{4, 4}, {8, 2}, {8, 4}, {4, 8}, {16, 2}}

// gemvMaxRows is the most x rows the GEMV takes (two 8-row mma tiles).
const gemvMaxRows = 16

// gemvFits reports whether the GEMV can take a product: few rows, k a
// multiple of 8 and 16-byte aligned operands (it reads 8 bf16 at a time).
func gemvFits(n, k int, x, w uint64) bool {
	return n >= 1 && n <= gemvMaxRows && k%8 == 0 && x%16 == 0 && w%16 == 0
}

// gemvCall queues y = x . w^T through the GEMV variant c; earlyW as for
// gemm. CUDA thread only.
//
//	y [n, m] BF16 or F32 (yt);  x [n, k] BF16;  w [m, k] BF16
func (b *Backend) gemvCall(c gemvConfig, y uint64, yt int, x, w uint64, n, m, k int, earlyW bool) error {
	return b.gemvCallPDL(c, y, yt, x, w, n, m, k, earlyW, false)
}

// gemvCallPDL is gemvCall, launched with launchPDL when site is set.
// CUDA thread only.
func (b *Backend) gemvCallPDL(c gemvConfig, y uint64, yt int, x, w uint64, n, m, k int, earlyW, site bool) error {
	ot := int(dtBF16)
	if yt == cudaR32F {
		ot = int(dtF32)
	}
	f, err := b.fn(fnKey{modSpec{file: "gemv", p: [8]int{(n + 7) / 8, c.nw, c.ur, ot}}, "gemv_bf16"})
	if err != nil {
		return err
	}
	early := uint64(0)
	if earlyW {
		early = 1
	}
	grid := [3]int{(m + 15) / 16, 1, 1}
	if site {
		return b.launchPDL(f, grid, c.nw*32, 0, y, x, w, i32(n), i32(m), i32(k), early)
	}
	return b.launch(f, grid, c.nw*32, 0, y, x, w, i32(n), i32(m), i32(k), early)
}

// gemmCall queues y = x . w^T with plan p and algorithm algo (64 bytes),
// returning cuBLASLt's status. CUDA thread only.
func (b *Backend) gemmCall(p *gemmPlan, algo []byte, y, x, w uint64) int {
	return b.gemmCallBeta(p, algo, y, x, w, false)
}

// gemmCallBeta is gemmCall with beta = 1 when accumulate is set: y +=
// x . w^T, y read as C and written as D (one layout, so in place).
func (b *Backend) gemmCallBeta(p *gemmPlan, algo []byte, y, x, w uint64, accumulate bool) int {
	g := &b.blas
	alpha := uintptr(unsafe.Pointer(&g.scalars[0]))
	beta := uintptr(unsafe.Pointer(&g.scalars[4]))
	if accumulate {
		beta = alpha // the pinned 1.0f
	}
	return g.lib.call(g.lib.matmul, g.handle, p.desc, alpha, uintptr(w), p.a, uintptr(x), p.b, beta,
		uintptr(y), p.d, uintptr(y), p.d, uintptr(unsafe.Pointer(&algo[0])), uintptr(g.workspace), ltWorkspaceBytes, b.stream)
}

// tuneGemm times each of p's candidate algorithms on the call's own
// operands and keeps the fastest in p.algo. Each candidate runs once
// untimed, then three timed runs, each after a write of tuneFlushBytes
// that evicts the weight from L2: a decode product streams its weight from
// memory, and timing it from L2 favours kernels that stream it slowly
// from memory. The heuristic's first choice is kept unless
// another is more than tuneMargin faster (timing noise). A candidate that
// fails is skipped; if timing itself fails, the first choice stays. It
// waits for the stream, so it runs once per plan, on an eager call (never
// while capturing). CUDA thread only.
func (b *Backend) tuneGemm(p *gemmPlan, key gemmKey, y, x, w uint64) {
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
	// timed returns the best of three flushed runs of run, in ms.
	timed := func(run func() bool) (float32, bool) {
		best := float32(math.MaxFloat32)
		for range 3 {
			if d.call(d.cuMemsetD8Async, uintptr(flush), 0, tuneFlushBytes, b.stream) != 0 ||
				d.call(d.cuEventRecord, start, b.stream) != 0 || !run() ||
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
	first := float32(math.MaxFloat32) // the heuristic's pick, unless it fails
	best, bestAt := float32(math.MaxFloat32), -1
	for i := 0; i+ltHeuristicResultBytes <= len(cands); i += ltHeuristicResultBytes {
		c := cands[i : i+ltHeuristicResultBytes]
		run := func() bool { return b.gemmCall(p, c[:64], y, x, w) == 0 }
		// state (offset 72) is the candidate's cublasStatus_t.
		if *(*int32)(unsafe.Pointer(&c[72])) != 0 || *(*uint64)(unsafe.Pointer(&c[64])) > ltWorkspaceBytes || !run() {
			continue
		}
		ms, ok := timed(run)
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
	kept := first
	if bestAt > 0 && best < first*(1-tuneMargin) {
		copy(p.algo, cands[bestAt:bestAt+64])
		p.workspace = *(*uint64)(unsafe.Pointer(&cands[bestAt+64]))
		kept = best
	}
	if kept < math.MaxFloat32 {
		p.tunedMs = kept
	}
	// The GEMV variants, timed the same way, replace cuBLASLt's kept
	// algorithm only if faster by the tuning's gemvMargin.
	if key.xt != cudaR16BF || key.wt != cudaR16BF || !gemvFits(key.n, key.k, x, w) {
		return
	}
	own, ownBest := gemvConfig{}, float32(math.MaxFloat32)
	for _, c := range gemvConfigs {
		run := func() bool { return b.gemvCall(c, y, key.yt, x, w, key.n, key.m, key.k, false) == nil }
		if !run() {
			continue
		}
		if ms, ok := timed(run); ok && ms < ownBest {
			own, ownBest = c, ms
		}
	}
	if own.nw == 0 {
		return
	}
	p.gemvMs, p.gemvBest = ownBest, own
	cur := kept
	if ownBest < kept*float32(1-b.tune.gemvMargin) {
		p.gemv, cur = own, ownBest
	}
	b.tuneBulk(p, key, y, x, w, cur, timed)
}

// GEMMChoices describes, for each decode-shaped product the tuner has
// timed, which kernel it kept and the times it saw (L2 flushed), so a
// benchmark can report what ran. Sorted by shape.
func (b *Backend) GEMMChoices() []string {
	var out []string
	_ = b.call(func() error {
		for key, p := range b.blas.plans {
			if p.tunedMs == 0 {
				continue
			}
			kind := "cuBLASLt"
			if p.bulk.cw > 0 {
				kind = p.bulk.String()
			} else if p.gemv.nw > 0 {
				kind = fmt.Sprintf("gemv(warps %d, spans %d)", p.gemv.nw, p.gemv.ur)
			}
			if p.pinned.nw > 0 {
				kind = fmt.Sprintf("gemv(warps %d, spans %d) pinned for the fused QKV+RoPE kernel (tuner's pick %s)",
					p.pinned.nw, p.pinned.ur, kind)
			}
			line := fmt.Sprintf("[%d,%d]x[%d,%d]^T: %s; best cuBLASLt %.4f ms", key.n, key.k, key.m, key.k, kind, p.tunedMs)
			if p.gemvMs > 0 {
				line += fmt.Sprintf(", best gemv %.4f ms", p.gemvMs)
			}
			if p.bulkMs > 0 {
				line += fmt.Sprintf(", best %v %.4f ms", p.bulkBest, p.bulkMs)
			}
			out = append(out, line)
		}
		return nil
	})
	slices.Sort(out)
	return out
}
