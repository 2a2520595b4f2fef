package kvcache

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"math"
)

// BlockID names one block of the device KV pools. It indexes the outermost
// dimension of every layer's K and V pool, so it is what the runner writes
// into block tables and slot mappings.
type BlockID int32

// NullBlock is never handed out. Runners pad block tables with it, and its
// contents are garbage by design, so nothing may ever read it as context.
const NullBlock BlockID = 0

// DefaultBlockSize is the block size in tokens when Options leaves it zero.
const DefaultBlockSize = 16

// ErrNoBlocks is wrapped by allocation errors when the free list cannot
// cover a request. It is not a failure of the request: the scheduler answers
// it by preempting a sequence or by waiting.
var ErrNoBlocks = errors.New("kvcache: out of free blocks")

// ErrStalePrefix is wrapped when a Prefix from MatchPrefix is used after a
// pool mutation evicted one of its blocks.
var ErrStalePrefix = errors.New("kvcache: stale prefix match")

// Options configure a Pool.
type Options struct {
	// NumBlocks is the size of the device pools in blocks, the null block
	// included, so NumBlocks-1 blocks are usable.
	NumBlocks int
	// BlockSize is the number of tokens per block; 0 means DefaultBlockSize.
	BlockSize int
	// EnablePrefixCache keeps the contents of full blocks findable by
	// MatchPrefix after their sequences free them.
	EnablePrefixCache bool
}

// Stats are cumulative counters of a Pool.
type Stats struct {
	// PrefixQueryTokens counts prompt tokens looked up in the prefix cache
	// by sequences that were then admitted (AllocatePrefix).
	PrefixQueryTokens uint64
	// PrefixHitTokens counts those tokens served from the cache.
	PrefixHitTokens uint64
	// Evictions counts cached blocks reused for new contents.
	Evictions uint64
}

// Pool hands out block ids and tracks who holds them. It owns no device
// memory: the runner allocates [NumBlocks][numKVHeads][BlockSize][headDim]
// per layer and trusts the pool's integers.
//
// A block is in exactly one of three states: in use (ref > 0), free and
// cached (ref == 0, registered in the prefix cache, still reusable by
// MatchPrefix until evicted), or free and empty. Free blocks sit in one
// list ordered by eviction preference: empty blocks at the front, cached
// blocks behind them oldest-freed first. Allocation takes from the front,
// so a cached prefix is only overwritten when no empty block is left.
//
// A Pool is not safe for concurrent use; the scheduler drives it from one
// goroutine.
type Pool struct {
	blockSize   int
	prefixCache bool

	// Per-block state, indexed by BlockID; index 0 is the null block, which
	// doubles as the sentinel of the circular free list.
	ref    []int32
	prev   []BlockID
	next   []BlockID
	isFree []bool
	meta   []entry

	numFree int

	// byHash maps a chained block hash to the one block registered under
	// it. Entries are verified by content on every hit (see entry).
	byHash    map[blockHash]BlockID
	nextEntry uint64
	mac       hash.Hash
	hashBuf   []byte
	// hashOverride replaces the keyed hash in tests that force collisions.
	hashOverride func(parent blockHash, salt string, tokens []int32) blockHash

	stats Stats
	dbg   debugState
}

// NewPool returns a pool with every usable block free and empty.
func NewPool(opts Options) (*Pool, error) {
	bs := opts.BlockSize
	if bs == 0 {
		bs = DefaultBlockSize
	}
	if bs < 0 {
		return nil, fmt.Errorf("kvcache: block size %d is negative", bs)
	}
	if opts.NumBlocks < 2 {
		return nil, fmt.Errorf("kvcache: %d blocks leave none usable besides the null block", opts.NumBlocks)
	}
	if err := checkSlots(opts.NumBlocks, bs); err != nil {
		return nil, err
	}
	key := make([]byte, 32)
	// crypto/rand.Read never fails (Go 1.24+): it crashes the program
	// rather than return a predictable key.
	_, _ = rand.Read(key)
	p := &Pool{
		blockSize:   bs,
		prefixCache: opts.EnablePrefixCache,
		byHash:      make(map[blockHash]BlockID),
		nextEntry:   1,
		mac:         hmac.New(sha256.New, key),
	}
	p.dbg.init()
	p.ref = make([]int32, 1, opts.NumBlocks)
	p.prev = make([]BlockID, 1, opts.NumBlocks)
	p.next = make([]BlockID, 1, opts.NumBlocks)
	p.isFree = make([]bool, 1, opts.NumBlocks)
	p.meta = make([]entry, 1, opts.NumBlocks)
	p.addBlocks(opts.NumBlocks - 1)
	return p, nil
}

