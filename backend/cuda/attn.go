package cuda

import (
	"encoding/binary"
	"math"
	"unsafe"

	"github.com/trigon-llm/trigon/backend"
)

// RoPEStoreKV implements backend.Backend in one kernel: per token and
// head, the optional RMS norm, the rotate-half rotation with
// angle = f32(pos) * invFreq[i], the Q store, and the K/V store into the
// paged caches. Positions and slots are checked on the device (Sync
// reports them).
//
//	Q        [numTokens, numHeads*headDim], the dtype of QKV
//	QKV      [numTokens, (numHeads+2*numKVHeads)*headDim] F32, F16 or BF16
//	KCache   [numBlocks, numKVHeads, blockSize, headDim] as a.KV says (VCache alike)
//	InvFreq  [headDim/2] F32
//	QNorm, KNorm [headDim] or nil, one float dtype
func (b *Backend) RoPEStoreKV(a backend.RoPEArgs) error {
	r, err := b.ropeOperands(a)
	if err != nil {
		return err
	}
	return b.post(func() error { return b.ropeStore(r) })
}

// Attention implements backend.Backend.
//
// Sequences with one query row take a split-KV decode kernel (the query
// heads of a GQA group share each K/V load; the split count depends only
// on the batch shape and MaxSeqLen, so a fixed-shape launch can be graph
// captured; see attn_decode.go); sequences with more take the tensor-core
// prefill kernel, which includes earlier cache contents (prefix-cached
// context). Both read the block tables directly. The caches are BF16, or
// FP8/INT8/INT4 (kvformat.go), and headDim one of attnHeadDims.
//
//	Out, Q      [numTokens, numHeads*headDim] BF16
//	KCache      [numBlocks, numKVHeads, blockSize, headDim] as a.KV says (VCache alike; scales in a.KVAux)
//	BlockTables [numSeqs, maxBlocksPerSeq] I32
//	SeqLens     [numSeqs] I32; QueryStart [numSeqs+1] I32
func (b *Backend) Attention(a backend.AttentionArgs) error {
	const op = "attention"
	out, err := b.tensorOf(op, "Out", a.Out)
	if err != nil {
		return err
	}
	q, err := b.tensorOf(op, "Q", a.Q)
	if err != nil {
		return err
	}
	kc, err := b.tensorOf(op, "KCache", a.KCache)
	if err != nil {
		return err
	}
	vc, err := b.tensorOf(op, "VCache", a.VCache)
	if err != nil {
		return err
	}
	bt, err := b.tensorOf(op, "BlockTables", a.BlockTables)
	if err != nil {
		return err
	}
	sl, err := b.tensorOf(op, "SeqLens", a.SeqLens)
	if err != nil {
		return err
	}
	qs, err := b.tensorOf(op, "QueryStart", a.QueryStart)
	if err != nil {
		return err
	}
	side, err := b.kvSides(op, a.KV, a.KVAux)
	if err != nil {
		return err
	}
	ksc, vsc := side.ksc, side.vsc
	checked := a
	checked.Out, checked.Q, checked.KCache, checked.VCache = out, q, kc, vc
	checked.BlockTables, checked.SeqLens, checked.QueryStart = bt, sl, qs
	checked.KVAux = side.checked(a.KVAux)
	dims, err := backend.CheckAttention(checked)
	if err != nil {
		return opErr(err)
	}
	h, kvh, d, s, n := a.NumHeads, a.NumKVHeads, a.HeadDim, a.NumSeqs, dims.NumTokens
	// The kernels' own limits: heads and sequences index grid dimensions,
	// HeadDim is one the kernels are built for, and the grid and the split
	// plan need a positive context bound.
	if h > 65535 || !attnHeadDims[d] {
		return backend.ShapeError("cuda: "+op, "heads", "NumHeads %d, HeadDim %d: want at most 65535 heads and HeadDim 16, 32, 64, 128 or 256", h, d)
	}
	if s > 65535 || a.MaxSeqLen <= 0 || a.MaxSeqLen > maxInt32 || a.SlidingWindow > maxInt32 {
		return backend.ShapeError("cuda: "+op, "args", "NumSeqs %d, MaxSeqLen %d, SlidingWindow %d: want at most 65535 sequences and 0 < MaxSeqLen <= 2^31-1", s, a.MaxSeqLen, a.SlidingWindow)
	}
	// The kernels read BF16 (or FP8/INT8/INT4) caches and BF16 Q and write BF16 Out.
	if a.KV.DType != backend.BF16 && a.KV.Scales == backend.KVNoScales {
		return backend.ShapeError("cuda: "+op, "KV", "%v: the attention kernels read BF16, FP8, INT8 or INT4 caches only", a.KV)
	}
	for _, c := range []struct {
		name string
		t    *tensor
	}{{"Q", q}, {"Out", out}} {
		if err := opErr(backend.CheckDType(op, c.name, c.t, backend.BF16)); err != nil {
			return err
		}
	}
	if overlaps(out, q) && out.ptr != q.ptr {
		return backend.ShapeError("cuda: "+op, "Out", "partially overlaps Q")
	}
	if n > maxInt32 {
		return backend.ShapeError("cuda: "+op, "Q", "%d rows exceed int32", n)
	}
	numBlocks, maxBlocks := dims.NumBlocks, dims.MaxBlocksPerSeq
	// The modules are specialised on the KV format (kernels/kv.cuh): the
	// spec, which CheckAttention matched against the pools, names it.
	dp, err := b.planDecode(s, h, kvh, d, a.KV, a.MaxSeqLen)
	if err != nil {
		return err
	}
	scale := f32bits(a.Scale * math.Log2E)
	// A sequence has at most min(MaxSeqLen, n) query rows. When there are
	// no more rows than sequences, almost surely every one is a decode row:
	// the prefill kernel then runs one block per sequence, which loops over
	// the tiles itself if some sequence does have several rows.
	maxQ := min(a.MaxSeqLen, n)
	if a.MaxQueryLen > 0 {
		maxQ = min(maxQ, a.MaxQueryLen)
	}
	// Prefill grid (heads, sequences, row tiles): the row tile, counted
	// from each sequence's end, is outermost so the longest causal tiles
	// are dispatched first; a sequence with more tiles than the grid has
	// loops over the rest in the kernel.
	pc := prefillTiling(d)
	preMod, preFn, preSmem, preThreads := pc.spec(d, a.KV), "attn_prefill", pc.smem(d), pc.warps*32
	if wg, ok := b.prefillWGSpec(d, a.KV); ok {
		pc = prefillConfig{rows: prefillWGRows}
		preMod, preFn, preSmem, preThreads = wg, "attn_prefill_wg", prefillWGSmem(d), prefillWGThreads
	}
	preGrid := [3]int{h, s, min((maxQ+pc.rows-1)/pc.rows, maxGridYZ)}
	if n <= s {
		preGrid = [3]int{1, s, 1}
	}
	// A decode-only batch (MaxQueryLen 1) needs no prefill kernel.
	decodeOnly := 0
	if a.MaxQueryLen == 1 {
		decodeOnly = 1
	}
	// The decode kernel reads every cached position but the step's own
	// (the newest, or StepKeys of them) before its predecessor finishes.
	stepKeys := max(1, a.StepKeys)
	if stepKeys > maxInt32 {
		return backend.ShapeError("cuda: "+op, "StepKeys", "%d exceeds int32", a.StepKeys)
	}
	return b.post(func() error {
		// Both decode kernels take the same arguments, as do both combines.
		dec, err := b.fnSmem(fnKey{dp.mod, dp.decode}, dp.smem)
		if err != nil {
			return err
		}
		var part uint64 // [s, h, nsplit, d+2] F32 partials
		if dp.nsplit > 1 {
			if part, err = b.tmpGet(s * h * dp.nsplit * (d + 2) * 4); err != nil {
				return err
			}
			defer b.tmpPut(part)
		}
		decArgs := []uint64{out.ptr, part, q.ptr, kc.ptr, vc.ptr, ptrOf(ksc), ptrOf(vsc),
			bt.ptr, i32(maxBlocks), sl.ptr, qs.ptr, i32(h), i32(kvh), i32(h / kvh), i32(dp.nsplit), scale,
			i32(a.SlidingWindow), i32(numBlocks), i32(n), i32(a.MaxSeqLen), i32(decodeOnly), i32(stepKeys), b.errDev}
		decArgs = append(decArgs, side.winArgs()...) // int4: the window pools, map and window
		if err := b.launch(dec, dp.grid, 128, dp.smem, decArgs...); err != nil {
			return err
		}
		if dp.nsplit > 1 {
			comb, err := b.fn(fnKey{dp.mod, dp.combine})
			if err != nil {
				return err
			}
			if err := b.launch(comb, [3]int{s, h, 1}, d, 0, out.ptr, part, sl.ptr, qs.ptr, i32(h), i32(dp.nsplit), i32(n), i32(a.MaxSeqLen)); err != nil {
				return err
			}
		}
		if decodeOnly == 1 {
			return nil
		}
		pre, err := b.fnSmem(fnKey{preMod, preFn}, preSmem)
		if err != nil {
			return err
		}
		preArgs := append([]uint64{out.ptr, q.ptr, kc.ptr, vc.ptr, ptrOf(ksc), ptrOf(vsc), bt.ptr, i32(maxBlocks),
			sl.ptr, qs.ptr, i32(h), i32(kvh), scale, i32(a.SlidingWindow), i32(numBlocks), i32(n), i32(a.MaxSeqLen), b.errDev}, side.winArgs()...)
		return b.launch(pre, preGrid, preThreads, preSmem, preArgs...)
	})
}

