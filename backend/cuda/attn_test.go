package cuda

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/trigon-llm/trigon/backend"
)

func invFreq(d int) []float32 {
	v := make([]float32, d/2)
	for i := range v {
		v[i] = float32(math.Pow(10000, -2*float64(i)/float64(d)))
	}
	return v
}

func TestRoPEStoreKV(t *testing.T) {
	sharedBackend(t, true)
	const blockSize, numBlocks = 16, 48
	for _, tc := range []struct {
		h, kv, d, tokens int
		norm             bool
	}{
		{8, 8, 64, 1, false},
		{32, 8, 128, 37, false},
		{16, 2, 128, 5, true},
		{12, 4, 64, 130, true},
		{8, 4, 32, 77, false},
		{4, 2, 16, 9, true},
	} {
		t.Run(fmt.Sprintf("h%d_kv%d_d%d_t%d_norm%v", tc.h, tc.kv, tc.d, tc.tokens, tc.norm), func(t *testing.T) {
			p := newPair(t)
			n, w := tc.tokens, (tc.h+2*tc.kv)*tc.d
			cqkv, gqkv := p.act(backend.BF16, []int{n, w}, p.normal(n*w, 1))
			pos := make([]int32, n)
			slots := make([]int32, n)
			perm := p.r.Perm(numBlocks * blockSize)
			written := map[int]bool{}
			for i := range pos {
				pos[i] = int32(p.r.IntN(8000))
				slots[i] = int32(perm[i])
				if i%7 == 3 {
					slots[i] = -1 // padding token: no cache write
				} else {
					written[perm[i]] = true
				}
			}
			cpos, gpos := p.same(backend.I32, []int{n}, i32Bytes(pos))
			cslot, gslot := p.same(backend.I32, []int{n}, i32Bytes(slots))
			cshape := []int{numBlocks, tc.kv, blockSize, tc.d}
			kInit := encode(backend.BF16, p.normal(numBlocks*tc.kv*blockSize*tc.d, 1))
			vInit := encode(backend.BF16, p.normal(numBlocks*tc.kv*blockSize*tc.d, 1))
			ck, gk := p.same(backend.BF16, cshape, append([]byte(nil), kInit...))
			cv, gv := p.same(backend.BF16, cshape, append([]byte(nil), vInit...))
			cf, gf := p.same(backend.F32, []int{tc.d / 2}, encode(backend.F32, invFreq(tc.d)))
			var cqn, gqn, ckn, gkn backend.Tensor
			if tc.norm {
				qn, kn := p.normal(tc.d, 0.2), p.normal(tc.d, 0.2)
				for i := range qn {
					qn[i] += 1
					kn[i] += 1
				}
				cqn, gqn = p.same(backend.BF16, []int{tc.d}, encode(backend.BF16, qn))
				ckn, gkn = p.same(backend.BF16, []int{tc.d}, encode(backend.BF16, kn))
			}
			cq, gq := p.cpuOut(n, tc.h*tc.d), p.poisoned(backend.BF16, n, tc.h*tc.d)
			args := func(q, qkv, pos, slot, k, v, f, qn, kn backend.Tensor) backend.RoPEArgs {
				return backend.RoPEArgs{Q: q, QKV: qkv, Positions: pos, SlotMapping: slot, KCache: k, VCache: v, KV: kvOf(k), InvFreq: f,
					QNorm: qn, KNorm: kn, NormEps: 1e-6, NumHeads: tc.h, NumKVHeads: tc.kv, HeadDim: tc.d}
			}
			p.must("cpu", p.c.RoPEStoreKV(args(cq, cqkv, cpos, cslot, ck, cv, cf, cqn, ckn)))
			p.must("gpu", p.g.RoPEStoreKV(args(gq, gqkv, gpos, gslot, gk, gv, gf, gqn, gkn)))
			p.must("sync", p.g.Sync())
			p.expectClose("q", read(t, p.g, gq), read(t, p.c, cq), bf16Tol)
			for _, c := range []struct {
				name   string
				ct, gt backend.Tensor
				init   []byte
			}{{"k cache", ck, gk, kInit}, {"v cache", cv, gv, vInit}} {
				gb, cb := readBytes(t, p.g, c.gt), readBytes(t, p.c, c.ct)
				// Written slots match the CPU; every other byte is untouched.
				var gw, cw []float32
				row := tc.d * 2
				for blk := 0; blk < numBlocks; blk++ {
					for h := 0; h < tc.kv; h++ {
						for off := 0; off < blockSize; off++ {
							i := ((blk*tc.kv+h)*blockSize + off) * row
							if written[blk*blockSize+off] {
								gw = append(gw, decode(backend.BF16, gb[i:i+row])...)
								cw = append(cw, decode(backend.BF16, cb[i:i+row])...)
							} else if !bytes.Equal(gb[i:i+row], c.init[i:i+row]) {
								t.Fatalf("%s: block %d head %d offset %d changed but no token maps there", c.name, blk, h, off)
							}
						}
					}
				}
				p.expectClose(c.name, gw, cw, bf16Tol)
			}
		})
	}
	t.Run("slot out of range", func(t *testing.T) {
		p := newPair(t)
		_, qkv := p.act(backend.BF16, []int{1, 3 * 64}, p.normal(3*64, 1))
		_, pos := p.same(backend.I32, []int{1}, i32Bytes([]int32{3}))
		_, slot := p.same(backend.I32, []int{1}, i32Bytes([]int32{numBlocks * blockSize}))
		k := p.poisoned(backend.BF16, numBlocks, 1, blockSize, 64)
		v := p.poisoned(backend.BF16, numBlocks, 1, blockSize, 64)
		_, f := p.same(backend.F32, []int{32}, encode(backend.F32, invFreq(64)))
		q := p.poisoned(backend.BF16, 1, 64)
		p.must("call", p.g.RoPEStoreKV(backend.RoPEArgs{Q: q, QKV: qkv, Positions: pos, SlotMapping: slot, KCache: k, VCache: v, KV: kvOf(k),
			InvFreq: f, NumHeads: 1, NumKVHeads: 1, HeadDim: 64}))
		if err := p.g.Sync(); !errors.Is(err, backend.ErrShape) {
			t.Fatalf("Sync: %v, want ErrShape", err)
		}
	})
}

