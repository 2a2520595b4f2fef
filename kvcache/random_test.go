package kvcache_test

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/trigon-llm/trigon/kvcache"
)

// rSeq is a sequence of the random test with its own model of what the
// KV cache must hold: digest[p] identifies the KV of position p, which
// depends on the salt and on every token up to p.
type rSeq struct {
	table    *kvcache.BlockTable
	salt     string
	tokens   []int32
	digest   []uint64
	computed int
}

func (s *rSeq) appendTokens(toks ...int32) {
	for _, tok := range toks {
		h := fnv.New64a()
		if n := len(s.digest); n > 0 {
			fmt.Fprintf(h, "%d|%d", s.digest[n-1], tok)
		} else {
			fmt.Fprintf(h, "%q|%d", s.salt, tok)
		}
		s.tokens = append(s.tokens, tok)
		s.digest = append(s.digest, h.Sum64())
	}
}

// rWorld simulates the device cache: one digest per slot, 0 for garbage.
type rWorld struct {
	t     *testing.T
	rng   *rand.Rand
	pool  *kvcache.Pool
	bs    int
	slots []uint64
	seqs  []*rSeq
	bases [][]int32
}

func (w *rWorld) slot(b kvcache.BlockID, off int) *uint64 {
	for len(w.slots) < w.pool.NumBlocks()*w.bs {
		w.slots = append(w.slots, 0)
	}
	return &w.slots[int(b)*w.bs+off]
}

// compute plays the runner: it writes the KV of positions [from, to) of s.
// Writing into a block another table holds would corrupt that table.
func (w *rWorld) compute(s *rSeq, from, to int) {
	for p := from; p < to; p++ {
		b := s.table.Blocks()[p/w.bs]
		if b == kvcache.NullBlock {
			w.t.Fatalf("write to the null block")
		}
		if r := w.pool.Ref(b); r != 1 {
			w.t.Fatalf("write position %d into block %d with ref %d", p, b, r)
		}
		*w.slot(b, p%w.bs) = s.digest[p]
	}
}

// check verifies the pool and that every computed position of every
// sequence reads back its own KV through its block table.
func (w *rWorld) check(step int, op string) {
	w.t.Helper()
	tables := make([]*kvcache.BlockTable, len(w.seqs))
	for i, s := range w.seqs {
		tables[i] = s.table
		for p := range s.computed {
			if got := *w.slot(s.table.Blocks()[p/w.bs], p%w.bs); got != s.digest[p] {
				w.t.Fatalf("step %d (%s): sequence %d position %d reads KV %x, want %x", step, op, i, p, got, s.digest[p])
			}
		}
		if err := w.pool.VerifyTokens(s.table, s.tokens[:s.computed]); err != nil {
			w.t.Fatalf("step %d (%s): %v", step, op, err)
		}
	}
	if err := w.pool.Verify(tables); err != nil {
		w.t.Fatalf("step %d (%s): %v", step, op, err)
	}
}

func (w *rWorld) newSeq() *rSeq {
	s := &rSeq{table: nil}
	if w.rng.IntN(5) == 0 {
		s.salt = "tenant-b"
	}
	s.table = kvcache.NewBlockTable(s.salt)
	base := w.bases[w.rng.IntN(len(w.bases))]
	s.appendTokens(base[:w.rng.IntN(len(base)+1)]...)
	for range 1 + w.rng.IntN(3*w.bs) {
		s.appendTokens(int32(w.rng.IntN(4)))
	}
	return s
}

