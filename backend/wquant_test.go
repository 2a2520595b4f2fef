package backend

import (
	"encoding/binary"
	"errors"
	"math"
	"testing"

	"github.com/trigon-llm/trigon/backend/backendtest"
)

// awqRef decodes AWQ4 blocks of g from the layout's definition (wquant.go),
// independently of dequantAWQ4.
func awqRef(b []byte, n, g int) []float64 {
	out := make([]float64, n)
	bb := 4 + g/2
	for k := range n {
		blk := b[k/g*bb:]
		s := backendtest.RefF16(binary.LittleEndian.Uint16(blk))
		z := backendtest.RefF16(binary.LittleEndian.Uint16(blk[2:]))
		j := k % g
		// Element j is in word j/8, at the nibble that holds element j%8
		// in AutoAWQ's order [0,2,4,6,1,3,5,7]: its inverse.
		nib := [8]int{0, 4, 1, 5, 2, 6, 3, 7}[j%8]
		word := binary.LittleEndian.Uint32(blk[4+4*(j/8):])
		q := uint8(word >> (4 * nib) & 15)
		out[k] = (float64(q) - z) * s
	}
	return out
}

func TestAWQ4RoundTrip(t *testing.T) {
	r := backendtest.NewRand(t)
	for _, g := range []int{32, 64, 128} {
		dt, err := AWQDType(g)
		if err != nil {
			t.Fatal(err)
		}
		if AWQGroup(dt) != g || dt.BlockSize() != g || dt.BlockBytes() != 4+g/2 || !dt.Quantized() {
			t.Fatalf("%v: group %d, block %d of %d bytes, quantized %v", dt, AWQGroup(dt), dt.BlockSize(), dt.BlockBytes(), dt.Quantized())
		}
		t.Run(dt.String(), func(t *testing.T) {
			for _, n := range []int{g, 3 * g, 4096} {
				x := backendtest.RandFloats(r, n, 1+r.Float64()*10)
				b, err := EncodeAWQ4(x, g)
				if err != nil {
					t.Fatal(err)
				}
				if want, _ := dt.RowBytes(n); len(b) != want {
					t.Fatalf("%d values: %d bytes, want %d", n, len(b), want)
				}
				got := make([]float32, n)
				if err := DequantizeRow(dt, b, got); err != nil {
					t.Fatal(err)
				}
				ref := awqRef(b, n, g)
				backendtest.CheckClose(t, "dequantized", got, ref, nil, 1e-6, 0)
				// Round to nearest: each value within half a step of its
				// group's scale (the range holds every value and 0).
				bound := make([]float64, n)
				for k := range n {
					s := backendtest.RefF16(binary.LittleEndian.Uint16(b[k/g*(4+g/2):]))
					bound[k] = s * 0.5001
				}
				for k := range n {
					if d := math.Abs(float64(got[k]) - float64(x[k])); d > bound[k] {
						t.Fatalf("value %d: %v decodes to %v, off by %.3g > half a step %.3g", k, x[k], got[k], d, bound[k])
					}
				}
			}
		})
	}
	// Whole blocks are self-contained: two rows decode as one run.
	x := backendtest.RandFloats(r, 128, 2)
	a, _ := EncodeAWQ4(x[:64], 32)
	b, _ := EncodeAWQ4(x[64:], 32)
	both := make([]float32, 128)
	if err := DequantizeRow(AWQ4G32, append(a, b...), both); err != nil {
		t.Fatal(err)
	}
	rows, err := DequantizeRows(AWQ4G32, append(a, b...), 2, 64)
	if err != nil {
		t.Fatal(err)
	}
	backendtest.CheckClose(t, "rows", rows, backendtest.Widen(both), nil, 0, 0)
}

func TestAWQ4Errors(t *testing.T) {
	if _, err := AWQDType(16); err == nil {
		t.Error("group 16: no error")
	}
	if _, err := EncodeAWQ4(make([]float32, 40), 32); !errors.Is(err, ErrShape) {
		t.Errorf("40 values in groups of 32: %v", err)
	}
	if _, err := EncodeAWQ4([]float32{float32(math.NaN()), 0}, 2); err == nil {
		t.Error("NaN: no error")
	}
	dst := make([]byte, 20)
	q := make([]uint8, 32)
	if err := PackAWQ4(dst, q, []uint16{0x3c00}, []uint8{16}, 32); err == nil {
		t.Error("zero point 16: no error")
	}
	q[3] = 16
	if err := PackAWQ4(dst, q, []uint16{0x3c00}, []uint8{0}, 32); err == nil {
		t.Error("value 16: no error")
	}
	if err := PackAWQ4(dst[:19], make([]uint8, 32), []uint16{0x3c00}, []uint8{0}, 32); err == nil {
		t.Error("short dst: no error")
	}
}

