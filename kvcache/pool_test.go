package kvcache_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/kvcache"
)

func TestNewPoolOptions(t *testing.T) {
	for _, tc := range []struct {
		name      string
		opts      kvcache.Options
		wantErr   string
		blockSize int
	}{
		{"default block size", kvcache.Options{NumBlocks: 4}, "", kvcache.DefaultBlockSize},
		{"explicit block size", kvcache.Options{NumBlocks: 4, BlockSize: 32}, "", 32},
		{"only the null block", kvcache.Options{NumBlocks: 1}, "none usable", 0},
		{"negative blocks", kvcache.Options{NumBlocks: -3}, "none usable", 0},
		{"negative block size", kvcache.Options{NumBlocks: 4, BlockSize: -16}, "negative", 0},
		{"slots overflow int32", kvcache.Options{NumBlocks: math.MaxInt32/16 + 1, BlockSize: 16}, "overflow", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := kvcache.NewPool(tc.opts)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.BlockSize() != tc.blockSize || p.NumFree() != tc.opts.NumBlocks-1 || p.Usage() != 0 {
				t.Fatalf("block size %d, free %d, usage %v", p.BlockSize(), p.NumFree(), p.Usage())
			}
		})
	}
}

func TestGrow(t *testing.T) {
	for _, tc := range []struct {
		name    string
		n       int
		wantErr bool
	}{
		{"zero", 0, false},
		{"some", 5, false},
		{"negative", -1, true},
		{"overflow", math.MaxInt32, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := kvcache.NewPool(kvcache.Options{NumBlocks: 3, BlockSize: 4})
			if err != nil {
				t.Fatal(err)
			}
			tb := kvcache.NewBlockTable("")
			if err := p.Allocate(tb, 8); err != nil {
				t.Fatal(err)
			}
			err = p.Grow(tc.n)
			if (err != nil) != tc.wantErr {
				t.Fatalf("Grow(%d) = %v", tc.n, err)
			}
			grown := 0
			if !tc.wantErr {
				grown = tc.n
			}
			if p.NumBlocks() != 3+grown || p.NumFree() != grown {
				t.Fatalf("after Grow(%d): %d blocks, %d free", tc.n, p.NumBlocks(), p.NumFree())
			}
			// The new blocks are usable and distinct.
			tb2 := kvcache.NewBlockTable("")
			if err := p.Allocate(tb2, 4*grown); err != nil {
				t.Fatal(err)
			}
			seen := map[kvcache.BlockID]bool{}
			for _, b := range append(tb.Blocks(), tb2.Blocks()...) {
				if b == kvcache.NullBlock || seen[b] || int(b) >= p.NumBlocks() {
					t.Fatalf("bad block %d in %v %v", b, tb.Blocks(), tb2.Blocks())
				}
				seen[b] = true
			}
			if err := p.Verify([]*kvcache.BlockTable{tb, tb2}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestBlocksForAndUsage(t *testing.T) {
	p, err := kvcache.NewPool(kvcache.Options{NumBlocks: 11, BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ tokens, blocks int }{
		{0, 0}, {1, 1}, {15, 1}, {16, 1}, {17, 2}, {160, 10}, {math.MaxInt, math.MaxInt/16 + 1},
	} {
		if got := p.BlocksFor(tc.tokens); got != tc.blocks {
			t.Errorf("BlocksFor(%d) = %d, want %d", tc.tokens, got, tc.blocks)
		}
	}
	tb := kvcache.NewBlockTable("")
	if err := p.Allocate(tb, 40); err != nil {
		t.Fatal(err)
	}
	if u := p.Usage(); u != 0.3 {
		t.Errorf("usage with 3 of 10 blocks = %v", u)
	}
}

func TestAllocatePrefixMisuse(t *testing.T) {
	p, err := kvcache.NewPool(kvcache.Options{NumBlocks: 9, BlockSize: 4, EnablePrefixCache: true})
	if err != nil {
		t.Fatal(err)
	}
	tokens := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9}
	a := kvcache.NewBlockTable("")
	if err := p.Allocate(a, len(tokens)); err != nil {
		t.Fatal(err)
	}
	if err := p.CommitFull(a, tokens); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		run  func(b *kvcache.BlockTable, m kvcache.Prefix) error
		is   error
	}{
		{"fewer tokens than cached", func(b *kvcache.BlockTable, m kvcache.Prefix) error {
			return p.AllocatePrefix(b, m, m.NumTokens-1)
		}, nil},
		{"table not empty", func(b *kvcache.BlockTable, m kvcache.Prefix) error {
			if err := p.Allocate(b, 1); err != nil {
				return err
			}
			defer p.Free(b)
			return p.AllocatePrefix(b, m, 9)
		}, nil},
		{"forged prefix", func(b *kvcache.BlockTable, m kvcache.Prefix) error {
			return p.AllocatePrefix(b, kvcache.Prefix{Blocks: m.Blocks, NumTokens: m.NumTokens}, 9)
		}, kvcache.ErrStalePrefix},
		{"other salt", func(b *kvcache.BlockTable, m kvcache.Prefix) error {
			return p.AllocatePrefix(kvcache.NewBlockTable("x"), m, 9)
		}, nil},
		{"commit beyond the table", func(b *kvcache.BlockTable, m kvcache.Prefix) error {
			return p.CommitFull(b, tokens)
		}, nil},
		{"fork beyond the table", func(b *kvcache.BlockTable, m kvcache.Prefix) error {
			_, _, err := p.Fork(b, 1)
			return err
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := kvcache.NewBlockTable("")
			m := p.MatchPrefix(b, tokens)
			if m.NumTokens != 8 {
				t.Fatalf("match %d tokens, want 8", m.NumTokens)
			}
			free := p.NumFree()
			err := tc.run(b, m)
			if err == nil {
				t.Fatal("no error")
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Fatalf("err = %v, want %v", err, tc.is)
			}
			if b.Len() != 0 || p.NumFree() != free {
				t.Fatalf("failed call changed state: table %v, free %d -> %d", b.Blocks(), free, p.NumFree())
			}
			if err := p.Verify([]*kvcache.BlockTable{a}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestVerifyCatchesRewrittenTokens: a table's tokens may only grow. A
// caller that commits other tokens for positions whose hashes the table
// already cached breaks the map's hash-to-contents invariant; lookups stay
// correct (hits compare tokens) and Verify reports the breach, which the
// invariants build turns into a panic at the faulty call.
func TestVerifyCatchesRewrittenTokens(t *testing.T) {
	p, err := kvcache.NewPool(kvcache.Options{NumBlocks: 9, BlockSize: 4, EnablePrefixCache: true})
	if err != nil {
		t.Fatal(err)
	}
	a := kvcache.NewBlockTable("")
	toks := []int32{1, 2, 3, 4, 5, 6}
	if err := p.Allocate(a, 6); err != nil {
		t.Fatal(err)
	}
	p.MatchPrefix(a, toks) // caches the hash of block 0 in a
	if err := p.Allocate(a, 6); err != nil {
		t.Fatal(err)
	}
	defer func() {
		r := recover()
		if (r != nil) != kvcache.Invariants {
			t.Fatalf("invariants build %v, panic %v", kvcache.Invariants, r)
		}
		if r != nil {
			return
		}
		if err := p.Verify([]*kvcache.BlockTable{a}); err == nil {
			t.Fatal("Verify missed a block cached under another block's hash")
		}
		// The rewritten block is never returned for either token run.
		for _, q := range [][]int32{{1, 2, 3, 4, 5}, {9, 9, 9, 9, 5}} {
			if m := p.MatchPrefix(kvcache.NewBlockTable(""), q); m.NumTokens != 0 {
				t.Fatalf("match %v for %v", m.Blocks, q)
			}
		}
	}()
	_ = p.CommitFull(a, []int32{9, 9, 9, 9, 5, 6})
}

func TestHashKeyed(t *testing.T) {
	p1, _ := kvcache.NewPool(kvcache.Options{NumBlocks: 2, EnablePrefixCache: true})
	p2, _ := kvcache.NewPool(kvcache.Options{NumBlocks: 2, EnablePrefixCache: true})
	rng := rand.New(rand.NewPCG(1, 2))
	toks := make([]int32, 16)
	for i := range toks {
		toks[i] = rng.Int32N(1 << 17)
	}
	var zero, parent [32]byte
	parent[0] = 1
	h := p1.HashBlock(zero, "", toks)
	if h != p1.HashBlock(zero, "", toks) {
		t.Fatal("hash is not deterministic within a pool")
	}
	if h == p2.HashBlock(zero, "", toks) {
		t.Fatal("two pools hash alike: the key is not random")
	}
	if h == p1.HashBlock(parent, "", toks) || h == p1.HashBlock(zero, "x", toks) {
		t.Fatal("hash ignores the parent or the salt")
	}
	other := append([]int32(nil), toks...)
	other[15]++
	if h == p1.HashBlock(zero, "", other) {
		t.Fatal("hash ignores the last token")
	}
	// Salt and tokens are length-delimited: moving bytes between them
	// changes the hash.
	if p1.HashBlock(zero, "ab", toks[:1]) == p1.HashBlock(zero, "a", toks[:1]) {
		t.Fatal("salt not delimited")
	}
}

// TestVerifyCatchesCorruption checks that Verify (and the invariants build,
// when enabled) notices a reference count that disagrees with the tables.
func TestVerifyCatchesCorruption(t *testing.T) {
	p, _ := kvcache.NewPool(kvcache.Options{NumBlocks: 5, BlockSize: 4})
	a := kvcache.NewBlockTable("")
	if err := p.Allocate(a, 8); err != nil {
		t.Fatal(err)
	}
	if err := p.Verify([]*kvcache.BlockTable{a}); err != nil {
		t.Fatal(err)
	}
	if err := p.Verify(nil); err == nil {
		t.Fatal("Verify without the live table passed")
	}
	p.CorruptRef(a.Blocks()[0])
	if err := p.Verify([]*kvcache.BlockTable{a}); err == nil {
		t.Fatal("Verify missed a bad reference count")
	}
	defer func() {
		if r := recover(); (r != nil) != kvcache.Invariants {
			t.Fatalf("invariants build %v, panic %v", kvcache.Invariants, r)
		}
	}()
	p.CheckInvariants()
}