// decodeSplits picks how many pieces each decode row's context is cut
// into for the CUDA-core kernel: enough blocks for the tuning's
// decodeWaves waves over the SMs, but no piece shorter than 64 tokens and
// at most decodeMaxSplits pieces (attn_combine's MAX_SPLITS is 32). It
// depends only on the batch shape, so a captured graph can be replayed for
// any context length up to maxSeqLen.
func (b *Backend) decodeSplits(seqs, blocksPerSeq, maxSeqLen int) int {
	base := seqs * blocksPerSeq
	want := (b.tune.decodeWaves*b.sms + base - 1) / base
	byLen := (maxSeqLen + 63) / 64
	return max(1, min(want, byLen, b.tune.decodeMaxSplits))
}

// Sample implements backend.Backend on the GPU: one 1024-thread block per
// row picks the token, or when every row is greedy argmax_rows's blocks
// split each row (see kernels/sample.cu); only the chosen ids come back to
// the host.
//
//	Logits [n, vocab] F32
func (b *Backend) Sample(a backend.SampleArgs) ([]int32, error) {
	lt, params, err := b.sampleOperands("sample", a)
	if err != nil {
		return nil, err
	}
	n := lt.shape[0]
	ids := make([]int32, n)
	err = b.callSpin(func() error {
		obuf, err := b.pool.get(n * 4)
		if err != nil {
			return err
		}
		defer b.pool.put(obuf)
		if err := b.sampleLaunch(lt, params, obuf); err != nil {
			return err
		}
		if err := b.copyOut(unsafe.Slice((*byte)(unsafe.Pointer(&ids[0])), n*4), obuf); err != nil {
			return err
		}
		// The copy waited for the stream: a row of NaN, +Inf or only -Inf
		// logits (or an earlier op's bad index) shows now.
		return b.deviceCheck()
	})
	if err != nil {
		return nil, err
	}
	return ids, nil
}

