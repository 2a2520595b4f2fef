package cuda

import "github.com/trigon-llm/trigon/backend"

// Decode attention (sequences with one query row) has two kernels:
//
//   - attn_decode_mma (kernels/attn_decode.cu), on the tensor cores: a
//     block owns (sequence, KV head, split) and up to 16 query heads of
//     the GQA group; each of its NW warps streams 16-token K/V tiles
//     through its own cp.async ring (Tuning.DecodeStages slots). Used
//     wherever a ring of at least two slots fits in a block's shared
//     memory.
//   - attn_decode (kernels/attention.cu), on the CUDA cores: where it
//     does not (head dim 256 on devices with 99 KiB a block).
//
// Both cut a row's context into a split count that depends only on the
// batch shape (never on the actual lengths), so a captured graph stays
// valid as contexts grow; a combine kernel merges the splits.

// decodeNW and decodeTile mirror NW (warps per block) and TT (tokens per
// tile) in kernels/attn_decode.cu.
const decodeNW, decodeTile = 4, 16

// decodePlan is the decode half of one Attention call, fixed on the
// caller's goroutine.
type decodePlan struct {
	mod             modSpec
	decode, combine string // kernel names in mod
	grid            [3]int
	smem            int // dynamic shared memory of the decode kernel, bytes
	nsplit          int
}

// planDecode picks the decode kernel, its grid and split count for s
// sequences of h query and kvh KV heads of d dims, caches of format kv and
// contexts up to maxSeqLen. Quantized caches have the tensor-core kernel
// only: where it cannot run, the plan is an error.
func (b *Backend) planDecode(s, h, kvh, d int, kv backend.KVSpec, maxSeqLen int) (decodePlan, error) {
	g := h / kvh
	stages := b.tune.decodeStages
	if kv.Scales != backend.KVNoScales && stages == 0 {
		stages = defaultDecodeStages
	}
	stages = decodeRingStages(kv, stages)
	if st, ok := decodeMMAStages(b.cc, d, kv, stages); ok {
		chunks := (g + 15) / 16 // blocks per KV head: 16 query heads each
		units := s * kvh * chunks
		n := b.decodeMMASplits(units, maxSeqLen, decodeMMAPerSM(b.cc, d, kv, st))
		return decodePlan{
			mod:    decodeMMAModule(d, kv, st),
			decode: "attn_decode_mma", combine: "attn_decode_combine",
			grid: [3]int{s, kvh * chunks, n}, smem: decodeMMASmem(d, kv, st), nsplit: n,
		}, nil
	}
	if kv.Scales != backend.KVNoScales {
		return decodePlan{}, backend.ShapeError("cuda: attention", "KV", "%v at head dim %d: the tensor-core decode kernel does not fit this GPU's shared memory, and only it reads quantized caches", kv, d)
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
		mod:    decodeCoreModule(d, kv, gc, b.tune.decodeUnroll),
		decode: "attn_decode", combine: "attn_combine",
		grid: [3]int{s, kvh * (g / gc), n}, nsplit: n,
	}, nil
}

// decodeRingStages is the ring depth the tensor-core decode kernel asks
// for over caches of format kv when the tuning asks for stages: an int4
// tile (values and scales) is about a third of a BF16 one, so its ring is
// twice as deep, for about as many bytes in flight per warp; the other
// formats take stages as they are. decodeMMAStages then fits it to the
// device's shared memory.
func decodeRingStages(kv backend.KVSpec, stages int) int {
	if kv.Scales == backend.KVScaleKIVI {
		return 2 * stages
	}
	return stages
}

// decodeMMAModule is attn_decode_mma's module for head dim d over caches
// of format kv with an st-slot ring.
func decodeMMAModule(d int, kv backend.KVSpec, st int) modSpec {
	return modSpec{file: "attn_decode", p: [8]int{d, kv.BlockSize, int(kv.DType), st, kvGroup(kv)}}
}

// decodeCoreModule is the CUDA-core decode module (attention.cu) for head
// dim d over caches of format kv, gc query heads a block and ur warp steps
// whose loads are issued together.
func decodeCoreModule(d int, kv backend.KVSpec, gc, ur int) modSpec {
	return modSpec{file: "attention", p: [8]int{d, kv.BlockSize, int(kv.DType), gc, ur}}
}

