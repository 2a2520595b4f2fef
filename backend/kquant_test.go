package backend

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"testing"
)

var kQuants = []struct {
	dt       DType
	quantize func([]float32) ([]byte, error)
	// maxRel bounds the relative RMS error on normal values: the
	// format's grid step over sqrt(12) with room for the 6- or 8-bit
	// scale codes.
	maxRel float64
}{
	{Q4_K, QuantizeQ4_K, 0.11},
	{Q5_K, QuantizeQ5_K, 0.055},
	{Q6_K, QuantizeQ6_K, 0.025},
}

// TestKQuantLayout decodes random bytes (every byte string is a valid
// block, save NaN or infinite f16 scales, which are masked off) with
// DequantizeRow and with the element-by-element reference of the layout.
func TestKQuantLayout(t *testing.T) {
	r := newRand(t)
	for _, c := range kQuants {
		t.Run(c.dt.String(), func(t *testing.T) {
			const nb = 6
			b := make([]byte, nb*c.dt.BlockBytes())
			for i := range b {
				b[i] = byte(r.Uint32())
			}
			for blk := range nb {
				p := b[blk*c.dt.BlockBytes():]
				// Clear the exponent's top bit of each f16 scale: finite.
				if c.dt == Q6_K {
					p[209] &= 0xbf
				} else {
					p[1] &= 0xbf
					p[3] &= 0xbf
				}
			}
			got := make([]float32, nb*QK_K)
			if err := DequantizeRow(c.dt, b, got); err != nil {
				t.Fatal(err)
			}
			checkClose(t, "values", got, decodeRef(t, c.dt, b, len(got)), nil, 1e-6, 1e-30)
		})
	}
}

// TestKScaleMin packs random 6-bit scales and mins and unpacks them.
func TestKScaleMin(t *testing.T) {
	r := newRand(t)
	for range 100 {
		var sc, m [8]uint8
		for j := range 8 {
			sc[j], m[j] = uint8(r.IntN(64)), uint8(r.IntN(64))
		}
		var s [12]byte
		kPackScaleMin(s[:], &sc, &m)
		for j := range 8 {
			if gs, gm := KScaleMin(s[:], j); gs != sc[j] || gm != m[j] {
				t.Fatalf("sub-block %d: got %d,%d want %d,%d (packed %x)", j, gs, gm, sc[j], m[j], s)
			}
		}
	}
}

// TestQuantizeK quantizes fresh random rows and checks the size, that
// DequantizeRow agrees with the layout's reference, and the error: within
// the format's bound, and below Q4_0's on the same data for Q4_K.
func TestQuantizeK(t *testing.T) {
	r := newRand(t)
	for _, c := range kQuants {
		t.Run(c.dt.String(), func(t *testing.T) {
			for _, n := range []int{256, 768, 4096} {
				x := randFloats(r, n, 0.01+r.Float64()*10)
				b, err := c.quantize(x)
				if err != nil {
					t.Fatal(err)
				}
				if want, _ := c.dt.RowBytes(n); len(b) != want {
					t.Fatalf("%d values: %d bytes, want %d", n, len(b), want)
				}
				got := make([]float32, n)
				if err := DequantizeRow(c.dt, b, got); err != nil {
					t.Fatal(err)
				}
				checkClose(t, "dequantized", got, decodeRef(t, c.dt, b, n), nil, 1e-6, 1e-30)
				e := relNorm(got, widen(x))
				if e > c.maxRel {
					t.Errorf("%d values: relative error %.4f, want <= %v", n, e, c.maxRel)
				}
				if c.dt == Q4_K {
					b0, _ := QuantizeQ4_0(x)
					g0 := make([]float32, n)
					if err := DequantizeRow(Q4_0, b0, g0); err != nil {
						t.Fatal(err)
					}
					if e0 := relNorm(g0, widen(x)); e >= e0 {
						t.Errorf("%d values: Q4_K error %.4f, Q4_0 %.4f", n, e, e0)
					}
				}
			}
			if _, err := c.quantize(make([]float32, 320)); err == nil {
				t.Error("320 values: no error")
			}
		})
	}
}

