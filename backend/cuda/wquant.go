package cuda

import (
	"fmt"
	"unsafe"

	"github.com/trigon-llm/trigon/backend"
)

// Products against the weight-quantized dtypes of backend/wquant.go
// (kernels/wquant.cu).
//
// AWQ4 (W4A16) weights live on the device in a layout of their own
// (wquant_layout.go, kernels/wquant.cu's header), which Write and Read
// translate. Up to wqDecMaxRows rows run awq_dec on sm_80 and later,
// which streams the packed weight with several 16-byte loads in flight a
// thread, widens it to bf16 pairs in registers and multiplies on the
// tensor cores (mma.sync); up to wqGemvMaxRows run awq_mma (the same
// product, x staged in shared memory chunk by chunk), or awq_gemv on the
// CUDA cores before sm_80 (one weight read per MAXN-row tile); more rows
// dequantize the weight into a pooled BF16 temporary for the BF16
// cuBLASLt GEMM, as Q8_0 does.
//
// F8E4M3Row (W8A8): x is first quantized per row to e4m3 (f8_act_quant:
// backend.QuantizeActE4M3's codes and scales). Up to wqDecMaxRows rows
// then run f8_dec, up to wqGemvMaxRows f8_mma (both the FP8 tensor cores,
// sm_89 and later), or f8_gemv (CUDA cores); more run cuBLASLt's FP8 GEMM
// of the codes (sm_89 and
// later: e4m3 x e4m3 into f32) and f8_epilogue applies the activation and
// weight scales. Where cuBLASLt has no FP8 algorithm for the shape or the
// device, the codes are widened to BF16 (exact: e4m3 has 4 significant
// bits) and the BF16 GEMM computes the same sums.

// wqGemvMaxRows is the most rows the quantized GEMVs take (the decode
// batches the engine captures in graphs go up to 64).
const wqGemvMaxRows = 64

// wqDecMaxRows is the most rows awq_dec and f8_dec take (two 8-row
// tiles: NT 1 or 2).
const wqDecMaxRows = 16

// wqDecWarps is DEC_NW of kernels/wquant.cu: warps per awq_dec / f8_dec
// block.
const wqDecWarps = 8

// wqMaxn is MAXN of kernels/wquant.cu: token rows per GEMV block row.
const wqMaxn = 8

// cudaR8FE4M3 is cudaDataType CUDA_R_8F_E4M3.
const cudaR8FE4M3 = 28

// f8Plan is a cuBLASLt FP8 GEMM description: acc[n,m] (f32) =
// xq[n,k] . w[m,k]^T over e4m3 codes, w's rows k+16 bytes apart.
type f8Plan struct {
	desc, a, b, d uintptr
	algo          [64]byte
	ok            bool // false: no algorithm; use the BF16 GEMM of codes
	// refused says why ok is false (cuBLASLt's status and result count,
	// the workspace asked, or the launch's status), for reports.
	refused string
}

// f8State caches the FP8 plans by shape. CUDA thread only.
type f8State struct {
	plans map[[3]int]*f8Plan
}

func (s *f8State) close(l *lt) {
	for _, p := range s.plans {
		for _, h := range []uintptr{p.a, p.b, p.d} {
			if h != 0 {
				l.call(l.layoutDestroy, h)
			}
		}
		if p.desc != 0 {
			l.call(l.descDestroy, p.desc)
		}
	}
	s.plans = nil
}

