package cpu

import "github.com/trigon-llm/trigon/backend"

var _ backend.ShardEmbedder = (*Backend)(nil)

// EmbedShard implements backend.ShardEmbedder: Embed over a table that
// holds the vocabulary rows [base, base+rows), zero rows for the ids of
// other shards.
func (b *Backend) EmbedShard(out, table, ids backend.Tensor, base int) error {
	const op = "embed_shard"
	o, err := tensorOf(op, "out", out)
	if err != nil {
		return err
	}
	tt, err := tensorOf(op, "table", table)
	if err != nil {
		return err
	}
	it, err := tensorOf(op, "ids", ids)
	if err != nil {
		return err
	}
	dims, err := backend.CheckEmbed(o, tt, it)
	if err != nil {
		return opErr(err)
	}
	if base < 0 {
		return backend.ShapeError("cpu: "+op, "base", "%d is negative", base)
	}
	n, rows, dim := dims.N, dims.Rows, dims.Dim
	if overlaps(o.data, tt.data) || overlaps(o.data, it.data) {
		return backend.ShapeError("cpu: "+op, "out", "overlaps an input")
	}
	idv := it.i32()
	for i, id := range idv {
		if id < 0 {
			return backend.ShapeError("cpu: "+op, "ids", "ids[%d] = %d is negative", i, id)
		}
	}
	tRow, oRow := tt.rowBytes(), o.rowBytes()
	b.parallel(n, b.grainFor(n, 16), func(w, lo, hi int) {
		var buf []float32
		if o.dt != backend.F32 {
			buf = b.floatScratch(w, dim)
		}
		for i := lo; i < hi; i++ {
			dst := o.data[i*oRow : (i+1)*oRow]
			id := int(idv[i]) - base
			if id < 0 || id >= rows {
				clear(dst) // zero in every float dtype
				continue
			}
			src := tt.data[id*tRow : (id+1)*tRow]
			if o.dt == tt.dt {
				copy(dst, src)
				continue
			}
			row := buf
			if o.dt == backend.F32 {
				row = bytesAs[float32](dst)
			}
			toFloat32(tt.dt, src, row)
			if o.dt != backend.F32 {
				fromFloat32(o.dt, row, dst)
			}
		}
	})
	return nil
}
