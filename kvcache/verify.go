package kvcache

import (
	"fmt"
	"slices"
)

// Verify checks the pool's invariants against tables, which must be every
// table that holds blocks of this pool: reference counts equal the number
// of table references, the free list holds exactly the unreferenced blocks,
// the null block is never handed out, and every prefix-cache entry points
// at a block whose stored contents hash to its key. It costs O(blocks +
// table lengths) and is meant for tests and debugging; builds with the
// invariants tag run it after every mutation.
func (p *Pool) Verify(tables []*BlockTable) error {
	return p.verify(tables, nil)
}

// verify is Verify. With hashed non-nil, it recomputes the hash of a
// registration only once: hashed[b] remembers the registration id of b
// whose hash was checked (registrations are immutable until dropped).
func (p *Pool) verify(tables []*BlockTable, hashed map[BlockID]uint64) error {
	n := len(p.ref)
	if p.ref[NullBlock] != 0 || p.isFree[NullBlock] || p.meta[NullBlock].id != 0 {
		return fmt.Errorf("kvcache: null block in use (ref %d, free %v, cached %v)", p.ref[NullBlock], p.isFree[NullBlock], p.meta[NullBlock].id != 0)
	}
	count := 0
	seenCached := false
	for b, prev := p.next[NullBlock], NullBlock; b != NullBlock; prev, b = b, p.next[b] {
		if count++; count > n {
			return fmt.Errorf("kvcache: free list has a cycle")
		}
		if p.prev[b] != prev {
			return fmt.Errorf("kvcache: free list: block %d has prev %d, want %d", b, p.prev[b], prev)
		}
		if !p.isFree[b] || p.ref[b] != 0 {
			return fmt.Errorf("kvcache: block %d in the free list has ref %d, free flag %v", b, p.ref[b], p.isFree[b])
		}
		cached := p.meta[b].id != 0
		if !cached && seenCached {
			return fmt.Errorf("kvcache: empty free block %d sits behind cached ones", b)
		}
		seenCached = seenCached || cached
	}
	if count != p.numFree {
		return fmt.Errorf("kvcache: free list holds %d blocks, counter says %d", count, p.numFree)
	}
	refs := make([]int32, n)
	stamp := make([]int, n)
	for ti, t := range tables {
		if t.numCommitted > len(t.blocks) || len(t.entries) != t.numCommitted || len(t.hashes) < t.numCommitted {
			return fmt.Errorf("kvcache: table %d: %d committed of %d blocks, %d entries, %d hashes", ti, t.numCommitted, len(t.blocks), len(t.entries), len(t.hashes))
		}
		for _, b := range t.blocks {
			if b <= NullBlock || int(b) >= n {
				return fmt.Errorf("kvcache: table %d holds block %d outside [1, %d)", ti, b, n)
			}
			if stamp[b] == ti+1 {
				return fmt.Errorf("kvcache: table %d holds block %d twice", ti, b)
			}
			stamp[b] = ti + 1
			refs[b]++
		}
	}
	for b := 1; b < n; b++ {
		if refs[b] != p.ref[b] {
			return fmt.Errorf("kvcache: block %d has ref %d but %d table references", b, p.ref[b], refs[b])
		}
		if p.isFree[b] != (p.ref[b] == 0) {
			return fmt.Errorf("kvcache: block %d has ref %d, free flag %v", b, p.ref[b], p.isFree[b])
		}
		e := &p.meta[b]
		if e.id == 0 {
			continue
		}
		if x, ok := p.byHash[e.hash]; !ok || x != BlockID(b) {
			return fmt.Errorf("kvcache: cached block %d is not the map's block for its hash", b)
		}
		if e.id >= p.nextEntry || e.parent >= e.id || len(e.tokens) != p.blockSize {
			return fmt.Errorf("kvcache: cached block %d: id %d, parent %d, %d tokens", b, e.id, e.parent, len(e.tokens))
		}
	}
	for h, b := range p.byHash {
		if b <= NullBlock || int(b) >= n || p.meta[b].id == 0 || p.meta[b].hash != h {
			return fmt.Errorf("kvcache: hash map entry points at block %d, which is not cached under it", b)
		}
		e := &p.meta[b]
		if hashed != nil && hashed[b] == e.id {
			continue
		}
		if p.hashBlock(e.parentHash, e.salt, e.tokens) != h {
			return fmt.Errorf("kvcache: block %d: its contents do not hash to its key", b)
		}
		if hashed != nil {
			hashed[b] = e.id
		}
	}
	return nil
}

// VerifyTokens checks that every cached block among t's committed blocks
// holds the tokens at its position in tokens (the sequence's tokens).
func (p *Pool) VerifyTokens(t *BlockTable, tokens []int32) error {
	bs := p.blockSize
	for i := 0; i < t.numCommitted && (i+1)*bs <= len(tokens); i++ {
		b := t.blocks[i]
		e := &p.meta[b]
		if e.id == 0 {
			continue
		}
		if e.salt != t.salt || !slices.Equal(e.tokens, tokens[i*bs:(i+1)*bs]) {
			return fmt.Errorf("kvcache: block %d at position %d caches tokens %v (salt %q), the sequence has %v (salt %q)", b, i, e.tokens, e.salt, tokens[i*bs:(i+1)*bs], t.salt)
		}
	}
	return nil
}