// advance computes the next chunk of s, taking prefix-cache hits on its
// first allocation. It reports false when the pool had no blocks.
func (w *rWorld) advance(s *rSeq) bool {
	if s.table.Len() == 0 {
		m := w.pool.MatchPrefix(s.table, s.tokens)
		if m.NumTokens > len(s.tokens)-1 || m.NumTokens%w.bs != 0 || len(m.Blocks)*w.bs != m.NumTokens {
			w.t.Fatalf("match of %d tokens covers %d (%d blocks)", len(s.tokens), m.NumTokens, len(m.Blocks))
		}
		n := 1 + w.rng.IntN(len(s.tokens)-m.NumTokens)
		if err := w.pool.AllocatePrefix(s.table, m, m.NumTokens+n); err != nil {
			if !errors.Is(err, kvcache.ErrNoBlocks) {
				w.t.Fatal(err)
			}
			return false
		}
		s.computed = m.NumTokens
		// The hit is checked like any computed position by check.
		w.compute(s, s.computed, s.computed+n)
		s.computed += n
	} else {
		n := 1 + w.rng.IntN(len(s.tokens)-s.computed)
		if err := w.pool.Allocate(s.table, s.computed+n); err != nil {
			if !errors.Is(err, kvcache.ErrNoBlocks) {
				w.t.Fatal(err)
			}
			return false
		}
		w.compute(s, s.computed, s.computed+n)
		s.computed += n
	}
	if err := w.pool.CommitFull(s.table, s.tokens[:s.computed]); err != nil {
		w.t.Fatal(err)
	}
	return true
}

// speculate plays a verify step of speculative decoding on s, which has
// one token to compute: that token and d draft tokens are computed, the
// first a drafts are accepted and a new token follows them, and the
// table is truncated to the tokens (the rejected drafts' slots hold KV of
// tokens the sequence does not have: check and later prefix hits catch a
// commit of them). It reports false when the pool had no blocks.
func (w *rWorld) speculate(s *rSeq) bool {
	c := s.computed
	d := 1 + w.rng.IntN(2*w.bs)
	if err := w.pool.Allocate(s.table, c+1+d); err != nil {
		if !errors.Is(err, kvcache.ErrNoBlocks) {
			w.t.Fatal(err)
		}
		return false
	}
	draft := make([]int32, d)
	for i := range draft {
		draft[i] = int32(w.rng.IntN(4))
	}
	// The KV the draft positions get: the chain through the draft.
	fed := &rSeq{salt: s.salt, tokens: slices.Clone(s.tokens), digest: slices.Clone(s.digest)}
	fed.appendTokens(draft...)
	fed.table = s.table
	w.compute(fed, c, c+1+d)
	a := w.rng.IntN(d + 1)
	s.appendTokens(draft[:a]...)
	s.computed = c + 1 + a
	s.appendTokens(int32(w.rng.IntN(4))) // the token after the accepted ones
	if err := w.pool.CommitFull(s.table, s.tokens[:s.computed]); err != nil {
		w.t.Fatal(err)
	}
	if err := w.pool.Truncate(s.table, len(s.tokens)); err != nil {
		w.t.Fatal(err)
	}
	if n := s.table.Len(); n > w.pool.BlocksFor(len(s.tokens)) || n < w.pool.BlocksFor(s.computed) {
		w.t.Fatalf("truncated to %d tokens (%d computed), the table holds %d blocks", len(s.tokens), s.computed, n)
	}
	return true
}

