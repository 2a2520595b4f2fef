package cpu

import (
	"bytes"
	"slices"
	"testing"
	"unsafe"

	"github.com/trigon-llm/trigon/backend"
)

func TestUploadKeepsReference(t *testing.T) {
	b := New(Options{})
	data := f32Bytes([]float32{1, 2, 3, 4, 5, 6})
	x := upload(t, b, backend.F32, []int{2, 3}, data)
	copy(data[4:8], f32Bytes([]float32{42}))
	if got := readF32(t, b, x); got[1] != 42 {
		t.Errorf("tensor does not see the caller's bytes: %v", got)
	}
}

// TestUploadCopiesLargeWeights checks the weight arena: large uploads are
// copies (the caller's later writes do not show), 64-byte aligned, do not
// overlap each other, and one with a run of its own starts on a huge page.
func TestUploadCopiesLargeWeights(t *testing.T) {
	b := New(Options{})
	sizes := []int{hugeMinBytes, 3 * hugeMinBytes, weightRunBytes / 2, hugeMinBytes + 4, weightRunBytes/2 - 8}
	var srcs [][]byte
	var ts []*tensor
	for i, n := range sizes {
		src := make([]byte, n)
		for j := range src {
			src[j] = byte(i*31 + j*7)
		}
		x := upload(t, b, backend.F32, []int{n / 4}, src)
		srcs, ts = append(srcs, src), append(ts, x.(*tensor))
	}
	for i, x := range ts {
		want := slices.Clone(srcs[i])
		srcs[i][0] ^= 0xff
		if !bytes.Equal(x.data, want) {
			t.Errorf("upload %d (%d bytes): tensor bytes differ from the data uploaded", i, sizes[i])
		}
		p := uintptr(unsafe.Pointer(&x.data[0]))
		if p%64 != 0 {
			t.Errorf("upload %d at %#x: not 64-byte aligned", i, p)
		}
		if cap(x.data) != len(x.data) {
			t.Errorf("upload %d: capacity %d beyond its %d bytes", i, cap(x.data), len(x.data))
		}
		if sizes[i] >= weightRunBytes/2 && p%hugePageBytes != 0 {
			t.Errorf("upload %d (%d bytes, a run of its own) at %#x: not on a huge-page boundary", i, sizes[i], p)
		}
		for j, y := range ts[:i] {
			if overlaps(x.data, y.data) {
				t.Errorf("uploads %d and %d overlap", j, i)
			}
		}
	}
}

func TestUploadMisalignedCopies(t *testing.T) {
	b := New(Options{})
	raw := make([]byte, 4*3+1)
	data := raw[1:]
	copy(data, f32Bytes([]float32{1, 2, 3}))
	x := upload(t, b, backend.F32, []int{3}, data)
	if p := uintptr(unsafe.Pointer(&x.(*tensor).data[0])); p%4 != 0 {
		t.Fatalf("tensor data at %#x is not 4-byte aligned", p)
	}
	if got := readF32(t, b, x); !slices.Equal(got, []float32{1, 2, 3}) {
		t.Errorf("values %v", got)
	}
}

func TestAllocZeroed(t *testing.T) {
	b := New(Options{})
	// 3 rows of 64 is small Go memory; 3 rows of 1<<20 floats a huge-page run.
	for _, cols := range []int{64, 1 << 20} {
		for _, dt := range []backend.DType{backend.F32, backend.BF16, backend.Q4_0, backend.I32} {
			x, err := b.Alloc(dt, 3, cols)
			if err != nil {
				t.Fatal(err)
			}
			want, _ := dt.Bytes([]int{3, cols})
			buf := make([]byte, want)
			buf[0] = 1
			if err := b.Read(x, buf); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(buf, make([]byte, want)) {
				t.Errorf("%v x %d: Alloc memory is not zeroed", dt, cols)
			}
			if !slices.Equal(x.Shape(), []int{3, cols}) || x.DType() != dt {
				t.Errorf("%v x %d: shape %v dtype %v", dt, cols, x.Shape(), x.DType())
			}
			if d := x.(*tensor).data; len(d) != want || cap(d) != want {
				t.Errorf("%v x %d: %d bytes, capacity %d, want %d", dt, cols, len(d), cap(d), want)
			}
		}
	}
}

