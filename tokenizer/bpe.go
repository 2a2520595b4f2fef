package tokenizer

import (
	"unicode/utf8"
)

// mergeKey packs an ordered pair of ids.
func mergeKey(a, b TokenID) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// merge is one BPE rule: the pair it applies to merges into id, and lower
// ranks apply first.
type merge struct {
	rank int32
	id   TokenID
}

// bpeModel is a BPE model in one of two flavours:
//
//   - merge ranks (tokenizer.json, GGUF "gpt2"): adjacent symbols merge by
//     the lowest-ranked rule in merges, leftmost first, as HF tokenizers do;
//   - scores (GGUF "llama" without merges): adjacent symbols merge when their
//     concatenation is a normal vocabulary piece, highest score first,
//     leftmost first, as SentencePiece and llama.cpp do.
//
// For byte-level vocabularies the words handed to encodeWord are raw bytes:
// the byte-to-rune mapping is folded into byteIDs and rawVocab, so encoding
// never builds mapped strings.
type bpeModel struct {
	vocab  map[string]TokenID // piece -> id, the model's own vocabulary
	merges map[uint64]merge

	byteLevel bool
	byteIDs   [256]TokenID       // byte-level: id of each byte's one-rune piece, or -1
	rawVocab  map[string]TokenID // byte-level: a piece's raw bytes -> id

	// ignoreMerges looks the whole word up first (Llama 3).
	ignoreMerges bool
	// byteFallback spells characters missing from vocab as <0xAB> tokens.
	byteFallback bool
	byteTokens   [256]TokenID // id of <0xAB>, or -1
	unk          TokenID      // -1 if none: unknown characters are dropped, as HF does
	fuseUnk      bool

	// scores mode (merges == nil): mergeable says which ids may result from
	// a merge (normal pieces only).
	scores    []float32
	mergeable []bool
}

// symbol is one node of the doubly linked list a word is merged on.
type symbol struct {
	id         TokenID
	start, end int32 // byte span in the word
	prev, next int32 // -1 at the ends
	noMerge    bool  // byte-fallback symbols never merge in scores mode
}

// candidate is a possible merge of symbols left and left.next.
type candidate struct {
	prio  float64 // lower first: the rank, or minus the score
	left  int32
	right int32
	id    TokenID // what the pair merges into (ranks mode)
	size  int32   // byte length of the merged span (scores mode)
}

func (c candidate) less(d candidate) bool {
	if c.prio != d.prio {
		return c.prio < d.prio
	}
	return c.left < d.left
}

// candHeap is a binary min-heap of candidates; a hand-rolled one avoids
// container/heap's interface calls on the hot path.
type candHeap []candidate

