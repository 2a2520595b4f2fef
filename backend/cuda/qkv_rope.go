package cuda

import (
	"github.com/trigon-llm/trigon/backend"
)

// qkvGEMVMaxRows is the most rows Tuning.QKVGEMV's pinned variant is used
// for (one 8-row x tile, the decode batches it is chosen for); more rows
// keep the tuner's pick.
const qkvGEMVMaxRows = 8

// planQKVRoPE plans the lowering rule qkv_rope (lower.go): for decode-sized batches
// whose QKV product runs on the register GEMV, one kernel (qkv_rope_bf16
// in kernels/gemv.cu) computes the projection and does RoPEStoreKV's work
// in its epilogue, leaving a.QKV unwritten; a bias (Qwen2's) is added
// there too, rounded as MatMul's add_bias rounds it. That saves a launch
// (two with a bias) and a round trip of the projection through memory per
// layer. The result is bit for bit that of MatMul followed by RoPEStoreKV
// on the same GEMV variant.
//
// With Q/K norms (Qwen3's a.QNorm, a.KNorm) and at most qkvGEMVMaxRows
// rows, it queues the pinned GEMV variant into a.QKV and then
// rope_store_kv, both launched with PDL: the result of MatMul on that
// variant followed by RoPEStoreKV, bit for bit. Why a pair and not one
// kernel: a head's norm needs the sum of squares of all its hd/16 GEMV
// blocks, which one kernel could only share across its blocks. Why PDL
// at this site only: on every gemv_bf16 and rope_store_kv launch it would
// also reach products that do not gain from it.
//
// Whether it fuses is decided here, on the caller's goroutine, from the
// operands alone: x and w BF16, at most gemvMaxRows rows, a.QKV, a.Q and
// the caches BF16, no Q/K norm or the pair's case above (no bias), no
// bias or an F32 one, a head dim that is a multiple of 16, and a GEMV
// able to take the operands.
// Otherwise it returns false. It never queues anything. Operands that
// MatMul(a.QKV, x, w, bias) or RoPEStoreKV(a) would refuse are an ErrShape
// error.
//
// Which kernel runs is decided on the CUDA thread: for at most
// qkvGEMVMaxRows rows the fused kernel with the pinned variant
// (Tuning.QKVGEMV); otherwise the plan's choice: the first eager call
// tunes the shape (x . w^T into a.QKV) exactly as MatMul does, and where
// cuBLASLt won, the call runs the unfused pair (cuBLASLt into a.QKV, then
// add_bias and rope_store_kv).
//
//	x [n, k] BF16;  w [(H+2*KV)*hd, k] BF16;  bias [(H+2*KV)*hd] F32 or nil
//	a as for RoPEStoreKV: a.QKV [n, (H+2*KV)*hd] (also the tuner's scratch)
func (b *Backend) planQKVRoPE(x, w, bias backend.Tensor, a backend.RoPEArgs) (qkvPlan, bool, error) {
	xt, wt, r, fuse, err := b.qkvRoPEOperands(x, w, a)
	if err != nil || !fuse {
		return qkvPlan{}, false, err
	}
	var bt *tensor
	if bias != nil {
		// Checked as MatMul(a.QKV, x, w, bias) checks it; only an F32 bias
		// (the model's widened one) fuses.
		if bt, err = b.tensorOf("matmul", "bias", bias); err != nil {
			return qkvPlan{}, false, err
		}
		if _, err := backend.CheckMatMul(r.qkv, xt, wt, bt); err != nil {
			return qkvPlan{}, false, opErr(err)
		}
		// The Q/K-norm pair takes no bias (no model has both).
		if bt.dt != backend.F32 || overlaps(bt, r.q) || overlaps(bt, r.kc) || overlaps(bt, r.vc) || r.qn != nil || r.kn != nil {
			return qkvPlan{}, false, nil
		}
	}
	return qkvPlan{x: xt, w: wt, bias: bt, r: r, pristine: earlyRead(wt)}, true, nil
}

// qkvPlan is a QKV product with RoPEStoreKV's work, as planQKVRoPE took
// it: the operands, and whether the weight may be read before the kernel
// waits (read when planned, in queue order, as MatMul reads it).
type qkvPlan struct {
	x, w, bias *tensor
	r          ropeOps
	pristine   bool
}

// runQKVRoPE queues p; early lets the kernel after it launch at its start
// (the lowering's early attribute). CUDA thread only.
func (b *Backend) runQKVRoPE(p *qkvPlan, early bool) error {
	return b.qkvRoPE(p.x, p.w, p.bias, p.r, p.w.shape[1], p.pristine, early)
}

