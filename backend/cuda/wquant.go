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
// of the codes (sm_89 and later: e4m3 x e4m3, f32 accumulate). Where
// cuBLASLt takes outer-vector scales (12.9 and later, on the GPUs it has
// such algorithms for), it multiplies each sum by its token's and its
// feature's scales and writes the output dtype itself (f8Scaled; the
// weight's scales gathered from the row trailers into a vector once,
// f8Scales); else it writes the F32 sums and f8_epilogue applies the
// scales (f8Epilogue). Where cuBLASLt has no FP8 algorithm for the shape
// or the device, the codes are widened to BF16 (exact: e4m3 has 4
// significant bits) and the BF16 GEMM computes the same sums (f8Codes).
// The path is chosen once per shape (f8PlanFor).

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

// f8Path is how an FP8 product of more than wqGemvMaxRows rows runs,
// chosen once per shape (f8PlanFor) and lowered at most once more, by a
// refusal at the shape's first call.
type f8Path int

const (
	// f8Codes: the codes widened to BF16, the BF16 GEMM of them into F32,
	// then f8_epilogue (no FP8 GEMM: before sm_89, or cuBLASLt has none).
	f8Codes f8Path = iota
	// f8Epilogue: cuBLASLt's FP8 GEMM of the codes into F32, then
	// f8_epilogue.
	f8Epilogue
	// f8Scaled: cuBLASLt's FP8 GEMM applies both scales (outer vectors)
	// and writes the output's dtype itself: no F32 product, no epilogue.
	f8Scaled
)

func (p f8Path) String() string {
	switch p {
	case f8Scaled:
		return "cuBLASLt FP8 GEMM, scales in cuBLASLt"
	case f8Epilogue:
		return "cuBLASLt FP8 GEMM into F32, f8_epilogue"
	}
	return "BF16 GEMM of the codes, f8_epilogue"
}

// f8Gemm is one cuBLASLt FP8 GEMM description: d[n,m] = xq[n,k] . w[m,k]^T
// over e4m3 codes, w's rows k+16 bytes apart; scaled: d = that times
// scaleW[m] * scaleX[n] (outer-vector scales, set per call), in d's dtype.
type f8Gemm struct {
	desc, a, b, d uintptr
	algo          [64]byte
	scaled        bool
}

// f8Plan is the FP8 product of one shape and output dtype: the path it
// takes and the GEMMs that path needs (plain: into F32, for f8_epilogue).
type f8Plan struct {
	path          f8Path
	scaled, plain f8Gemm
	// refused says why the faster paths were not taken (cuBLASLt's status
	// and result count, the workspace asked, or the launch's status), for
	// reports.
	refused string
}

// refuse adds why to p's refusals.
func (p *f8Plan) refuse(why string) {
	if p.refused != "" {
		p.refused += "; "
	}
	p.refused += why
}

// f8Key identifies an FP8 plan: n rows of x, m output features, k inputs,
// the output's dtype.
type f8Key struct {
	n, m, k int
	ot      backend.DType
}

// f8State caches the FP8 plans by shape, and the weights' scales gathered
// into vectors (f8Scales). CUDA thread only.
type f8State struct {
	plans map[f8Key]*f8Plan
	// scales maps an F8E4M3Row weight (address and size, as the BF16
	// shadows of F32 weights) to its rows' scales as one f32 vector [m];
	// dropped with the shadows when the weight is freed or written.
	scales map[shadowKey]uint64
}

func (g *f8Gemm) destroy(l *lt) {
	for _, h := range []uintptr{g.a, g.b, g.d} {
		if h != 0 {
			l.call(l.layoutDestroy, h)
		}
	}
	if g.desc != 0 {
		l.call(l.descDestroy, g.desc)
	}
	*g = f8Gemm{}
}

