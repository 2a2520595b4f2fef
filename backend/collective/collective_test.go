package collective_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/collective"
	"github.com/trigon-llm/trigon/backend/cpu"
)

func group(t *testing.T, n int) ([]backend.Backend, []*collective.Comm) {
	t.Helper()
	bs := make([]backend.Backend, n)
	for i := range bs {
		bs[i] = cpu.New(cpu.Options{Threads: 1})
	}
	comms, err := collective.New(bs)
	if err != nil {
		t.Fatal(err)
	}
	return bs, comms
}

// each runs fn for every rank on its own goroutine and returns the errors.
func each(n int, fn func(r int) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = fn(r)
		}()
	}
	wg.Wait()
	return errs
}

func upload(t *testing.T, b backend.Backend, dt backend.DType, shape []int, vals []float32) backend.Tensor {
	t.Helper()
	var raw []byte
	for _, v := range vals {
		if dt == backend.BF16 {
			raw = binary.LittleEndian.AppendUint16(raw, backend.F32ToBF16(v))
		} else {
			raw = binary.LittleEndian.AppendUint32(raw, math.Float32bits(v))
		}
	}
	tt, err := b.Alloc(dt, shape...)
	if err == nil {
		err = b.Write(tt, raw)
	}
	if err != nil {
		t.Fatal(err)
	}
	return tt
}

func read(t *testing.T, b backend.Backend, tt backend.Tensor) []float32 {
	t.Helper()
	n, _ := backend.NumElements(tt.Shape())
	size, _ := tt.DType().Bytes(tt.Shape())
	raw := make([]byte, size)
	if err := b.Read(tt, raw); err != nil {
		t.Fatal(err)
	}
	out := make([]float32, n)
	for i := range out {
		if tt.DType() == backend.BF16 {
			out[i] = backend.BF16ToF32(binary.LittleEndian.Uint16(raw[2*i:]))
		} else {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
		}
	}
	return out
}

func TestAllReduce(t *testing.T) {
	for _, c := range []struct {
		name  string
		ranks int
		dt    backend.DType
		shape []int
	}{
		{"one rank", 1, backend.F32, []int{3, 5}},
		{"two f32", 2, backend.F32, []int{4, 7}},
		{"three f32 uneven split", 3, backend.F32, []int{1, 10}},
		{"four bf16", 4, backend.BF16, []int{5, 8}},
		{"more ranks than elements", 4, backend.F32, []int{1, 2}},
	} {
		t.Run(c.name, func(t *testing.T) {
			bs, comms := group(t, c.ranks)
			n := c.shape[0] * c.shape[1]
			rng := rand.New(rand.NewPCG(uint64(c.ranks), uint64(n)))
			in := make([][]float32, c.ranks)
			ts := make([]backend.Tensor, c.ranks)
			for r := range in {
				in[r] = make([]float32, n)
				for i := range in[r] {
					in[r][i] = float32(rng.NormFloat64())
					if c.dt == backend.BF16 {
						in[r][i] = backend.BF16ToF32(backend.F32ToBF16(in[r][i]))
					}
				}
				ts[r] = upload(t, bs[r], c.dt, c.shape, in[r])
			}
			for r, err := range each(c.ranks, func(r int) error { return comms[r].AllReduce(ts[r]) }) {
				if err != nil {
					t.Fatalf("rank %d: %v", r, err)
				}
			}
			for r := range c.ranks {
				got := read(t, bs[r], ts[r])
				for i := range got {
					// The sum in rank order, in f32: the same bits on every rank.
					want := in[0][i]
					for q := 1; q < c.ranks; q++ {
						want += in[q][i]
					}
					if c.dt == backend.BF16 {
						want = backend.BF16ToF32(backend.F32ToBF16(want))
					}
					if math.Float32bits(got[i]) != math.Float32bits(want) {
						t.Fatalf("rank %d element %d = %v, want %v", r, i, got[i], want)
					}
				}
			}
		})
	}
}