// qkvRoPEOperands checks FusedQKVRoPE's operands (ErrShape errors, as
// MatMul(a.QKV, x, w, nil) and RoPEStoreKV(a) would give them) and reports
// whether qkv_rope_bf16 takes them.
func (b *Backend) qkvRoPEOperands(x, w backend.Tensor, a backend.RoPEArgs) (xt, wt *tensor, r ropeOps, fuse bool, err error) {
	if r, err = b.ropeOperands(a); err != nil {
		return nil, nil, r, false, err
	}
	// x and w are MatMul(a.QKV, x, w, nil)'s operands and are checked as
	// it checks them, under its name.
	const op = "matmul"
	if xt, err = b.tensorOf(op, "x", x); err != nil {
		return nil, nil, r, false, err
	}
	if wt, err = b.tensorOf(op, "w", w); err != nil {
		return nil, nil, r, false, err
	}
	md, err := backend.CheckMatMul(r.qkv, xt, wt, nil)
	if err != nil {
		return nil, nil, r, false, opErr(err)
	}
	m, k := md.Out, md.In
	// cuBLASLt and the GEMVs write BF16 or F32 only (as MatMul).
	if err := opErr(backend.CheckDType(op, "out", r.qkv, backend.BF16, backend.F32)); err != nil {
		return nil, nil, r, false, err
	}
	if overlaps(r.qkv, xt) || overlaps(r.qkv, wt) {
		return nil, nil, r, false, backend.ShapeError("cuda: "+op, "out", "overlaps x or w")
	}
	if m > maxInt32 || k > maxInt32 {
		return nil, nil, r, false, backend.ShapeError("cuda: "+op, "w", "%v x %v exceeds int32", xt.shape, wt.shape)
	}
	bf := backend.BF16
	fuse = r.n <= gemvMaxRows && gemvFits(r.n, k, xt.ptr, wt.ptr) &&
		xt.dt == bf && wt.dt == bf && r.qkv.dt == bf && r.kv.DType == bf &&
		(r.qn == nil && r.kn == nil || r.n <= qkvGEMVMaxRows) && r.d%16 == 0 &&
		// The kernel reads x and w while other blocks write Q and the
		// caches; the unfused pair would not mind, so neither may overlap.
		!overlaps(xt, r.q) && !overlaps(xt, r.kc) && !overlaps(xt, r.vc) &&
		!overlaps(wt, r.q) && !overlaps(wt, r.kc) && !overlaps(wt, r.vc)
	return xt, wt, r, fuse, nil
}

// qkvRoPE runs on the CUDA thread: the fused kernel with the pinned
// variant (up to qkvGEMVMaxRows rows) or where the shape's plan kept the
// GEMV, else cuBLASLt into r.qkv and rope_store_kv. earlyW as for gemm.
func (b *Backend) qkvRoPE(xt, wt, bt *tensor, r ropeOps, k int, earlyW, early bool) error {
	n, m := r.n, r.qkv.shape[1]
	if r.qn != nil || r.kn != nil {
		// The Q/K-norm pair.
		if err := b.gemvCallPDL(b.tune.qkvGEMV, r.qkv.ptr, cudaR16BF, xt.ptr, wt.ptr, n, m, k, earlyW, true); err != nil {
			return err
		}
		return b.ropeStorePDL(r, true)
	}
	var bias uint64
	if bt != nil {
		bias = bt.ptr
	}
	p, err := b.gemmPlanFor(r.qkv.ptr, cudaR16BF, xt.ptr, wt.ptr, n, m, k)
	if err != nil {
		return err
	}
	c := p.gemv
	p.pinned = gemvConfig{}
	if n <= qkvGEMVMaxRows {
		c, p.pinned = b.tune.qkvGEMV, b.tune.qkvGEMV
	}
	if c.nw == 0 {
		if err := b.gemmWith(p, r.qkv.ptr, cudaR16BF, xt.ptr, wt.ptr, n, m, k, earlyW); err != nil {
			return err
		}
		if bt != nil {
			f, err := b.fn(fnKey{modSpec{file: "act", p: [8]int{int(backend.F32), int(backend.BF16)}}, "add_bias"})
			if err != nil {
				return err
			}
			if err := b.launch(f, [3]int{b.gridFor(n * m), 1, 1}, 256, 0, r.qkv.ptr, bt.ptr, i32(n), i32(m)); err != nil {
				return err
			}
		}
		return b.ropeStore(r)
	}
	return b.qkvRoPECall(c, xt.ptr, wt.ptr, r, k, earlyW, early, bias)
}