// seqSpec is one sequence of an attention batch: ctx tokens of context
// (this step's included) and q query rows.
type seqSpec struct{ ctx, q int }

// attentionCases are TestAttention's batches of decode rows, prefill rows
// and both, over the head dims, GQA ratios, windows and padding the
// kernels take.
func attentionCases() []attnCase {
	var cases []attnCase
	for _, tc := range []struct {
		name     string
		h, kv, d int
		seqs     []seqSpec
		window   int
		padRows  int
		unroll   int // decode kernel UR; 0: the default
	}{
		{"decode_gqa1_d64", 8, 8, 64, []seqSpec{{1, 1}, {17, 1}, {300, 1}}, 0, 0, 0},
		{"decode_gqa4_d128", 32, 8, 128, []seqSpec{{2049, 1}, {1000, 1}, {16, 1}, {33, 1}}, 0, 0, 0},
		{"decode_gqa8_d128", 32, 4, 128, []seqSpec{{2049, 1}, {5, 1}}, 0, 0, 0},
		{"decode_gqa7_d64", 14, 2, 64, []seqSpec{{129, 1}, {64, 1}, {700, 1}}, 0, 0, 0},
		{"prefill_gqa4_d128", 16, 4, 128, []seqSpec{{200, 200}, {77, 77}}, 0, 0, 0},
		{"prefill_2049_gqa1", 8, 8, 128, []seqSpec{{2049, 2049}}, 0, 0, 0},
		{"prefix_cached_gqa4_d64", 8, 2, 64, []seqSpec{{300, 45}, {129, 128}, {65, 2}}, 0, 0, 0},
		{"mixed_gqa4_d128", 32, 8, 128, []seqSpec{{1000, 1}, {500, 100}, {1, 1}, {2049, 64}}, 0, 0, 0},
		{"window_gqa2", 8, 4, 128, []seqSpec{{700, 1}, {500, 130}, {90, 90}}, 128, 0, 0},
		{"window_decode_only", 8, 4, 128, []seqSpec{{700, 1}, {129, 1}, {90, 1}}, 128, 0, 0},
		{"window_prefill_only", 8, 4, 128, []seqSpec{{500, 130}, {90, 90}}, 128, 0, 0},
		{"window_unroll4", 8, 4, 128, []seqSpec{{700, 1}, {500, 130}, {90, 90}}, 128, 0, 4},
		{"decode_unroll4", 8, 4, 128, []seqSpec{{700, 1}, {129, 1}, {90, 1}}, 0, 0, 4},
		{"decode_gqa4_unroll1", 32, 8, 128, []seqSpec{{2049, 1}, {1, 1}, {33, 1}}, 0, 0, 1},
		{"decode_gqa4_unroll8", 32, 8, 128, []seqSpec{{2049, 1}, {1, 1}, {33, 1}, {300, 1}}, 0, 0, 8},
		{"mixed_gqa8_d64_unroll8", 16, 2, 64, []seqSpec{{513, 1}, {200, 70}, {17, 1}}, 0, 0, 8},
		{"padding_and_empty", 8, 8, 64, []seqSpec{{10, 1}, {20, 0}, {40, 3}}, 0, 3, 0},
		{"mixed_gqa2_d32", 8, 4, 32, []seqSpec{{300, 1}, {200, 57}, {1, 1}, {1025, 1}}, 0, 0, 0},
		{"prefill_gqa2_d32", 8, 4, 32, []seqSpec{{1024, 1024}, {33, 33}}, 0, 0, 0},
		{"mixed_gqa2_d16", 4, 2, 16, []seqSpec{{70, 1}, {102, 40}, {5, 5}}, 0, 0, 0},
		{"mixed_gqa4_d256", 8, 2, 256, []seqSpec{{300, 1}, {129, 65}}, 0, 0, 0},
		{"decode_many_seqs", 16, 8, 128, []seqSpec{{3, 1}, {700, 1}, {1, 1}, {64, 1}, {65, 1}, {1500, 1}, {999, 1}, {2, 1}, {128, 1}}, 0, 0, 0},
		// Speculative decoding's verify steps: every sequence 1+k rows
		// over a cached context, k even or not.
		{"verify_k4_gqa4_d128", 32, 8, 128, []seqSpec{{1000, 5}, {300, 5}, {6, 5}, {2049, 5}}, 0, 0, 0},
		{"verify_uneven_gqa2_d32", 10, 5, 32, []seqSpec{{500, 5}, {40, 2}, {129, 4}, {7, 1}}, 0, 0, 0},
		// attn_prefill: row counts that are not multiples of its tiles
		// (128 rows, 64 at d=256) and span several, cached prefixes
		// (ctx > q), windows narrower and wider than a key tile, d 16 to
		// 256, GQA 1/4/8 and MQA, and a batch with no more rows than
		// sequences (one block per sequence loops over all its tiles).
		{"prefill_300_1000_gqa4_d128", 16, 4, 128, []seqSpec{{300, 300}, {1000, 1000}}, 0, 0, 0},
		{"prefill_prefix_gqa8_d128", 16, 2, 128, []seqSpec{{1300, 1000}, {700, 300}, {130, 129}, {64, 2}}, 0, 0, 0},
		{"prefill_ragged_gqa1_d64", 8, 8, 64, []seqSpec{{1000, 1000}, {5, 2}, {129, 129}, {900, 17}, {300, 300}}, 0, 0, 0},
		{"prefill_with_decode_gqa4_d64", 16, 4, 64, []seqSpec{{800, 1}, {1000, 300}, {17, 1}, {257, 256}}, 0, 0, 0},
		{"prefill_window200_gqa4_d128", 16, 4, 128, []seqSpec{{1000, 1000}, {1200, 300}}, 200, 0, 0},
		{"prefill_window7_gqa1_d64", 4, 4, 64, []seqSpec{{300, 300}, {400, 129}}, 7, 0, 0},
		{"prefill_window_wide_gqa4_d128", 8, 2, 128, []seqSpec{{600, 500}}, 5000, 0, 0},
		{"prefill_gqa8_d256", 16, 2, 256, []seqSpec{{300, 300}, {600, 250}, {70, 65}}, 0, 0, 0},
		{"prefill_window_gqa2_d256", 4, 2, 256, []seqSpec{{500, 200}, {90, 90}}, 100, 0, 0},
		{"prefill_mqa_d128", 8, 1, 128, []seqSpec{{1000, 1000}, {40, 40}}, 0, 0, 0},
		{"prefill_long_gqa2_d16", 4, 2, 16, []seqSpec{{700, 700}, {300, 131}}, 0, 0, 0},
		{"prefill_one_block_per_seq", 8, 2, 64, oneBlockSeqs(), 0, 0, 0},
	} {
		cases = append(cases, attnCase{name: tc.name, h: tc.h, kv: tc.kv, d: tc.d, seqs: tc.seqs, window: tc.window,
			padRows: tc.padRows, unroll: tc.unroll})
	}
	return cases
}

