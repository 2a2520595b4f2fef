package cpu

import "github.com/trigon-llm/trigon/backend"

var _ backend.ShardEmbedder = (*Backend)(nil)

// EmbedShard implements backend.ShardEmbedder: Embed over a table that
// holds the vocabulary rows [base, base+rows), zero rows for the ids of
// other shards.
func (b *Backend) EmbedShard(out, table, ids backend.Tensor, base int) error {
	return b.embed("embed_shard", out, table, ids, base, true)
}
