package cuda

import (
	"fmt"
	"os"
	"strconv"
	"unsafe"

	"github.com/trigon-llm/trigon/backend"
)

var _ backend.Chainer = (*Backend)(nil)

// chainEnabled turns the chained products (kernels/chain.cu) on
// (TRIGON_CUDA_CHAIN=on, read by New). Off by default: on the H200
// (docs/benchmarks.md, 2026-11-30, fifth session) a Llama-3-8B layer
// boundary at batch 4 took 134-136 us chained against 123 us as separate
// kernels, and the chain's weight stream alone, with nothing multiplied,
// took 123.5 us: the ring of shared-memory tiles streams no faster than
// the separate kernels do.
var chainEnabled = false

// chainEnv names chainEnabled's override: "on" or "off".
const chainEnv = "TRIGON_CUDA_CHAIN"

// chainKC is the k columns of a ring tile (KC in kernels/chain.cu; a
// tile row is one TMA copy of 2*chainKC bytes), TRIGON_CUDA_CHAIN_KC.
var chainKC = 1024

// chainNC is the chain kernel's consumer warps (NC), TRIGON_CUDA_CHAIN_NC.
var chainNC = 16

// chainNoMath builds the kernel whose consumers do not multiply (NOMATH):
// the stream's rate alone, with wrong results. Only BenchmarkChainOps sets
// it (TRIGON_CUDA_CHAIN_NOMATH=1 in its environment).
var chainNoMath = 0

// chainThreads is the chain kernel's block: the consumer warps and the
// producer warp.
func chainThreads() int { return (chainNC + 1) * 32 }

// chainSpec is the chain kernel's module.
func chainSpec() modSpec {
	return modSpec{file: "chain", p: [6]int{chainKC, chainNC, chainNoMath}}
}

// chainStageAddMax: an ADD op's x is staged in shared memory when it is
// at most this many bytes (the O projection's input at 8 rows), else read
// from L2 a tile ahead (the down projection's), TRIGON_CUDA_CHAIN_STAGE_KB.
var chainStageAddMax = 72 << 10

// chainTileBytes is one ring tile: 16 rows of KC + 32 bf16.
func chainTileBytes() int { return 16 * (chainKC + 32) * 2 }

// applyChainEnv reads chainEnv, TRIGON_CUDA_CHAIN_KC, TRIGON_CUDA_CHAIN_NC
// and TRIGON_CUDA_CHAIN_STAGE_KB.
func applyChainEnv() error {
	on, err := envSwitch(chainEnv, chainEnabled)
	if err != nil {
		return err
	}
	chainEnabled = on
	if v := os.Getenv("TRIGON_CUDA_CHAIN_KC"); v != "" {
		kc, err := strconv.Atoi(v)
		if err != nil || (kc != 256 && kc != 512 && kc != 1024 && kc != 2048) {
			return fmt.Errorf("cuda: TRIGON_CUDA_CHAIN_KC=%q: want 256, 512, 1024 or 2048", v)
		}
		chainKC = kc
	}
	if v := os.Getenv("TRIGON_CUDA_CHAIN_NC"); v != "" {
		nc, err := strconv.Atoi(v)
		if err != nil || (nc != 4 && nc != 8 && nc != 16) {
			return fmt.Errorf("cuda: TRIGON_CUDA_CHAIN_NC=%q: want 4, 8 or 16", v)
		}
		chainNC = nc
	}
	if chainKC < 32*chainNC {
		return fmt.Errorf("cuda: TRIGON_CUDA_CHAIN_KC=%d is less than 32 columns per consumer warp (%d warps)", chainKC, chainNC)
	}
	if v := os.Getenv("TRIGON_CUDA_CHAIN_STAGE_KB"); v != "" {
		kb, err := strconv.Atoi(v)
		if err != nil || kb < 0 || kb > 200 {
			return fmt.Errorf("cuda: TRIGON_CUDA_CHAIN_STAGE_KB=%q: want 0..200", v)
		}
		chainStageAddMax = kb << 10
	}
	return nil
}

