package kvcache

import (
	"encoding/binary"
	"fmt"
	"slices"
)

// blockHash is the chained hash of one full block:
//
//	hash_i = HMAC-SHA256(poolKey, hash_{i-1} || len(salt) || salt || tokens_i)
//
// with hash_{-1} all zeros. The key is 32 random bytes per pool, so a client
// cannot predict hashes and craft prompts that collide with another
// tenant's blocks to evict them or probe for them.
type blockHash [32]byte

// entry is the prefix-cache registration of one block. Correctness never
// rests on the hash: a hit must match the block's tokens and salt exactly,
// and its parent must be the very registration matched one block earlier.
// Registration ids are never reused, so by induction a matched chain holds
// exactly the looked-up tokens, even if two different chains were to share
// a hash. The hash only finds candidates.
type entry struct {
	id         uint64 // registration id; 0: not registered
	parent     uint64 // id of the registration of the previous block; 0 for the first
	hash       blockHash
	parentHash blockHash
	salt       string
	tokens     []int32 // [blockSize]
}

// Prefix is the result of MatchPrefix: the longest run of cached full
// blocks that hold the start of a sequence's tokens. It is valid until the
// next pool mutation; hand it to AllocatePrefix to take the blocks.
type Prefix struct {
	// Blocks are the cached blocks, in order. The caller must not modify it.
	Blocks []BlockID
	// NumTokens = len(Blocks) * block size: tokens whose KV need no compute.
	NumTokens int

	numQueried int
	entries    []uint64
	salt       string
}

// hashBlock computes one link of the chain. It reuses one HMAC state and
// buffer, which is why the pool is single-goroutine.
func (p *Pool) hashBlock(parent blockHash, salt string, tokens []int32) blockHash {
	if p.hashOverride != nil {
		return p.hashOverride(parent, salt, tokens)
	}
	buf := p.hashBuf[:0]
	buf = append(buf, parent[:]...)
	buf = binary.LittleEndian.AppendUint64(buf, uint64(len(salt)))
	buf = append(buf, salt...)
	for _, tok := range tokens {
		buf = binary.LittleEndian.AppendUint32(buf, uint32(tok))
	}
	p.hashBuf = buf
	p.mac.Reset()
	p.mac.Write(buf)
	var h blockHash
	p.mac.Sum(h[:0])
	return h
}

// ensureHashes extends t's hash cache to the first n full blocks of tokens.
func (p *Pool) ensureHashes(t *BlockTable, tokens []int32, n int) {
	bs := p.blockSize
	for i := len(t.hashes); i < n; i++ {
		var parent blockHash
		if i > 0 {
			parent = t.hashes[i-1]
		}
		t.hashes = append(t.hashes, p.hashBlock(parent, t.salt, tokens[i*bs:(i+1)*bs]))
	}
}

// MatchPrefix finds the cached full blocks that begin tokens, the whole
// token sequence of t's sequence. The match never covers the last token:
// the model must compute at least one position to produce logits, so the
// hit is capped at len(tokens)-1 rounded down to a block. It changes no
// block state; t only caches the block hashes of tokens, which is why
// tokens must only ever grow by appending for a given table.
func (p *Pool) MatchPrefix(t *BlockTable, tokens []int32) Prefix {
	if !p.prefixCache || len(tokens) == 0 {
		return Prefix{}
	}
	m := Prefix{numQueried: len(tokens), salt: t.salt}
	n := (len(tokens) - 1) / p.blockSize
	p.ensureHashes(t, tokens, n)
	bs := p.blockSize
	var parent uint64
	for i := range n {
		b, ok := p.byHash[t.hashes[i]]
		if !ok {
			break
		}
		e := &p.meta[b]
		if e.parent != parent || e.salt != t.salt || !slices.Equal(e.tokens, tokens[i*bs:(i+1)*bs]) {
			break
		}
		m.Blocks = append(m.Blocks, b)
		m.entries = append(m.entries, e.id)
		parent = e.id
	}
	m.NumTokens = len(m.Blocks) * bs
	return m
}

// CommitFull registers t's full blocks within tokens, the sequence's tokens
// whose KV is computed (call it after the step that computed them, never
// before: a block registered early could be matched by a sequence that
// reads it before it is written). Blocks already committed are skipped.
// When another block already caches the same chain, t's block stays
// unregistered (a duplicate) and the chain continues from the cached one.
// It does nothing when prefix caching is off.
func (p *Pool) CommitFull(t *BlockTable, tokens []int32) error {
	if !p.prefixCache {
		return nil
	}
	bs := p.blockSize
	if len(tokens) > len(t.blocks)*bs {
		return fmt.Errorf("kvcache: commit %d tokens to a table covering %d", len(tokens), len(t.blocks)*bs)
	}
	n := len(tokens) / bs
	if n <= t.numCommitted {
		return nil
	}
	p.ensureHashes(t, tokens, n)
	for i := t.numCommitted; i < n; i++ {
		var parent uint64
		var parentHash blockHash
		if i > 0 {
			parent = t.entries[i-1]
			parentHash = t.hashes[i-1]
		}
		blk := tokens[i*bs : (i+1)*bs]
		b := t.blocks[i]
		if e := &p.meta[b]; e.id != 0 {
			// Shared with a table that registered it (fork or prefix hit):
			// the contents must be what this table computed.
			if e.salt != t.salt || !slices.Equal(e.tokens, blk) {
				return fmt.Errorf("kvcache: block %d (#%d) is cached with other tokens than the table's", b, i)
			}
			if e.parent == parent {
				t.entries = append(t.entries, e.id)
				t.numCommitted = i + 1
				continue
			}
			// Same contents registered under another chain (the tables
			// forked before committing): register it anew below.
		}
		h := t.hashes[i]
		if x, ok := p.byHash[h]; ok {
			e := &p.meta[x]
			if e.parent == parent && e.salt == t.salt && slices.Equal(e.tokens, blk) {
				t.entries = append(t.entries, e.id)
				t.numCommitted = i + 1
				continue
			}
			// A stale registration (its parent was evicted and registered
			// anew) or a true collision: either way the newer chain is the
			// one lookups can reach.
			p.unregister(x)
		}
		p.register(b, h, parentHash, parent, t.salt, blk)
		t.entries = append(t.entries, p.meta[b].id)
		t.numCommitted = i + 1
	}
	p.checkInvariants()
	return nil
}

func (p *Pool) register(b BlockID, h, parentHash blockHash, parent uint64, salt string, tokens []int32) {
	if p.meta[b].id != 0 {
		p.unregister(b)
	}
	e := &p.meta[b]
	e.id = p.nextEntry
	p.nextEntry++
	e.parent = parent
	e.hash = h
	e.parentHash = parentHash
	e.salt = salt
	e.tokens = append(e.tokens[:0], tokens...)
	p.byHash[h] = b
}

// unregister drops b from the cache. A free cached block becomes an empty
// one, so it moves to the front of the free list.
func (p *Pool) unregister(b BlockID) {
	e := &p.meta[b]
	delete(p.byHash, e.hash)
	e.id, e.parent, e.salt = 0, 0, ""
	e.tokens = e.tokens[:0]
	if p.isFree[b] {
		p.remove(b)
		p.pushFront(b)
	}
}
