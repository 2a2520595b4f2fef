package kvcache_test

import (
	"github.com/trigon-llm/trigon/internal/datadriven"

	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/kvcache"
)

// TestScripts runs testdata/*.txt. Commands:
//
//	pool blocks=N [block-size=B] [prefix-cache=false]   new pool
//	seq NAME tokens=SPEC [salt=S]                       new sequence (no blocks)
//	append NAME tokens=SPEC                             more tokens
//	match NAME                                          MatchPrefix, kept for alloc
//	alloc NAME n=TOKENS [prefix]                        Allocate (AllocatePrefix with the kept match)
//	commit NAME [n=TOKENS]                              CommitFull of the first n tokens
//	fork NAME CHILD n=TOKENS                            Fork at n tokens
//	free NAME                                           Free
//	truncate NAME n=TOKENS                              Truncate to n tokens (tokens past n dropped too)
//	grow n=BLOCKS
//	state                                               free list, tables, stats
//
// SPEC is a comma list of token ids and ranges: 1-8,100. After every
// command the pool is verified against all tables.
func TestScripts(t *testing.T) {
	datadriven.RunScripts(t, "testdata/*.txt", func(t *testing.T) func(c *datadriven.Case) string {
		h := &kvHarness{t: t, seqs: map[string]*kvSeq{}}
		return h.do
	})
}

type kvSeq struct {
	table  *kvcache.BlockTable
	tokens []int32
	match  *kvcache.Prefix
}

type kvHarness struct {
	t    *testing.T
	pool *kvcache.Pool
	seqs map[string]*kvSeq
}

func (h *kvHarness) do(c *datadriven.Case) string {
	out, err := h.exec(c)
	if err != nil {
		out += "error: " + err.Error()
	}
	if h.pool != nil {
		var tables []*kvcache.BlockTable
		for _, s := range h.seqs {
			tables = append(tables, s.table)
			if err := h.pool.VerifyTokens(s.table, s.tokens); err != nil {
				h.t.Fatalf("%s: %v", c.Pos, err)
			}
		}
		if err := h.pool.Verify(tables); err != nil {
			h.t.Fatalf("%s: %v", c.Pos, err)
		}
	}
	return out
}

func (h *kvHarness) seq(c *datadriven.Case, i int) (string, *kvSeq, error) {
	name, err := c.Positional(i)
	if err != nil {
		return "", nil, err
	}
	s, ok := h.seqs[name]
	if !ok {
		return name, nil, fmt.Errorf("no sequence %q", name)
	}
	return name, s, nil
}

