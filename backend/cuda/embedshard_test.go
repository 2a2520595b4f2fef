package cuda

import (
	"errors"
	"fmt"
	"testing"

	"github.com/trigon-llm/trigon/backend"
)

// TestEmbedShard: the embedding over a vocabulary shard against the CPU's,
// ids inside and outside the shard mixed (zero rows for the others, no
// device-side error); a negative id still raises the check.
func TestEmbedShard(t *testing.T) {
	sharedBackend(t, true)
	for _, tc := range []struct {
		table, out      backend.DType
		rows, dim, base int
		n               int
	}{
		{backend.BF16, backend.BF16, 500, 4096, 500, 9},
		{backend.BF16, backend.F32, 300, 996, 1000, 7},
		{backend.Q8_0, backend.BF16, 257, 4096, 257, 11},
		{backend.BF16, backend.BF16, 400, 4096, 0, 5},
	} {
		t.Run(fmt.Sprintf("%v_to_%v_%dx%d_at%d", tc.table, tc.out, tc.rows, tc.dim, tc.base), func(t *testing.T) {
			p := newPair(t)
			tab := encode(tc.table, p.normal(tc.rows*tc.dim, 1))
			ct, gt := p.same(tc.table, []int{tc.rows, tc.dim}, tab)
			ids := make([]int32, tc.n)
			for i := range ids {
				// Ids over three shards' range: below, in and above this one.
				ids[i] = int32(p.r.IntN(tc.base + 2*tc.rows))
			}
			ids[0] = int32(tc.base) // the shard's first and last rows
			ids[1] = int32(tc.base + tc.rows - 1)
			ci, gi := p.same(backend.I32, []int{tc.n}, i32Bytes(ids))
			co, gout := p.cpuOut(tc.n, tc.dim), p.poisoned(tc.out, tc.n, tc.dim)
			p.must("cpu embed_shard", p.c.EmbedShard(co, ct, ci, tc.base))
			p.must("gpu embed_shard", p.g.EmbedShard(gout, gt, gi, tc.base))
			p.must("sync", p.g.Sync())
			p.expectClose("embed_shard", read(t, p.g, gout), read(t, p.c, co), 4e-3)
		})
	}
	p := newPair(t)
	_, gt := p.same(backend.BF16, []int{4, 256}, encode(backend.BF16, p.normal(4*256, 1)))
	_, gi := p.same(backend.I32, []int{1}, i32Bytes([]int32{-1}))
	p.must("embed_shard", p.g.EmbedShard(p.poisoned(backend.BF16, 1, 256), gt, gi, 4))
	if err := p.g.Sync(); !errors.Is(err, backend.ErrShape) {
		t.Errorf("negative id: Sync = %v, want the device-side id check", err)
	}
}