func TestAttention(t *testing.T) {
	sharedBackend(t, true)
	for _, tc := range attentionCases() {
		testAttentionCase(t, tc)
	}
	// Decode paths of the tensor-core kernel (and the CUDA-core one beside
	// it): GQA 1, 2, 5, 16, 20 and 32 (two head chunks), head dims 16 to
	// 256, contexts of 1 token, of a few tiles and of tens of tiles per
	// warp (the ring wraps many times), not multiples of the 16-token tile
	// or the cache block, windows that start mid-tile, cache blocks of 8
	// (tiles span blocks) and 32 tokens, one split (direct output), three
	// splits, and two and four pipeline stages.
	for _, tc := range []attnCase{
		{name: "decode_gqa5_d128", h: 10, kv: 2, d: 128, seqs: []seqSpec{{1, 1}, {17, 1}, {2049, 1}, {300, 1}, {16, 1}, {32, 1}}},
		{name: "decode_gqa2_d64_10heads", h: 10, kv: 5, d: 64, seqs: []seqSpec{{1000, 1}, {7, 1}, {64, 1}}},
		{name: "decode_gqa2_d256", h: 8, kv: 4, d: 256, seqs: []seqSpec{{513, 1}, {1, 1}, {100, 1}}},
		{name: "decode_gqa8_d256_window", h: 16, kv: 2, d: 256, seqs: []seqSpec{{700, 1}, {90, 1}}, window: 77},
		{name: "decode_gqa16_d128", h: 16, kv: 1, d: 128, seqs: []seqSpec{{700, 1}, {31, 1}}},
		{name: "decode_mqa20_d64", h: 20, kv: 1, d: 64, seqs: []seqSpec{{300, 1}, {5, 1}}},
		{name: "decode_mqa32_d32", h: 32, kv: 1, d: 32, seqs: []seqSpec{{129, 1}, {2, 1}}},
		{name: "decode_gqa1_d16", h: 4, kv: 4, d: 16, seqs: []seqSpec{{45, 1}, {1, 1}, {250, 1}}},
		{name: "decode_one_split", h: 32, kv: 8, d: 128, seqs: []seqSpec{{2049, 1}, {1, 1}, {700, 1}}, maxSplits: 1},
		{name: "decode_one_split_long_gqa1", h: 2, kv: 2, d: 64, seqs: []seqSpec{{4001, 1}, {33, 1}}, maxSplits: 1},
		{name: "decode_three_splits", h: 16, kv: 4, d: 64, seqs: []seqSpec{{1000, 1}, {65, 1}, {3, 1}}, maxSplits: 3},
		{name: "decode_window37", h: 8, kv: 2, d: 128, seqs: []seqSpec{{700, 1}, {40, 1}, {37, 1}, {36, 1}, {1, 1}, {53, 1}}, window: 37},
		{name: "decode_window_one_split", h: 8, kv: 4, d: 64, seqs: []seqSpec{{500, 1}, {101, 1}}, window: 100, maxSplits: 1},
		{name: "decode_bs8_gqa4_d128", h: 16, kv: 4, d: 128, seqs: []seqSpec{{300, 1}, {1, 1}, {77, 1}}, bs: 8},
		{name: "decode_bs8_window21_d64", h: 8, kv: 4, d: 64, seqs: []seqSpec{{300, 1}, {30, 1}, {21, 1}}, window: 21, bs: 8},
		{name: "decode_bs32_gqa4_d64", h: 16, kv: 4, d: 64, seqs: []seqSpec{{300, 1}, {33, 1}, {1, 1}}, bs: 32},
		{name: "decode_bs32_window50_d128", h: 8, kv: 2, d: 128, seqs: []seqSpec{{300, 1}, {49, 1}, {64, 1}}, window: 50, bs: 32},
		{name: "decode_stages2", h: 32, kv: 8, d: 128, seqs: []seqSpec{{2049, 1}, {100, 1}, {1, 1}}, stages: 2},
		{name: "decode_stages4_d64", h: 32, kv: 8, d: 64, seqs: []seqSpec{{2049, 1}, {100, 1}, {1, 1}}, stages: 4},
		{name: "mixed_bs8_gqa2", h: 8, kv: 4, d: 64, seqs: []seqSpec{{300, 1}, {200, 57}, {1, 1}}, bs: 8},
	} {
		testAttentionCase(t, tc)
	}
	// Device-side checks, for both decode kernels: a batch said to be
	// decode-only (MaxQueryLen 1) that has a sequence of two rows (no
	// prefill kernel runs, so the rows would be left unwritten; the decode
	// kernel reports it instead), and a block id past the cache (in cache
	// blocks of 16, which hold whole tiles, and of 8, which do not).
	for _, kernel := range []struct {
		name   string
		stages int
	}{{"mma", 0}, {"simt", -1}} {
		g := backendWith(t, Tuning{DecodeStages: kernel.stages}, "")
		t.Run("decode_only_hint_broken_"+kernel.name, func(t *testing.T) {
			const blockSize = 16
			p := newPairOn(t, g)
			_, k := p.same(backend.BF16, []int{3, 1, blockSize, 64}, encode(backend.BF16, p.normal(3*blockSize*64, 1)))
			_, v := p.same(backend.BF16, []int{3, 1, blockSize, 64}, encode(backend.BF16, p.normal(3*blockSize*64, 1)))
			_, q := p.act(backend.BF16, []int{3, 64}, p.normal(3*64, 1))
			_, bt := p.same(backend.I32, []int{2, 1}, i32Bytes([]int32{1, 2}))
			_, sl := p.same(backend.I32, []int{2}, i32Bytes([]int32{5, 9}))
			_, qs := p.same(backend.I32, []int{3}, i32Bytes([]int32{0, 1, 3}))
			out := p.poisoned(backend.BF16, 3, 64)
			p.must("call", p.g.Attention(backend.AttentionArgs{Out: out, Q: q, KCache: k, VCache: v, KV: kvOf(k), BlockTables: bt, SeqLens: sl,
				QueryStart: qs, NumSeqs: 2, MaxSeqLen: 9, MaxQueryLen: 1, NumHeads: 1, NumKVHeads: 1, HeadDim: 64, Scale: 0.125}))
			if err := p.g.Sync(); !errors.Is(err, backend.ErrShape) {
				t.Fatalf("Sync: %v, want ErrShape", err)
			}
		})
		for _, blockSize := range []int{16, 8} {
			t.Run(fmt.Sprintf("bad_block_id_%s_bs%d", kernel.name, blockSize), func(t *testing.T) {
				p := newPairOn(t, g)
				// 20 tokens: blocks 1 and 2 are fine, the last (4) is not.
				nb := (20 + blockSize - 1) / blockSize
				k := p.poisoned(backend.BF16, 4, 1, blockSize, 64)
				v := p.poisoned(backend.BF16, 4, 1, blockSize, 64)
				_, q := p.act(backend.BF16, []int{1, 64}, p.normal(64, 1))
				ids := []int32{1, 2, 3}[:nb-1]
				_, bt := p.same(backend.I32, []int{1, nb}, i32Bytes(append(ids, 4)))
				_, sl := p.same(backend.I32, []int{1}, i32Bytes([]int32{20}))
				_, qs := p.same(backend.I32, []int{2}, i32Bytes([]int32{0, 1}))
				out := p.poisoned(backend.BF16, 1, 64)
				p.must("call", p.g.Attention(backend.AttentionArgs{Out: out, Q: q, KCache: k, VCache: v, KV: kvOf(k), BlockTables: bt, SeqLens: sl,
					QueryStart: qs, NumSeqs: 1, MaxSeqLen: 20, NumHeads: 1, NumKVHeads: 1, HeadDim: 64, Scale: 0.125}))
				if err := p.g.Sync(); !errors.Is(err, backend.ErrShape) {
					t.Fatalf("Sync: %v, want ErrShape", err)
				}
			})
		}
	}
}