func (h *kvHarness) exec(c *datadriven.Case) (string, error) {
	if c.Cmd != "pool" && h.pool == nil {
		return "", fmt.Errorf("no pool yet")
	}
	switch c.Cmd {
	case "pool":
		n, err := c.Int("blocks", 0)
		if err != nil {
			return "", err
		}
		bs, err := c.Int("block-size", 0)
		if err != nil {
			return "", err
		}
		pc, err := c.Bool("prefix-cache", true)
		if err != nil {
			return "", err
		}
		p, err := kvcache.NewPool(kvcache.Options{NumBlocks: n, BlockSize: bs, EnablePrefixCache: pc})
		if err != nil {
			return "", err
		}
		h.pool, h.seqs = p, map[string]*kvSeq{}
		return fmt.Sprintf("%d usable blocks of %d tokens", p.NumBlocks()-1, p.BlockSize()), nil
	case "seq":
		name, err := c.Positional(0)
		if err != nil {
			return "", err
		}
		toks, err := parseTokens(c.Str("tokens", ""))
		if err != nil {
			return "", err
		}
		if _, ok := h.seqs[name]; ok {
			return "", fmt.Errorf("sequence %q exists", name)
		}
		h.seqs[name] = &kvSeq{table: kvcache.NewBlockTable(c.Str("salt", "")), tokens: toks}
		return "", nil
	case "append":
		_, s, err := h.seq(c, 0)
		if err != nil {
			return "", err
		}
		toks, err := parseTokens(c.Str("tokens", ""))
		if err != nil {
			return "", err
		}
		s.tokens = append(s.tokens, toks...)
		return "", nil
	case "match":
		_, s, err := h.seq(c, 0)
		if err != nil {
			return "", err
		}
		m := h.pool.MatchPrefix(s.table, s.tokens)
		s.match = &m
		if m.NumTokens == 0 {
			return "miss", nil
		}
		return fmt.Sprintf("hit %d tokens: %v", m.NumTokens, m.Blocks), nil
	case "alloc":
		name, s, err := h.seq(c, 0)
		if err != nil {
			return "", err
		}
		n, err := c.Int("n", len(s.tokens))
		if err != nil {
			return "", err
		}
		if c.Has("prefix") {
			if s.match == nil {
				return "", fmt.Errorf("alloc prefix without match")
			}
			err = h.pool.AllocatePrefix(s.table, *s.match, n)
			s.match = nil
		} else {
			err = h.pool.Allocate(s.table, n)
		}
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("%s: %v", name, s.table.Blocks()), nil
	case "commit":
		_, s, err := h.seq(c, 0)
		if err != nil {
			return "", err
		}
		n, err := c.Int("n", len(s.tokens))
		if err != nil {
			return "", err
		}
		if n > len(s.tokens) {
			return "", fmt.Errorf("commit %d of %d tokens", n, len(s.tokens))
		}
		if err := h.pool.CommitFull(s.table, s.tokens[:n]); err != nil {
			return "", err
		}
		return fmt.Sprintf("committed %d blocks, %d cached in the pool", s.table.NumCommitted(), h.pool.NumCachedBlocks()), nil
	case "fork":
		_, s, err := h.seq(c, 0)
		if err != nil {
			return "", err
		}
		child, err := c.Positional(1)
		if err != nil {
			return "", err
		}
		if _, ok := h.seqs[child]; ok {
			return "", fmt.Errorf("sequence %q exists", child)
		}
		n, err := c.Int("n", len(s.tokens))
		if err != nil {
			return "", err
		}
		ct, copies, err := h.pool.Fork(s.table, n)
		if err != nil {
			return "", err
		}
		h.seqs[child] = &kvSeq{table: ct, tokens: slices.Clone(s.tokens[:min(n, len(s.tokens))])}
		out := fmt.Sprintf("%s: %v", child, ct.Blocks())
		for _, cp := range copies {
			out += fmt.Sprintf(" copy %d->%d", cp.Src, cp.Dst)
		}
		return out, nil
	case "free":
		_, s, err := h.seq(c, 0)
		if err != nil {
			return "", err
		}
		h.pool.Free(s.table)
		return fmt.Sprintf("free %d/%d", h.pool.NumFree(), h.pool.NumBlocks()-1), nil
	case "truncate":
		name, s, err := h.seq(c, 0)
		if err != nil {
			return "", err
		}
		n, err := c.Int("n", 0)
		if err != nil {
			return "", err
		}
		if err := h.pool.Truncate(s.table, n); err != nil {
			return "", err
		}
		s.tokens = s.tokens[:min(n, len(s.tokens))]
		return fmt.Sprintf("%s: %v, free %d/%d", name, s.table.Blocks(), h.pool.NumFree(), h.pool.NumBlocks()-1), nil
	case "grow":
		n, err := c.Int("n", 0)
		if err != nil {
			return "", err
		}
		if err := h.pool.Grow(n); err != nil {
			return "", err
		}
		return fmt.Sprintf("free %d/%d", h.pool.NumFree(), h.pool.NumBlocks()-1), nil
	case "state":
		return h.state(), nil
	}
	return "", fmt.Errorf("unknown command %q", c.Cmd)
}

func (h *kvHarness) state() string {
	var b strings.Builder
	p := h.pool
	fmt.Fprintf(&b, "free %d/%d, usage %.3f:", p.NumFree(), p.NumBlocks()-1, p.Usage())
	for _, id := range p.FreeList() {
		fmt.Fprintf(&b, " %d", id)
		if p.Cached(id) {
			b.WriteString("*")
		}
	}
	names := make([]string, 0, len(h.seqs))
	for n := range h.seqs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		s := h.seqs[n]
		if s.table.Len() == 0 {
			continue
		}
		fmt.Fprintf(&b, "\n%s:", n)
		for _, id := range s.table.Blocks() {
			fmt.Fprintf(&b, " %d", id)
			if p.Cached(id) {
				b.WriteString("*")
			}
			if r := p.Ref(id); r > 1 {
				fmt.Fprintf(&b, "(ref %d)", r)
			}
		}
	}
	st := p.Stats()
	fmt.Fprintf(&b, "\ncached blocks %d, prefix queries %d tokens, hits %d, evictions %d",
		p.NumCachedBlocks(), st.PrefixQueryTokens, st.PrefixHitTokens, st.Evictions)
	return b.String()
}

// parseTokens reads a comma list of ids and lo-hi ranges.
func parseTokens(spec string) ([]int32, error) {
	var out []int32
	if spec == "" {
		return nil, nil
	}
	for part := range strings.SplitSeq(spec, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return nil, fmt.Errorf("tokens %q: %w", spec, err)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil {
				return nil, fmt.Errorf("tokens %q: %w", spec, err)
			}
		}
		if b < a {
			return nil, fmt.Errorf("tokens %q: empty range %s", spec, part)
		}
		for v := a; v <= b; v++ {
			out = append(out, int32(v))
		}
	}
	return out, nil
}