// decodeMMASmem is attn_decode_mma's dynamic shared memory for head dim d,
// caches of format kv and st stages, as kernels/attn_decode.cu lays it
// out: the query tile (16 rows of d+8 bf16), then per warp st slots of a
// K and a V tile of 16 such rows; for an fp8 or int8 cache per warp a K
// and a V staging tile of such rows and st slots of the stored K and V
// rows and their scales; for int4 per warp st slots of the K and V codes,
// the block's K scales and zero points [2][d] and the rows' V ones
// [16][d/G][2], and no fewer bytes than the warp's f32 output [16][d]
// that the merge leaves there (int4 tiles are decoded in registers).
func decodeMMASmem(d int, kv backend.KVSpec, st int) int {
	tile := (d + 8) * 2 * decodeTile // bytes of one bf16 K or V tile
	if kv.Scales == backend.KVNoScales {
		return tile * (1 + 2*decodeNW*st)
	}
	if kv.Scales == backend.KVScaleKIVI {
		slot := 2*decodeTile*d/2 + 4*d + decodeTile*(d/kv.GroupSize)*4
		return tile + decodeNW*max(st*slot, decodeTile*d*4)
	}
	slot := 2 * decodeTile * d // 1-byte elements
	if kv.Scales == backend.KVScaleGroups {
		slot += 2 * decodeTile * (d / kv.GroupSize) * 2
	}
	return tile + decodeNW*(2*tile+st*slot)
}

// decodeMMAStaticSmem is attn_decode_mma's static shared memory over
// caches of format kv: the per-warp row maxima and sums of the merge, and
// the tile masks (int4: also each slot's bf16 rows and window block).
func decodeMMAStaticSmem(kv backend.KVSpec, st int) int {
	n := 2*decodeNW*16*4 + decodeNW*st*4
	if kv.Scales == backend.KVScaleKIVI {
		n += 2 * decodeNW * st * 4
	}
	return n
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
// dim d on compute capability cc for the tuning's stages: stages, or
// fewer (down to 2) where the shared memory of a block does not allow it.
// ok is false where the tensor-core kernel cannot run (stages 0, GPUs
// before sm_80, or not even two stages fit).
//
// An int4 ring (decodeRingStages: twice the tuning's depth) is first
// made shallower, down to the tuning's depth, until the blocks per SM
// that the kernel's registers are compiled for (decodeMMAMinBlocks) fit
// in the SM's shared memory: its tiles are small, so resident warps, not
// one warp's depth, keep most bytes in flight and hide the decoding.
func decodeMMAStages(cc, d int, kv backend.KVSpec, stages int) (st int, ok bool) {
	if stages == 0 || cc < 80 {
		return 0, false
	}
	perSM, perBlock := smemLimits(cc)
	if kv.Scales == backend.KVScaleKIVI {
		for st = stages; st > stages/2 && st >= 2; st-- {
			n := decodeMMASmem(d, kv, st) + decodeMMAStaticSmem(kv, st)
			if n <= perBlock && perSM/(n+1<<10) >= decodeMMAMinBlocks(d, kv) {
				return st, true
			}
		}
	}
	for st = stages; st >= 2; st-- {
		if decodeMMASmem(d, kv, st)+decodeMMAStaticSmem(kv, st) <= perBlock {
			return st, true
		}
	}
	return 0, false
}

// decodeMMAMinBlocks mirrors MIN_BLOCKS in kernels/attn_decode.cu: the
// blocks per SM its register budget is compiled for over caches of format
// kv (int4, with no staging tiles, one more at head dims up to 128).
func decodeMMAMinBlocks(d int, kv backend.KVSpec) int {
	if kv.Scales == backend.KVScaleKIVI {
		switch {
		case d <= 64:
			return 4
		case d <= 128:
			return 3
		}
		return 1
	}
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
func decodeMMAPerSM(cc, d int, kv backend.KVSpec, st int) int {
	perSM, _ := smemLimits(cc)
	bySmem := perSM / (decodeMMASmem(d, kv, st) + decodeMMAStaticSmem(kv, st) + 1<<10)
	return max(1, min(bySmem, decodeMMAMinBlocks(d, kv)))
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
	limit := max(1, min(b.tune.decodeMaxSplits, tiles/decodeNW))
	cost := func(n int) float64 { return float64((units*n+slots-1)/slots) / float64(n) }
	best, bestCost := 1, cost(1)
	for n := 2; n <= limit; n++ {
		if c := cost(n); c < 0.97*bestCost {
			best, bestCost = n, c
		}
	}
	return best
}