func runRandom(t *testing.T, seed uint64, bs int, prefix, collide bool, ops int) kvcache.Stats {
	rng := rand.New(rand.NewPCG(seed, 99))
	numBlocks := 8 + rng.IntN(40)
	pool, err := kvcache.NewPool(kvcache.Options{NumBlocks: numBlocks, BlockSize: bs, EnablePrefixCache: prefix})
	if err != nil {
		t.Fatal(err)
	}
	if collide {
		// A hash of almost nothing: most blocks collide with each other.
		pool.SetHashOverride(func(_ [32]byte, _ string, tokens []int32) [32]byte {
			return [32]byte{byte(tokens[0] % 2)}
		})
	}
	w := &rWorld{t: t, rng: rng, pool: pool, bs: bs}
	for range 3 {
		base := make([]int32, 2*bs+rng.IntN(4*bs))
		for i := range base {
			base[i] = int32(rng.IntN(4))
		}
		w.bases = append(w.bases, base)
	}
	for step := range ops {
		op := ""
		switch r := rng.IntN(100); {
		case r < 15 && len(w.seqs) < 8:
			op = "new"
			w.seqs = append(w.seqs, w.newSeq())
		case r < 55 && len(w.seqs) > 0:
			op = "advance"
			s := w.seqs[rng.IntN(len(w.seqs))]
			if s.computed < len(s.tokens) && !w.advance(s) && len(w.seqs) > 1 {
				// Out of blocks: preempt another sequence, as the scheduler would.
				op = "preempt"
				v := w.seqs[rng.IntN(len(w.seqs))]
				pool.Free(v.table)
				v.computed = 0
			}
		case r < 70 && len(w.seqs) > 0:
			op = "append"
			s := w.seqs[rng.IntN(len(w.seqs))]
			if s.computed == len(s.tokens) {
				for range 1 + rng.IntN(3) {
					s.appendTokens(int32(rng.IntN(4)))
				}
			}
		case r < 78 && len(w.seqs) > 0 && len(w.seqs) < 8:
			op = "fork"
			s := w.seqs[rng.IntN(len(w.seqs))]
			if s.table.Len() == 0 {
				break
			}
			child, copies, err := pool.Fork(s.table, s.computed)
			if errors.Is(err, kvcache.ErrNoBlocks) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, cp := range copies {
				for off := range bs {
					*w.slot(cp.Dst, off) = *w.slot(cp.Src, off)
				}
			}
			c := &rSeq{table: child, salt: s.salt, computed: s.computed}
			c.tokens = slices.Clone(s.tokens[:s.computed])
			c.digest = slices.Clone(s.digest[:s.computed])
			w.seqs = append(w.seqs, c)
		case r < 95 && len(w.seqs) > 0:
			op = "free"
			i := rng.IntN(len(w.seqs))
			pool.Free(w.seqs[i].table)
			w.seqs = slices.Delete(w.seqs, i, i+1)
		case r < 97 && len(w.seqs) > 0:
			op = "speculate"
			s := w.seqs[rng.IntN(len(w.seqs))]
			if s.table.Len() > 0 && s.computed == len(s.tokens)-1 {
				w.speculate(s)
			}
		case r < 99:
			op = "grow"
			if err := pool.Grow(rng.IntN(3)); err != nil {
				t.Fatal(err)
			}
		}
		w.check(step, op)
	}
	for _, s := range w.seqs {
		pool.Free(s.table)
	}
	w.seqs = nil
	w.check(ops, "free all")
	if pool.NumFree() != pool.NumBlocks()-1 {
		t.Fatalf("%d of %d blocks free after freeing everything", pool.NumFree(), pool.NumBlocks()-1)
	}
	return pool.Stats()
}

// TestRandomOps runs long random operation sequences and checks after
// every operation that the pool is consistent and that every sequence
// reads back exactly the KV it computed, including through prefix hits,
// forks, preemptions and speculative rollbacks, also when block hashes
// collide.
func TestRandomOps(t *testing.T) {
	for _, tc := range []struct {
		name            string
		bs              int
		prefix, collide bool
	}{
		{"bs4-prefix", 4, true, false},
		{"bs1-prefix", 1, true, false},
		{"bs16-prefix", 16, true, false},
		{"bs4-noprefix", 4, false, false},
		{"bs4-collisions", 4, true, true},
		{"bs2-collisions", 2, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var hits, evictions uint64
			for seed := range uint64(8) {
				st := runRandom(t, seed, tc.bs, tc.prefix, tc.collide, 2000)
				hits += st.PrefixHitTokens
				evictions += st.Evictions
			}
			if tc.prefix && hits == 0 {
				t.Errorf("no prefix-cache hits in any run: the test does not exercise the cache")
			}
			if tc.prefix && !tc.collide && evictions == 0 {
				t.Errorf("no evictions in any run: the test does not exercise eviction")
			}
			t.Logf("hit tokens %d, evictions %d", hits, evictions)
		})
	}
}
