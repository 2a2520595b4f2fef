package cuda

import (
	"fmt"
	"math"
	"testing"

	"github.com/trigon-llm/trigon/backend"
)

// TestKQuantMatMul runs K-quant products on the GPU against the CPU
// backend on fresh random inputs: the dequantizing GEMV (kgemv, up to 8
// rows; row counts that leave lanes idle: 768 = 24 pieces of 32) and the
// dequantize-then-cuBLASLt path (kdequant, more rows), BF16 and F32 out.
// Under 4 rows the CPU quantizes x per 256 values (Q8_K) where the GPU
// multiplies bf16 x: about 1% of the outputs' norm more.
func TestKQuantMatMul(t *testing.T) {
	sharedBackend(t, true)
	type shape struct{ n, in, out int }
	for _, w := range []backend.DType{backend.Q4_K, backend.Q5_K, backend.Q6_K} {
		for _, tc := range []struct {
			s   shape
			out backend.DType
		}{
			{shape{1, 4096, 1000}, backend.BF16},
			{shape{3, 768, 333}, backend.F32},
			{shape{4, 4096, 1024}, backend.BF16},
			{shape{8, 11008, 257}, backend.BF16},
			{shape{9, 1024, 512}, backend.F32},
			{shape{33, 4096, 1000}, backend.BF16},
		} {
			t.Run(fmt.Sprintf("%v_n%d_%dx%d_out%v", w, tc.s.n, tc.s.in, tc.s.out, tc.out), func(t *testing.T) {
				p := newPair(t)
				s := tc.s
				cx, gx := p.act(backend.BF16, []int{s.n, s.in}, p.normal(s.n*s.in, 1))
				wv := p.normal(s.out*s.in, float32(1/math.Sqrt(float64(s.in))))
				cw, gw := p.same(w, []int{s.out, s.in}, encode(w, wv))
				co, gout := p.cpuOut(s.n, s.out), p.poisoned(tc.out, s.n, s.out)
				p.must("cpu", p.c.MatMul(co, cx, cw, nil))
				p.must("gpu", p.g.MatMul(gout, gx, gw, nil))
				p.must("sync", p.g.Sync())
				tol := bf16Tol
				if s.n < 4 {
					tol = 2e-2
				}
				p.expectClose("matmul", read(t, p.g, gout), read(t, p.c, co), tol)
			})
		}
	}
}

// TestKQuantEmbed gathers K-quant embedding rows (load_k) against the CPU.
func TestKQuantEmbed(t *testing.T) {
	sharedBackend(t, true)
	for _, tc := range []struct {
		table, out backend.DType
		rows, dim  int
	}{
		{backend.Q4_K, backend.BF16, 300, 4096},
		{backend.Q5_K, backend.F32, 100, 768},
		{backend.Q6_K, backend.BF16, 257, 1024},
	} {
		t.Run(fmt.Sprintf("%v_to_%v_%dx%d", tc.table, tc.out, tc.rows, tc.dim), func(t *testing.T) {
			p := newPair(t)
			const n = 9
			tab := encode(tc.table, p.normal(tc.rows*tc.dim, 1))
			ct, gt := p.same(tc.table, []int{tc.rows, tc.dim}, tab)
			ids := make([]int32, n)
			for i := range ids {
				ids[i] = int32(p.r.IntN(tc.rows))
			}
			ids[0] = int32(tc.rows - 1)
			ci, gi := p.same(backend.I32, []int{n}, i32Bytes(ids))
			co, gout := p.cpuOut(n, tc.dim), p.poisoned(tc.out, n, tc.dim)
			p.must("cpu embed", p.c.Embed(co, ct, ci))
			p.must("gpu embed", p.g.Embed(gout, gt, gi))
			p.must("sync", p.g.Sync())
			p.expectClose("embed", read(t, p.g, gout), read(t, p.c, co), 4e-3)
		})
	}
}
