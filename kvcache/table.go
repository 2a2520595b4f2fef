package kvcache

// BlockTable is one sequence's blocks, in position order: position p of the
// sequence lives at offset p%BlockSize of block Blocks()[p/BlockSize].
//
// A table belongs to one pool. Its ids are only ever appended while the
// sequence holds them, and Free starts a new backing array, so a slice
// returned by Blocks stays a valid snapshot for as long as anyone keeps it.
type BlockTable struct {
	salt   string
	blocks []BlockID

	// hashes caches the chained hashes of the first len(hashes) full
	// blocks of the sequence's tokens. It survives Free (preemption), since
	// the tokens of a sequence only grow.
	hashes []blockHash
	// entries[i] is the registration id of block i's contents (its own
	// or, for a duplicate, the cached block's) for the first numCommitted
	// blocks: the parent links of the next blocks to commit.
	entries      []uint64
	numCommitted int
}

// NewBlockTable returns an empty table. salt separates prefix caches: only
// tables with equal salts share cached blocks. Use it for whatever must not
// share KV although the tokens agree (LoRA adapter, tenant, cache_salt of
// the request).
func NewBlockTable(salt string) *BlockTable {
	return &BlockTable{salt: salt}
}

// Blocks returns the block ids in order. The caller must not modify the
// slice; it stays valid after later pool calls (see BlockTable).
func (t *BlockTable) Blocks() []BlockID { return t.blocks }

// Len is the number of blocks.
func (t *BlockTable) Len() int { return len(t.blocks) }

// Salt returns the prefix-cache salt given to NewBlockTable.
func (t *BlockTable) Salt() string { return t.salt }