// sampleOperands checks Sample's operands and encodes the rows' rules as
// sample_rows reads them (5 words a row).
func (b *Backend) sampleOperands(op string, a backend.SampleArgs) (*tensor, []byte, error) {
	lt, err := b.tensorOf(op, "Logits", a.Logits)
	if err != nil {
		return nil, nil, err
	}
	checked := a
	checked.Logits = lt
	d, err := backend.CheckSample(checked)
	if err != nil {
		return nil, nil, opErr(err)
	}
	n, vocab := d.N, d.Vocab
	if vocab > maxInt32 || n > maxInt32 {
		return nil, nil, backend.ShapeError("cuda: "+op, "Logits", "%v exceeds int32", lt.shape)
	}
	params := make([]byte, n*5*4)
	for i, r := range a.Rows {
		// The CPU reference's checks: only the temperature matters for a
		// greedy row.
		bad := math.IsNaN(float64(r.Temperature)) || math.IsInf(float64(r.Temperature), 0)
		if !bad && r.Temperature > 0 {
			bad = r.TopK < 0 || math.IsNaN(float64(r.TopP)) || !(r.MinP >= 0) || !(r.U >= 0 && r.U < 1)
		}
		if bad {
			return nil, nil, backend.ShapeError("cuda: "+op, "Rows", "row %d: invalid rule %+v", i, r)
		}
		topk := min(r.TopK, maxInt32)
		w := params[i*20:]
		binary.LittleEndian.PutUint32(w[0:], math.Float32bits(r.Temperature))
		binary.LittleEndian.PutUint32(w[4:], uint32(int32(topk)))
		binary.LittleEndian.PutUint32(w[8:], math.Float32bits(r.TopP))
		binary.LittleEndian.PutUint32(w[12:], math.Float32bits(r.MinP))
		binary.LittleEndian.PutUint32(w[16:], math.Float32bits(r.U))
	}
	return lt, params, nil
}

