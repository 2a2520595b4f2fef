package cuda

import "github.com/trigon-llm/trigon/backend"

var _ backend.ShardEmbedder = (*Backend)(nil)

// EmbedShard implements backend.ShardEmbedder with Embed's kernel: ids
// outside the shard [base, base+rows) write zero rows without raising the
// device-side id check; negative ids still raise it.
func (b *Backend) EmbedShard(out, table, ids backend.Tensor, base int) error {
	return b.embed("embed_shard", out, table, ids, base, true)
}
