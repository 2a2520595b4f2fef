package backend

import (
	"encoding/binary"
	"errors"
	"math"
	"sort"
	"testing"
)

// nearestCode is an independent reference for round-to-nearest-even into a
// 16-bit float format: it binary-searches the format's positive codes (which
// sort like their values) in f64. The infinity code stands for the next
// power of two, which is exactly where IEEE rounding overflows.
func nearestCode(f float64, value func(uint16) float64, infCode uint16, infAs float64) uint16 {
	sign := uint16(0)
	if math.Signbit(f) {
		sign, f = 0x8000, -f
	}
	val := func(c uint16) float64 {
		if c == infCode {
			return infAs
		}
		return value(c)
	}
	if f >= infAs {
		return sign | infCode
	}
	// First code whose value is >= f.
	hi := uint16(sort.Search(int(infCode)+1, func(c int) bool { return val(uint16(c)) >= f }))
	if hi == 0 || val(hi) == f {
		return sign | hi
	}
	lo := hi - 1
	dl, dh := f-val(lo), val(hi)-f
	switch {
	case dl < dh:
		return sign | lo
	case dh < dl:
		return sign | hi
	case lo&1 == 0:
		return sign | lo
	}
	return sign | hi
}

func refBF16(f float32) uint16 {
	return nearestCode(float64(f), func(c uint16) float64 { return float64(math.Float32frombits(uint32(c) << 16)) }, 0x7f80, math.Ldexp(1, 128))
}

func refToF16(f float32) uint16 {
	return nearestCode(float64(f), refF16, 0x7c00, 65536)
}

// edgeFloats are values around every boundary the conversions care about,
// plus random ones in every binade.
func edgeFloats() []float32 {
	v := []float32{0, 1, 1.5, 65504, 65505, 65519.99, 65520, 65536, 1e10, math.MaxFloat32,
		6.1035156e-05, 6.097555e-05, 5.9604645e-08, 2.9802322e-08, 2.9802326e-08, 8.940697e-08, 1e-10,
		math.SmallestNonzeroFloat32, 1.1754942e-38, 3.3895314e38, 3.3961776e38, 1.00390625, 1.01171875,
		1 + 1.0/2048, 1 + 3.0/2048, 0.1, 1.0 / 3}
	var out []float32
	for _, f := range v {
		b := math.Float32bits(f)
		for _, x := range []float32{f, math.Float32frombits(b + 1), math.Float32frombits(b - 1)} {
			if x == x { // NaN has its own cases
				out = append(out, x, -x)
			}
		}
	}
	return out
}

func TestBF16(t *testing.T) {
	r := newRand(t)
	vals := edgeFloats()
	for range 20000 {
		vals = append(vals, math.Float32frombits(r.Uint32()&0x7f7fffff|r.Uint32()&0x80000000))
	}
	t.Run("round", func(t *testing.T) {
		for _, f := range vals {
			if got, want := F32ToBF16(f), refBF16(f); got != want {
				t.Fatalf("F32ToBF16(%g [%#08x]) = %#04x, want %#04x", f, math.Float32bits(f), got, want)
			}
		}
	})
	t.Run("specials", func(t *testing.T) {
		for _, c := range []struct {
			in   float32
			want uint16
		}{
			{float32(math.Inf(1)), 0x7f80},
			{float32(math.Inf(-1)), 0xff80},
			{float32(math.Copysign(0, -1)), 0x8000},
		} {
			if got := F32ToBF16(c.in); got != c.want {
				t.Errorf("F32ToBF16(%v) = %#04x, want %#04x", c.in, got, c.want)
			}
		}
		for _, nan := range []uint32{0x7fc00000, 0x7f800001, 0xffffffff, 0x7f80ffff} {
			h := F32ToBF16(math.Float32frombits(nan))
			if f := BF16ToF32(h); f == f {
				t.Errorf("NaN %#08x became %#04x = %v", nan, h, f)
			}
			if h>>15 != uint16(nan>>31) {
				t.Errorf("NaN %#08x lost its sign: %#04x", nan, h)
			}
		}
	})
	t.Run("roundtrip", func(t *testing.T) {
		for c := range 1 << 16 {
			f := BF16ToF32(uint16(c))
			if f != f {
				continue
			}
			if got := F32ToBF16(f); got != uint16(c) {
				t.Fatalf("F32ToBF16(BF16ToF32(%#04x)) = %#04x", c, got)
			}
		}
	})
}

