package cuda

import (
	"fmt"
	"unsafe"

	"github.com/trigon-llm/trigon/backend"
)

// bulkConfig is one variant of the bulk-copy GEMV (kernels/gemv_bulk.cu):
// consumer warps, weight columns per pipeline stage, stages in flight per
// block, and the blocks per SM its registers must allow (the kernel's MB;
// 0: no bound, the compiler's choice, which allows two at eight consumer
// warps). The zero value means none.
type bulkConfig struct{ cw, ck, st, mb int }

// bulkConfigs are the variants the tuner times: those that stream a
// decode product's weight fastest in a sweep of warps, stage columns and
// stages (tools/gpu/probes/stream.cu). The last is bulkPick's for weights
// of 2-3 tiles an SM.
var bulkConfigs = []bulkConfig{{4, 512, 2, 0}, {8, 512, 3, 0}, {4, 1024, 2, 0}, {8, 1024, 2, 0}, {8, 1024, 3, 0}, {8, 512, 3, 3}}

// stageBytes is one pipeline stage: 16 weight rows of ck columns, rows
// ck+32 elements apart (the kernel's RSTR).
func (c bulkConfig) stageBytes() int { return 16 * (c.ck + 32) * 2 }

// smem is the dynamic shared memory of a block: st stages.
func (c bulkConfig) smem() int { return c.st * c.stageBytes() }

// spec is the module of variant c for n x rows and output dtype ot.
func (c bulkConfig) spec(n, ot int) modSpec {
	return modSpec{file: "gemv_bulk", p: [8]int{(n + 7) / 8, c.cw, c.ck, c.st, ot, c.mb}}
}

// tag names the variant in test and benchmark names: w8_c1024_s2, and
// _b3 where it is bound to three blocks an SM.
func (c bulkConfig) tag() string {
	t := fmt.Sprintf("w%d_c%d_s%d", c.cw, c.ck, c.st)
	if c.mb > 1 {
		t += fmt.Sprintf("_b%d", c.mb)
	}
	return t
}

func (c bulkConfig) String() string {
	if c.mb > 1 {
		return fmt.Sprintf("gemv_bulk(warps %d, columns %d, stages %d, %d blocks an SM)", c.cw, c.ck, c.st, c.mb)
	}
	return fmt.Sprintf("gemv_bulk(warps %d, columns %d, stages %d)", c.cw, c.ck, c.st)
}

// bulkFits reports whether variant c takes a product of n x rows and k
// columns: sm_90 or newer (TMA bulk copies), at most gemvMaxRows rows, k
// a multiple of the stage's columns, 16-byte aligned operands.
func (b *Backend) bulkFits(c bulkConfig, n, k int, x, w uint64) bool {
	return b.cc >= 90 && n >= 1 && n <= gemvMaxRows && k%c.ck == 0 && x%16 == 0 && w%16 == 0
}

// bulkFusedMaxRows is the most x rows the fused products (MatMulAdd's
// add, GateUpSiLU) take the bulk GEMV for: one 8-row x tile. With two, the
// variants need so many registers that one block fits an SM, and its
// stream no longer hides the consumers' latency; those rows go to the
// register GEMV.
const bulkFusedMaxRows = 8

// bulkFused is bulkFits for the fused products: at most bulkFusedMaxRows
// rows of x.
func (b *Backend) bulkFused(c bulkConfig, n, k int, x, w uint64) bool {
	return n <= bulkFusedMaxRows && b.bulkFits(c, n, k, x, w)
}

// bulkGrid returns the grid of a launch of f (variant c) over tiles
// weight tiles: every tile, or as many blocks as are resident at once
// (the kernel is persistent). CUDA thread only.
func (b *Backend) bulkGrid(f uintptr, c bulkConfig, tiles int) int {
	per, ok := b.bulkOcc[f]
	if !ok {
		per = 0
		if b.d.cuOccupancyMaxActiveBlocksPerMultiprocessor != 0 {
			var n int32
			if b.d.call(b.d.cuOccupancyMaxActiveBlocksPerMultiprocessor, uintptr(unsafe.Pointer(&n)), f,
				uintptr((c.cw+1)*32), uintptr(c.smem())) == 0 {
				per = int(n)
			}
		}
		if per <= 0 { // no answer: what the shared memory alone allows
			perSM, _ := smemLimits(b.cc)
			per = max(1, perSM/(c.smem()+c.cw*512+2<<10))
		}
		if b.bulkOcc == nil {
			b.bulkOcc = map[uintptr]int{}
		}
		b.bulkOcc[f] = per
	}
	return max(1, min(tiles, per*b.sms))
}

// bulkCall queues kernel (gemvb_bf16, gemvb_add_bf16 or gemvb_silu_bf16)
// of variant c: y [n, m] (ot, BF16 but for gemvb_bf16), x [n, k], w [m, k]
// ([2m, k] for the SiLU kernel); earlyW as for gemm. CUDA thread only.
func (b *Backend) bulkCall(c bulkConfig, kernel string, y uint64, ot int, x, w uint64, n, m, k int, earlyW bool) error {
	return b.bulkCallFlags(c, kernel, y, ot, x, w, n, m, k, flag(earlyW))
}

// bulkCallFlags is bulkCall with the kernel's flag word: bit 0 earlyW,
// bit 1 (launchEarlyBit) lets the next kernel launch at this one's start.
// CUDA thread only.
func (b *Backend) bulkCallFlags(c bulkConfig, kernel string, y uint64, ot int, x, w uint64, n, m, k int, flags uint64) error {
	f, err := b.fnSmem(fnKey{c.spec(n, ot), kernel}, c.smem())
	if err != nil {
		return err
	}
	tiles := (m + 15) / 16
	if kernel == "gemvb_silu_bf16" {
		tiles = m / 8
	}
	return b.launch(f, [3]int{b.bulkGrid(f, c, tiles), 1, 1}, (c.cw+1)*32, c.smem(), y, x, w, i32(n), i32(m), i32(k), flags)
}

