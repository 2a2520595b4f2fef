package cuda

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/backend"
)

// hostOnly is a Backend with no device and no CUDA thread: ops validate
// their operands on the caller's goroutine before queueing anything, so
// the validation can be tested on any machine. A queued op lands in the
// buffered task channel instead of running.
type hostOnly struct {
	b    *Backend
	next uint64 // fake device addresses, 256-byte aligned, never overlapping
}

func newHostOnly() *hostOnly {
	tune, err := Tuning{}.resolve()
	if err != nil {
		panic(err)
	}
	return &hostOnly{b: &Backend{name: "cuda:host-only", cc: 90, sms: 132, tune: tune, tasks: make(chan task, 16)}, next: 1 << 20}
}

// t makes a tensor of this backend at a fresh address.
func (h *hostOnly) t(dt backend.DType, shape ...int) backend.Tensor {
	n, err := dt.Bytes(shape)
	if err != nil {
		panic(err)
	}
	a := &allocation{ptr: h.next}
	t := &tensor{b: h.b, dt: dt, shape: shape, ptr: h.next, bytes: n, alloc: a, owner: a}
	h.next += uint64(n+255) &^ 255
	return t
}

// queued drains and counts the ops queued so far.
func (h *hostOnly) queued() int {
	n := 0
	for {
		select {
		case <-h.b.tasks:
			n++
		default:
			return n
		}
	}
}