// TestAttentionPrefillWG runs, on Hopper, every TestAttention batch with
// prefill rows at head dims 64 and 128 through attn_prefill's mma.sync
// kernel, which every target but sm_90a runs there (TestAttention covers
// the wgmma kernel): on a backend compiling for plain sm_90. Cache blocks
// of 8 and 32 tokens (key tiles spanning and splitting blocks) run on
// both kernels. It first checks the wgmma kernel is the one sm_90a picks.
func TestAttentionPrefillWG(t *testing.T) {
	b := sharedBackend(t, true)
	if b.comp.arch == "sm_90a" {
		for _, d := range []int{64, 128} {
			if _, ok := b.prefillWGSpec(d, backend.PlainKV(backend.BF16, 16)); !ok {
				t.Fatalf("sm_90a, head dim %d: the wgmma prefill kernel is not selected", d)
			}
		}
	} else {
		t.Logf("%s: the wgmma kernel is not used here; every case runs the mma.sync kernel", b.comp.arch)
	}
	extra := []attnCase{
		{name: "prefill_bs8_gqa4_d128", h: 16, kv: 4, d: 128, seqs: []seqSpec{{700, 700}, {300, 129}, {40, 40}}, bs: 8},
		{name: "prefill_bs32_gqa2_d64", h: 8, kv: 4, d: 64, seqs: []seqSpec{{1000, 1000}, {129, 65}}, bs: 32},
		{name: "prefill_bs8_window33_d128", h: 8, kv: 2, d: 128, seqs: []seqSpec{{600, 600}, {250, 250}}, window: 33, bs: 8},
	}
	for _, tc := range extra {
		tc.defaultDecode = true // the decode kernels are TestAttention's
		testAttentionCase(t, tc)
	}
	if b.comp.arch != "sm_90a" {
		return
	}
	for _, tc := range append(attentionCases(), extra...) {
		prefill := false
		for _, s := range tc.seqs {
			prefill = prefill || s.q > 1
		}
		if !prefill || (tc.d != 64 && tc.d != 128) {
			continue
		}
		tc.arch = "sm_90"
		tc.defaultDecode = true
		testAttentionCase(t, tc)
	}
}