// The chain kernel's geometry (kernels/chain.cu).
const (
	chainMaxOps    = 4  // MAX_OPS
	chainMaxStages = 16 // MAX_STAGES
	chainMinStages = 4  // fewer ring tiles than this would not cover the wait between ops
	chainMaxRows   = 8  // token rows: the 8 columns of the mma B operand
	// chainStaticSmem covers the kernel's static shared memory (4.7 KB
	// at 8 consumer warps, 9 KB at 16: mbarriers, the warps' partial sums,
	// the norm's sums).
	chainStaticSmem = 12 << 10
	// The NORM ops' inputs are always staged in shared memory and may
	// take up to chainStageNormMax.
	chainStageNormMax = 96 << 10
	// chainErr is ERR_CHAIN: a block waited past its timeout.
	chainErr = 64
)

// Op kinds of chainOp (OP_* in kernels/chain.cu).
const (
	chainOpAdd      = 1
	chainOpNormSiLU = 2
	chainOpNormQKV  = 3
)

// chainOp mirrors ChainOp in kernels/chain.cu: every field 8 bytes.
type chainOp struct {
	kind, m, k, staged                   int64
	w, x, y, g, pos, slots, kc, vc, invf uint64
	h, kv, hd, bs, nslots                int64
}

// chainArgs mirrors ChainArgs, the kernel's one parameter.
type chainArgs struct {
	ops             [chainMaxOps]chainOp
	nops, n, stages int64
	eps             float32
	_               int32
	err, sync       uint64
}

// chainArgsBytes is the size of the kernel's parameter (TestChainArgsLayout).
const chainArgsBytes = chainMaxOps*18*8 + 3*8 + 8 + 2*8

// Chain implements backend.Chainer through chain_bf16 (kernels/chain.cu),
// when chainEnabled (it refuses every run otherwise, checking nothing):
// the ops' products run as one persistent kernel, one block per SM, whose
// producer warp streams the block's share of every weight of the run
// through shared memory while its consumer warps follow the ops' data
// dependencies. It takes
// runs of at most chainMaxOps ops on the same 1..8 token rows whose
// operands the NormFuser kernels take (BF16, F32 norm weights), with k a
// multiple of 32, MatMulAdd outputs a multiple of 16 wide, on a device of
// compute capability 9.0 or newer (TMA bulk copies); elsewhere it returns
// false. Rounding is the unfused ops' (see the kernel file).
func (b *Backend) Chain(ops []backend.ChainOp) (bool, error) {
	if len(ops) == 0 || !chainEnabled || b.cc < 90 || b.chainSmem == 0 {
		return false, nil
	}
	var a chainArgs
	ok := len(ops) <= chainMaxOps
	n := -1
	xsBytes := 0
	for i, op := range ops {
		c, rows, fits, err := b.chainOperands(op)
		if err != nil {
			return false, fmt.Errorf("chain op %d: %w", i, err)
		}
		if !fits || (n >= 0 && rows != n) || rows < 1 || rows > chainMaxRows {
			ok = false
		}
		n = rows
		if !ok {
			continue // still check the remaining ops' operands
		}
		bytes := n * (int(c.k) + 32) * 2
		switch {
		case c.kind != chainOpAdd && bytes > chainStageNormMax:
			ok = false
			continue
		case c.kind != chainOpAdd || bytes <= chainStageAddMax:
			c.staged = 1
			xsBytes = max(xsBytes, bytes)
		}
		a.ops[i] = c
	}
	if !ok {
		return false, nil
	}
	stages := min(chainMaxStages, (b.chainSmem-xsBytes)/chainTileBytes())
	if stages < chainMinStages {
		return false, nil
	}
	// The kernel takes one epsilon: the norms of a model share theirs.
	epsSet := false
	for _, op := range ops {
		if op.Kind == backend.ChainMatMulAdd {
			continue
		}
		if epsSet && op.Eps != a.eps {
			return false, nil
		}
		a.eps, epsSet = op.Eps, true
	}
	a.nops, a.n, a.stages = int64(len(ops)), int64(n), int64(stages)
	smem := stages*chainTileBytes() + xsBytes
	if err := b.post(func() error {
		f, err := b.fnSmem(fnKey{chainSpec(), "chain_bf16"}, b.chainSmem)
		if err != nil {
			return err
		}
		a.err, a.sync = b.errDev, b.chainSync
		return b.launchBlob(f, [3]int{b.sms, 1, 1}, chainThreads(), smem, unsafe.Pointer(&a), int(unsafe.Sizeof(a)))
	}); err != nil {
		return false, err
	}
	return true, nil
}