// matmulWQ computes y = x . w^T for a weight-quantized w; x is BF16 at
// xptr. The caller adds the bias. CUDA thread only.
// pristine: no kernel ever wrote w (the decode kernels may then load it
// before the previous kernel completes).
func (b *Backend) matmulWQ(o, wt *tensor, xptr uint64, n, m, k int, pristine bool) error {
	yt := cudaR16BF
	if o.dt == backend.F32 {
		yt = cudaR32F
	}
	spec := modSpec{file: "wquant", p: [8]int{int(wt.dt), int(o.dt), 1}}
	grid := [3]int{(m + 7) / 8, (n + wqMaxn - 1) / wqMaxn, 1}
	if wt.dt != backend.F8E4M3Row {
		if n <= wqDecMaxRows && b.cc >= 80 {
			return b.wqDec(o.ptr, int(o.dt), xptr, 0, wt, n, m, k, pristine)
		}
		if n <= wqGemvMaxRows && b.cc >= 80 {
			return b.awqMMA(o.ptr, int(o.dt), xptr, wt, n, m, k)
		}
		if n <= wqGemvMaxRows {
			f, err := b.fn(fnKey{spec, "awq_gemv"})
			if err != nil {
				return err
			}
			return b.launch(f, grid, 256, 0, o.ptr, xptr, wt.ptr, i32(n), i32(m), i32(k))
		}
		tmp, err := b.tmpGet(m * k * 2)
		if err != nil {
			return err
		}
		defer b.tmpPut(tmp)
		f, err := b.fn(fnKey{spec, "awq_dequant"})
		if err != nil {
			return err
		}
		if err := b.launch(f, [3]int{b.gridFor(m * k / 8), 1, 1}, 256, 0, tmp, wt.ptr, i32(m), i32(k)); err != nil {
			return err
		}
		return b.gemm(o.ptr, yt, xptr, tmp, n, m, k, false)
	}

	// FP8: the activations' codes and scales first.
	xq, err := b.tmpGet(n*k + 4*n + 16)
	if err != nil {
		return err
	}
	defer b.tmpPut(xq)
	sx := xq + uint64((n*k+15)/16*16)
	f, err := b.fn(fnKey{spec, "f8_act_quant"})
	if err != nil {
		return err
	}
	if err := b.launch(f, [3]int{n, 1, 1}, 256, 0, xq, sx, xptr, i32(n), i32(k)); err != nil {
		return err
	}
	if n <= wqDecMaxRows && b.cc >= 89 {
		return b.wqDec(o.ptr, int(o.dt), xq, sx, wt, n, m, k, pristine)
	}
	if n <= wqGemvMaxRows && b.cc >= 89 {
		return b.f8MMA(o.ptr, int(o.dt), xq, sx, wt, n, m, k)
	}
	if n <= wqGemvMaxRows {
		f, err := b.fn(fnKey{spec, "f8_gemv"})
		if err != nil {
			return err
		}
		return b.launch(f, grid, 256, 0, o.ptr, xq, sx, wt.ptr, i32(n), i32(m), i32(k))
	}
	acc, err := b.tmpGet(n * m * 4)
	if err != nil {
		return err
	}
	defer b.tmpPut(acc)
	p, err := b.f8PlanFor(n, m, k)
	if err != nil {
		return err
	}
	if p.ok {
		st := b.f8GemmCall(p, wt.ptr, xq, acc)
		// A refusal at launch (the heuristic offered an algorithm the
		// call then declines) sends this shape to the BF16 GEMM of codes
		// from now on; nothing was queued.
		p.ok = st == 0
		if !p.ok {
			p.refused = fmt.Sprintf("cublasLtMatmul: status %d", st)
		}
	}
	if !p.ok {
		if err := b.f8CodesGemm(acc, xq, wt.ptr, n, m, k); err != nil {
			return err
		}
	}
	f, err = b.fn(fnKey{spec, "f8_epilogue"})
	if err != nil {
		return err
	}
	return b.launch(f, [3]int{(m + 255) / 256, (n + f8EpiRows - 1) / f8EpiRows, 1}, 256, 0, o.ptr, acc, sx, wt.ptr, i32(n), i32(m), i32(k))
}

// f8EpiRows mirrors F8_EPI_ROWS in kernels/wquant.cu: the rows of acc one
// f8_epilogue thread scales.
const f8EpiRows = 16

// mmaSplits chooses how many blocks split k in awq_mma and f8_mma (64
// output features a block): enough for Tuning.WQWaves blocks per SM where
// the features alone are fewer, each split a whole number of 128-wide
// chunks.
// It returns the splits and the chunks each takes.
func (b *Backend) mmaSplits(m, k int) (splits, cps int) {
	fb, chunks := (m+63)/64, (k+127)/128
	splits = max(1, min(chunks, (b.tune.wqWaves*b.sms+fb-1)/fb))
	cps = (chunks + splits - 1) / splits
	return (chunks + cps - 1) / cps, cps
}