// checkSlots rejects pools whose slot numbers (block*blockSize + offset)
// would not fit the I32 slot mappings of the backend contract.
func checkSlots(numBlocks, blockSize int) error {
	if numBlocks > math.MaxInt32/blockSize {
		return fmt.Errorf("kvcache: %d blocks of %d tokens overflow int32 slot numbers", numBlocks, blockSize)
	}
	return nil
}

// Grow adds n empty blocks, ids NumBlocks() .. NumBlocks()+n-1, for when
// the runner has mapped another slab of KV memory.
func (p *Pool) Grow(n int) error {
	if n < 0 {
		return fmt.Errorf("kvcache: grow by %d blocks", n)
	}
	total := len(p.ref)
	if n > math.MaxInt32-total {
		return fmt.Errorf("kvcache: growing %d blocks by %d overflows BlockID", total, n)
	}
	if err := checkSlots(total+n, p.blockSize); err != nil {
		return err
	}
	p.addBlocks(n)
	p.checkInvariants()
	return nil
}

// addBlocks appends n empty blocks at the front of the free list, lowest
// id first.
func (p *Pool) addBlocks(n int) {
	first := len(p.ref)
	for range n {
		p.ref = append(p.ref, 0)
		p.prev = append(p.prev, 0)
		p.next = append(p.next, 0)
		p.isFree = append(p.isFree, false)
		p.meta = append(p.meta, entry{})
	}
	for b := len(p.ref) - 1; b >= first; b-- {
		p.pushFront(BlockID(b))
	}
}

// BlockSize is the number of tokens per block.
func (p *Pool) BlockSize() int { return p.blockSize }

// NumBlocks is the size of the device pools in blocks, null block included.
func (p *Pool) NumBlocks() int { return len(p.ref) }

// NumFree counts free blocks, cached ones included: all of them can be
// allocated.
func (p *Pool) NumFree() int { return p.numFree }

// Usage is the fraction of usable blocks in use, in [0, 1].
func (p *Pool) Usage() float64 {
	usable := len(p.ref) - 1
	return float64(usable-p.numFree) / float64(usable)
}

// Stats returns the cumulative counters.
func (p *Pool) Stats() Stats { return p.stats }

// PrefixCacheEnabled reports whether full blocks are cached for reuse.
func (p *Pool) PrefixCacheEnabled() bool { return p.prefixCache }

// BlocksFor is the number of blocks that hold numTokens tokens.
func (p *Pool) BlocksFor(numTokens int) int {
	n := numTokens / p.blockSize
	if numTokens%p.blockSize != 0 {
		n++
	}
	return n
}

// Allocate grows t to cover numTokens tokens. It is all or nothing: on
// error t and the pool are unchanged. The error wraps ErrNoBlocks when the
// free list is too short.
func (p *Pool) Allocate(t *BlockTable, numTokens int) error {
	return p.AllocatePrefix(t, Prefix{}, numTokens)
}

