package cuda

import (
	"errors"
	"math"
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
	return &hostOnly{b: &Backend{name: "cuda:host-only", cc: 90, sms: 132, tasks: make(chan task, 16)}, next: 1 << 20}
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
		return backend.RoPEArgs{Q: q, QKV: qkv, Positions: pos, SlotMapping: slots, KCache: kc, VCache: vc,
			InvFreq: invf, NumHeads: heads, NumKVHeads: kvh, HeadDim: hd}
	}
	attn := func() backend.AttentionArgs {
		return backend.AttentionArgs{Out: h.t(bf, n, heads*hd), Q: q, KCache: kc, VCache: vc, BlockTables: bt,
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
		{"rope inv freq length", func() error { a := rope(); a.InvFreq = h.t(f32, hd); return h.b.RoPEStoreKV(a) }, false},

		{"attention valid", func() error { return h.b.Attention(attn()) }, true},
		{"attention heads not a multiple", func() error { a := attn(); a.NumKVHeads = 3; return h.b.Attention(a) }, false},
		{"attention head dim 96", func() error { a := attn(); a.HeadDim = 96; return h.b.Attention(a) }, false},
		{"attention NaN scale", func() error { a := attn(); a.Scale = float32(math.NaN()); return h.b.Attention(a) }, false},
		{"attention negative window", func() error { a := attn(); a.SlidingWindow = -1; return h.b.Attention(a) }, false},
		{"attention no sequences", func() error { a := attn(); a.NumSeqs = 0; return h.b.Attention(a) }, false},
		{"attention F32 cache", func() error { a := attn(); a.KCache = h.t(f32, blocks, kvh, bs, hd); return h.b.Attention(a) }, false},
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

func TestParseGEMVMargin(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want float64
		ok   bool
	}{{"0", 0, true}, {"0.10", 0.10, true}, {"0.03", 0.03, true}, {"0.5", 0, false}, {"-0.1", 0, false}, {"NaN", 0, false}, {"", 0, false}, {"10%", 0, false}} {
		got, err := parseGEMVMargin(tc.in)
		if (err == nil) != tc.ok || (tc.ok && got != tc.want) {
			t.Errorf("parseGEMVMargin(%q) = %g, %v; want %g, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func TestParseTuneMaxRows(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
		ok   bool
	}{{"64", 64, true}, {"1", 1, true}, {"8192", 8192, true}, {"1048576", 1 << 20, true}, {"0", 0, false}, {"-4", 0, false}, {"1048577", 0, false}, {"", 0, false}, {"2k", 0, false}} {
		got, err := parseTuneMaxRows(tc.in)
		if (err == nil) != tc.ok || (tc.ok && got != tc.want) {
			t.Errorf("parseTuneMaxRows(%q) = %d, %v; want %d, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}
