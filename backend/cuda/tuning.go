package cuda

import "fmt"

// Tuning holds the values the kernels are tuned by (Options.Tuning). The
// zero value of each field means its default, the value the kernels were
// tuned with on Hopper; New rejects a value outside a field's range.
type Tuning struct {
	// DecodeStages is the depth of the tensor-core decode attention
	// kernel's per-warp cp.async ring, 2 to 4 (default 3): DecodeStages-1
	// K/V tiles are in flight per warp while one is computed. A device
	// whose block shared memory holds fewer takes fewer, down to 2, and
	// one that holds not even 2 runs the CUDA-core decode kernel; -1 runs
	// the CUDA-core kernel everywhere.
	DecodeStages int
	// DecodeMaxSplits caps the number of pieces decode attention cuts a
	// row's context into, 1 to 32 (default 32, what the combine kernels
	// merge).
	DecodeMaxSplits int
	// DecodeWaves is how many blocks per SM the CUDA-core decode kernel's
	// grid aims for, 1 to 16 (default 4); its split count follows.
	DecodeWaves int
	// DecodeUnroll is how many warp steps of K/V loads the CUDA-core
	// decode kernel issues before it uses them: 1, 2, 4 or 8 (default 2).
	DecodeUnroll int
	// GEMVMargin is the fraction, in (0, 0.5), by which the tuner's
	// fastest own GEMV must beat the kept cuBLASLt algorithm (and the bulk
	// GEMV the choice before it) to replace it (default 0.03). The tuner
	// times each product alone with L2 flushed; back to back in a decode
	// step an own GEMV's lead on some shapes shrinks.
	GEMVMargin float64
	// TuneMaxRows is the most rows of a product the tuner times, 1 to
	// 1<<20 (default 64). Larger products (prefill) take cuBLASLt's
	// heuristic's first choice: every prompt chunk length is a new shape,
	// and timing the candidates of one stalls the stream. After
	// EndTuning, so do the smaller ones first seen.
	TuneMaxRows int
	// NormPrefetchBytes is how much of the next product's weight
	// AddRMSNormPrefetch asks L2 for, at most 256 MiB (default 12 MiB);
	// -1 prefetches nothing.
	NormPrefetchBytes int
	// QKVGEMV is the register GEMV variant FusedQKVRoPE runs for steps of
	// at most qkvGEMVMaxRows rows whatever the tuner chose for the plain
	// product (default 8 warps, 2 spans). The tuner's candidates time
	// within a few percent of each other at decode QKV shapes, so its pick
	// would vary from process to process, and the decode step with it.
	QKVGEMV GEMVVariant
	// WQWaves is how many blocks per SM the weight-quantized tensor-core
	// GEMVs (awq_mma, f8_mma) aim for where a product's output features
	// alone give fewer blocks, 1 to 16 (default 4): their k is split into
	// that many more blocks, whose partial sums wq_reduce adds. Each
	// thread keeps one chunk of weights in flight, so the blocks resident
	// on an SM are what keeps its loads outstanding. Products of at most
	// 16 rows run awq_dec / f8_dec instead (WQDecodeKSplit,
	// WQDecodeWaves).
	WQWaves int
	// WQDecodeKSplit is how many of the 8 warps of an awq_dec / f8_dec
	// block (the weight-quantized products of at most 16 rows) split the
	// block's k range: 1, 2, 4 or 8 (default 8 for up to 8 rows, 4 for
	// more); the others take more output features (8 / WQDecodeKSplit
	// tiles of 16 a block), which then share x's reads in L1. Their
	// partial sums are added in shared memory at the block's end. More
	// warps on k give more blocks (more weight loads in flight); more on
	// features read x from L2 fewer times, which counts as rows grow.
	WQDecodeKSplit int
	// WQDecodeWaves is how many blocks per SM the grid of awq_dec / f8_dec
	// aims for where the output features alone give fewer, 1 to 16
	// (default 1): k is then split across blocks too, whose partial sums
	// wq_reduce (f8_epilogue_parts) adds in a second kernel.
	WQDecodeWaves int
}

// GEMVVariant names a variant of the register GEMV (kernels/gemv.cu):
// Warps per block, 1 to 32, which split k between them, and Spans, 1 to
// 16, the 32-wide k spans whose loads each warp issues together. The zero
// value means the field's default.
type GEMVVariant struct{ Warps, Spans int }

// tuning is Tuning with the defaults filled in and in the units the
// backend uses, fixed at New.
type tuning struct {
	decodeStages    int // 0: no tensor-core decode kernel
	decodeMaxSplits int
	decodeWaves     int
	decodeUnroll    int
	gemvMargin      float64
	tuneMaxRows     int
	normPrefetch    int // bytes; 0: none
	qkvGEMV         gemvConfig
	wqWaves         int
	wqDecKSplit     int // 0: by rows (decKSplit)
	wqDecWaves      int
}