func TestAllGather(t *testing.T) {
	for _, widths := range [][]int{{3}, {2, 2}, {3, 2, 2}, {1, 4, 2, 3}} {
		ranks, rows := len(widths), 3
		bs, comms := group(t, ranks)
		total := 0
		for _, w := range widths {
			total += w
		}
		xs, outs := make([]backend.Tensor, ranks), make([]backend.Tensor, ranks)
		for r := range ranks {
			vals := make([]float32, rows*widths[r])
			for i := range vals {
				vals[i] = float32(100*r + i) // row i/w, column i%w of rank r
			}
			xs[r] = upload(t, bs[r], backend.F32, []int{rows, widths[r]}, vals)
			var err error
			if outs[r], err = bs[r].Alloc(backend.F32, rows, total); err != nil {
				t.Fatal(err)
			}
		}
		for r, err := range each(ranks, func(r int) error { return comms[r].AllGather(outs[r], xs[r], widths) }) {
			if err != nil {
				t.Fatalf("widths %v rank %d: %v", widths, r, err)
			}
		}
		for r := range ranks {
			got := read(t, bs[r], outs[r])
			for i := range rows {
				col := 0
				for q, w := range widths {
					for j := range w {
						if want := float32(100*q + i*w + j); got[i*total+col+j] != want {
							t.Fatalf("widths %v rank %d: out[%d][%d] = %v, want %v", widths, r, i, col+j, got[i*total+col+j], want)
						}
					}
					col += w
				}
			}
		}
	}
}

// TestMismatch: ranks that disagree on a shape all fail, none hangs, and
// the group works again after.
func TestMismatch(t *testing.T) {
	bs, comms := group(t, 2)
	a := upload(t, bs[0], backend.F32, []int{2, 3}, make([]float32, 6))
	b := upload(t, bs[1], backend.F32, []int{3, 2}, make([]float32, 6))
	ts := []backend.Tensor{a, b}
	for r, err := range each(2, func(r int) error { return comms[r].AllReduce(ts[r]) }) {
		if !errors.Is(err, backend.ErrShape) {
			t.Errorf("rank %d: %v, want a shape error", r, err)
		}
	}
	c := upload(t, bs[1], backend.F32, []int{2, 3}, make([]float32, 6))
	ts[1] = c
	for r, err := range each(2, func(r int) error { return comms[r].AllReduce(ts[r]) }) {
		if err != nil {
			t.Errorf("rank %d after the mismatch: %v", r, err)
		}
	}
}

// TestAbort: a rank waiting for one that never comes is released by Abort.
func TestAbort(t *testing.T) {
	bs, comms := group(t, 2)
	x := upload(t, bs[0], backend.F32, []int{1, 4}, make([]float32, 4))
	done := make(chan error)
	go func() { done <- comms[0].AllReduce(x) }()
	comms[0].Group().Abort(errors.New("rank 1 failed"))
	if err := <-done; !errors.Is(err, collective.ErrAborted) {
		t.Fatalf("AllReduce after Abort: %v, want ErrAborted", err)
	}
}

// BenchmarkAllReduce: the in-process sum over 2 and 4 CPU ranks at a
// decode step's shape (batch x hidden, f32) and a prefill chunk's.
func BenchmarkAllReduce(b *testing.B) {
	for _, ranks := range []int{2, 4} {
		for _, rows := range []int{4, 512} {
			b.Run(fmt.Sprintf("ranks%d_%dx4096", ranks, rows), func(b *testing.B) {
				bs := make([]backend.Backend, ranks)
				for i := range bs {
					bs[i] = cpu.New(cpu.Options{Threads: 1})
				}
				comms, err := collective.New(bs)
				if err != nil {
					b.Fatal(err)
				}
				ts := make([]backend.Tensor, ranks)
				for r := range ranks {
					if ts[r], err = bs[r].Alloc(backend.F32, rows, 4096); err != nil {
						b.Fatal(err)
					}
					if err := bs[r].Write(ts[r], make([]byte, 4*rows*4096)); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportAllocs()
				b.SetBytes(int64(4 * rows * 4096))
				for b.Loop() {
					errs := each(ranks, func(r int) error { return comms[r].AllReduce(ts[r]) })
					for _, err := range errs {
						if err != nil {
							b.Fatal(err)
						}
					}
				}
			})
		}
	}
}
