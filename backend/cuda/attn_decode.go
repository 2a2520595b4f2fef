package cuda

import (
	"fmt"
	"os"
	"strconv"
	"unsafe"
)

// Decode attention (sequences with one query row) has two kernels:
//
//   - attn_decode_mma (kernels/attn_decode.cu), on the tensor cores: a
//     block owns (sequence, KV head, split) and up to 16 query heads of
//     the GQA group; each of its NW warps streams 16-token K/V tiles
//     through its own cp.async ring of decodeStages slots. Used on sm_80
//     and newer when the ring fits in shared memory.
//   - attn_decode (kernels/attention.cu), on the CUDA cores: the fallback
//     for older GPUs, and the reference the benchmark compares against.
//
// Both cut a row's context into a split count that depends only on the
// batch shape (never on the actual lengths), so a captured graph stays
// valid as contexts grow. Each split writes an (o, m, l) partial. The
// CUDA-core kernel's partials are merged by a second kernel (attn_combine);
// attn_decode_mma's by default by the last of its own blocks to finish
// each (sequence, head chunk): every block counts its arrival in a device
// counter (splitCounters), and the one that brings the count to nsplit
// merges the partials and zeroes the counter for the next launch. That
// saves a kernel per layer and step: its launch, its graph node gap and
// its memory latency. The separate attn_decode_combine remains,
// selectable with decodeFusedCombine (decodeCombineEnv), and is the
// fallback while a graph is captured with too few counters (they cannot
// be allocated then).

// decodeNW and decodeTile mirror NW (warps per block) and TT (tokens per
// tile) in kernels/attn_decode.cu.
const decodeNW, decodeTile = 4, 16

// decodeStages is the depth of attn_decode_mma's per-warp cp.async ring
// (decodeStages-1 tiles in flight per warp while one is computed); 0
// selects the CUDA-core kernel. A variable so tests and the benchmark can
// compare; decodeStagesEnv overrides it.
var decodeStages = 3

// decodeStagesEnv names an override of decodeStages read once by New: 0
// (the CUDA-core kernel), 2, 3 or 4.
const decodeStagesEnv = "TRIGON_CUDA_DECODE_STAGES"

// decodeMaxSplits caps the split count of both decode kernels; at most 32,
// the combine kernels' MAX_SPLITS. A variable so tests can force one split
// (the kernels then write the output directly) or an odd count.
var decodeMaxSplits = 32

// decodeFusedCombine selects how attn_decode_mma's split partials are
// merged: true, by its own last block per (sequence, head chunk) (one
// kernel); false, by attn_decode_combine (two). A variable so tests cover
// both and the benchmark can compare; decodeCombineEnv overrides it.
var decodeFusedCombine = true

// decodeCombineEnv names an override of decodeFusedCombine read once by
// New: "fused" or "kernel".
const decodeCombineEnv = "TRIGON_CUDA_DECODE_COMBINE"

// decodeForceSplits, when positive, replaces the split count the
// tensor-core kernel's plan computes (at most decodeMaxSplits still): for
// tests, which need several splits on short contexts, some of them empty.
var decodeForceSplits = 0

// parseDecodeStages reads decodeStagesEnv's value.
func parseDecodeStages(v string) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil || (n != 0 && (n < 2 || n > 4)) {
		return 0, fmt.Errorf("cuda: %s=%q: want 0 (CUDA-core kernel), 2, 3 or 4", decodeStagesEnv, v)
	}
	return n, nil
}

// applyDecodeStages applies decodeStagesEnv; applyDecodeTuning calls it once.
func applyDecodeStages() error {
	v := os.Getenv(decodeStagesEnv)
	if v == "" {
		return nil
	}
	n, err := parseDecodeStages(v)
	if err == nil {
		decodeStages = n
	}
	return err
}

// parseDecodeCombine reads decodeCombineEnv's value.
func parseDecodeCombine(v string) (fused bool, err error) {
	switch v {
	case "fused":
		return true, nil
	case "kernel":
		return false, nil
	}
	return false, fmt.Errorf("cuda: %s=%q: want fused or kernel", decodeCombineEnv, v)
}

// applyDecodeCombine applies decodeCombineEnv; applyDecodeTuning calls it
// once.
func applyDecodeCombine() error {
	v := os.Getenv(decodeCombineEnv)
	if v == "" {
		return nil
	}
	fused, err := parseDecodeCombine(v)
	if err == nil {
		decodeFusedCombine = fused
	}
	return err
}