// decKSplit is the warps of an awq_dec / f8_dec block that split k for a
// product of n rows: Tuning.WQDecodeKSplit, by default all 8 for one 8-row
// tile (x is small; more blocks keep more weight loads in flight) and 4
// for two (x's reads from L2 grow with the rows; features sharing them
// in L1 halve them).
func (b *Backend) decKSplit(n int) int {
	if kw := b.tune.wqDecKSplit; kw != 0 {
		return kw
	}
	if n <= 8 {
		return 8
	}
	return 4
}

// decSplits chooses the grid of awq_dec and f8_dec for m output features,
// chunks chunks of k and kw warps of a block on k: blocks of 16*8/kw
// features, and enough blocks splitting k for Tuning.WQDecodeWaves blocks
// per SM where the features alone give fewer, each split at least one
// chunk a warp. It returns the blocks along m, the splits and the chunks
// each takes.
func (b *Backend) decSplits(m, chunks, kw int) (fb, splits, cps int) {
	fb = (m + 16*(wqDecWarps/kw) - 1) / (16 * (wqDecWarps / kw))
	splits = max(1, min((chunks+kw-1)/kw, b.tune.wqDecWaves*b.sms/fb))
	cps = (chunks + splits - 1) / splits
	return fb, (chunks + cps - 1) / cps, cps
}

// wqDec queues awq_dec (AWQ4 w, x BF16 at x) or f8_dec (F8E4M3Row w, x
// the e4m3 codes at x and their scales at sx), and the kernel adding the
// partial sums when k is split: y[n,m] (dtype ot) = x . w^T for n <= 16
// rows. CUDA thread only.
func (b *Backend) wqDec(y uint64, ot int, x, sx uint64, wt *tensor, n, m, k int, pristine bool) error {
	spec := modSpec{file: "wquant", p: [8]int{int(wt.dt), ot, (n + 7) / 8}}
	f8 := wt.dt == backend.F8E4M3Row
	name, chunk := "awq_dec", 128
	if f8 {
		name, chunk = "f8_dec", 64
	}
	f, err := b.fn(fnKey{spec, name})
	if err != nil {
		return err
	}
	kwn := b.decKSplit(n)
	fb, splits, cps := b.decSplits(m, (k+chunk-1)/chunk, kwn)
	grid := [3]int{fb, splits, 1}
	// The kernels' arguments after (y, part): f8_dec has sx after x.
	args := [11]uint64{y, 0, x, wt.ptr, i32(n), i32(m), i32(k), i32(cps), i32(kwn), flag(pristine)}
	na := 10
	if f8 {
		args = [11]uint64{y, 0, x, sx, wt.ptr, i32(n), i32(m), i32(k), i32(cps), i32(kwn), flag(pristine)}
		na = 11
	}
	if splits == 1 {
		return b.launch(f, grid, 32*wqDecWarps, 0, args[:na]...)
	}
	part, err := b.tmpGet(splits * n * m * 4)
	if err != nil {
		return err
	}
	defer b.tmpPut(part)
	args[0], args[1] = 0, part
	if err := b.launch(f, grid, 32*wqDecWarps, 0, args[:na]...); err != nil {
		return err
	}
	if f8 {
		r, err := b.fn(fnKey{spec, "f8_epilogue_parts"})
		if err != nil {
			return err
		}
		return b.launch(r, [3]int{b.gridFor(n * m), 1, 1}, 256, 0, y, part, i32(splits), sx, wt.ptr, i32(n), i32(m), i32(k))
	}
	r, err := b.fn(fnKey{spec, "wq_reduce"})
	if err != nil {
		return err
	}
	return b.launch(r, [3]int{b.gridFor(n * m), 1, 1}, 256, 0, y, part, i32(splits), i32(n), i32(m))
}