func TestF16(t *testing.T) {
	r := newRand(t)
	t.Run("widen", func(t *testing.T) {
		for c := range 1 << 16 {
			got, want := F16ToF32(uint16(c)), refF16(uint16(c))
			if math.IsNaN(want) {
				if got == got {
					t.Fatalf("F16ToF32(%#04x) = %v, want NaN", c, got)
				}
				continue
			}
			if float64(got) != want || math.Signbit(float64(got)) != (c&0x8000 != 0) {
				t.Fatalf("F16ToF32(%#04x) = %v, want %v", c, got, want)
			}
		}
	})
	t.Run("round", func(t *testing.T) {
		vals := edgeFloats()
		for range 20000 {
			// Exponents concentrated around half's range, subnormals included.
			e := r.IntN(50) - 30
			f := float32(math.Ldexp(1+r.Float64(), e))
			if r.IntN(2) == 0 {
				f = -f
			}
			vals = append(vals, f)
		}
		for c := range 1 << 16 {
			// Exact midpoints between neighbouring halves: the ties.
			a, b := refF16(uint16(c)), refF16(uint16(c+1))
			if c&0x7fff < 0x7bff && !math.IsNaN(a) {
				vals = append(vals, float32((a+b)/2))
			}
		}
		for _, f := range vals {
			if got, want := F32ToF16(f), refToF16(f); got != want {
				t.Fatalf("F32ToF16(%g [%#08x]) = %#04x, want %#04x", f, math.Float32bits(f), got, want)
			}
		}
	})
	t.Run("specials", func(t *testing.T) {
		if got := F32ToF16(float32(math.Inf(1))); got != 0x7c00 {
			t.Errorf("+Inf -> %#04x", got)
		}
		if got := F32ToF16(float32(math.Inf(-1))); got != 0xfc00 {
			t.Errorf("-Inf -> %#04x", got)
		}
		for _, nan := range []uint32{0x7fc00000, 0x7f800001, 0xff800001, 0x7fffffff} {
			h := F32ToF16(math.Float32frombits(nan))
			if h&0x7c00 != 0x7c00 || h&0x3ff == 0 || h>>15 != uint16(nan>>31) {
				t.Errorf("NaN %#08x -> %#04x, want a NaN of the same sign", nan, h)
			}
		}
	})
	t.Run("roundtrip", func(t *testing.T) {
		for c := range 1 << 16 {
			f := F16ToF32(uint16(c))
			if f != f {
				continue
			}
			if got := F32ToF16(f); got != uint16(c) {
				t.Fatalf("F32ToF16(F16ToF32(%#04x)) = %#04x", c, got)
			}
		}
	})
}