func TestViewReshapeShareMemory(t *testing.T) {
	r := newRand(t)
	b := New(Options{})
	t.Run("F32 rows", func(t *testing.T) {
		v := randFloats(r, 4*6, 1)
		x := uploadF32(t, b, v, 4, 6)
		view, err := b.View(x, 1, 2)
		if err != nil {
			t.Fatal(err)
		}
		if got := readF32(t, b, view); !slices.Equal(got, v[6:18]) {
			t.Errorf("view rows %v, want %v", got, v[6:18])
		}
		if err := b.Write(view, f32Bytes(make([]float32, 12))); err != nil {
			t.Fatal(err)
		}
		got := readF32(t, b, x)
		if !slices.Equal(got[6:18], make([]float32, 12)) || !slices.Equal(got[:6], v[:6]) || !slices.Equal(got[18:], v[18:]) {
			t.Errorf("write through the view: base %v", got)
		}
		re, err := b.Reshape(x, 3, 8)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Write(re, f32Bytes(v)); err != nil {
			t.Fatal(err)
		}
		if got := readF32(t, b, x); !slices.Equal(got, v) {
			t.Errorf("write through the reshape: base %v", got)
		}
	})
	t.Run("Q8_0 rows", func(t *testing.T) {
		enc := encode(t, backend.Q8_0, randFloats(r, 5*64, 1))
		x := upload(t, b, backend.Q8_0, []int{5, 64}, enc)
		view, err := b.View(x, 2, 3)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 3*2*34)
		if err := b.Read(view, buf); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf, enc[2*2*34:]) {
			t.Error("quantized view reads the wrong bytes")
		}
	})
}

func TestTensorErrors(t *testing.T) {
	b := New(Options{})
	x := alloc(t, b, backend.F32, 4, 6)
	q := alloc(t, b, backend.Q4_0, 64)
	for _, c := range []struct {
		name string
		fn   func() error
	}{
		{"alloc zero dim", func() error { _, err := b.Alloc(backend.F32, 3, 0); return err }},
		{"alloc negative dim", func() error { _, err := b.Alloc(backend.F32, -1); return err }},
		{"alloc partial block", func() error { _, err := b.Alloc(backend.Q8_0, 2, 33); return err }},
		{"alloc unknown dtype", func() error { _, err := b.Alloc(backend.DType(77), 2); return err }},
		{"alloc overflow", func() error { _, err := b.Alloc(backend.F32, 1<<40, 1<<40); return err }},
		{"upload short", func() error { _, err := b.Upload(backend.F32, []int{2, 3}, make([]byte, 20)); return err }},
		{"upload long", func() error { _, err := b.Upload(backend.BF16, []int{2, 3}, make([]byte, 14)); return err }},
		{"write size", func() error { return b.Write(x, make([]byte, 4)) }},
		{"read size", func() error { return b.Read(x, make([]byte, 100)) }},
		{"view past end", func() error { _, err := b.View(x, 3, 2); return err }},
		{"view negative", func() error { _, err := b.View(x, -1, 2); return err }},
		{"view empty", func() error { _, err := b.View(x, 1, 0); return err }},
		{"view inside a block", func() error { _, err := b.View(q, 16, 32); return err }},
		{"reshape count", func() error { _, err := b.Reshape(x, 5, 5); return err }},
		{"reshape partial block", func() error { _, err := b.Reshape(q, 4, 16); return err }},
		{"reshape zero", func() error { _, err := b.Reshape(x, 0, 24); return err }},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := c.fn(); err == nil {
				t.Error("no error")
			}
		})
	}
	t.Run("freed", func(t *testing.T) {
		y := alloc(t, b, backend.F32, 2)
		b.Free(y)
		b.Free(y) // twice is harmless
		if err := b.Read(y, make([]byte, 8)); err == nil {
			t.Error("read of a freed tensor: no error")
		}
		if _, err := b.View(y, 0, 1); err == nil {
			t.Error("view of a freed tensor: no error")
		}
	})
}
