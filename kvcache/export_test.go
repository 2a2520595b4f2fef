package kvcache

// Hooks for the external tests; compiled only into the test binary.

// Invariants reports whether the invariants build tag is set.
const Invariants = invariants

// FreeList returns the free blocks, front (next to be evicted) first.
func (p *Pool) FreeList() []BlockID {
	var l []BlockID
	for b := p.next[NullBlock]; b != NullBlock; b = p.next[b] {
		l = append(l, b)
	}
	return l
}

// Ref returns b's reference count.
func (p *Pool) Ref(b BlockID) int { return int(p.ref[b]) }

// Cached reports whether b is registered in the prefix cache.
func (p *Pool) Cached(b BlockID) bool { return p.meta[b].id != 0 }

// NumCachedBlocks counts prefix-cache registrations.
func (p *Pool) NumCachedBlocks() int { return len(p.byHash) }

// NumCommitted is the number of t's blocks on the prefix-cache chain.
func (t *BlockTable) NumCommitted() int { return t.numCommitted }

// SetHashOverride replaces the keyed block hash, to force collisions.
func (p *Pool) SetHashOverride(f func(parent [32]byte, salt string, tokens []int32) [32]byte) {
	p.hashOverride = func(parent blockHash, salt string, tokens []int32) blockHash {
		return f(parent, salt, tokens)
	}
}

// HashBlock exposes the keyed hash of one block.
func (p *Pool) HashBlock(parent [32]byte, salt string, tokens []int32) [32]byte {
	return p.hashBlock(parent, salt, tokens)
}

// CorruptRef bumps b's reference count behind the pool's back, so tests
// can see Verify (and the invariants build) catch it.
func (p *Pool) CorruptRef(b BlockID) { p.ref[b]++ }

// CheckInvariants runs the invariants build's hook (a no-op without it).
func (p *Pool) CheckInvariants() { p.checkInvariants() }