// tuneBulk times the bulk variants that take the product (L2 flushed, as
// the tuner times the others) and records the fastest in p; it becomes
// the product's kernel if it beats cur ms, the current choice's time, by
// the tuning's gemvMargin. CUDA thread only.
func (b *Backend) tuneBulk(p *gemmPlan, key gemmKey, y, x, w uint64, cur float32, timed func(func() bool) (float32, bool)) {
	if key.xt != cudaR16BF || key.wt != cudaR16BF {
		return
	}
	ot := int(dtBF16)
	if key.yt == cudaR32F {
		ot = int(dtF32)
	}
	best, bestMs := bulkConfig{}, float32(0)
	for _, c := range bulkConfigs {
		if !b.bulkFits(c, key.n, key.k, x, w) {
			continue
		}
		run := func() bool { return b.bulkCall(c, "gemvb_bf16", y, ot, x, w, key.n, key.m, key.k, false) == nil }
		if !run() {
			continue
		}
		if ms, ok := timed(run); ok && (best.cw == 0 || ms < bestMs) {
			best, bestMs = c, ms
		}
	}
	if best.cw == 0 {
		return
	}
	p.bulkBest, p.bulkMs = best, bestMs
	if bestMs < cur*float32(1-b.tune.gemvMargin) {
		p.bulk = best
	}
}

// bulkPick is the bulk variant the fused products (MatMulAdd's add,
// GateUpSiLU) run for a weight of rows x k on sms SMs:
// eight consumer warps, 1024-column stages where k allows, three stages
// for the large gate/up weight and two otherwise. Chosen from graph-timed
// runs (BenchmarkGEMVBulk) rather than by the tuner: its timings, each
// run alone after an L2 flush, rank the variants differently from runs
// back to back in a graph, which is how a decode step runs them.
//
// Those variants fit two blocks an SM (their registers), so a weight of
// more than 2*sms 16-row tiles but no more than 3*sms (a 6144-row weight
// on 132 SMs) would leave some blocks two tiles and others one, about 1.5
// tiles' time for a product whose SMs average under 3 tiles. It
// takes 512-column stages (half the registers) bound to three blocks an
// SM instead: one tile a block.
func bulkPick(rows, k, sms int) bulkConfig {
	tiles := (rows + 15) / 16
	if tiles > 2*sms && tiles <= 3*sms && k%512 == 0 {
		return bulkConfig{cw: 8, ck: 512, st: 3, mb: 3}
	}
	c := bulkConfig{cw: 8, ck: 1024, st: 2}
	if k%1024 != 0 {
		c.ck, c.st = 512, 3
	} else if rows >= 16384 {
		c.st = 3
	}
	return c
}

// planGateUpSiLU plans the lowering rule gateup_silu (lower.go) for BF16
// operands of at most bulkFusedMaxRows rows on sm_90 and newer:
// gemvb_silu_bf16 (kernels/gemv_bulk.cu) multiplies each gate row and its
// up row in one tile and applies SiLU x mul in the epilogue, so the
// gate/up product never goes to memory and the SiLU kernel does not run.
// It returns false where the kernel does not take the operands; operands
// MatMul or SiLUMul would refuse are an ErrShape error. It queues nothing.
//
//	out [n, inter] BF16;  x [n, k] BF16;  w [2*inter, k] BF16
func (b *Backend) planGateUpSiLU(out, x, w backend.Tensor) (siluPlan, bool, error) {
	const op = "GateUpSiLU"
	ot, err := b.tensorOf(op, "out", out)
	if err != nil {
		return siluPlan{}, false, err
	}
	// SiLUMul's out: a float activation (backend.CheckSiLUMul).
	if err := opErr(backend.CheckActivation(op, "out", ot, -1, -1)); err != nil {
		return siluPlan{}, false, err
	}
	inter := ot.shape[1]
	xt, wt, ok, err := b.product(op, x, w, 2*inter)
	if err != nil {
		return siluPlan{}, false, err
	}
	n, k := xt.shape[0], wt.shape[1]
	if err := opErr(backend.CheckShape(op, "out", ot, n, inter)); err != nil {
		return siluPlan{}, false, err
	}
	if !ok || ot.dt != backend.BF16 || inter%8 != 0 || b.cc < 90 {
		return siluPlan{}, false, nil
	}
	c := bulkPick(2*inter, k, b.sms)
	if !b.bulkFused(c, n, k, xt.ptr, wt.ptr) {
		return siluPlan{}, false, nil
	}
	return siluPlan{out: ot, x: xt, w: wt, c: c, pristine: earlyRead(wt)}, true, nil
}

// siluPlan is a gate/up product with SiLU x mul as planGateUpSiLU took it.
type siluPlan struct {
	out, x, w *tensor
	c         bulkConfig
	pristine  bool
}

// runGateUpSiLU queues p; early lets the next kernel (the down product,
// whose producers then stream its weight as this kernel's blocks leave)
// launch at its start. CUDA thread only.
func (b *Backend) runGateUpSiLU(p *siluPlan, early bool) error {
	n, inter, k := p.x.shape[0], p.out.shape[1], p.w.shape[1]
	return b.bulkCallFlags(p.c, "gemvb_silu_bf16", p.out.ptr, int(dtBF16), p.x.ptr, p.w.ptr, n, inter, k,
		flag(p.pristine)|launchEarlyBit(early))
}
