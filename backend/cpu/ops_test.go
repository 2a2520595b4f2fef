package cpu

import (
	"fmt"
	"math"
	"testing"

	"github.com/trigon-llm/trigon/backend"
)

func TestEmbed(t *testing.T) {
	r := newRand(t)
	for _, tableDT := range weightDTypes {
		for _, outDT := range floatDTypes {
			for _, sh := range []struct{ rows, dim, n int }{{1, 32, 1}, {7, 64, 5}, {50, 96, 33}, {300, 256, 70}} {
				t.Run(fmt.Sprintf("%v->%v/%dx%d/n=%d", tableDT, outDT, sh.rows, sh.dim, sh.n), func(t *testing.T) {
					b := New(Options{Threads: 3})
					tb := encode(t, tableDT, randFloats(r, sh.rows*sh.dim, 2))
					table := upload(t, b, tableDT, []int{sh.rows, sh.dim}, tb)
					ids := make([]int32, sh.n)
					for i := range ids {
						ids[i] = int32(r.IntN(sh.rows))
					}
					out := alloc(t, b, outDT, sh.n, sh.dim)
					if err := b.Embed(out, table, uploadI32(t, b, ids, sh.n)); err != nil {
						t.Fatal(err)
					}
					ref := decodeRef(t, tableDT, tb, sh.rows*sh.dim)
					raw := make([]byte, len(out.(*tensor).data))
					if err := b.Read(out, raw); err != nil {
						t.Fatal(err)
					}
					got := decodeRef(t, outDT, raw, sh.n*sh.dim)
					for i, id := range ids {
						for j := range sh.dim {
							want := ref[int(id)*sh.dim+j]
							if outDT != backend.F32 {
								// The only loss is the final rounding to outDT.
								want = decodeRef(t, outDT, encode(t, outDT, []float32{float32(want)}), 1)[0]
							}
							if g := got[i*sh.dim+j]; g != want {
								t.Fatalf("out[%d][%d] = %v, want table[%d][%d] = %v", i, j, g, id, j, want)
							}
						}
					}
				})
			}
		}
	}
}

func TestEmbedErrors(t *testing.T) {
	b := New(Options{})
	table := alloc(t, b, backend.F32, 10, 8)
	out := alloc(t, b, backend.F32, 3, 8)
	for _, c := range []struct {
		name           string
		out, table, id backend.Tensor
	}{
		{"id too large", out, table, uploadI32(t, b, []int32{0, 10, 1}, 3)},
		{"negative id", out, table, uploadI32(t, b, []int32{0, -1, 1}, 3)},
		{"ids not I32", out, table, alloc(t, b, backend.F32, 3)},
		{"out rows", alloc(t, b, backend.F32, 2, 8), table, uploadI32(t, b, []int32{0, 1, 2}, 3)},
		{"out dim", alloc(t, b, backend.F32, 3, 9), table, uploadI32(t, b, []int32{0, 1, 2}, 3)},
		{"out quantized", alloc(t, b, backend.Q8_0, 3, 32), alloc(t, b, backend.F32, 10, 32), uploadI32(t, b, []int32{0, 1, 2}, 3)},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := readF32(t, b, out)
			if err := b.Embed(c.out, c.table, c.id); !isShapeErr(err) {
				t.Fatalf("error %v, want a shape error", err)
			}
			for i, v := range readF32(t, b, out) {
				if math.Float32bits(v) != math.Float32bits(before[i]) {
					t.Fatal("out written despite the error")
				}
			}
		})
	}
}

func refRMSNorm(x, w []float64, eps float64) []float64 {
	var ss float64
	for _, v := range x {
		ss += v * v
	}
	r := 1 / math.Sqrt(ss/float64(len(x))+eps)
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = v * r * w[i]
	}
	return out
}

func TestAddRMSNorm(t *testing.T) {
	r := newRand(t)
	for _, wDT := range floatDTypes {
		for _, withResidual := range []bool{false, true} {
			for _, sh := range []struct{ rows, dim int }{{1, 8}, {3, 33}, {17, 256}, {40, 1000}} {
				t.Run(fmt.Sprintf("w=%v/residual=%v/%dx%d", wDT, withResidual, sh.rows, sh.dim), func(t *testing.T) {
					b := New(Options{Threads: 2})
					const eps = 1e-6
					x := randFloats(r, sh.rows*sh.dim, 3)
					res := randFloats(r, sh.rows*sh.dim, 3)
					wb := encode(t, wDT, randFloats(r, sh.dim, 1))
					wv := decodeRef(t, wDT, wb, sh.dim)
					xt := uploadF32(t, b, x, sh.rows, sh.dim)
					var rt backend.Tensor
					if withResidual {
						rt = uploadF32(t, b, res, sh.rows, sh.dim)
					}
					out := alloc(t, b, backend.F32, sh.rows, sh.dim)
					if err := b.AddRMSNorm(out, xt, rt, upload(t, b, wDT, []int{sh.dim}, wb), eps); err != nil {
						t.Fatal(err)
					}
					var want, wantRes []float64
					for i := range sh.rows {
						row := widen(x[i*sh.dim : (i+1)*sh.dim])
						if withResidual {
							for j := range row {
								row[j] = float64(res[i*sh.dim+j] + x[i*sh.dim+j]) // the residual is f32
							}
							wantRes = append(wantRes, row...)
						}
						want = append(want, refRMSNorm(row, wv, eps)...)
					}
					checkClose(t, "out", readF32(t, b, out), want, nil, 3e-7, 1e-7)
					if withResidual {
						checkClose(t, "residual", readF32(t, b, rt), wantRes, nil, 0, 0)
					}
				})
			}
		}
	}
	t.Run("in place", func(t *testing.T) {
		b := New(Options{})
		x := randFloats(r, 5*64, 1)
		w := randFloats(r, 64, 1)
		xt := uploadF32(t, b, append([]float32(nil), x...), 5, 64)
		if err := b.AddRMSNorm(xt, xt, nil, uploadF32(t, b, w, 64), 1e-5); err != nil {
			t.Fatal(err)
		}
		var want []float64
		for i := range 5 {
			want = append(want, refRMSNorm(widen(x[i*64:(i+1)*64]), widen(w), 1e-5)...)
		}
		checkClose(t, "out", readF32(t, b, xt), want, nil, 3e-7, 1e-7)
	})
}