// sampleLaunch queues the picks of lt's rows under the encoded rules,
// the ids going to out (n int32 on the device): argmax_rows when every row
// is greedy, else sample_rows. CUDA thread only.
func (b *Backend) sampleLaunch(lt *tensor, params []byte, out uint64) error {
	n, vocab := lt.shape[0], lt.shape[1]
	if greedyRows(params) {
		return b.argmaxLaunch(lt.ptr, n, vocab, out)
	}
	f, err := b.fn(fnKey{modSpec{file: "sample"}, "sample_rows"})
	if err != nil {
		return err
	}
	// The rules' buffer goes back to the pool at once: the pool's memory
	// is reused only by later ops, which the stream runs after this one.
	pbuf, err := b.pool.get(len(params))
	if err != nil {
		return err
	}
	defer b.pool.put(pbuf)
	if err := b.copyIn(pbuf, params); err != nil {
		return err
	}
	return b.launch(f, [3]int{n, 1, 1}, 1024, 0, lt.ptr, i32(vocab), pbuf, out, b.errDev)
}

// greedyRows reports whether every row's encoded rule (sampleOperands)
// picks the top token: sample_rows's test, temperature <= 0 or min-p
// above 1.
func greedyRows(params []byte) bool {
	for w := params; len(w) >= 20; w = w[20:] {
		temp := math.Float32frombits(binary.LittleEndian.Uint32(w[0:]))
		minp := math.Float32frombits(binary.LittleEndian.Uint32(w[12:]))
		if temp > 0 && !(minp > 1) {
			return false
		}
	}
	return true
}

// argmaxChunk is the logits one argmax_rows block reads: 16 a thread,
// so a 128k vocabulary takes 32 blocks a row.
const argmaxChunk = 4096

// argmaxLaunch queues argmax_rows over n rows of vocab logits at lg.
// CUDA thread only.
func (b *Backend) argmaxLaunch(lg uint64, n, vocab int, out uint64) error {
	f, err := b.fn(fnKey{modSpec{file: "sample"}, "argmax_rows"})
	if err != nil {
		return err
	}
	if n > b.argmaxRows {
		rows := max(n, 256)
		cnt, err := b.pool.get(rows * 4)
		if err != nil {
			return err
		}
		if err := b.d.check("cuMemsetD32Async", b.d.call(b.d.cuMemsetD32Async, uintptr(cnt), 0, uintptr(rows), b.stream)); err != nil {
			b.pool.put(cnt)
			return err
		}
		if b.argmaxCount != 0 {
			b.pool.put(b.argmaxCount)
		}
		b.argmaxCount, b.argmaxRows = cnt, rows
	}
	s := (vocab + argmaxChunk - 1) / argmaxChunk
	part, err := b.pool.get(n * s * 8)
	if err != nil {
		return err
	}
	defer b.pool.put(part) // reused only by ops the stream runs later
	return b.launch(f, [3]int{s, n, 1}, 256, 0, lg, i32(vocab), i32(argmaxChunk), part, b.argmaxCount, out, b.errDev)
}