// qkvRoPECall launches qkv_rope_bf16 with GEMV variant c; with a bias
// (F32 [m], else 0) it is added to the projection. early: the next kernel
// may launch at this one's start. CUDA thread only.
func (b *Backend) qkvRoPECall(c gemvConfig, x, w uint64, r ropeOps, k int, earlyW, early bool, bias uint64) error {
	f, err := b.fn(fnKey{modSpec{file: "gemv", p: [8]int{(r.n + 7) / 8, c.nw, c.ur, dtBF16}}, "qkv_rope_bf16"})
	if err != nil {
		return err
	}
	blocks := (r.h + 2*r.kvh) * r.d / 16
	return b.launch(f, [3]int{blocks, 1, 1}, c.nw*32, 0, r.q.ptr, x, w, r.pos.ptr, r.slots.ptr, r.kc.ptr, r.vc.ptr,
		r.invf.ptr, bias, i32(r.n), i32(k), i32(r.h), i32(r.kvh), i32(r.d), i32(r.blockSize), i32(r.numSlots),
		b.errDev, flag(earlyW)|launchEarlyBit(early))
}

// ropeOps are RoPEStoreKV's operands, checked by ropeOperands; ropeStore
// launches rope_store_kv on them.
type ropeOps struct {
	q, qkv, pos, slots, kc, vc, invf *tensor
	side                             kvSide  // the caches' scales and int4 window; zero for unquantized caches
	qn, kn                           *tensor // nil: no norm
	nt                               backend.DType
	kv                               backend.KVSpec // the caches' format (dtype, block size)
	eps                              float32
	h, kvh, d                        int
	n                                int // token rows
	blockSize, numSlots              int // numSlots = numBlocks*blockSize
}

// ropeOperands checks a as RoPEStoreKV does (backend.CheckRoPEStoreKV,
// then rope_store_kv's own limits), on the caller's goroutine.
func (b *Backend) ropeOperands(a backend.RoPEArgs) (ropeOps, error) {
	const op = "ropestorekv"
	var r ropeOps
	var err error
	for _, c := range []struct {
		name string
		dst  **tensor
		t    backend.Tensor
	}{{"Q", &r.q, a.Q}, {"QKV", &r.qkv, a.QKV}, {"Positions", &r.pos, a.Positions}, {"SlotMapping", &r.slots, a.SlotMapping},
		{"KCache", &r.kc, a.KCache}, {"VCache", &r.vc, a.VCache}, {"InvFreq", &r.invf, a.InvFreq}} {
		if *c.dst, err = b.tensorOf(op, c.name, c.t); err != nil {
			return r, err
		}
	}
	if r.qn, err = b.optTensorOf(op, "QNorm", a.QNorm); err != nil {
		return r, err
	}
	if r.kn, err = b.optTensorOf(op, "KNorm", a.KNorm); err != nil {
		return r, err
	}
	if r.side, err = b.kvSides(op, a.KV, a.KVAux); err != nil {
		return r, err
	}
	checked := a
	checked.Q, checked.QKV, checked.Positions, checked.SlotMapping = r.q, r.qkv, r.pos, r.slots
	checked.KCache, checked.VCache, checked.InvFreq = r.kc, r.vc, r.invf
	checked.QNorm, checked.KNorm = orNil(r.qn), orNil(r.kn)
	checked.KVAux = r.side.checked(a.KVAux)
	dims, err := backend.CheckRoPEStoreKV(checked)
	if err != nil {
		return r, opErr(err)
	}
	h, kvh, d := a.NumHeads, a.NumKVHeads, a.HeadDim
	// rope_store_kv's limits: a warp's lanes cover a head of at most 1024
	// dims, and the heads of a token index the grid's y dimension in
	// blocks of eight.
	if d > 1024 || h+kvh > 65535*4 {
		return r, backend.ShapeError("cuda: "+op, "heads", "NumHeads %d, NumKVHeads %d, HeadDim %d: want HeadDim <= 1024 and at most %d heads", h, kvh, d, 65535*4)
	}
	if a.KV.Scales == backend.KVScalePerHead && kvh > fp8ScanHeads {
		return r, backend.ShapeError("cuda: "+op, "heads", "NumKVHeads %d: an FP8 cache's scale pass takes at most %d", kvh, fp8ScanHeads)
	}
	r.h, r.kvh, r.d, r.n = h, kvh, d, dims.NumTokens
	// The kernel is specialised on one activation dtype (Q and QKV) and
	// one norm-weight dtype (QNorm and KNorm).
	if err := opErr(backend.CheckDType(op, "Q", r.q, r.qkv.dt)); err != nil {
		return r, err
	}
	if overlaps(r.q, r.qkv) {
		return r, backend.ShapeError("cuda: "+op, "Q", "overlaps QKV")
	}
	r.nt = backend.BF16
	for _, t := range []*tensor{r.qn, r.kn} {
		if t != nil {
			r.nt = t.dt
		}
	}
	if r.qn != nil && r.kn != nil && r.qn.dt != r.kn.dt {
		return r, backend.ShapeError("cuda: "+op, "KNorm", "dtype %v differs from QNorm's %v", r.kn.dt, r.qn.dt)
	}
	r.eps = a.NormEps
	numBlocks := dims.NumBlocks
	r.kv, r.blockSize = a.KV, dims.BlockSize
	if numBlocks > maxInt32/r.blockSize || r.n > maxInt32 {
		return r, backend.ShapeError("cuda: "+op, "KCache", "%v slots exceed int32", r.kc.shape)
	}
	r.numSlots = numBlocks * r.blockSize
	return r, nil
}