func TestAddRMSNormErrors(t *testing.T) {
	b := New(Options{})
	x := alloc(t, b, backend.F32, 4, 16)
	w := alloc(t, b, backend.F32, 16)
	for _, c := range []struct {
		name           string
		out, x, res, w backend.Tensor
		eps            float32
	}{
		{"weight length", alloc(t, b, backend.F32, 4, 16), x, nil, alloc(t, b, backend.F32, 15), 1e-5},
		{"out shape", alloc(t, b, backend.F32, 4, 15), x, nil, w, 1e-5},
		{"residual shape", alloc(t, b, backend.F32, 4, 16), x, alloc(t, b, backend.F32, 3, 16), w, 1e-5},
		{"residual is x", alloc(t, b, backend.F32, 4, 16), x, x, w, 1e-5},
		{"x BF16", alloc(t, b, backend.F32, 4, 16), alloc(t, b, backend.BF16, 4, 16), nil, w, 1e-5},
		{"NaN eps", alloc(t, b, backend.F32, 4, 16), x, nil, w, float32(math.NaN())},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := b.AddRMSNorm(c.out, c.x, c.res, c.w, c.eps); !isShapeErr(err) {
				t.Fatalf("error %v, want a shape error", err)
			}
		})
	}
}

func TestSiLUMul(t *testing.T) {
	r := newRand(t)
	for _, sh := range []struct{ n, inter int }{{1, 1}, {3, 37}, {16, 512}, {33, 1000}} {
		t.Run(fmt.Sprintf("%dx%d", sh.n, sh.inter), func(t *testing.T) {
			b := New(Options{Threads: 2})
			g := randFloats(r, sh.n*2*sh.inter, 4)
			out := alloc(t, b, backend.F32, sh.n, sh.inter)
			if err := b.SiLUMul(out, uploadF32(t, b, g, sh.n, 2*sh.inter)); err != nil {
				t.Fatal(err)
			}
			want := make([]float64, sh.n*sh.inter)
			for i := range sh.n {
				for j := range sh.inter {
					gate, up := float64(g[i*2*sh.inter+j]), float64(g[i*2*sh.inter+sh.inter+j])
					want[i*sh.inter+j] = gate / (1 + math.Exp(-gate)) * up
				}
			}
			checkClose(t, "out", readF32(t, b, out), want, nil, 2e-7, 1e-30)
		})
	}
	t.Run("errors", func(t *testing.T) {
		b := New(Options{})
		for _, c := range []struct {
			name        string
			out, gateUp backend.Tensor
		}{
			{"odd gateUp", alloc(t, b, backend.F32, 2, 4), alloc(t, b, backend.F32, 2, 9)},
			{"rows", alloc(t, b, backend.F32, 3, 4), alloc(t, b, backend.F32, 2, 8)},
			{"dtype", alloc(t, b, backend.F32, 2, 4), alloc(t, b, backend.BF16, 2, 8)},
		} {
			if err := b.SiLUMul(c.out, c.gateUp); !isShapeErr(err) {
				t.Errorf("%s: error %v, want a shape error", c.name, err)
			}
		}
	})
}

// TestFillNormal checks FillNormal's bytes against backend.SyntheticValue
// encoded in the tensor's dtype, over several goroutine chunks, into a row
// view of a bigger tensor, and its refusals.
func TestFillNormal(t *testing.T) {
	b := New(Options{Threads: 3})
	for _, tc := range []struct {
		dt   backend.DType
		rows int
	}{{backend.F32, 1}, {backend.BF16, 3}, {backend.BF16, 70001}, {backend.F32, 40000}} {
		t.Run(fmt.Sprintf("%v_%d", tc.dt, tc.rows), func(t *testing.T) {
			const cols = 7
			full, err := b.Alloc(tc.dt, tc.rows+2, cols)
			if err != nil {
				t.Fatal(err)
			}
			view, err := b.View(full, 1, tc.rows)
			if err != nil {
				t.Fatal(err)
			}
			if err := b.FillNormal(view, 77, 1, 0.5); err != nil {
				t.Fatal(err)
			}
			data := full.(*tensor).data
			es := tc.dt.BlockBytes()
			for i := range (tc.rows + 2) * cols {
				got := data[i*es : (i+1)*es]
				if i < cols || i >= (tc.rows+1)*cols {
					for _, c := range got {
						if c != 0 {
							t.Fatalf("element %d outside the view was written", i)
						}
					}
					continue
				}
				v := backend.SyntheticValue(77, int64(i-cols), 1, 0.5)
				var want uint32
				if tc.dt == backend.F32 {
					want = math.Float32bits(v)
				} else {
					want = uint32(backend.F32ToBF16(v))
				}
				var have uint32
				for k := es - 1; k >= 0; k-- {
					have = have<<8 | uint32(got[k])
				}
				if have != want {
					t.Fatalf("element %d: %#x, want %#x", i-cols, have, want)
				}
			}
		})
	}
	f16, err := b.Alloc(backend.F16, 4)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.FillNormal(f16, 1, 0, 1); err == nil {
		t.Error("FillNormal of an F16 tensor: no error")
	}
}
