package cuda

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/trigon-llm/trigon/backend"
)

func TestSizeClass(t *testing.T) {
	for _, tc := range []struct{ n, want int }{
		{1, 256}, {256, 256}, {257, 512}, {1 << 20, 1 << 20}, {1<<20 + 1, 1<<20 + 1<<18}, {3 << 20, 3 << 20}, {100 << 20, 112 << 20},
	} {
		if got := sizeClass(tc.n); got != tc.want {
			t.Errorf("sizeClass(%d) = %d, want %d", tc.n, got, tc.want)
		}
		if got := sizeClass(tc.n); got < tc.n || (tc.n >= 256 && got > 2*tc.n) {
			t.Errorf("sizeClass(%d) = %d outside [n, 2n]", tc.n, got)
		}
	}
}

// TestReadWrite round-trips bytes through the small-write ring and the
// chunked staging path, through views and reshapes, and after the pool
// has recycled blocks.
func TestReadWrite(t *testing.T) {
	p := newPair(t)
	g := p.g
	for _, size := range []int{4, 1000, ringSlotBytes, ringSlotBytes + 4, stageBytes + 12344} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			data := make([]byte, size)
			for i := range data {
				data[i] = byte(p.r.IntN(256))
			}
			x := p.gpuT(backend.I32, []int{size / 4}, data)
			if got := readBytes(t, g, x); !bytes.Equal(got, data) {
				t.Fatal("read back differs")
			}
			if size >= 8 {
				v, err := g.View(x, 1, size/4-1)
				p.must("view", err)
				if got := readBytes(t, g, v); !bytes.Equal(got, data[4:]) {
					t.Fatal("view differs")
				}
				r, err := g.Reshape(v, 1, size/4-1)
				p.must("reshape", err)
				upd := make([]byte, size-4)
				for i := range upd {
					upd[i] = byte(p.r.IntN(256))
				}
				p.must("write", g.Write(r, upd))
				if got := readBytes(t, g, x); !bytes.Equal(got[4:], upd) || !bytes.Equal(got[:4], data[:4]) {
					t.Fatal("write through a reshaped view misplaced bytes")
				}
			}
		})
	}
	t.Run("reuse", func(t *testing.T) {
		a, err := g.Alloc(backend.BF16, 1000, 64)
		p.must("alloc", err)
		ptr := a.(*tensor).ptr
		g.Free(a)
		b, err := g.Alloc(backend.BF16, 1000, 64)
		p.must("alloc", err)
		p.gts = append(p.gts, b)
		if b.(*tensor).ptr != ptr {
			t.Errorf("freed block not reused: %#x then %#x", ptr, b.(*tensor).ptr)
		}
		if err := g.Read(a, make([]byte, 128000)); err == nil {
			t.Error("read of a freed tensor succeeded")
		}
	})
	t.Run("errors", func(t *testing.T) {
		x := p.gpuT(backend.F32, []int{4, 4}, make([]byte, 64))
		if err := g.Write(x, make([]byte, 60)); err == nil {
			t.Error("short write accepted")
		}
		if _, err := g.View(x, 3, 2); err == nil {
			t.Error("view past the end accepted")
		}
		if _, err := g.Reshape(x, 5, 3); err == nil {
			t.Error("reshape changing the size accepted")
		}
		if _, err := g.Alloc(backend.Q8_0, 3, 33); err == nil {
			t.Error("Q8_0 row of 33 accepted")
		}
	})
}

// TestReadReportsDeferredError checks that Read, like Sync, reports (and
// clears) the error of an op queued before it that failed on the CUDA
// thread: the tensor's bytes are then not that op's result, and handing
// them back without an error once let a kernel that did not compile pass
// as stale logits.
func TestReadReportsDeferredError(t *testing.T) {
	g := sharedBackend(t, true)
	x, err := g.Upload(backend.F32, []int{4}, make([]byte, 16))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Free(x)
	boom := errors.New("a queued op failed")
	if err := g.post(func() error { return boom }); err != nil {
		t.Fatal(err)
	}
	if err := g.Read(x, make([]byte, 16)); !errors.Is(err, boom) {
		t.Fatalf("Read after a failed op: %v, want %v", err, boom)
	}
	if err := g.Sync(); err != nil {
		t.Fatalf("Sync after Read reported %v: Read should have cleared the error", err)
	}
	if err := g.Read(x, make([]byte, 16)); err != nil {
		t.Fatalf("a second Read: %v", err)
	}
}