// AllocatePrefix is Allocate for a sequence's first allocation after a
// prefix-cache lookup: t, which must be empty when m holds blocks, first
// takes m's cached blocks (a reference each), then fresh blocks up to
// numTokens. m must come from MatchPrefix on t with no pool mutation in
// between; a stale m gives an error wrapping ErrStalePrefix.
func (p *Pool) AllocatePrefix(t *BlockTable, m Prefix, numTokens int) error {
	if numTokens < 0 {
		return fmt.Errorf("kvcache: allocate %d tokens", numTokens)
	}
	if len(m.Blocks) > 0 {
		if len(t.blocks) != 0 {
			return fmt.Errorf("kvcache: prefix of %d blocks for a table that holds %d", len(m.Blocks), len(t.blocks))
		}
		if numTokens < m.NumTokens {
			return fmt.Errorf("kvcache: allocate %d tokens, fewer than the %d cached", numTokens, m.NumTokens)
		}
		if len(m.entries) != len(m.Blocks) {
			return fmt.Errorf("kvcache: prefix not made by MatchPrefix: %w", ErrStalePrefix)
		}
		if m.salt != t.salt {
			return fmt.Errorf("kvcache: prefix matched for salt %q, table has %q", m.salt, t.salt)
		}
		for i, b := range m.Blocks {
			if b <= NullBlock || int(b) >= len(p.ref) || p.meta[b].id != m.entries[i] {
				return fmt.Errorf("kvcache: prefix block %d (#%d): %w", b, i, ErrStalePrefix)
			}
		}
	}
	need := p.BlocksFor(numTokens) - len(t.blocks) - len(m.Blocks)
	need = max(need, 0)
	take := need
	for _, b := range m.Blocks {
		if p.ref[b] == 0 {
			take++ // a cached free block leaves the free list too
		}
	}
	if take > p.numFree {
		return fmt.Errorf("kvcache: allocate %d blocks with %d free: %w", take, p.numFree, ErrNoBlocks)
	}
	if len(m.Blocks) > 0 {
		for _, b := range m.Blocks {
			if p.ref[b] == 0 {
				p.remove(b)
			}
			p.ref[b]++
		}
		t.blocks = append(t.blocks, m.Blocks...)
		t.entries = append(t.entries[:0], m.entries...)
		t.numCommitted = len(m.Blocks)
	}
	if m.numQueried > 0 {
		p.stats.PrefixQueryTokens += uint64(m.numQueried)
		p.stats.PrefixHitTokens += uint64(m.NumTokens)
	}
	for range need {
		t.blocks = append(t.blocks, p.take())
	}
	p.dbg.track(t)
	p.checkInvariants()
	return nil
}

// take pops the front of the free list, evicting its cached contents.
func (p *Pool) take() BlockID {
	b := p.next[NullBlock]
	p.remove(b)
	if p.meta[b].id != 0 {
		p.unregister(b)
		p.stats.Evictions++
	}
	p.ref[b] = 1
	return b
}

// Free drops t's references. Blocks nobody else holds return to the free
// list: empty ones at the front, cached ones at the back, last block first,
// so a sequence's later (less shared) blocks are evicted before its root.
// t becomes empty but keeps its cached block hashes, so a preempted
// sequence can look up its own prefix again.
func (p *Pool) Free(t *BlockTable) {
	for i := len(t.blocks) - 1; i >= 0; i-- {
		b := t.blocks[i]
		p.ref[b]--
		if p.ref[b] > 0 {
			continue
		}
		if p.meta[b].id != 0 {
			p.pushBack(b)
		} else {
			p.pushFront(b)
		}
	}
	// A fresh slice, never the old backing array: plans handed out earlier
	// alias t.blocks and must keep seeing the ids they were given.
	t.blocks = nil
	t.entries = t.entries[:0]
	t.numCommitted = 0
	p.dbg.untrack(t)
	p.checkInvariants()
}