// TestPrefillWGSelect checks which prefill kernel Attention picks: the
// wgmma one only for sm_90a SASS and head dims 64 and 128.
func TestPrefillWGSelect(t *testing.T) {
	for _, tc := range []struct {
		arch string
		d    int
		want bool
	}{
		{"sm_90a", 128, true},
		{"sm_90a", 64, true},
		{"sm_90", 128, false},
		{"compute_90", 128, false},
		{"sm_80", 64, false},
		{"sm_90a", 256, false},
		{"sm_90a", 32, false},
	} {
		b := &Backend{comp: &compiler{arch: tc.arch}}
		spec, ok := b.prefillWGSpec(tc.d, backend.PlainKV(backend.BF16, 32))
		if ok != tc.want {
			t.Errorf("%s d=%d: wgmma kernel %v, want %v", tc.arch, tc.d, ok, tc.want)
		}
		if ok && (spec.file != "attn_prefill_wg" || spec.p != [8]int{tc.d, 32, dtBF16} || len(spec.defines()) != 3) {
			t.Errorf("%s d=%d: module %v", tc.arch, tc.d, spec)
		}
	}
	// The layout's total: Q (128 rows) and two stages of K and V (128
	// keys each), plus the 1024-byte alignment slack, within the 227 KB a
	// block may have.
	for _, d := range []int{64, 128} {
		if got, want := prefillWGSmem(d), (128+4*128)*d*2+1024; got != want || got > 227<<10 {
			t.Errorf("d=%d: %d bytes of shared memory, want %d (at most %d)", d, got, want, 227<<10)
		}
	}
}

// oneBlockSeqs is a batch of no more query rows than sequences, for which
// Attention gives each sequence one prefill block that loops over all of
// its row tiles and heads: 199 short sequences, a few of them decoding,
// and one of 190 rows (two 128-row tiles) after a 210-token prefix.
func oneBlockSeqs() []seqSpec {
	seqs := make([]seqSpec, 0, 200)
	for i := range 199 {
		q := 0
		if i%20 == 0 {
			q = 1
		}
		seqs = append(seqs, seqSpec{1 + i%37, q})
	}
	return append(seqs, seqSpec{400, 190})
}

// TestPrefillTiling checks the prefill tilings against what
// kernels/attn_prefill.cu assumes of them (its static_asserts and the
// launch limits), for every head dim Attention accepts.
func TestPrefillTiling(t *testing.T) {
	const maxDynSmem = 227 << 10 // per block on sm_80 and sm_90
	for d := range attnHeadDims {
		c := prefillTiling(d)
		smem := c.smem(d)
		t.Logf("d=%d: %+v, %d bytes of shared memory", d, c, smem)
		switch {
		case c.rows != 16*c.warps:
			t.Errorf("d=%d: %d rows for %d warps, want 16 per warp", d, c.rows, c.warps)
		case c.keys%16 != 0 || d%16 != 0:
			t.Errorf("d=%d: %d keys per tile: both must be multiples of 16", d, c.keys)
		case c.qInRegs && d > 128:
			t.Errorf("d=%d: Q fragments in registers", d)
		case smem <= 0 || smem > maxDynSmem:
			t.Errorf("d=%d: %d bytes of shared memory, limit %d", d, smem, maxDynSmem)
		}
		// The Q tile either shares stage 1 or follows both stages.
		stage := 2 * c.keys * (d + 8) * 2
		if want := 2*stage + c.rows*(d+8)*2; !c.qInRegs && smem != want {
			t.Errorf("d=%d: %d bytes, want %d", d, smem, want)
		}
		if s := c.spec(d, backend.PlainKV(backend.BF16, 32)); s.file != "attn_prefill" || len(s.defines()) != 8 || s.p[1] != 32 || s.p[2] != dtBF16 || s.p[7] != 0 {
			t.Errorf("d=%d: module %v", d, s)
		}
	}
}

// attnCase is one TestAttention batch.
type attnCase struct {
	name     string
	h, kv, d int
	seqs     []seqSpec
	window   int
	padRows  int // rows past the last sequence's, which no kernel may write
	unroll   int // Tuning.DecodeUnroll of the CUDA-core decode kernel's run; 0: the default
	bs       int // cache block size; 0: 16
	// stages is Tuning.DecodeStages for the case: 0 runs it with the
	// default tensor-core kernel and, if it has decode rows and
	// defaultDecode is not set, again with the CUDA-core one (-1).
	stages        int
	defaultDecode bool // run only the default decode kernel: the case is about prefill
	maxSplits     int  // Tuning.DecodeMaxSplits; 0: the default
	// spec is a quantized cache format (its block size is bs's); zero:
	// a BF16 cache of normal values.
	spec backend.KVSpec
	// arch is the target the case's kernels are compiled for (backendWith;
	// "" the device's); set, the case's name carries it.
	arch string
}