func TestF8E4M3Row(t *testing.T) {
	r := backendtest.NewRand(t)
	dt := F8E4M3Row
	if rb, _ := dt.RowBytes(64); rb != 80 || !dt.Quantized() {
		t.Fatalf("row of 64: %d bytes, quantized %v", rb, dt.Quantized())
	}
	for _, n := range []int{16, 320, 4096} {
		x := backendtest.RandFloats(r, n, 1+r.Float64()*10)
		b, err := EncodeF8E4M3Row(x, 0)
		if err != nil {
			t.Fatal(err)
		}
		got := make([]float32, n)
		if err := DequantizeRow(dt, b, got); err != nil {
			t.Fatal(err)
		}
		s := float64(math.Float32frombits(binary.LittleEndian.Uint32(b[n:])))
		var amax float64
		for _, v := range x {
			amax = max(amax, math.Abs(float64(v)))
		}
		if math.Abs(s-amax/448) > 1e-7*s {
			t.Fatalf("scale %v, want max|x|/448 = %v", s, amax/448)
		}
		for i, c := range b[n+4:] {
			if c != 0 {
				t.Fatalf("trailer byte %d is %d", 4+i, c)
			}
		}
		for k := range n {
			want := float64(E4M3ToF32(b[k])) * s
			if float64(got[k]) != float64(float32(want)) {
				t.Fatalf("value %d: %v, want %v", k, got[k], want)
			}
			// Three mantissa bits: half an ulp is 1/16 relative above
			// e4m3's subnormals, whose step is 2^-9 of the scale.
			if d := math.Abs(float64(got[k]) - float64(x[k])); d > math.Abs(float64(x[k]))/16+s/1024+1e-12 {
				t.Fatalf("value %d: %v decodes to %v", k, x[k], got[k])
			}
		}
	}
	// Two rows are two units: decoding them as one run is refused.
	a, _ := EncodeF8E4M3Row(backendtest.RandFloats(r, 32, 1), 0)
	b, _ := EncodeF8E4M3Row(backendtest.RandFloats(r, 32, 1), 0.5)
	if err := DequantizeRow(dt, append(a, b...), make([]float32, 64)); !errors.Is(err, ErrShape) {
		t.Errorf("two rows as one: %v", err)
	}
	rows, err := DequantizeRows(dt, append(a, b...), 2, 32)
	if err != nil {
		t.Fatal(err)
	}
	if F8RowScale(b) != 0.5 || rows[32] != E4M3ToF32(b[0])*0.5 {
		t.Errorf("second row: scale %v, value %v", F8RowScale(b), rows[32])
	}
	if _, err := EncodeF8E4M3Row(make([]float32, 20), 0); err == nil {
		t.Error("20 values: no error")
	}
}

func TestQuantizeActE4M3(t *testing.T) {
	r := backendtest.NewRand(t)
	x := backendtest.RandFloats(r, 100, 5)
	got := make([]float32, len(x))
	s := QuantizeActE4M3(x, got)
	if s != E4M3Scale(x) {
		t.Fatalf("scale %v, want %v", s, E4M3Scale(x))
	}
	for i, v := range x {
		if want := E4M3ToF32(F32ToE4M3(v/s)) * s; got[i] != want && !(got[i] == 0 && want == 0) {
			// v*(1/s) and v/s may differ by an ulp before rounding to
			// e4m3; they land on the same code except at a tie.
			if math.Abs(float64(got[i]-want)) > math.Abs(float64(want))/8 {
				t.Fatalf("x[%d] = %v: %v, want %v", i, v, got[i], want)
			}
		}
	}
	zeros := make([]float32, 16)
	if s := QuantizeActE4M3(zeros, zeros); s != 1 || zeros[3] != 0 {
		t.Errorf("zeros: scale %v, value %v", s, zeros[3])
	}
}