// awqMMA queues awq_mma (and wq_reduce when k is split): y[n,m] (dtype
// ot) = x . w^T for n <= 64 rows of BF16 x. CUDA thread only.
func (b *Backend) awqMMA(y uint64, ot int, x uint64, wt *tensor, n, m, k int) error {
	spec := modSpec{file: "wquant", p: [8]int{int(wt.dt), ot, (n + 7) / 8}}
	f, err := b.fn(fnKey{spec, "awq_mma"})
	if err != nil {
		return err
	}
	splits, cps := b.mmaSplits(m, k)
	grid := [3]int{(m + 63) / 64, splits, 1}
	if splits == 1 {
		return b.launch(f, grid, 32*awqMMAWarps, 0, y, 0, x, wt.ptr, i32(n), i32(m), i32(k), i32(cps))
	}
	part, err := b.tmpGet(splits * n * m * 4)
	if err != nil {
		return err
	}
	defer b.tmpPut(part)
	if err := b.launch(f, grid, 32*awqMMAWarps, 0, 0, part, x, wt.ptr, i32(n), i32(m), i32(k), i32(cps)); err != nil {
		return err
	}
	r, err := b.fn(fnKey{spec, "wq_reduce"})
	if err != nil {
		return err
	}
	return b.launch(r, [3]int{b.gridFor(n * m), 1, 1}, 256, 0, y, part, i32(splits), i32(n), i32(m))
}

// f8MMA queues f8_mma (and f8_epilogue_parts when k is split): y[n,m]
// (dtype ot) = the FP8 product of xq (codes, scales sx) and w for n <= 64
// rows. CUDA thread only.
func (b *Backend) f8MMA(y uint64, ot int, xq, sx uint64, wt *tensor, n, m, k int) error {
	spec := modSpec{file: "wquant", p: [8]int{int(wt.dt), ot, (n + 7) / 8}}
	f, err := b.fn(fnKey{spec, "f8_mma"})
	if err != nil {
		return err
	}
	splits, cps := b.mmaSplits(m, k)
	grid := [3]int{(m + 63) / 64, splits, 1}
	if splits == 1 {
		return b.launch(f, grid, 32*awqMMAWarps, 0, y, 0, xq, sx, wt.ptr, i32(n), i32(m), i32(k), i32(cps))
	}
	part, err := b.tmpGet(splits * n * m * 4)
	if err != nil {
		return err
	}
	defer b.tmpPut(part)
	if err := b.launch(f, grid, 32*awqMMAWarps, 0, 0, part, xq, sx, wt.ptr, i32(n), i32(m), i32(k), i32(cps)); err != nil {
		return err
	}
	r, err := b.fn(fnKey{spec, "f8_epilogue_parts"})
	if err != nil {
		return err
	}
	return b.launch(r, [3]int{b.gridFor(n * m), 1, 1}, 256, 0, y, part, i32(splits), sx, wt.ptr, i32(n), i32(m), i32(k))
}

// awqMMAWarps is AWQ_NW of kernels/wquant.cu.
const awqMMAWarps = 4

// f8CodesGemm computes acc[n,m] (f32) = codes(xq) . codes(w)^T through
// the BF16 GEMM, the codes widened to BF16 in temporaries. CUDA thread
// only.
func (b *Backend) f8CodesGemm(acc, xq, w uint64, n, m, k int) error {
	xb, err := b.tmpGet(n * k * 2)
	if err != nil {
		return err
	}
	defer b.tmpPut(xb)
	wb, err := b.tmpGet(m * k * 2)
	if err != nil {
		return err
	}
	defer b.tmpPut(wb)
	f, err := b.fn(fnKey{modSpec{file: "wquant", p: [8]int{int(backend.F8E4M3Row), int(backend.BF16), 1}}, "f8_codes"})
	if err != nil {
		return err
	}
	if err := b.launch(f, [3]int{b.gridFor(n * k), 1, 1}, 256, 0, xb, xq, i32(n), i32(k), i32(k)); err != nil {
		return err
	}
	if err := b.launch(f, [3]int{b.gridFor(m * k), 1, 1}, 256, 0, wb, w, i32(m), i32(k), i32(k+16)); err != nil {
		return err
	}
	return b.gemm(acc, cudaR32F, xb, wb, n, m, k, false)
}