// testAttentionCase runs tc on the CPU and the GPU and compares: for each
// decode kernel it asks for, without and with the MaxQueryLen hint (the
// runner passes it; 1 skips the prefill kernel).
func testAttentionCase(t *testing.T, tc attnCase) {
	t.Helper()
	bs := tc.bs
	if bs == 0 {
		bs = 16
	}
	stages := []int{tc.stages}
	quant := tc.spec.Scales != 0 && tc.spec.Scales != backend.KVNoScales
	if tc.stages == 0 && !tc.defaultDecode && !quant {
		for _, s := range tc.seqs {
			if s.q == 1 {
				stages = append(stages, -1)
				break
			}
		}
	}
	for _, st := range stages {
		for _, hinted := range []bool{false, true} {
			name := tc.name
			if tc.arch != "" {
				name += "_" + tc.arch
			}
			if st == -1 {
				name += "_simt"
			}
			if hinted {
				name += "_hinted"
			}
			t.Run(name, func(t *testing.T) {
				tune := Tuning{DecodeStages: st, DecodeMaxSplits: tc.maxSplits}
				if st == -1 {
					tune.DecodeUnroll = tc.unroll // only the CUDA-core kernel unrolls
				}
				p := newPairOn(t, backendWith(t, tune, tc.arch))
				ns := len(tc.seqs)
				maxBlocks, totalBlocks, rows, maxLen, maxQ := 0, 0, 0, 0, 0
				for _, s := range tc.seqs {
					nb := (s.ctx + bs - 1) / bs
					maxBlocks = max(maxBlocks, nb)
					totalBlocks += nb
					rows += s.q
					maxLen = max(maxLen, s.ctx)
					maxQ = max(maxQ, s.q)
				}
				if !hinted {
					maxQ = 0
				}
				maxBlocks++ // a spare column holding an invalid id no kernel may read
				numBlocks := totalBlocks + 3
				ids := p.r.Perm(numBlocks - 1) // block 0 stays the null block
				tables := make([]int32, ns*maxBlocks)
				lens := make([]int32, ns)
				starts := make([]int32, ns+1)
				next := 0
				for i, s := range tc.seqs {
					for j := range maxBlocks {
						tables[i*maxBlocks+j] = 1 << 30
					}
					for j := range (s.ctx + bs - 1) / bs {
						tables[i*maxBlocks+j] = int32(ids[next] + 1)
						next++
					}
					lens[i] = int32(s.ctx)
					starts[i+1] = starts[i] + int32(s.q)
				}
				n := rows + tc.padRows
				cshape := []int{numBlocks, tc.kv, bs, tc.d}
				cells := numBlocks * tc.kv * bs * tc.d
				spec := backend.PlainKV(backend.BF16, bs)
				var ck, gk, cv, gv backend.Tensor
				var caux, gaux backend.KVAux
				if quant {
					spec = tc.spec
					spec.BlockSize = bs
					ck, gk, cv, gv, caux, gaux = p.quantCaches(spec, numBlocks, tc.kv, tc.d)
					if spec.Scales == backend.KVScaleKIVI {
						p.kiviWindows(spec, numBlocks, tc.kv, tc.d, tables, lens, maxBlocks, &caux, &gaux)
					}
				} else {
					ck, gk = p.same(backend.BF16, cshape, encode(backend.BF16, p.normal(cells, 1)))
					cv, gv = p.same(backend.BF16, cshape, encode(backend.BF16, p.normal(cells, 1)))
				}
				cq, gq := p.act(backend.BF16, []int{n, tc.h * tc.d}, p.normal(n*tc.h*tc.d, 1))
				cbt, gbt := p.same(backend.I32, []int{ns, maxBlocks}, i32Bytes(tables))
				csl, gsl := p.same(backend.I32, []int{ns}, i32Bytes(lens))
				cqs, gqs := p.same(backend.I32, []int{ns + 1}, i32Bytes(starts))
				co, gout := p.cpuOut(n, tc.h*tc.d), p.poisoned(backend.BF16, n, tc.h*tc.d)
				args := func(out, q, k, v, bt, sl, qs backend.Tensor, aux backend.KVAux) backend.AttentionArgs {
					return backend.AttentionArgs{Out: out, Q: q, KCache: k, VCache: v, KV: spec, KVAux: aux, BlockTables: bt, SeqLens: sl, QueryStart: qs,
						NumSeqs: ns, MaxSeqLen: maxLen, MaxQueryLen: maxQ, NumHeads: tc.h, NumKVHeads: tc.kv, HeadDim: tc.d,
						Scale: float32(1 / math.Sqrt(float64(tc.d))), SlidingWindow: tc.window}
				}
				p.must("cpu", p.c.Attention(args(co, cq, ck, cv, cbt, csl, cqs, caux)))
				p.must("gpu", p.g.Attention(args(gout, gq, gk, gv, gbt, gsl, gqs, gaux)))
				p.must("sync", p.g.Sync())
				got, want := read(t, p.g, gout), read(t, p.c, co)
				w := tc.h * tc.d
				tol := bf16Tol
				if quant {
					tol = quantAttnTol
				}
				e, err := relErr(got[:rows*w], want[:rows*w])
				if err != nil || e > tol {
					// Say which sequences are off before failing.
					for i, s := range tc.seqs {
						lo, hi := int(starts[i])*w, int(starts[i+1])*w
						se, serr := relErr(got[lo:hi], want[lo:hi])
						t.Logf("sequence %d (ctx %d, %d rows): relative error %.3g %v", i, s.ctx, s.q, se, serr)
					}
				}
				p.expectClose("attention", got[:rows*w], want[:rows*w], tol)
				for i, v := range got[rows*w:] {
					if !math.IsNaN(float64(v)) {
						t.Fatalf("padding row %d was written", rows+i/w)
					}
				}
			})
		}
	}
}

func TestSample(t *testing.T) {
	sharedBackend(t, true)
	rules := []backend.SampleRow{
		{},
		{Temperature: 0.7},
		{Temperature: 1, TopK: 50},
		{Temperature: 1, TopP: 0.9},
		{Temperature: 1, MinP: 0.05},
		{Temperature: 0.8, TopK: 40, TopP: 0.95, MinP: 0.02},
		{Temperature: 1.5, TopP: 0.5},
		{Temperature: 1, TopK: 1},
		{Temperature: 2, TopK: 1 << 20},
		{Temperature: 0.3, MinP: 1.5},
	}
	for _, tc := range []struct {
		vocab int
		ties  bool
	}{{1000, false}, {32000, false}, {151936, false}, {32000, true}, {50, true}} {
		t.Run(fmt.Sprintf("vocab%d_ties%v", tc.vocab, tc.ties), func(t *testing.T) {
			p := newPair(t)
			const trials = 4
			n := len(rules) * trials
			lv := p.normal(n*tc.vocab, 3)
			if tc.ties {
				for i := range lv {
					lv[i] = float32(math.Round(float64(lv[i])))
				}
			}
			p.sampleBoth(lv, n, tc.vocab, rules)
		})
	}
}