func (h *candHeap) push(c candidate) {
	*h = append(*h, c)
	s := *h
	i := len(s) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !s[i].less(s[p]) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

func (h *candHeap) pop() candidate {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	s = s[:last]
	i := 0
	for {
		l := 2*i + 1
		if l >= len(s) {
			break
		}
		m := l
		if r := l + 1; r < len(s) && s[r].less(s[l]) {
			m = r
		}
		if !s[m].less(s[i]) {
			break
		}
		s[i], s[m] = s[m], s[i]
		i = m
	}
	*h = s
	return top
}

// encodeWord appends the ids of one pre-tokenized word to dst.
func (m *bpeModel) encodeWord(word string, dst []TokenID) []TokenID {
	if word == "" {
		return dst
	}
	if m.ignoreMerges {
		v := m.vocab
		if m.byteLevel {
			v = m.rawVocab
		}
		if id, ok := v[word]; ok {
			return append(dst, id)
		}
	}
	syms := m.initialSymbols(word)
	if len(syms) == 0 {
		return dst
	}
	if len(syms) > 1 {
		if m.merges != nil {
			m.mergeByRank(syms)
		} else {
			m.mergeByScore(word, syms)
		}
	}
	for i := int32(0); i >= 0; i = syms[i].next {
		dst = append(dst, syms[i].id)
	}
	return dst
}

// initialSymbols splits a word into its characters (bytes for byte-level
// models), applying byte fallback and unknown-token rules as HF's BPE does.
func (m *bpeModel) initialSymbols(word string) []symbol {
	syms := make([]symbol, 0, len(word))
	add := func(id TokenID, start, end int, noMerge bool) {
		n := int32(len(syms))
		syms = append(syms, symbol{id: id, start: int32(start), end: int32(end), prev: n - 1, next: -1, noMerge: noMerge})
		if n > 0 {
			syms[n-1].next = n
		}
	}
	lastUnk := false
	if m.byteLevel {
		for i := 0; i < len(word); i++ {
			if id := m.byteIDs[word[i]]; id >= 0 {
				add(id, i, i+1, false)
				lastUnk = false
				continue
			}
			lastUnk = m.addUnknown(&syms, add, lastUnk, i, i+1)
		}
		return syms
	}
	for i := 0; i < len(word); {
		_, size := utf8.DecodeRuneInString(word[i:])
		ch := word[i : i+size]
		if id, ok := m.vocab[ch]; ok {
			add(id, i, i+size, false)
			lastUnk = false
			i += size
			continue
		}
		if m.byteFallback && m.hasByteTokens(ch) {
			for k := 0; k < len(ch); k++ {
				add(m.byteTokens[ch[k]], i+k, i+k+1, true)
			}
			lastUnk = false
			i += size
			continue
		}
		lastUnk = m.addUnknown(&syms, add, lastUnk, i, i+size)
		i += size
	}
	return syms
}

func (m *bpeModel) hasByteTokens(ch string) bool {
	for k := 0; k < len(ch); k++ {
		if m.byteTokens[ch[k]] < 0 {
			return false
		}
	}
	return true
}

// addUnknown handles a character with no id: it becomes the unknown token
// (fused with a preceding one when fuseUnk), or is dropped when the model
// has no unknown token, as HF does. It reports whether the last symbol is
// now an unknown token.
func (m *bpeModel) addUnknown(syms *[]symbol, add func(TokenID, int, int, bool), lastUnk bool, start, end int) bool {
	if m.unk < 0 {
		return false
	}
	if m.fuseUnk && lastUnk {
		(*syms)[len(*syms)-1].end = int32(end)
		return true
	}
	add(m.unk, start, end, true)
	return true
}

// mergeByRank applies merge rules lowest rank first, leftmost first.
func (m *bpeModel) mergeByRank(syms []symbol) {
	h := make(candHeap, 0, len(syms))
	try := func(left int32) {
		right := syms[left].next
		if right < 0 {
			return
		}
		if r, ok := m.merges[mergeKey(syms[left].id, syms[right].id)]; ok {
			h.push(candidate{prio: float64(r.rank), left: left, right: right, id: r.id})
		}
	}
	for i := int32(0); i+1 < int32(len(syms)); i++ {
		try(i)
	}
	for len(h) > 0 {
		c := h.pop()
		l := &syms[c.left]
		if l.end == l.start || l.next < 0 {
			continue // merged away, or now last
		}
		r := &syms[l.next]
		// Stale entry: the pair at this position changed since it was pushed.
		if cur, ok := m.merges[mergeKey(l.id, r.id)]; !ok || cur.id != c.id {
			continue
		}
		l.id = c.id
		l.end = r.end
		l.next = r.next
		if r.next >= 0 {
			syms[r.next].prev = c.left
		}
		r.start, r.end = 0, 0
		if l.prev >= 0 {
			try(l.prev)
		}
		try(c.left)
	}
}

// mergeByScore merges the adjacent pair whose concatenation is the
// highest-scoring mergeable piece, leftmost first (SentencePiece BPE).
func (m *bpeModel) mergeByScore(word string, syms []symbol) {
	h := make(candHeap, 0, len(syms))
	try := func(left int32) {
		right := syms[left].next
		if right < 0 || syms[left].noMerge || syms[right].noMerge {
			return
		}
		id, ok := m.vocab[word[syms[left].start:syms[right].end]]
		if !ok || !m.mergeable[id] {
			return
		}
		h.push(candidate{prio: -float64(m.scores[id]), left: left, right: right, id: id,
			size: syms[right].end - syms[left].start})
	}
	for i := int32(0); i+1 < int32(len(syms)); i++ {
		try(i)
	}
	for len(h) > 0 {
		c := h.pop()
		l := &syms[c.left]
		r := &syms[c.right]
		if l.end == l.start || r.end == r.start || l.next != c.right || r.end-l.start != c.size {
			continue
		}
		l.id = c.id
		l.end = r.end
		l.next = r.next
		if r.next >= 0 {
			syms[r.next].prev = c.left
		}
		r.start, r.end = 0, 0
		if l.prev >= 0 {
			try(l.prev)
		}
		try(c.left)
	}
}
