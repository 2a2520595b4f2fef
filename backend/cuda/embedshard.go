package cuda

import "github.com/trigon-llm/trigon/backend"

var _ backend.ShardEmbedder = (*Backend)(nil)

// EmbedShard implements backend.ShardEmbedder with Embed's kernel: ids
// outside the shard [base, base+rows) write zero rows without raising the
// device-side id check; negative ids still raise it.
func (b *Backend) EmbedShard(out, table, ids backend.Tensor, base int) error {
	const op = "embed_shard"
	o, err := b.tensorOf(op, "out", out)
	if err != nil {
		return err
	}
	tt, err := b.tensorOf(op, "table", table)
	if err != nil {
		return err
	}
	it, err := b.tensorOf(op, "ids", ids)
	if err != nil {
		return err
	}
	d, err := backend.CheckEmbed(o, tt, it)
	if err != nil {
		return opErr(err)
	}
	rows, dim, n := d.Rows, d.Dim, d.N
	if rows > maxInt32 || dim > maxInt32 || base < 0 || base > maxInt32-rows {
		return backend.ShapeError("cuda: "+op, "table", "%v at row %d exceeds int32 indexing", tt.shape, base)
	}
	k := fnKey{modSpec{file: "embed", p: [8]int{int(tt.dt), int(o.dt)}}, "embed"}
	return b.post(func() error {
		f, err := b.fn(k)
		if err != nil {
			return err
		}
		return b.launch(f, [3]int{n, 1, 1}, 256, 0, o.ptr, tt.ptr, it.ptr, i32(dim), i32(rows), b.errDev, i32(base), 1)
	})
}