// decodePlan is the decode half of one Attention call, fixed on the
// caller's goroutine. With nsplit > 1 the partials are merged by the
// combine kernel or, when fused, by the decode kernel itself, which then
// needs one arrival counter per sequence and grid row; the CUDA thread
// still falls back to the combine kernel where it cannot have them (see
// Backend.decodeCounters).
type decodePlan struct {
	mod             modSpec
	decode, combine string // kernel names in mod
	grid            [3]int
	smem            int // dynamic shared memory of the decode kernel, bytes
	nsplit          int
	fused           bool // attn_decode_mma merges its own splits
	counters        int  // arrival counters the fused merge needs: grid[0] * grid[1]
}

// planDecode picks the decode kernel, its grid and split count for s
// sequences of h query and kvh KV heads of d dims, cache blocks of
// blockSize tokens and contexts up to maxSeqLen.
func (b *Backend) planDecode(s, h, kvh, d, blockSize, maxSeqLen int) decodePlan {
	g := h / kvh
	if st, ok := decodeMMAStages(b.cc, d); ok {
		chunks := (g + 15) / 16 // blocks per KV head: 16 query heads each
		units := s * kvh * chunks
		n := b.decodeMMASplits(units, maxSeqLen, decodeMMAPerSM(b.cc, d, st))
		if decodeForceSplits > 0 {
			n = min(decodeForceSplits, decodeMaxSplits)
		}
		p := decodePlan{
			mod:    modSpec{file: "attn_decode", p: [6]int{d, blockSize, st}},
			decode: "attn_decode_mma", combine: "attn_decode_combine",
			grid: [3]int{s, kvh * chunks, n}, smem: decodeMMASmem(d, st), nsplit: n,
		}
		if decodeFusedCombine && n > 1 && units <= maxSplitCounters {
			p.fused, p.counters = true, units
		}
		return p
	}
	// The CUDA-core kernel: a block takes gc query heads, the largest of
	// 8, 4, 2 dividing the group.
	gc := 1
	for _, c := range []int{8, 4, 2} {
		if g%c == 0 {
			gc = c
			break
		}
	}
	n := b.decodeSplits(s, kvh*(g/gc), maxSeqLen)
	return decodePlan{
		mod:    modSpec{file: "attention", p: [6]int{d, blockSize, gc, decodeUnroll}},
		decode: "attn_decode", combine: "attn_combine",
		grid: [3]int{s, kvh * (g / gc), n}, nsplit: n,
	}
}

// decodeMMASmem is attn_decode_mma's dynamic shared memory for head dim d
// and st stages, as kernels/attn_decode.cu lays it out: the query tile and
// per warp st slots of a K and a V tile, 16 rows of d+8 bf16 each.
func decodeMMASmem(d, st int) int {
	return (d + 8) * 2 * decodeTile * (1 + 2*decodeNW*st)
}

// decodeMMAStaticSmem is attn_decode_mma's static shared memory: the
// per-warp row maxima and sums of the merge, the tile masks and the
// fused combine's last-block flag.
func decodeMMAStaticSmem(st int) int {
	return 2*decodeNW*16*4 + decodeNW*st*4 + 4
}

// smemLimits returns the shared memory of one SM and the most one block
// may opt in to, by compute capability (the CUDA programming guide's
// table); other architectures get the smallest of sm_80 and newer.
func smemLimits(cc int) (perSM, perBlock int) {
	switch cc {
	case 80, 87:
		return 164 << 10, 163 << 10
	case 90, 100, 103:
		return 228 << 10, 227 << 10
	}
	return 100 << 10, 99 << 10
}

// decodeMMAStages returns the ring depth attn_decode_mma runs with at head
// dim d on compute capability cc: decodeStages, or fewer (down to 2) where
// the shared memory of a block does not allow it. ok is false where the
// tensor-core kernel cannot run (decodeStages 0, GPUs before sm_80, or
// not even two stages fit).
func decodeMMAStages(cc, d int) (st int, ok bool) {
	if decodeStages == 0 || cc < 80 {
		return 0, false
	}
	_, perBlock := smemLimits(cc)
	for st = decodeStages; st >= 2; st-- {
		if decodeMMASmem(d, st)+decodeMMAStaticSmem(st) <= perBlock {
			return st, true
		}
	}
	return 0, false
}

// decodeMMAMinBlocks mirrors MIN_BLOCKS in kernels/attn_decode.cu: the
// blocks per SM its register budget is compiled for.
func decodeMMAMinBlocks(d int) int {
	switch {
	case d <= 64:
		return 3
	case d <= 128:
		return 2
	}
	return 1
}

// decodeMMAPerSM is how many attn_decode_mma blocks fit on one SM: as
// many as the shared memory holds (1 KB of it is reserved per block), but
// no more than the register budget is known to allow.
func decodeMMAPerSM(cc, d, st int) int {
	perSM, _ := smemLimits(cc)
	bySmem := perSM / (decodeMMASmem(d, st) + decodeMMAStaticSmem(st) + 1<<10)
	return max(1, min(bySmem, decodeMMAMinBlocks(d)))
}