// sampleBoth samples n rows of logits lv on both backends, row i under
// rules[i % len(rules)] with a fresh U, and wants the same ids.
func (p *pair) sampleBoth(lv []float32, n, vocab int, rules []backend.SampleRow) {
	p.t.Helper()
	cl, gl := p.same(backend.F32, []int{n, vocab}, encode(backend.F32, lv))
	rows := make([]backend.SampleRow, n)
	for i := range rows {
		rows[i] = rules[i%len(rules)]
		rows[i].U = p.r.Float32()
	}
	want, err := p.c.Sample(backend.SampleArgs{Logits: cl, Rows: rows})
	p.must("cpu", err)
	got, err := p.g.Sample(backend.SampleArgs{Logits: gl, Rows: rows})
	p.must("gpu", err)
	for i := range want {
		if got[i] != want[i] {
			p.t.Errorf("row %d %+v: GPU chose %d, CPU %d", i, rows[i], got[i], want[i])
		}
	}
}

// TestSampleGreedy checks argmax_rows, the split kernel that picks when
// every row is greedy, against the CPU: rows of rounded logits (ties, the
// lowest id must win across chunks), the maximum at the first and the
// last id, vocabularies of one partial chunk to many, more rows than the
// counters first allocated; then rows of NaN, +Inf and nothing but -Inf,
// which must fail as sample_rows fails (and leave the counters zero: the
// next call is checked too).
func TestSampleGreedy(t *testing.T) {
	sharedBackend(t, true)
	greedy := []backend.SampleRow{{}, {Temperature: 0.3, MinP: 1.5}, {Temperature: -1}}
	for _, tc := range []struct {
		n, vocab int
		ties     bool
	}{{1, 50, true}, {4, 4096, false}, {3, 4097, true}, {9, 32000, true}, {4, 128256, false}, {2, 151936, true}, {300, 8193, false}} {
		t.Run(fmt.Sprintf("n%d_vocab%d_ties%v", tc.n, tc.vocab, tc.ties), func(t *testing.T) {
			p := newPair(t)
			lv := p.normal(tc.n*tc.vocab, 3)
			for i := range lv {
				if tc.ties {
					lv[i] = float32(math.Round(float64(lv[i])))
				}
			}
			for r := 0; r < tc.n; r++ {
				row := lv[r*tc.vocab : (r+1)*tc.vocab]
				switch r % 4 {
				case 1:
					row[0] = 100
				case 2:
					row[tc.vocab-1] = 100
				case 3: // a tie between the last id and one in another chunk
					row[tc.vocab-1], row[tc.vocab/3] = 100, 100
				}
			}
			p.sampleBoth(lv, tc.n, tc.vocab, greedy)
		})
	}
	t.Run("bad_rows", func(t *testing.T) {
		p := newPair(t)
		const vocab = 10000
		for _, bad := range []string{"nan", "inf", "all_neg_inf", "neg_nan"} {
			lv := p.normal(2*vocab, 1)
			row := lv[vocab:]
			switch bad {
			case "nan":
				row[7000] = float32(math.NaN())
			case "inf":
				row[123] = float32(math.Inf(1))
			case "all_neg_inf":
				for i := range row {
					row[i] = float32(math.Inf(-1))
				}
			case "neg_nan":
				row[9999] = math.Float32frombits(0xffc00000)
			}
			_, gl := p.same(backend.F32, []int{2, vocab}, encode(backend.F32, lv))
			if _, err := p.g.Sample(backend.SampleArgs{Logits: gl, Rows: make([]backend.SampleRow, 2)}); !errors.Is(err, backend.ErrShape) {
				t.Errorf("%s: Sample gave %v, want ErrShape", bad, err)
			}
			p.must("sync after "+bad, p.g.Sync())
			// A clean call after it: the counters were left zero.
			cl, gl2 := p.same(backend.F32, []int{2, vocab}, encode(backend.F32, p.normal(2*vocab, 1)))
			want, err := p.c.Sample(backend.SampleArgs{Logits: cl, Rows: make([]backend.SampleRow, 2)})
			p.must("cpu", err)
			got, err := p.g.Sample(backend.SampleArgs{Logits: gl2, Rows: make([]backend.SampleRow, 2)})
			p.must("gpu after "+bad, err)
			if got[0] != want[0] || got[1] != want[1] {
				t.Errorf("after %s: GPU chose %v, CPU %v", bad, got, want)
			}
		}
	})
}

