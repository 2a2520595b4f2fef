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
				return backend.RoPEArgs{Q: q, QKV: qkv, Positions: pos, SlotMapping: slot, KCache: k, VCache: v, InvFreq: f,
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
		p.must("call", p.g.RoPEStoreKV(backend.RoPEArgs{Q: q, QKV: qkv, Positions: pos, SlotMapping: slot, KCache: k, VCache: v,
			InvFreq: f, NumHeads: 1, NumKVHeads: 1, HeadDim: 64}))
		if err := p.g.Sync(); !errors.Is(err, backend.ErrShape) {
			t.Fatalf("Sync: %v, want ErrShape", err)
		}
	})
}

// seqSpec is one sequence of an attention batch: ctx tokens of context
// (this step's included) and q query rows.
type seqSpec struct{ ctx, q int }

func TestAttention(t *testing.T) {
	sharedBackend(t, true)
	const blockSize = 16
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
	} {
		// Each case runs without and with the MaxQueryLen hint (the runner
		// passes it; 1 skips the prefill kernel).
		for _, hinted := range []bool{false, true} {
			name := tc.name
			if hinted {
				name += "_hinted"
			}
			t.Run(name, func(t *testing.T) {
				p := newPair(t)
				if tc.unroll != 0 {
					defer func(u int) { decodeUnroll = u }(decodeUnroll)
					decodeUnroll = tc.unroll
				}
				ns := len(tc.seqs)
				maxBlocks, totalBlocks, rows, maxLen, maxQ := 0, 0, 0, 0, 0
				for _, s := range tc.seqs {
					nb := (s.ctx + blockSize - 1) / blockSize
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
					for j := range (s.ctx + blockSize - 1) / blockSize {
						tables[i*maxBlocks+j] = int32(ids[next] + 1)
						next++
					}
					lens[i] = int32(s.ctx)
					starts[i+1] = starts[i] + int32(s.q)
				}
				n := rows + tc.padRows
				cshape := []int{numBlocks, tc.kv, blockSize, tc.d}
				cells := numBlocks * tc.kv * blockSize * tc.d
				ck, gk := p.same(backend.BF16, cshape, encode(backend.BF16, p.normal(cells, 1)))
				cv, gv := p.same(backend.BF16, cshape, encode(backend.BF16, p.normal(cells, 1)))
				cq, gq := p.act(backend.BF16, []int{n, tc.h * tc.d}, p.normal(n*tc.h*tc.d, 1))
				cbt, gbt := p.same(backend.I32, []int{ns, maxBlocks}, i32Bytes(tables))
				csl, gsl := p.same(backend.I32, []int{ns}, i32Bytes(lens))
				cqs, gqs := p.same(backend.I32, []int{ns + 1}, i32Bytes(starts))
				co, gout := p.cpuOut(n, tc.h*tc.d), p.poisoned(backend.BF16, n, tc.h*tc.d)
				args := func(out, q, k, v, bt, sl, qs backend.Tensor) backend.AttentionArgs {
					return backend.AttentionArgs{Out: out, Q: q, KCache: k, VCache: v, BlockTables: bt, SeqLens: sl, QueryStart: qs,
						NumSeqs: ns, MaxSeqLen: maxLen, MaxQueryLen: maxQ, NumHeads: tc.h, NumKVHeads: tc.kv, HeadDim: tc.d,
						Scale: float32(1 / math.Sqrt(float64(tc.d))), SlidingWindow: tc.window}
				}
				p.must("cpu", p.c.Attention(args(co, cq, ck, cv, cbt, csl, cqs)))
				p.must("gpu", p.g.Attention(args(gout, gq, gk, gv, gbt, gsl, gqs)))
				p.must("sync", p.g.Sync())
				got, want := read(t, p.g, gout), read(t, p.c, co)
				w := tc.h * tc.d
				e, err := relErr(got[:rows*w], want[:rows*w])
				if err != nil || e > bf16Tol {
					// Say which sequences are off before failing.
					for i, s := range tc.seqs {
						lo, hi := int(starts[i])*w, int(starts[i+1])*w
						se, serr := relErr(got[lo:hi], want[lo:hi])
						t.Logf("sequence %d (ctx %d, %d rows): relative error %.3g %v", i, s.ctx, s.q, se, serr)
					}
				}
				p.expectClose("attention", got[:rows*w], want[:rows*w], bf16Tol)
				for i, v := range got[rows*w:] {
					if !math.IsNaN(float64(v)) {
						t.Fatalf("padding row %d was written", rows+i/w)
					}
				}
			})
		}
	}
	// A batch said to be decode-only (MaxQueryLen 1) that has a sequence
	// of two rows: no prefill kernel runs, so the rows would be left
	// unwritten; the decode kernel reports it instead.
	t.Run("decode_only_hint_broken", func(t *testing.T) {
		p := newPair(t)
		_, k := p.same(backend.BF16, []int{3, 1, blockSize, 64}, encode(backend.BF16, p.normal(3*blockSize*64, 1)))
		_, v := p.same(backend.BF16, []int{3, 1, blockSize, 64}, encode(backend.BF16, p.normal(3*blockSize*64, 1)))
		_, q := p.act(backend.BF16, []int{3, 64}, p.normal(3*64, 1))
		_, bt := p.same(backend.I32, []int{2, 1}, i32Bytes([]int32{1, 2}))
		_, sl := p.same(backend.I32, []int{2}, i32Bytes([]int32{5, 9}))
		_, qs := p.same(backend.I32, []int{3}, i32Bytes([]int32{0, 1, 3}))
		out := p.poisoned(backend.BF16, 3, 64)
		p.must("call", p.g.Attention(backend.AttentionArgs{Out: out, Q: q, KCache: k, VCache: v, BlockTables: bt, SeqLens: sl,
			QueryStart: qs, NumSeqs: 2, MaxSeqLen: 9, MaxQueryLen: 1, NumHeads: 1, NumKVHeads: 1, HeadDim: 64, Scale: 0.125}))
		if err := p.g.Sync(); !errors.Is(err, backend.ErrShape) {
			t.Fatalf("Sync: %v, want ErrShape", err)
		}
	})
	t.Run("bad_block_id", func(t *testing.T) {
		p := newPair(t)
		k := p.poisoned(backend.BF16, 4, 1, blockSize, 64)
		v := p.poisoned(backend.BF16, 4, 1, blockSize, 64)
		_, q := p.act(backend.BF16, []int{1, 64}, p.normal(64, 1))
		_, bt := p.same(backend.I32, []int{1, 2}, i32Bytes([]int32{1, 4}))
		_, sl := p.same(backend.I32, []int{1}, i32Bytes([]int32{20}))
		_, qs := p.same(backend.I32, []int{2}, i32Bytes([]int32{0, 1}))
		out := p.poisoned(backend.BF16, 1, 64)
		p.must("call", p.g.Attention(backend.AttentionArgs{Out: out, Q: q, KCache: k, VCache: v, BlockTables: bt, SeqLens: sl,
			QueryStart: qs, NumSeqs: 1, MaxSeqLen: 20, NumHeads: 1, NumKVHeads: 1, HeadDim: 64, Scale: 0.125}))
		if err := p.g.Sync(); !errors.Is(err, backend.ErrShape) {
			t.Fatalf("Sync: %v, want ErrShape", err)
		}
	})
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
			cl, gl := p.same(backend.F32, []int{n, tc.vocab}, encode(backend.F32, lv))
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
					t.Errorf("row %d %+v: GPU chose %d, CPU %d", i, rows[i], got[i], want[i])
				}
			}
		})
	}
}