// decodeMMASplits picks how many pieces each decode row's context is cut
// into, for units blocks per split (sequences x KV heads x head chunks)
// and perSM resident blocks per SM. Blocks of one launch have equal work,
// so the cost of n splits is the number of waves of resident blocks they
// take over n (in units of an unsplit block's time); the cheapest n wins
// but only if at least 3% cheaper than a smaller one, since every split
// costs a partial write and the combine. No piece is shorter than a tile
// per warp (64 tokens), nor are there more than decodeMaxSplits. It
// depends only on the batch shape, so a captured graph can be replayed for
// any context length up to maxSeqLen.
func (b *Backend) decodeMMASplits(units, maxSeqLen, perSM int) int {
	slots := max(1, perSM*b.sms)
	tiles := (maxSeqLen + decodeTile - 1) / decodeTile
	limit := max(1, min(decodeMaxSplits, tiles/decodeNW))
	cost := func(n int) float64 { return float64((units*n+slots-1)/slots) / float64(n) }
	best, bestCost := 1, cost(1)
	for n := 2; n <= limit; n++ {
		if c := cost(n); c < 0.97*bestCost {
			best, bestCost = n, c
		}
	}
	return best
}

// maxSplitCounters caps the arrival counters of one fused launch (16 MiB
// of int32): more sequences x grid rows than that (far beyond a real
// batch) take the combine kernel, and the kernel's int index stays far
// from overflow.
const maxSplitCounters = 1 << 22

// minSplitCounters is the smallest counter array allocated: enough for
// 128 sequences of 8 KV heads, so a typical server grows it at most a few
// times.
const minSplitCounters = 1 << 10

// splitCounters are attn_decode_mma's arrival counters for the fused
// combine: device int32s, zero between launches (the last block of each
// (sequence, head chunk) zeroes its own). They are the Backend's, not a
// temporary: the zeros must persist from launch to launch and into every
// graph replay. An array is zeroed once when allocated and grows only on
// an eager call; a replaced array is kept until teardown, since a graph
// captured earlier still names it. CUDA thread only.
type splitCounters struct {
	cur     counterArray   // the array launches get now
	retired []counterArray // earlier ones, which graphs may still use
}

// counterArray is one device array of arrival counters.
type counterArray struct {
	ptr uint64 // [n] int32
	n   int
}

// nextCounterLen is the length of the array to allocate for need counters
// when the current one has have: 0 if it is long enough, else need
// rounded up to a doubling of have (at least minSplitCounters).
func nextCounterLen(have, need int) int {
	if need <= have {
		return 0
	}
	n := max(have, minSplitCounters)
	for n < need {
		n *= 2
	}
	return n
}

// decodeCounters returns the device address of at least need zeroed
// arrival counters, growing the array if needed, or 0 when it is too
// short and a graph is being captured (a capture cannot allocate): the
// caller then merges with the combine kernel. CUDA thread only.
func (b *Backend) decodeCounters(need int) (uint64, error) {
	c := &b.decodeCnt
	n := nextCounterLen(c.cur.n, need)
	if n == 0 {
		return c.cur.ptr, nil
	}
	if b.capturing {
		return 0, nil
	}
	d := b.d
	var ptr uint64
	res := d.call(d.cuMemAlloc, uintptr(unsafe.Pointer(&ptr)), uintptr(n*4))
	if res == cudaErrorOutOfMemory && b.pool.cached > 0 {
		b.pool.trim() // as pool.get does: cached blocks first
		res = d.call(d.cuMemAlloc, uintptr(unsafe.Pointer(&ptr)), uintptr(n*4))
	}
	if err := d.check("cuMemAlloc", res); err != nil {
		return 0, fmt.Errorf("decode split counters (%d): %w", n, err)
	}
	// Stream-ordered: the zeros land before the launch that uses them.
	if err := d.check("cuMemsetD32Async", d.call(d.cuMemsetD32Async, uintptr(ptr), 0, uintptr(n), b.stream)); err != nil {
		d.call(d.cuMemFree, uintptr(ptr))
		return 0, fmt.Errorf("decode split counters (%d): %w", n, err)
	}
	if c.cur.ptr != 0 {
		c.retired = append(c.retired, c.cur)
	}
	c.cur = counterArray{ptr: ptr, n: n}
	return ptr, nil
}

// free releases every counter array (teardown, after the stream is idle).
func (c *splitCounters) free(d *driver) {
	for _, a := range append(c.retired, c.cur) {
		if a.ptr != 0 {
			d.call(d.cuMemFree, uintptr(a.ptr))
		}
	}
	*c = splitCounters{}
}
