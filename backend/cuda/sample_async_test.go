package cuda

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/backend"
)

// TestSampleTo checks SampleTo + ReadAsync against Sample on fresh random
// logits (greedy and sampled rows), with a second sampling queued before
// the first read is waited for, and ReadAsync's limits.
func TestSampleTo(t *testing.T) {
	sharedBackend(t, true)
	p := newPair(t)
	const n, vocab = 8, 128256
	rows := make([]backend.SampleRow, n)
	for i := range rows {
		if i%2 == 1 {
			rows[i] = backend.SampleRow{Temperature: 0.8, TopK: 40, TopP: 0.95, U: p.r.Float32()}
		}
	}
	_, l1 := p.same(backend.F32, []int{n, vocab}, encode(backend.F32, p.normal(n*vocab, 3)))
	_, l2 := p.same(backend.F32, []int{n, vocab}, encode(backend.F32, p.normal(n*vocab, 3)))
	want1, err := p.g.Sample(backend.SampleArgs{Logits: l1, Rows: rows})
	p.must("sample 1", err)
	want2, err := p.g.Sample(backend.SampleArgs{Logits: l2, Rows: rows})
	p.must("sample 2", err)
	ids1, ids2 := p.poisoned(backend.I32, n), p.poisoned(backend.I32, n)
	raw1, raw2 := make([]byte, 4*n), make([]byte, 4*n)
	p.must("sample to 1", p.g.SampleTo(ids1, backend.SampleArgs{Logits: l1, Rows: rows}))
	wait1, err := p.g.ReadAsync(ids1, raw1)
	p.must("read 1", err)
	p.must("sample to 2", p.g.SampleTo(ids2, backend.SampleArgs{Logits: l2, Rows: rows}))
	wait2, err := p.g.ReadAsync(ids2, raw2)
	p.must("read 2", err)
	p.must("wait 1", wait1())
	p.must("wait 2", wait2())
	if err := wait1(); err == nil {
		t.Error("a second wait succeeded")
	}
	for i := range n {
		if g1, g2 := int32(binary.LittleEndian.Uint32(raw1[4*i:])), int32(binary.LittleEndian.Uint32(raw2[4*i:])); g1 != want1[i] || g2 != want2[i] {
			t.Fatalf("row %d: SampleTo picked %d and %d, Sample %d and %d", i, g1, g2, want1[i], want2[i])
		}
	}
	// Limits: a read larger than MaxAsyncRead, and more than MaxAsyncReads pending.
	big := p.poisoned(backend.I32, backend.MaxAsyncRead/4+1)
	if _, err := p.g.ReadAsync(big, make([]byte, backend.MaxAsyncRead+4)); err == nil {
		t.Error("a read past MaxAsyncRead was accepted")
	}
	var waits []func() error
	for range backend.MaxAsyncReads + 1 {
		w, err := p.g.ReadAsync(ids1, make([]byte, 4*n))
		p.must("queue read", err)
		waits = append(waits, w)
	}
	for i, w := range waits {
		err := w()
		if i < backend.MaxAsyncReads && err != nil {
			t.Errorf("read %d: %v", i, err)
		}
		if i == backend.MaxAsyncReads && (err == nil || !strings.Contains(err.Error(), "pending")) {
			t.Errorf("read %d beyond the limit: %v, want an error naming the pending reads", i, err)
		}
	}
	p.must("sync", p.g.Sync())
}

// TestSmallCopies writes random bytes with Write and reads them back with
// Read and ReadAsync, through copy_words (whole words up to a ring slot)
// and through the copy engines (odd sizes; sizes past a ring slot), back
// to back without a sync between them, so a kernel copy reading a ring
// slot the host reuses, or a read landing late, shows.
func TestSmallCopies(t *testing.T) {
	p := newPair(t)
	type tc struct {
		dt backend.DType
		n  int // elements
	}
	cases := []tc{{backend.I32, 1}, {backend.BF16, 3}, {backend.I32, 620}, {backend.I32, 16 << 10},
		{backend.I32, ringSlotBytes / 4}, {backend.I32, ringSlotBytes/4 + 1}, {backend.BF16, 4097}}
	// Twice the ring: slots are reused while earlier copies may be queued.
	for round := range 2 * ringSlots / len(cases) {
		ts, want := make([]backend.Tensor, len(cases)), make([][]byte, len(cases))
		for i, c := range cases {
			ts[i] = p.poisoned(c.dt, c.n)
			size, _ := c.dt.Bytes([]int{c.n})
			want[i] = make([]byte, size)
			for j := range want[i] {
				want[i][j] = byte(p.r.Uint32())
			}
			p.must("write", p.g.Write(ts[i], want[i]))
		}
		var waits []func() error
		var got [][]byte
		for i := range cases {
			if len(want[i]) > backend.MaxAsyncRead || len(waits) == backend.MaxAsyncReads {
				continue
			}
			buf := make([]byte, len(want[i]))
			w, err := p.g.ReadAsync(ts[i], buf)
			p.must("read async", err)
			waits, got = append(waits, w), append(got, buf)
		}
		k := 0
		for i := range cases {
			if len(want[i]) > backend.MaxAsyncRead || k == len(waits) {
				continue
			}
			p.must("wait", waits[k]())
			if !bytes.Equal(got[k], want[i]) {
				t.Errorf("round %d, %v[%d]: ReadAsync differs from what was written", round, cases[i].dt, cases[i].n)
			}
			k++
		}
		for i := range cases {
			if b := readBytes(t, p.g, ts[i]); !bytes.Equal(b, want[i]) {
				t.Errorf("round %d, %v[%d]: Read differs from what was written", round, cases[i].dt, cases[i].n)
			}
		}
	}
}