func TestQuantizeKnownBlock(t *testing.T) {
	// x[j] = j - 16 for j < 32: max magnitude -16 at j = 0.
	x := make([]float32, 32)
	for j := range x {
		x[j] = float32(j - 16)
	}
	t.Run("Q8_0", func(t *testing.T) {
		b, err := QuantizeQ8_0(x)
		if err != nil {
			t.Fatal(err)
		}
		d := refF16(binary.LittleEndian.Uint16(b))
		if want := refF16(F32ToF16(16.0 / 127)); d != want {
			t.Errorf("scale %v, want %v", d, want)
		}
		for j := range 32 {
			want := math.Round(float64(float32(x[j]) * (1 / (float32(16) / 127))))
			if got := float64(int8(b[2+j])); got != want {
				t.Errorf("q[%d] = %v, want %v", j, got, want)
			}
		}
	})
	t.Run("Q4_0", func(t *testing.T) {
		b, err := QuantizeQ4_0(x)
		if err != nil {
			t.Fatal(err)
		}
		// d = -16 / -8 = 2: nibble = trunc(x/2 + 8.5) clamped to 15.
		if d := refF16(binary.LittleEndian.Uint16(b)); d != 2 {
			t.Errorf("scale %v, want 2", d)
		}
		for j := range 16 {
			lo, hi := int(b[2+j]&15), int(b[2+j]>>4)
			wantLo := min(15, int(float64(x[j])/2+8.5))
			wantHi := min(15, int(float64(x[j+16])/2+8.5))
			if lo != wantLo || hi != wantHi {
				t.Errorf("byte %d: nibbles %d,%d want %d,%d", j, lo, hi, wantLo, wantHi)
			}
		}
	})
}

func TestQuantizeError(t *testing.T) {
	r := newRand(t)
	for _, c := range []struct {
		dt       DType
		quantize func([]float32) ([]byte, error)
		maxRel   float64
	}{
		{Q8_0, QuantizeQ8_0, 0.01},
		{Q4_0, QuantizeQ4_0, 0.15},
	} {
		t.Run(c.dt.String(), func(t *testing.T) {
			for _, n := range []int{32, 96, 4096} {
				x := randFloats(r, n, 1+r.Float64()*10)
				b, err := c.quantize(x)
				if err != nil {
					t.Fatal(err)
				}
				if want, _ := c.dt.RowBytes(n); len(b) != want {
					t.Fatalf("%d values: %d bytes, want %d", n, len(b), want)
				}
				ref := decodeRef(t, c.dt, b, n)
				got := make([]float32, n)
				if err := DequantizeRow(c.dt, b, got); err != nil {
					t.Fatal(err)
				}
				// DequantizeRow agrees with the layout's definition...
				checkClose(t, "dequantized", got, ref, nil, 1e-7, 0)
				// ...and the quantization error is what the format allows.
				if e := relNorm(got, widen(x)); e > c.maxRel {
					t.Errorf("%d values: relative error %.4f, want <= %v", n, e, c.maxRel)
				}
			}
			if _, err := c.quantize(make([]float32, 33)); err == nil {
				t.Error("33 values: no error")
			}
		})
	}
}

func TestDequantizeRowFloat(t *testing.T) {
	r := newRand(t)
	for _, dt := range []DType{F32, F16, BF16} {
		t.Run(dt.String(), func(t *testing.T) {
			x := randFloats(r, 37, 3)
			b := encode(t, dt, x)
			got := make([]float32, len(x))
			if err := DequantizeRow(dt, b, got); err != nil {
				t.Fatal(err)
			}
			checkClose(t, "values", got, decodeRef(t, dt, b, len(x)), nil, 0, 0)
		})
	}
}

func TestDequantizeRowErrors(t *testing.T) {
	for _, c := range []struct {
		name string
		dt   DType
		src  int
		n    int
	}{
		{"short F32", F32, 7, 2},
		{"long BF16", BF16, 6, 2},
		{"partial Q8_0 block", Q8_0, 34, 16},
		{"wrong Q4_0 bytes", Q4_0, 34, 32},
		{"I32", I32, 8, 2},
		{"unknown", DType(99), 8, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := DequantizeRow(c.dt, make([]byte, c.src), make([]float32, c.n)); err == nil {
				t.Error("no error")
			}
		})
	}
	if err := DequantizeRow(F32, make([]byte, 4), make([]float32, 2)); !errors.Is(err, ErrShape) {
		t.Errorf("size mismatch error %v does not wrap ErrShape", err)
	}
}