func (s *f8State) close(l *lt) {
	for _, p := range s.plans {
		p.scaled.destroy(l)
		p.plain.destroy(l)
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
	p, err := b.f8PlanFor(n, m, k, o.dt)
	if err != nil {
		return err
	}
	if p.path == f8Scaled {
		sw, done, err := b.f8Scales(wt, m, k)
		if err != nil {
			return err
		}
		st := b.f8GemmCall(&p.scaled, wt.ptr, xq, sw, sx, o.ptr)
		done()
		if st == 0 {
			return nil
		}
		// A refusal at launch (the heuristic offered an algorithm the
		// call then declines) sends this shape to the F32 GEMM and
		// f8_epilogue from now on; nothing was queued.
		p.path = f8Epilogue
		p.refuse(fmt.Sprintf("outer-vector scales: cublasLtMatmul: status %d", st))
	}
	acc, err := b.tmpGet(n * m * 4)
	if err != nil {
		return err
	}
	defer b.tmpPut(acc)
	if p.path == f8Epilogue {
		// As above: a refusal sends the shape to the BF16 GEMM of codes.
		if st := b.f8GemmCall(&p.plain, wt.ptr, xq, 0, 0, acc); st != 0 {
			p.path = f8Codes
			p.refuse(fmt.Sprintf("FP8 GEMM: cublasLtMatmul: status %d", st))
		}
	}
	if p.path == f8Codes {
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

// f8GemmCall queues FP8 GEMM g, d = xq . w^T of the codes (F32,
// unscaled; or, g.scaled, times the weight's scales sw [m] and the
// activations' sx [n], in g's output dtype), returning cuBLASLt's status.
// CUDA thread only.
func (b *Backend) f8GemmCall(g *f8Gemm, w, xq, sw, sx, d uint64) int {
	bl := &b.blas
	l := bl.lib
	if g.scaled {
		// The plan is shared by every weight of the shape: the vectors
		// are this call's, read by cublasLtMatmul as it queues the call.
		for _, a := range []struct {
			attr int
			ptr  uint64
		}{{ltDescAScalePointer, sw}, {ltDescBScalePointer, sx}} {
			if st := l.call(l.descSetAttr, g.desc, uintptr(a.attr), uintptr(unsafe.Pointer(&a.ptr)), 8); st != 0 {
				return st
			}
		}
	}
	alpha := uintptr(unsafe.Pointer(&bl.scalars[0]))
	beta := uintptr(unsafe.Pointer(&bl.scalars[4]))
	return l.call(l.matmul, bl.handle, g.desc, alpha, uintptr(w), g.a, uintptr(xq), g.b, beta,
		uintptr(d), g.d, uintptr(d), g.d, uintptr(unsafe.Pointer(&g.algo[0])), uintptr(bl.workspace), ltWorkspaceBytes, b.stream)
}

// f8Scales returns the address of w's row scales as one f32 vector [m]
// (cuBLASLt's outer-vector scale of op(A)'s rows): f8_row_scales gathers
// them from the rows' trailers on the weight's first use and the vector
// is kept until the weight is freed or written (dropShadows). While a
// graph records, the vector is gathered into a temporary of the call
// instead (a kept one would hold nothing until the graph first runs);
// done releases it. CUDA thread only.
func (b *Backend) f8Scales(wt *tensor, m, k int) (sw uint64, done func(), err error) {
	sk := shadowKey{wt.ptr, wt.bytes}
	if sw, ok := b.f8.scales[sk]; ok {
		return sw, func() {}, nil
	}
	f, err := b.fn(fnKey{modSpec{file: "wquant", p: [8]int{int(backend.F8E4M3Row), int(backend.BF16), 1}}, "f8_row_scales"})
	if err != nil {
		return 0, nil, err
	}
	if b.capturing {
		if sw, err = b.tmpGet(4 * m); err != nil {
			return 0, nil, err
		}
		done = func() { b.tmpPut(sw) }
	} else {
		if sw, err = b.pool.get(4 * m); err != nil {
			return 0, nil, err
		}
		done = func() {}
	}
	if err := b.launch(f, [3]int{b.gridFor(m), 1, 1}, 256, 0, sw, wt.ptr, i32(m), i32(k)); err != nil {
		if b.capturing {
			b.tmpPut(sw)
		} else {
			b.pool.put(sw)
		}
		return 0, nil, err
	}
	if !b.capturing {
		if b.f8.scales == nil {
			b.f8.scales = map[shadowKey]uint64{}
		}
		b.f8.scales[sk] = sw
	}
	return sw, done, nil
}

// f8PlanFor returns the FP8 plan of the shape and output dtype, made on
// first use: f8Scaled where cuBLASLt has an algorithm for outer-vector
// scales, else f8Epilogue where it has an FP8 one (before sm_89, or for
// the shape, neither: f8Codes). CUDA thread only.
func (b *Backend) f8PlanFor(n, m, k int, ot backend.DType) (*f8Plan, error) {
	key := f8Key{n, m, k, ot}
	if p, ok := b.f8.plans[key]; ok {
		return p, nil
	}
	if b.f8.plans == nil {
		b.f8.plans = map[f8Key]*f8Plan{}
	}
	p := &f8Plan{}
	if b.cc < 89 {
		p.refused = fmt.Sprintf("compute capability %d: FP8 GEMMs need 89", b.cc)
		b.f8.plans[key] = p
		return p, nil
	}
	why, err := b.f8GemmInit(&p.plain, n, m, k, cudaR32F, false)
	if err != nil {
		p.plain.destroy(b.blas.lib)
		return nil, err
	}
	if why != "" {
		p.refused = "FP8 GEMM: " + why
		b.f8.plans[key] = p
		return p, nil
	}
	p.path = f8Epilogue
	dt := cudaR16BF
	if ot == backend.F32 {
		dt = cudaR32F
	}
	if why, err = b.f8GemmInit(&p.scaled, n, m, k, dt, true); err != nil {
		p.plain.destroy(b.blas.lib)
		p.scaled.destroy(b.blas.lib)
		return nil, err
	}
	if why != "" {
		p.refused = fmt.Sprintf("outer-vector scales (cuBLASLt %d): %s", b.blas.lib.call(b.blas.lib.version), why)
	} else {
		p.path = f8Scaled
	}
	b.f8.plans[key] = p
	return p, nil
}

// f8GemmInit describes FP8 GEMM g for the shape, its output of cudaDataType
// dt, and asks the heuristic for its algorithm; why is non-empty when
// cuBLASLt offers none (or, scaled, does not know the outer-vector
// attributes: a library before 12.9). CUDA thread only.
func (b *Backend) f8GemmInit(g *f8Gemm, n, m, k, dt int, scaled bool) (why string, err error) {
	bl := &b.blas
	l := bl.lib
	g.scaled = scaled
	set := func(attr int, v int32) int {
		return l.call(l.descSetAttr, g.desc, uintptr(attr), uintptr(unsafe.Pointer(&v)), 4)
	}
	if err := l.check("cublasLtMatmulDescCreate", l.call(l.descCreate, uintptr(unsafe.Pointer(&g.desc)), cublasCompute32F, cudaR32F)); err != nil {
		return "", err
	}
	if err := l.check("cublasLtMatmulDescSetAttribute", set(ltDescTransA, cublasOpT)); err != nil {
		return "", err
	}
	if err := l.check("cublasLtMatmulDescSetAttribute", set(ltDescTransB, cublasOpN)); err != nil {
		return "", err
	}
	if scaled {
		// op(A) is w's m rows (M = m): A's scales are the weight's, one
		// an output feature; op(B) is xq's n rows as columns (N = n): B's
		// are the activations', one a token.
		for _, a := range []int{ltDescAScaleMode, ltDescBScaleMode} {
			if st := set(a, ltScaleOuterVec32F); st != 0 {
				return fmt.Sprintf("cublasLtMatmulDescSetAttribute(%d, outer vector): status %d", a, st), nil
			}
		}
		// The heuristic reads no device memory; it sees non-null vectors
		// here, and each call sets its own (f8GemmCall).
		ph := bl.workspace
		for _, a := range []int{ltDescAScalePointer, ltDescBScalePointer} {
			if st := l.call(l.descSetAttr, g.desc, uintptr(a), uintptr(unsafe.Pointer(&ph)), 8); st != 0 {
				return fmt.Sprintf("cublasLtMatmulDescSetAttribute(%d): status %d", a, st), nil
			}
		}
	}
	// Column-major: w is k x m with leading dimension k+16 (the row
	// trailers), used transposed; xq is k x n (ld k); d is m x n (ld m),
	// which is y[n,m] row-major.
	if err := l.check("cublasLtMatrixLayoutCreate", l.call(l.layoutCreate, uintptr(unsafe.Pointer(&g.a)), cudaR8FE4M3, uintptr(k), uintptr(m), uintptr(k+16))); err != nil {
		return "", err
	}
	if err := l.check("cublasLtMatrixLayoutCreate", l.call(l.layoutCreate, uintptr(unsafe.Pointer(&g.b)), cudaR8FE4M3, uintptr(k), uintptr(n), uintptr(k))); err != nil {
		return "", err
	}
	if err := l.check("cublasLtMatrixLayoutCreate", l.call(l.layoutCreate, uintptr(unsafe.Pointer(&g.d)), uintptr(dt), uintptr(m), uintptr(n), uintptr(m))); err != nil {
		return "", err
	}
	var res [ltHeuristicResultBytes]byte
	var count int32
	st := l.call(l.heuristic, bl.handle, g.desc, g.a, g.b, g.d, g.d, bl.pref, 1, uintptr(unsafe.Pointer(&res[0])), uintptr(unsafe.Pointer(&count)))
	if ws := *(*uint64)(unsafe.Pointer(&res[64])); st != 0 || count < 1 || ws > ltWorkspaceBytes {
		return fmt.Sprintf("cublasLtMatmulAlgoGetHeuristic: status %d, %d results, workspace %d (at most %d)", st, count, ws, ltWorkspaceBytes), nil
	}
	copy(g.algo[:], res[:64])
	return "", nil
}