// TestValidationWithoutGPU feeds each op operands it must refuse and
// expects backend.ErrShape with nothing queued; a valid call of each
// shape first proves the harness sees what an accepted op queues.
func TestValidationWithoutGPU(t *testing.T) {
	h := newHostOnly()
	bf, f32, i32 := backend.BF16, backend.F32, backend.I32

	// Operands of a valid step: 3 tokens, 8 heads / 2 KV heads of 64 dims.
	const n, hidden, heads, kvh, hd, inter, vocab, blocks, bs = 3, 512, 8, 2, 64, 1024, 100, 10, 16
	x := h.t(bf, n, hidden)
	w := h.t(bf, inter, hidden)
	y := h.t(bf, n, inter)
	q := h.t(bf, n, heads*hd)
	qkv := h.t(bf, n, (heads+2*kvh)*hd)
	pos, slots := h.t(i32, n), h.t(i32, n)
	kc, vc := h.t(bf, blocks, kvh, bs, hd), h.t(bf, blocks, kvh, bs, hd)
	invf := h.t(f32, hd/2)
	bt, sl, qs := h.t(i32, 2, 4), h.t(i32, 2), h.t(i32, 3)
	rope := func() backend.RoPEArgs {
		return backend.RoPEArgs{Q: q, QKV: qkv, Positions: pos, SlotMapping: slots, KCache: kc, VCache: vc, KV: backend.PlainKV(bf, bs),
			InvFreq: invf, NumHeads: heads, NumKVHeads: kvh, HeadDim: hd}
	}
	attn := func() backend.AttentionArgs {
		return backend.AttentionArgs{Out: h.t(bf, n, heads*hd), Q: q, KCache: kc, VCache: vc, KV: backend.PlainKV(bf, bs), BlockTables: bt,
			SeqLens: sl, QueryStart: qs, NumSeqs: 2, MaxSeqLen: 64, NumHeads: heads, NumKVHeads: kvh, HeadDim: hd,
			Scale: 0.125}
	}
	other := newHostOnly().t(bf, n, hidden) // a tensor of another backend
	freed := h.t(bf, n, hidden)
	freed.(*tensor).alloc.freed = true

	for _, tc := range []struct {
		name string
		op   func() error
		ok   bool
	}{
		{"matmul valid", func() error { return h.b.MatMul(y, x, w, nil) }, true},
		{"matmul x inner dim", func() error { return h.b.MatMul(y, h.t(bf, n, hidden+8), w, nil) }, false},
		{"matmul out shape", func() error { return h.b.MatMul(h.t(bf, n, inter-1), x, w, nil) }, false},
		{"matmul out dtype", func() error { return h.b.MatMul(h.t(i32, n, inter), x, w, nil) }, false},
		{"matmul weight dtype", func() error { return h.b.MatMul(y, x, h.t(i32, inter, hidden), nil) }, false},
		{"matmul weight 3-d", func() error { return h.b.MatMul(y, x, h.t(bf, 2, inter, hidden), nil) }, false},
		{"matmul bias length", func() error { return h.b.MatMul(y, x, w, h.t(bf, inter+1)) }, false},
		{"matmul out is x", func() error { return h.b.MatMul(x, x, h.t(bf, hidden, hidden), nil) }, false},
		{"matmul nil x", func() error { return h.b.MatMul(y, nil, w, nil) }, false},
		{"matmul other backend", func() error { return h.b.MatMul(y, other, w, nil) }, false},
		{"matmul freed", func() error { return h.b.MatMul(y, freed, w, nil) }, false},

		{"norm valid", func() error { return h.b.AddRMSNorm(h.t(bf, n, hidden), x, h.t(bf, n, hidden), h.t(bf, hidden), 1e-5) }, true},
		{"norm weight length", func() error { return h.b.AddRMSNorm(h.t(bf, n, hidden), x, nil, h.t(bf, hidden-1), 1e-5) }, false},
		{"norm residual shape", func() error {
			return h.b.AddRMSNorm(h.t(bf, n, hidden), x, h.t(bf, n+1, hidden), h.t(bf, hidden), 1e-5)
		}, false},
		{"norm out shape", func() error { return h.b.AddRMSNorm(h.t(bf, n, hidden+1), x, nil, h.t(bf, hidden), 1e-5) }, false},

		{"silu valid", func() error { return h.b.SiLUMul(h.t(bf, n, inter), h.t(bf, n, 2*inter)) }, true},
		{"silu gateUp width", func() error { return h.b.SiLUMul(h.t(bf, n, inter), h.t(bf, n, 2*inter+2)) }, false},
		{"silu rows", func() error { return h.b.SiLUMul(h.t(bf, n+1, inter), h.t(bf, n, 2*inter)) }, false},

		{"embed valid", func() error { return h.b.Embed(x, h.t(bf, vocab, hidden), h.t(i32, n)) }, true},
		{"embed ids dtype", func() error { return h.b.Embed(x, h.t(bf, vocab, hidden), h.t(f32, n)) }, false},
		{"embed width", func() error { return h.b.Embed(x, h.t(bf, vocab, hidden+8), h.t(i32, n)) }, false},

		{"rope valid", func() error { return h.b.RoPEStoreKV(rope()) }, true},
		{"rope heads not a multiple", func() error { a := rope(); a.NumKVHeads = 3; return h.b.RoPEStoreKV(a) }, false},
		{"rope qkv width", func() error { a := rope(); a.QKV = h.t(bf, n, heads*hd); return h.b.RoPEStoreKV(a) }, false},
		{"rope positions length", func() error { a := rope(); a.Positions = h.t(i32, n+1); return h.b.RoPEStoreKV(a) }, false},
		{"rope cache heads", func() error { a := rope(); a.KCache = h.t(bf, blocks, kvh+1, bs, hd); return h.b.RoPEStoreKV(a) }, false},
		{"rope no KV spec", func() error { a := rope(); a.KV = backend.KVSpec{}; return h.b.RoPEStoreKV(a) }, false},
		{"rope KV block size", func() error { a := rope(); a.KV = backend.PlainKV(bf, 2*bs); return h.b.RoPEStoreKV(a) }, false},
		{"rope Q dtype differs from QKV", func() error { a := rope(); a.Q = h.t(f32, n, heads*hd); return h.b.RoPEStoreKV(a) }, false},
		{"rope inv freq length", func() error { a := rope(); a.InvFreq = h.t(f32, hd); return h.b.RoPEStoreKV(a) }, false},

		{"attention valid", func() error { return h.b.Attention(attn()) }, true},
		{"attention heads not a multiple", func() error { a := attn(); a.NumKVHeads = 3; return h.b.Attention(a) }, false},
		{"attention head dim 96", func() error { a := attn(); a.HeadDim = 96; return h.b.Attention(a) }, false},
		{"attention NaN scale", func() error { a := attn(); a.Scale = float32(math.NaN()); return h.b.Attention(a) }, false},
		{"attention negative window", func() error { a := attn(); a.SlidingWindow = -1; return h.b.Attention(a) }, false},
		{"attention no sequences", func() error { a := attn(); a.NumSeqs = 0; return h.b.Attention(a) }, false},
		{"attention F32 cache", func() error { a := attn(); a.KCache = h.t(f32, blocks, kvh, bs, hd); return h.b.Attention(a) }, false},
		{"attention F32 KV spec", func() error {
			a := attn()
			a.KCache, a.VCache, a.KV = h.t(f32, blocks, kvh, bs, hd), h.t(f32, blocks, kvh, bs, hd), backend.PlainKV(f32, bs)
			return h.b.Attention(a)
		}, false},
		{"attention no context bound", func() error { a := attn(); a.MaxSeqLen = 0; return h.b.Attention(a) }, false},
		{"attention V shape", func() error { a := attn(); a.VCache = h.t(bf, blocks+1, kvh, bs, hd); return h.b.Attention(a) }, false},
		{"attention block tables rows", func() error { a := attn(); a.BlockTables = h.t(i32, 3, 4); return h.b.Attention(a) }, false},
		{"attention query starts", func() error { a := attn(); a.QueryStart = h.t(i32, 2); return h.b.Attention(a) }, false},
		{"attention out overlaps Q", func() error {
			a := attn()
			a.Out = &tensor{b: h.b, dt: bf, shape: []int{n, heads * hd}, ptr: q.(*tensor).ptr + 2, bytes: q.(*tensor).bytes}
			return h.b.Attention(a)
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.op()
			got := h.queued()
			if tc.ok {
				if err != nil || got == 0 {
					t.Fatalf("valid call: err %v, %d ops queued; want accepted", err, got)
				}
				return
			}
			if !errors.Is(err, backend.ErrShape) {
				t.Fatalf("err %v, want ErrShape", err)
			}
			if got != 0 {
				t.Fatalf("refused call queued %d ops", got)
			}
			t.Log(err)
		})
	}
}