// chainOperands checks op as its NormFuser method checks its operands (the
// same ErrShape errors) and returns its kernel description, its token rows
// and whether the chain kernel takes it.
func (b *Backend) chainOperands(op backend.ChainOp) (c chainOp, rows int, fits bool, err error) {
	switch op.Kind {
	case backend.ChainMatMulAdd:
		rt, xt, wt, ok, err := b.addOperands(op.Out, op.X, op.W)
		if err != nil {
			return c, 0, false, err
		}
		m, k := wt.shape[0], wt.shape[1]
		c = chainOp{kind: chainOpAdd, m: int64(m), k: int64(k), w: wt.ptr, x: xt.ptr, y: rt.ptr}
		return c, xt.shape[0], ok && m%16 == 0 && k%32 == 0, nil
	case backend.ChainNormGateUpSiLU:
		o, ht, wt, gt, ok, err := b.siluOperands(op.Out, op.X, op.NormW, op.Eps, op.W)
		if err != nil {
			return c, 0, false, err
		}
		inter, k := o.shape[1], wt.shape[1]
		c = chainOp{kind: chainOpNormSiLU, m: int64(inter), k: int64(k), w: wt.ptr, x: ht.ptr, y: o.ptr, g: gt.ptr}
		return c, ht.shape[0], ok && k%32 == 0, nil
	case backend.ChainNormQKVRoPE:
		ht, wt, r, ok, err := b.qkvRoPEOperands(op.X, op.W, op.RoPE)
		if err != nil {
			return c, 0, false, err
		}
		k := wt.shape[1]
		gt, gok, err := b.normWeight("normqkvrope", op.NormW, op.Eps, k)
		if err != nil {
			return c, 0, false, err
		}
		ok = ok && gok && k%32 == 0 && !overlaps(gt, r.q) && !overlaps(gt, r.kc) && !overlaps(gt, r.vc) &&
			!overlaps(ht, r.q) && !overlaps(ht, r.kc) && !overlaps(ht, r.vc)
		c = chainOp{kind: chainOpNormQKV, m: int64(wt.shape[0]), k: int64(k), w: wt.ptr, x: ht.ptr, y: r.q.ptr, g: gt.ptr,
			pos: r.pos.ptr, slots: r.slots.ptr, kc: r.kc.ptr, vc: r.vc.ptr, invf: r.invf.ptr,
			h: int64(r.h), kv: int64(r.kvh), hd: int64(r.d), bs: int64(r.blockSize), nslots: int64(r.numSlots)}
		return c, r.n, ok, nil
	default:
		return c, 0, false, backend.ShapeError("cuda: chain", "Kind", "unknown op kind %d", op.Kind)
	}
}

// initChain sizes the chain kernel's shared memory from the device's
// opt-in limit and makes its zeroed counters. CUDA thread only.
func (b *Backend) initChain() error {
	if b.cc < 90 {
		return nil
	}
	optin, err := b.d.deviceAttr(b.dev, cuDevAttrMaxSharedPerBlockOptin)
	if err != nil {
		return err
	}
	b.chainSmem = optin - chainStaticSmem
	if b.chainSync, err = b.pool.get(64); err != nil {
		return err
	}
	if err := b.d.check("cuMemsetD8Async", b.d.call(b.d.cuMemsetD8Async, uintptr(b.chainSync), 0, 64, b.stream)); err != nil {
		return err
	}
	return b.d.check("cuStreamSynchronize", b.d.call(b.d.cuStreamSynchronize, b.stream))
}

// launchBlob starts kernel f whose one parameter is the size bytes at p
// (a struct), copied into pinned memory first. CUDA thread only.
func (b *Backend) launchBlob(f uintptr, grid [3]int, block, smem int, p unsafe.Pointer, size int) error {
	if size > len(b.blob.b)-64 {
		return fmt.Errorf("launch: a %d-byte parameter, at most %d", size, len(b.blob.b)-64)
	}
	copy(b.blob.b[64:64+size], unsafe.Slice((*byte)(p), size))
	return b.launchParams(f, grid, block, smem, b.blob.host) // one pointer, to the struct at +64
}