// f8GemmCall queues plan p's FP8 GEMM, acc = w . xq^T of the codes (F32,
// unscaled), returning cuBLASLt's status. CUDA thread only.
func (b *Backend) f8GemmCall(p *f8Plan, w, xq, acc uint64) int {
	g := &b.blas
	alpha := uintptr(unsafe.Pointer(&g.scalars[0]))
	beta := uintptr(unsafe.Pointer(&g.scalars[4]))
	return g.lib.call(g.lib.matmul, g.handle, p.desc, alpha, uintptr(w), p.a, uintptr(xq), p.b, beta,
		uintptr(acc), p.d, uintptr(acc), p.d, uintptr(unsafe.Pointer(&p.algo[0])), uintptr(g.workspace), ltWorkspaceBytes, b.stream)
}

// f8PlanFor returns the FP8 plan of the shape, made on first use; a plan
// without an algorithm (cuBLASLt refuses FP8 here: before sm_89, or the
// shape) has ok false. CUDA thread only.
func (b *Backend) f8PlanFor(n, m, k int) (*f8Plan, error) {
	key := [3]int{n, m, k}
	if p, ok := b.f8.plans[key]; ok {
		return p, nil
	}
	if b.f8.plans == nil {
		b.f8.plans = map[[3]int]*f8Plan{}
	}
	p := &f8Plan{}
	b.f8.plans[key] = p
	if b.cc < 89 {
		p.refused = fmt.Sprintf("compute capability %d: FP8 GEMMs need 89", b.cc)
		return p, nil
	}
	g := &b.blas
	l := g.lib
	set := func(attr int, v int32) error {
		return l.check("cublasLtMatmulDescSetAttribute", l.call(l.descSetAttr, p.desc, uintptr(attr), uintptr(unsafe.Pointer(&v)), 4))
	}
	if err := l.check("cublasLtMatmulDescCreate", l.call(l.descCreate, uintptr(unsafe.Pointer(&p.desc)), cublasCompute32F, cudaR32F)); err != nil {
		return nil, err
	}
	if err := set(ltDescTransA, cublasOpT); err != nil {
		return nil, err
	}
	if err := set(ltDescTransB, cublasOpN); err != nil {
		return nil, err
	}
	// Column-major: w is k x m with leading dimension k+16 (the row
	// trailers), used transposed; xq is k x n (ld k); acc is m x n (ld m).
	if err := l.check("cublasLtMatrixLayoutCreate", l.call(l.layoutCreate, uintptr(unsafe.Pointer(&p.a)), cudaR8FE4M3, uintptr(k), uintptr(m), uintptr(k+16))); err != nil {
		return nil, err
	}
	if err := l.check("cublasLtMatrixLayoutCreate", l.call(l.layoutCreate, uintptr(unsafe.Pointer(&p.b)), cudaR8FE4M3, uintptr(k), uintptr(n), uintptr(k))); err != nil {
		return nil, err
	}
	if err := l.check("cublasLtMatrixLayoutCreate", l.call(l.layoutCreate, uintptr(unsafe.Pointer(&p.d)), cudaR32F, uintptr(m), uintptr(n), uintptr(m))); err != nil {
		return nil, err
	}
	var res [ltHeuristicResultBytes]byte
	var count int32
	st := l.call(l.heuristic, g.handle, p.desc, p.a, p.b, p.d, p.d, g.pref, 1, uintptr(unsafe.Pointer(&res[0])), uintptr(unsafe.Pointer(&count)))
	if ws := *(*uint64)(unsafe.Pointer(&res[64])); st != 0 || count < 1 || ws > ltWorkspaceBytes {
		// No FP8 algorithm: the BF16 GEMM of codes.
		p.refused = fmt.Sprintf("cublasLtMatmulAlgoGetHeuristic: status %d, %d results, workspace %d (at most %d)", st, count, ws, ltWorkspaceBytes)
		return p, nil
	}
	copy(p.algo[:], res[:64])
	p.ok = true
	return p, nil
}