// attnHeadDims are the head dims the attention kernels take: the
// tensor-core kernels tile HD in 16-wide mma steps, the CUDA-core decode
// kernel gives each token HD/8 lanes (a power of two dividing the warp).
var attnHeadDims = map[int]bool{16: true, 32: true, 64: true, 128: true, 256: true}

// prefillConfig is the tiling of one attn_prefill module: the kernel's BM
// (rows), BN (keys), NW (warps) and QR (qInRegs) constants. The kernel's
// shared-memory layout follows from them (smem).
type prefillConfig struct {
	rows, keys, warps int
	qInRegs           bool
}

// prefillTiling picks the prefill tiles for head dim d. Up to 128 dims a
// block takes 128 query rows (8 warps of 16) against 64-key tiles with Q
// held in registers: per lane 64 f32 accumulators, 32 scores and 32 Q
// words at d=128, which leaves room below 255 registers. At exactly 128
// dims the key tiles are 128 long (64 scores a lane; 139 KB of shared
// memory, one block per SM): half the barriers and pipeline turns per key.
// At 256 dims the
// accumulators alone are 128 registers, so Q is re-read from shared
// memory each tile and the tiles shrink to 64 rows by 32 keys (101 KB of
// shared memory: two blocks per SM).
func prefillTiling(d int) prefillConfig {
	if d > 128 {
		return prefillConfig{rows: 64, keys: 32, warps: 4, qInRegs: false}
	}
	if d == 128 {
		return prefillConfig{rows: 128, keys: 128, warps: 8, qInRegs: true}
	}
	return prefillConfig{rows: 128, keys: 64, warps: 8, qInRegs: true}
}

// spec is the module of the tiling for head dim d over caches of format
// kv (its block size and dtype).
func (c prefillConfig) spec(d int, kv backend.KVSpec) modSpec {
	qr := 0
	if c.qInRegs {
		qr = 1
	}
	return modSpec{file: "attn_prefill", p: [8]int{d, kv.BlockSize, int(kv.DType), c.rows, c.keys, c.warps, qr, kvGroup(kv)}}
}

// smem is the dynamic shared memory of the tiling for head dim d, as
// kernels/attn_prefill.cu lays it out: two pipeline stages of a K and a V
// tile with rows padded to d+8 elements, and the Q tile, which shares
// stage 1 when it is moved into registers before that stage is first
// filled and fits in it.
func (c prefillConfig) smem(d int) int {
	row := (d + 8) * 2
	stage := 2 * c.keys * row
	q := c.rows * row
	if c.qInRegs && c.rows <= 2*c.keys {
		return 2 * stage
	}
	return 2*stage + q
}

// The wgmma prefill kernel's fixed tiling: 128 query rows (two
// warpgroups of 64) against 128-key tiles, 256 threads.
const (
	prefillWGRows    = 128
	prefillWGKeys    = 128
	prefillWGThreads = 256
)

// prefillWGSpec is the wgmma prefill module for head dim d over caches of
// format kv, where the target allows it: wgmma needs sm_90a SASS, and the
// kernel takes head dims 64 and 128 over BF16 caches. Elsewhere prefill
// runs attn_prefill's mma.sync kernel.
func (b *Backend) prefillWGSpec(d int, kv backend.KVSpec) (modSpec, bool) {
	if b.comp == nil || b.comp.arch != "sm_90a" || (d != 64 && d != 128) || kv.Scales != backend.KVNoScales {
		return modSpec{}, false
	}
	return prefillWGModule(d, kv), true
}

// prefillWGModule is the wgmma prefill module for head dim d over caches
// of format kv, whatever the target (the warm list compiles it for every
// one: below sm_90a its kernel traps).
func prefillWGModule(d int, kv backend.KVSpec) modSpec {
	return modSpec{file: "attn_prefill_wg", p: [8]int{d, kv.BlockSize, int(kv.DType)}}
}

// prefillWGSmem is the wgmma kernel's dynamic shared memory at head dim
// d: the Q tile and two stages of a K and a V tile, plus 1024 bytes to
// align the base to the 128-byte swizzle's 1024-byte atoms.
func prefillWGSmem(d int) int {
	return (prefillWGRows+4*prefillWGKeys)*d*2 + 1024
}

// maxGridYZ is CUDA's limit on a grid's y and z dimensions.
const maxGridYZ = 65535