// defaultDecodeStages is the tensor-core decode kernel's default ring
// depth (Tuning.DecodeStages); quantized caches, which only that kernel
// reads, use it when the tuning asks for the CUDA-core kernel.
const defaultDecodeStages = 3

// resolve checks t and returns it with the defaults filled in.
func (t Tuning) resolve() (tuning, error) {
	r := tuning{decodeStages: defaultDecodeStages, decodeMaxSplits: 32, decodeWaves: 4, decodeUnroll: 2, gemvMargin: tuneMargin,
		tuneMaxRows: 64, normPrefetch: 12 << 20, qkvGEMV: gemvConfig{nw: 8, ur: 2}, wqWaves: 4,
		wqDecWaves: 1}
	bad := func(field string, v any, want string) (tuning, error) {
		return tuning{}, fmt.Errorf("cuda: Options.Tuning.%s %v: want %s", field, v, want)
	}
	switch t.DecodeStages {
	case 0:
	case -1:
		r.decodeStages = 0
	case 2, 3, 4:
		r.decodeStages = t.DecodeStages
	default:
		return bad("DecodeStages", t.DecodeStages, "2, 3 or 4, -1 for the CUDA-core kernel, or 0 for the default")
	}
	if t.DecodeMaxSplits != 0 {
		if t.DecodeMaxSplits < 1 || t.DecodeMaxSplits > 32 {
			return bad("DecodeMaxSplits", t.DecodeMaxSplits, "1 to 32, or 0 for the default")
		}
		r.decodeMaxSplits = t.DecodeMaxSplits
	}
	if t.DecodeWaves != 0 {
		if t.DecodeWaves < 1 || t.DecodeWaves > 16 {
			return bad("DecodeWaves", t.DecodeWaves, "1 to 16, or 0 for the default")
		}
		r.decodeWaves = t.DecodeWaves
	}
	switch t.DecodeUnroll {
	case 0:
	case 1, 2, 4, 8:
		r.decodeUnroll = t.DecodeUnroll
	default:
		return bad("DecodeUnroll", t.DecodeUnroll, "1, 2, 4 or 8, or 0 for the default")
	}
	if t.GEMVMargin != 0 {
		if !(t.GEMVMargin > 0 && t.GEMVMargin < 0.5) {
			return bad("GEMVMargin", t.GEMVMargin, "a fraction in (0, 0.5), or 0 for the default")
		}
		r.gemvMargin = t.GEMVMargin
	}
	if t.TuneMaxRows != 0 {
		if t.TuneMaxRows < 1 || t.TuneMaxRows > 1<<20 {
			return bad("TuneMaxRows", t.TuneMaxRows, "1 to 1048576, or 0 for the default")
		}
		r.tuneMaxRows = t.TuneMaxRows
	}
	switch {
	case t.NormPrefetchBytes == -1:
		r.normPrefetch = 0
	case t.NormPrefetchBytes < 0 || t.NormPrefetchBytes > 256<<20:
		return bad("NormPrefetchBytes", t.NormPrefetchBytes, "at most 256 MiB, -1 for none, or 0 for the default")
	case t.NormPrefetchBytes > 0:
		r.normPrefetch = t.NormPrefetchBytes
	}
	if v := t.QKVGEMV; v != (GEMVVariant{}) {
		if v.Warps < 1 || v.Warps > 32 || v.Spans < 1 || v.Spans > 16 {
			return bad("QKVGEMV", fmt.Sprintf("%+v", v), "Warps 1 to 32 and Spans 1 to 16, or the zero value for the default")
		}
		r.qkvGEMV = gemvConfig{nw: v.Warps, ur: v.Spans}
	}
	if t.WQWaves != 0 {
		if t.WQWaves < 1 || t.WQWaves > 16 {
			return bad("WQWaves", t.WQWaves, "1 to 16, or 0 for the default")
		}
		r.wqWaves = t.WQWaves
	}
	switch t.WQDecodeKSplit {
	case 0:
	case 1, 2, 4, 8:
		r.wqDecKSplit = t.WQDecodeKSplit
	default:
		return bad("WQDecodeKSplit", t.WQDecodeKSplit, "1, 2, 4 or 8, or 0 for the default")
	}
	if t.WQDecodeWaves != 0 {
		if t.WQDecodeWaves < 1 || t.WQDecodeWaves > 16 {
			return bad("WQDecodeWaves", t.WQDecodeWaves, "1 to 16, or 0 for the default")
		}
		r.wqDecWaves = t.WQDecodeWaves
	}
	return r, nil
}