// Truncate shrinks t to the blocks that hold its first numTokens tokens,
// dropping the references of the blocks after them (speculative decoding:
// the KV slots of rejected draft tokens). Freed blocks go back to the free
// list as Free puts them. Committed blocks are never dropped: their
// contents are computed tokens, and the chain of t's prefix-cache entries
// ends with them; a numTokens inside them is an error, and so is a
// negative one. The dropped blocks held only KV past numTokens, which
// no computed token's attention reads.
func (p *Pool) Truncate(t *BlockTable, numTokens int) error {
	if numTokens < 0 {
		return fmt.Errorf("kvcache: truncate to %d tokens", numTokens)
	}
	if numTokens < t.numCommitted*p.blockSize {
		return fmt.Errorf("kvcache: truncate to %d tokens, inside the %d committed blocks", numTokens, t.numCommitted)
	}
	keep := p.BlocksFor(numTokens)
	if keep >= len(t.blocks) {
		return nil
	}
	for i := len(t.blocks) - 1; i >= keep; i-- {
		b := t.blocks[i]
		p.ref[b]--
		if p.ref[b] > 0 {
			continue
		}
		if p.meta[b].id != 0 {
			p.pushBack(b)
		} else {
			p.pushFront(b)
		}
	}
	// A fresh backing array, as Free: plans handed out earlier alias
	// t.blocks, and the table's next Allocate must not write over the ids
	// they were given.
	t.blocks = append([]BlockID(nil), t.blocks[:keep]...)
	if len(t.blocks) == 0 {
		t.blocks = nil
		p.dbg.untrack(t)
	}
	p.checkInvariants()
	return nil
}

// Fork returns a new table for a sequence that continues from the first
// numTokens tokens of t (n>1 sampling). Full blocks are shared by
// reference: they are never written again. A partially filled last block
// cannot be shared, since both sequences will write their next tokens into
// it, so the fork gets a fresh block and the returned copy list tells the
// runner to copy the source block into it before it writes any KV of the
// next step. The error wraps ErrNoBlocks when that block is not available.
func (p *Pool) Fork(t *BlockTable, numTokens int) (*BlockTable, []BlockCopy, error) {
	if numTokens < 0 || numTokens > len(t.blocks)*p.blockSize {
		return nil, nil, fmt.Errorf("kvcache: fork at %d tokens of a table covering %d", numTokens, len(t.blocks)*p.blockSize)
	}
	full := numTokens / p.blockSize
	partial := numTokens%p.blockSize != 0
	if partial && p.numFree == 0 {
		return nil, nil, fmt.Errorf("kvcache: fork needs a block for the partial last block: %w", ErrNoBlocks)
	}
	c := &BlockTable{salt: t.salt}
	c.blocks = make([]BlockID, full, p.BlocksFor(numTokens))
	copy(c.blocks, t.blocks[:full])
	for _, b := range c.blocks {
		p.ref[b]++
	}
	committed := min(t.numCommitted, full)
	c.entries = append([]uint64(nil), t.entries[:committed]...)
	c.numCommitted = committed
	c.hashes = append([]blockHash(nil), t.hashes[:min(len(t.hashes), full)]...)
	var copies []BlockCopy
	if partial {
		dst := p.take()
		c.blocks = append(c.blocks, dst)
		copies = []BlockCopy{{Src: t.blocks[full], Dst: dst}}
	}
	p.dbg.track(c)
	p.checkInvariants()
	return c, copies, nil
}

// BlockCopy asks the runner to copy every layer's K and V (and scales) of
// block Src into block Dst.
type BlockCopy struct {
	Src, Dst BlockID
}

// Free-list primitives. The list is circular through the null block.

func (p *Pool) pushFront(b BlockID) {
	n := p.next[NullBlock]
	p.prev[b], p.next[b] = NullBlock, n
	p.prev[n], p.next[NullBlock] = b, b
	p.isFree[b] = true
	p.numFree++
}

func (p *Pool) pushBack(b BlockID) {
	l := p.prev[NullBlock]
	p.prev[b], p.next[b] = l, NullBlock
	p.next[l], p.prev[NullBlock] = b, b
	p.isFree[b] = true
	p.numFree++
}

func (p *Pool) remove(b BlockID) {
	pr, nx := p.prev[b], p.next[b]
	p.next[pr], p.prev[nx] = nx, pr
	p.prev[b], p.next[b] = NullBlock, NullBlock
	p.isFree[b] = false
	p.numFree--
}
