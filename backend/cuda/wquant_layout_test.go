package cuda

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/trigon-llm/trigon/backend"
)

// TestAWQRepack checks the AWQ4 device layout without a GPU, on rows of
// fresh random values: translating back gives the format's bytes again,
// and reading the device rows the way awq_quad does (lane quad tq of
// chunk c takes words tq + 4q at 64c + 4*(tq*Q + q), their groups'
// headers from the plane after the nibbles) gives backend's dequantized
// values for every input, over every group size and row widths whose
// last chunk holds 32, 64, 96 or 128 inputs.
func TestAWQRepack(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("random seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 1))
	for _, dt := range []backend.DType{backend.AWQ4G32, backend.AWQ4G64, backend.AWQ4G128} {
		g := backend.AWQGroup(dt)
		for _, k := range []int{32, 64, 96, 128, 160, 192, 224, 384, 448, 640, 4096 + 96} {
			if k%g != 0 {
				continue
			}
			t.Run(fmt.Sprintf("%v_k%d", dt, k), func(t *testing.T) {
				const rows = 3
				vals := make([]float32, rows*k)
				for i := range vals {
					vals[i] = float32(r.NormFloat64())
				}
				host := encodeWQ(t, dt, vals, rows, k)
				dev := make([]byte, len(host))
				if err := awqRepack(dt, dev, host, k, true); err != nil {
					t.Fatal(err)
				}
				back := make([]byte, len(host))
				if err := awqRepack(dt, back, dev, k, false); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(back, host) {
					t.Fatal("device layout does not translate back to the format's bytes")
				}
				want, err := backend.DequantizeRows(dt, host, rows, k)
				if err != nil {
					t.Fatal(err)
				}
				rb := len(host) / rows
				for row := range rows {
					got := laneQuadDecode(dev[row*rb:(row+1)*rb], k, g)
					for i, v := range got {
						if w := want[row*k+i]; v != w {
							t.Fatalf("row %d input %d: the lane quads read %v, want %v", row, i, v, w)
						}
					}
				}
			})
		}
	}
	if err := awqRepack(backend.AWQ4G128, make([]byte, 68), make([]byte, 68), 96, true); err == nil {
		t.Error("a row of 96 inputs in groups of 128 was accepted")
	}
}

// laneQuadDecode decodes one device row of k inputs in groups of g as
// awq_quad and awq_pairs read it.
func laneQuadDecode(row []byte, k, g int) []float32 {
	out := make([]float32, k)
	u32 := func(off int) uint32 { return binary.LittleEndian.Uint32(row[off:]) }
	for c := 0; c*128 < k; c++ {
		quads := min(4, k/32-4*c)
		for tq := range 4 {
			for q := range quads {
				word := u32(64*c + 4*(tq*quads+q))
				first := 128*c + 8*tq + 32*q
				hdr := u32(k/2 + 4*(first/g))
				s := backend.F16ToF32(uint16(hdr))
				z := backend.F16ToF32(uint16(hdr >> 16))
				for p := range 4 {
					out[first+2*p] = (float32((word>>(4*p))&15) - z) * s
					out[first+2*p+1] = (float32((word>>(4*p+16))&15) - z) * s
				}
			}
		}
	}
	return out
}

// TestAWQReadBack uploads AWQ4 weights and reads them back: the device
// layout stays inside the backend (Read and ReadAsync translate), and a
// reshape that changes the row width is refused.
func TestAWQReadBack(t *testing.T) {
	g := sharedBackend(t, true)
	p := newPair(t)
	for _, dt := range []backend.DType{backend.AWQ4G32, backend.AWQ4G128} {
		rows, k := 5, 640
		data := encodeWQ(t, dt, p.normal(rows*k, 1), rows, k)
		w := p.gpuT(dt, []int{rows, k}, data)
		got := make([]byte, len(data))
		p.must("read", g.Read(w, got))
		if !bytes.Equal(got, data) {
			t.Errorf("%v: Read returned other bytes than were uploaded", dt)
		}
		wait, err := g.ReadAsync(w, got)
		p.must("read async", err)
		clear(got)
		p.must("wait", wait())
		if !bytes.Equal(got, data) {
			t.Errorf("%v: ReadAsync returned other bytes than were uploaded", dt)
		}
		v, err := g.View(w, 2, 3)
		p.must("view", err)
		vb := make([]byte, 3*len(data)/rows)
		p.must("read view", g.Read(v, vb))
		if !bytes.Equal(vb, data[2*len(data)/rows:]) {
			t.Errorf("%v: a view of rows 2..4 reads other bytes than theirs", dt)
		}
		if _, err := g.Reshape(w, rows*k/128, 128); err == nil {
			t.Errorf("%v: reshape of rows of %d to rows of 128 accepted", dt, k)
		}
	}
}