// TestQuantizeKShapes covers blocks the random test rarely makes: all
// zero, constant, all positive, one outlier, sub-blocks of very
// different magnitudes, and zero sub-blocks among others (which must
// decode to exact zeros: padding relies on it).
func TestQuantizeKShapes(t *testing.T) {
	r := newRand(t)
	cases := map[string]func(i int) float32{
		"zero":     func(int) float32 { return 0 },
		"constant": func(int) float32 { return -1.25 },
		"positive": func(int) float32 { return 1 + float32(r.Float64()) },
		"outlier": func(i int) float32 {
			if i == 77 {
				return 40
			}
			return float32(r.NormFloat64())
		},
		"ramp":      func(i int) float32 { return float32(r.NormFloat64()) * float32(math.Pow(2, float64(i/32-4))) },
		"zero tail": func(i int) float32 { return float32(r.NormFloat64()) * float32(min(1, max(0, 192-i))) },
	}
	for _, c := range kQuants {
		for name, f := range cases {
			t.Run(fmt.Sprintf("%v/%s", c.dt, name), func(t *testing.T) {
				x := make([]float32, QK_K)
				for i := range x {
					x[i] = f(i)
				}
				b, err := c.quantize(x)
				if err != nil {
					t.Fatal(err)
				}
				got := make([]float32, QK_K)
				if err := DequantizeRow(c.dt, b, got); err != nil {
					t.Fatal(err)
				}
				var amax float64
				for _, v := range x {
					amax = math.Max(amax, math.Abs(float64(v)))
				}
				for i, v := range x {
					if v == 0 && got[i] != 0 {
						t.Errorf("x[%d] = 0 decodes to %v", i, got[i])
					}
					if err := math.Abs(float64(got[i] - v)); err > 0.1*amax+1e-6 {
						t.Errorf("x[%d] = %v decodes to %v", i, v, got[i])
					}
				}
				if name != "zero" {
					if e := relNorm(got, widen(x)); e > 2*c.maxRel {
						t.Errorf("relative error %.4f", e)
					}
				}
			})
		}
	}
}

// TestKQuantDType checks the sizes the K-quants report.
func TestKQuantDType(t *testing.T) {
	for _, c := range []struct {
		dt    DType
		name  string
		bytes int
	}{{Q4_K, "Q4_K", 144}, {Q5_K, "Q5_K", 176}, {Q6_K, "Q6_K", 210}} {
		if c.dt.String() != c.name || c.dt.BlockSize() != 256 || c.dt.BlockBytes() != c.bytes || !c.dt.Quantized() {
			t.Errorf("%v: block %d x %d bytes, quantized %v", c.dt, c.dt.BlockSize(), c.dt.BlockBytes(), c.dt.Quantized())
		}
		if n, err := c.dt.RowBytes(512); err != nil || n != 2*c.bytes {
			t.Errorf("%v: 512 values take %d bytes (%v)", c.dt, n, err)
		}
		if _, err := c.dt.RowBytes(320); err == nil {
			t.Errorf("%v: a row of 320 has no error", c.dt)
		}
	}
}

// TestKQuantLlamaCpp decodes blocks that llama.cpp's reference quantizers
// wrote (testdata/kquant-llamacpp.json, from
// tools/cpubench/llama_kquant_fixture.py) and expects the values
// llama.cpp's dequantizers gave, bit for bit (both compute d*sc*q - dmin*m
// and d*scale*(q-32) in the same f32 steps); and quantizes the same
// input, expecting an error near that of llama.cpp's reference quantizer
// (within a third more; measured about equal).
func TestKQuantLlamaCpp(t *testing.T) {
	raw, err := os.ReadFile("testdata/kquant-llamacpp.json")
	if err != nil {
		t.Fatal(err)
	}
	var fx map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fx); err != nil {
		t.Fatal(err)
	}
	var input []float32
	if err := json.Unmarshal(fx["input"], &input); err != nil {
		t.Fatal(err)
	}
	for _, c := range kQuants {
		t.Run(c.dt.String(), func(t *testing.T) {
			var ref struct {
				Blocks string    `json:"blocks"`
				Values []float32 `json:"values"`
			}
			if err := json.Unmarshal(fx[c.dt.String()], &ref); err != nil {
				t.Fatal(err)
			}
			blocks, err := hex.DecodeString(ref.Blocks)
			if err != nil {
				t.Fatal(err)
			}
			got := make([]float32, len(ref.Values))
			if err := DequantizeRow(c.dt, blocks, got); err != nil {
				t.Fatal(err)
			}
			checkClose(t, "llama.cpp's blocks", got, widen(ref.Values), nil, 0, 0)
			ours, err := c.quantize(input)
			if err != nil {
				t.Fatal(err)
			}
			dq := make([]float32, len(input))
			if err := DequantizeRow(c.dt, ours, dq); err != nil {
				t.Fatal(err)
			}
			e, el := relNorm(dq, widen(input)), relNorm(ref.Values, widen(input))
			t.Logf("relative error: trigon %.4f, llama.cpp %.4f", e, el)
			if e > el*4/3 {
				t.Errorf("relative error %.4f, llama.cpp's %.4f", e, el)
			}
		})
	}
}
