package kvcache_test

import (
	"testing"

	"github.com/trigon-llm/trigon/kvcache"
)

// BenchmarkMatchPrefix looks up a 4k-token prompt whose blocks are all
// cached (hashes cached in the table after the first lookup, as for a
// request that waits several steps).
func BenchmarkMatchPrefix(b *testing.B) {
	p, _ := kvcache.NewPool(kvcache.Options{NumBlocks: 1024, EnablePrefixCache: true})
	toks := make([]int32, 4096)
	for i := range toks {
		toks[i] = int32(i * 7 % 32000)
	}
	a := kvcache.NewBlockTable("")
	if err := p.Allocate(a, len(toks)); err != nil {
		b.Fatal(err)
	}
	if err := p.CommitFull(a, toks); err != nil {
		b.Fatal(err)
	}
	q := kvcache.NewBlockTable("")
	b.ReportAllocs()
	for b.Loop() {
		if m := p.MatchPrefix(q, toks); m.NumTokens != 4080 {
			b.Fatal(m.NumTokens)
		}
	}
}

// BenchmarkDecodeAllocate is one decode step's pool work for 256
// sequences: grow by a token, commit, and occasionally take a block.
func BenchmarkDecodeAllocate(b *testing.B) {
	p, _ := kvcache.NewPool(kvcache.Options{NumBlocks: 256*64 + 1, EnablePrefixCache: true})
	type seq struct {
		t    *kvcache.BlockTable
		toks []int32
	}
	seqs := make([]seq, 256)
	for i := range seqs {
		seqs[i] = seq{t: kvcache.NewBlockTable(""), toks: []int32{int32(i)}}
	}
	b.ReportAllocs()
	for b.Loop() {
		for i := range seqs {
			s := &seqs[i]
			if len(s.toks) == 1000 {
				p.Free(s.t)
				s.toks = s.toks[:1]
			}
			if err := p.Allocate(s.t, len(s.toks)); err != nil {
				b.Fatal(err)
			}
			if err := p.CommitFull(s.t, s.toks); err != nil {
				b.Fatal(err)
			}
			s.toks = append(s.toks, int32(len(s.toks)))
		}
	}
}