// TestTuning checks Options.Tuning's validation and defaults: the zero
// value is the defaults, each field takes its range, and a value outside
// it is an error naming the field, so New fails before it touches a
// device.
func TestTuning(t *testing.T) {
	def := tuning{decodeStages: 3, decodeMaxSplits: 32, decodeWaves: 4, decodeUnroll: 2, gemvMargin: 0.03,
		tuneMaxRows: 64, normPrefetch: 12 << 20, qkvGEMV: gemvConfig{nw: 8, ur: 2}, wqWaves: 4,
		wqDecWaves: 1}
	with := func(f func(*tuning)) tuning {
		r := def
		f(&r)
		return r
	}
	for _, tc := range []struct {
		name string
		in   Tuning
		want tuning
		bad  string // the field an error names; "" for none
	}{
		{name: "defaults", want: def},
		{name: "stages 2", in: Tuning{DecodeStages: 2}, want: with(func(r *tuning) { r.decodeStages = 2 })},
		{name: "stages 4", in: Tuning{DecodeStages: 4}, want: with(func(r *tuning) { r.decodeStages = 4 })},
		{name: "CUDA-core decode", in: Tuning{DecodeStages: -1}, want: with(func(r *tuning) { r.decodeStages = 0 })},
		{name: "stages 1", in: Tuning{DecodeStages: 1}, bad: "DecodeStages"},
		{name: "stages 5", in: Tuning{DecodeStages: 5}, bad: "DecodeStages"},
		{name: "one split", in: Tuning{DecodeMaxSplits: 1}, want: with(func(r *tuning) { r.decodeMaxSplits = 1 })},
		{name: "33 splits", in: Tuning{DecodeMaxSplits: 33}, bad: "DecodeMaxSplits"},
		{name: "negative splits", in: Tuning{DecodeMaxSplits: -2}, bad: "DecodeMaxSplits"},
		{name: "16 waves", in: Tuning{DecodeWaves: 16}, want: with(func(r *tuning) { r.decodeWaves = 16 })},
		{name: "17 waves", in: Tuning{DecodeWaves: 17}, bad: "DecodeWaves"},
		{name: "8 WQ waves", in: Tuning{WQWaves: 8}, want: with(func(r *tuning) { r.wqWaves = 8 })},
		{name: "17 WQ waves", in: Tuning{WQWaves: 17}, bad: "WQWaves"},
		{name: "negative WQ waves", in: Tuning{WQWaves: -1}, bad: "WQWaves"},
		{name: "WQ decode k split 2", in: Tuning{WQDecodeKSplit: 2}, want: with(func(r *tuning) { r.wqDecKSplit = 2 })},
		{name: "WQ decode k split 3", in: Tuning{WQDecodeKSplit: 3}, bad: "WQDecodeKSplit"},
		{name: "WQ decode waves 4", in: Tuning{WQDecodeWaves: 4}, want: with(func(r *tuning) { r.wqDecWaves = 4 })},
		{name: "17 WQ decode waves", in: Tuning{WQDecodeWaves: 17}, bad: "WQDecodeWaves"},
		{name: "unroll 8", in: Tuning{DecodeUnroll: 8}, want: with(func(r *tuning) { r.decodeUnroll = 8 })},
		{name: "unroll 3", in: Tuning{DecodeUnroll: 3}, bad: "DecodeUnroll"},
		{name: "margin 0.1", in: Tuning{GEMVMargin: 0.1}, want: with(func(r *tuning) { r.gemvMargin = 0.1 })},
		{name: "margin 0.5", in: Tuning{GEMVMargin: 0.5}, bad: "GEMVMargin"},
		{name: "negative margin", in: Tuning{GEMVMargin: -0.1}, bad: "GEMVMargin"},
		{name: "NaN margin", in: Tuning{GEMVMargin: math.NaN()}, bad: "GEMVMargin"},
		{name: "tune 8192 rows", in: Tuning{TuneMaxRows: 8192}, want: with(func(r *tuning) { r.tuneMaxRows = 8192 })},
		{name: "tune 1<<20+1 rows", in: Tuning{TuneMaxRows: 1<<20 + 1}, bad: "TuneMaxRows"},
		{name: "tune -1 rows", in: Tuning{TuneMaxRows: -1}, bad: "TuneMaxRows"},
		{name: "prefetch 4 MiB", in: Tuning{NormPrefetchBytes: 4 << 20}, want: with(func(r *tuning) { r.normPrefetch = 4 << 20 })},
		{name: "no prefetch", in: Tuning{NormPrefetchBytes: -1}, want: with(func(r *tuning) { r.normPrefetch = 0 })},
		{name: "prefetch 257 MiB", in: Tuning{NormPrefetchBytes: 257 << 20}, bad: "NormPrefetchBytes"},
		{name: "prefetch -2", in: Tuning{NormPrefetchBytes: -2}, bad: "NormPrefetchBytes"},
		{name: "QKV GEMV 4x8", in: Tuning{QKVGEMV: GEMVVariant{4, 8}}, want: with(func(r *tuning) { r.qkvGEMV = gemvConfig{4, 8} })},
		{name: "QKV GEMV no spans", in: Tuning{QKVGEMV: GEMVVariant{Warps: 8}}, bad: "QKVGEMV"},
		{name: "QKV GEMV 64 warps", in: Tuning{QKVGEMV: GEMVVariant{64, 2}}, bad: "QKVGEMV"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.in.resolve()
			if tc.bad != "" {
				if err == nil || !strings.Contains(err.Error(), "Options.Tuning."+tc.bad+" ") {
					t.Fatalf("%+v: %v, want an error naming %s", tc.in, err, tc.bad)
				}
				if _, nerr := New(Options{Tuning: tc.in}); nerr == nil || nerr.Error() != err.Error() {
					t.Fatalf("New: %v, want %v", nerr, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("%+v: %+v, %v; want %+v", tc.in, got, err, tc.want)
			}
		})
	}
}