// ropeStore launches rope_store_kv: one warp per two tokens and a Q or K head,
// eight heads a block sharing their rotation angles.
// CUDA thread only.
func (b *Backend) ropeStore(r ropeOps) error { return b.ropeStorePDL(r, false) }

// ropeStorePDL is ropeStore, launched with launchPDL when site is set.
// CUDA thread only.
func (b *Backend) ropeStorePDL(r ropeOps, site bool) error {
	f, err := b.fn(fnKey{ropeModule(r.d, r.kv, r.qkv.dt, r.nt), "rope_store_kv"})
	if err != nil {
		return err
	}
	const tokensPerWarp, headsPerBlock = 2, 8 // TPW and HPB of kernels/rope.cu
	grid := [3]int{(r.n + tokensPerWarp - 1) / tokensPerWarp, (r.h + r.kvh + headsPerBlock - 1) / headsPerBlock, 1}
	args := [...]uint64{r.q.ptr, r.qkv.ptr, r.pos.ptr, r.slots.ptr, r.kc.ptr, r.vc.ptr, ptrOf(r.side.ksc), ptrOf(r.side.vsc), r.invf.ptr,
		ptrOf(r.qn), ptrOf(r.kn), f32bits(r.eps), i32(r.h), i32(r.kvh), i32(r.numSlots), b.errDev, i32(r.n), 0}
	if r.kv.Scales == backend.KVScalePerHead {
		// The scan pass first: it sets the scales still unset (dynamic
		// FP8) from this call's tokens, and returns at once when every
		// head has its scale. Both passes are plain stream launches, so a
		// decode graph captures them like any other.
		scan := args
		scan[len(scan)-1] = b.fp8Scan
		if err := b.launch(f, grid, headsPerBlock*32, 0, scan[:]...); err != nil {
			return err
		}
	}
	launch := b.launch
	if site {
		launch = b.launchPDL
	}
	if err := launch(f, grid, headsPerBlock*32, 0, append(args[:], r.side.winArgs()...)...); err != nil || r.kv.Scales != backend.KVScaleKIVI {
		return err
	}
	// int4: the K of the blocks this launch filled, quantized from their
	// window copies once every token of them is there. A plain stream
	// launch after the store, so a decode graph captures it too.
	seal, err := b.fn(fnKey{ropeModule(r.d, r.kv, r.qkv.dt, r.nt), "kivi_seal_k"})
	if err != nil {
		return err
	}
	const sealWarps = 4 // tokens per kivi_seal_k block
	sargs := append([]uint64{r.slots.ptr, r.kc.ptr, r.side.ksc.ptr, i32(r.kvh), i32(r.n), i32(r.numSlots)}, r.side.winArgs()...)
	return b.launch(seal, [3]int{(r.n + sealWarps - 1) / sealWarps, r.kvh, 1}, sealWarps*32, 0, sargs...)
}

// ropeModule is rope_store_kv's module for head dim d, caches of format
// kv, QKV and Q of dtype qt and norm weights of dtype nt.
func ropeModule(d int, kv backend.KVSpec, qt, nt backend.DType) modSpec {
	return modSpec{file: "rope", p: [8]int{d, kv.BlockSize, int(qt), int(kv.DType), int(nt), kvGroup(kv)}}
}

// kvGroup is the KV_G constant of the modules over caches of format kv:
// the int8 channel group, int4's V channel group, 0 for the other formats.
func kvGroup(kv backend.KVSpec) int {
	if kv.Scales == backend.KVScaleGroups || kv.Scales == backend.KVScaleKIVI {
		return kv.GroupSize
	}
	return 0
}