// TestDecodePlan checks the decode kernel choice and split counts without
// a GPU: the tensor-core kernel where it can run (its shared memory within
// the block limit), the CUDA-core one otherwise; splits within the caps,
// none shorter than a tile per warp, and as many as one wave of resident
// blocks holds when the batch alone does not fill the GPU.
func TestDecodePlan(t *testing.T) {
	for _, tc := range []struct {
		cc, sms, stages        int
		seqs, h, kv, d, maxLen int
		wantMMA                bool
		spec                   backend.KVSpec // zero: BF16, 16-token blocks
		wantErr                bool
	}{
		{90, 132, 3, 4, 32, 8, 128, 2048, true, backend.KVSpec{}, false},
		{90, 132, 3, 1, 32, 8, 128, 8192, true, backend.KVSpec{}, false},
		{90, 132, 3, 64, 32, 8, 128, 2048, true, backend.KVSpec{}, false},
		{90, 132, 3, 4, 32, 8, 128, 32768, true, backend.KVSpec{}, false},
		{90, 132, 3, 3, 10, 5, 64, 300, true, backend.KVSpec{}, false},
		{90, 132, 4, 2, 16, 2, 256, 5000, true, backend.KVSpec{}, false},
		{90, 132, 3, 1, 32, 1, 64, 100, true, backend.KVSpec{}, false},
		{90, 132, 3, 200, 8, 8, 128, 40, true, backend.KVSpec{}, false},
		{80, 108, 3, 4, 32, 8, 128, 2048, true, backend.KVSpec{}, false},
		{86, 84, 3, 4, 32, 8, 128, 2048, true, backend.KVSpec{}, false},  // two stages fit in 99 KB
		{86, 84, 3, 4, 16, 8, 256, 2048, false, backend.KVSpec{}, false}, // not even two
		{75, 40, 3, 4, 32, 8, 128, 2048, false, backend.KVSpec{}, false}, // no bf16 mma
		{90, 132, -1, 4, 32, 8, 128, 2048, false, backend.KVSpec{}, false},
		// Quantized caches: the tensor-core kernel only, whatever the tuning.
		{90, 132, 3, 16, 32, 8, 128, 32768, true, backend.Int8KV(16, 32), false},
		{90, 132, 3, 4, 32, 8, 128, 2048, true, backend.FP8KV(16), false},
		{90, 132, -1, 4, 32, 8, 128, 2048, true, backend.Int8KV(16, 8), false},
		{90, 132, 4, 2, 16, 2, 256, 5000, true, backend.Int8KV(16, 128), false},
		{86, 84, 3, 4, 16, 8, 256, 2048, false, backend.Int8KV(16, 32), true},
		// int4: a ring twice as deep (fitted to the block's shared memory).
		{90, 132, 3, 16, 32, 8, 128, 32768, true, backend.Int4KV(16, 32, 128), false},
		{90, 132, 3, 4, 32, 8, 128, 2048, true, backend.Int4KV(16, 8, 0), false},
		{90, 132, 4, 2, 16, 2, 256, 5000, true, backend.Int4KV(32, 128, 128), false},
		{86, 84, 3, 4, 32, 8, 128, 2048, true, backend.Int4KV(16, 32, 128), false},
	} {
		kv := tc.spec
		if kv.BlockSize == 0 {
			kv = backend.PlainKV(backend.BF16, 16)
		}
		t.Run(fmt.Sprintf("sm%d_st%d_b%d_h%d_kv%d_d%d_ctx%d_%s", tc.cc, tc.stages, tc.seqs, tc.h, tc.kv, tc.d, tc.maxLen, kv.Name()), func(t *testing.T) {
			tune, err := Tuning{DecodeStages: tc.stages}.resolve()
			if err != nil {
				t.Fatal(err)
			}
			b := &Backend{cc: tc.cc, sms: tc.sms, tune: tune}
			p, err := b.planDecode(tc.seqs, tc.h, tc.kv, tc.d, kv, tc.maxLen)
			if (err != nil) != tc.wantErr {
				t.Fatalf("plan error %v, want an error: %v", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			t.Logf("%+v", p)
			// Both kernels are specialised on the KV format: block size
			// and dtype after the head dim (fileParams).
			if p.mod.p[0] != tc.d || p.mod.p[1] != kv.BlockSize || p.mod.p[2] != int(kv.DType) {
				t.Errorf("module %v, want head dim %d and the format %v", p.mod, tc.d, kv)
			}
			if mma := p.decode == "attn_decode_mma"; mma != tc.wantMMA {
				t.Fatalf("kernel %s, want tensor cores %v", p.decode, tc.wantMMA)
			}
			if p.grid[0] != tc.seqs || p.grid[2] != p.nsplit || p.nsplit < 1 || p.nsplit > tune.decodeMaxSplits {
				t.Fatalf("grid %v with %d splits", p.grid, p.nsplit)
			}
			if !tc.wantMMA {
				return
			}
			g := tc.h / tc.kv
			if want := tc.kv * ((g + 15) / 16); p.grid[1] != want {
				t.Errorf("grid y %d, want %d (16 query heads per block)", p.grid[1], want)
			}
			st := p.mod.p[3]
			if st < 2 || st > decodeRingStages(kv, max(tc.stages, defaultDecodeStages)) || p.mod.file != "attn_decode" || p.mod.p[4] != kvGroup(kv) {
				t.Errorf("module %v", p.mod)
			}
			_, perBlock := smemLimits(tc.cc)
			if p.smem != decodeMMASmem(tc.d, kv, st) || p.smem+decodeMMAStaticSmem(kv, st) > perBlock {
				t.Errorf("%d bytes of shared memory, block limit %d", p.smem, perBlock)
			}
			tiles := (tc.maxLen + decodeTile - 1) / decodeTile
			if p.nsplit > 1 && tiles/p.nsplit < decodeNW {
				t.Errorf("%d splits of %d tiles leave a warp without one", p.nsplit, tiles)
			}
			units := p.grid[0] * p.grid[1]
			slots := decodeMMAPerSM(tc.cc, tc.d, kv, st) * tc.sms
			// Time in units of an unsplit block: waves of resident blocks
			// over splits. No allowed count may beat the choice by 3%.
			limit := max(1, min(tune.decodeMaxSplits, tiles/decodeNW))
			cost := func(n int) float64 { return math.Ceil(float64(units*n)/float64(slots)) / float64(n) }
			for n := 1; n <= limit; n++ {
				if cost(n) < 0.97*cost(p.nsplit) {
					t.Errorf("%d splits take %.3f, %d would take %.3f", p.nsplit, cost(p.nsplit), n, cost(n))
				}
			}
			if units*p.nsplit*2 <= slots && p.nsplit < limit {
				t.Errorf("%d blocks leave more than half of %d slots idle with %d more splits allowed", units*p.nsplit, slots, limit-p.nsplit)
			}
		})
	}
}
