package llama

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/model"
)

// harness drives a Model the way a runner would, with the simplest possible
// block allocation: sequences prefill (whole or in chunks) and decode
// through a paged KV cache whose block ids come from a shuffled free list,
// so consecutive positions of a sequence land in scattered blocks.
type harness struct {
	t         testing.TB
	b         backend.Backend
	m         *Model
	kv        []model.LayerKV
	blockSize int
	numBlocks int
	free      []int32 // free block ids; block 0 is the null block and never handed out
}

// seq is one sequence's host state.
type seq struct {
	tokens   []int32 // prompt, then generated tokens
	computed int     // tokens whose K/V are in the cache
	blocks   []int32 // block table
}

// work is one sequence's share of a step: its next n uncomputed tokens,
// with the logits of every row (all), of none (none), or of the last.
type work struct {
	s    *seq
	n    int
	all  bool
	none bool
}

func newHarness(t testing.TB, b backend.Backend, m *Model, kvDType backend.DType, blockSize, numBlocks int, rng *rand.Rand) *harness {
	t.Helper()
	c := m.Config()
	h := &harness{t: t, b: b, m: m, blockSize: blockSize, numBlocks: numBlocks}
	for range c.NumLayers {
		k, err := b.Alloc(kvDType, numBlocks, c.NumKVHeads, blockSize, c.HeadDim)
		if err != nil {
			t.Fatal(err)
		}
		v, err := b.Alloc(kvDType, numBlocks, c.NumKVHeads, blockSize, c.HeadDim)
		if err != nil {
			t.Fatal(err)
		}
		h.kv = append(h.kv, model.LayerKV{K: k, V: v, Spec: backend.PlainKV(kvDType, blockSize)})
	}
	for i := 1; i < numBlocks; i++ {
		h.free = append(h.free, int32(i))
	}
	rng.Shuffle(len(h.free), func(i, j int) { h.free[i], h.free[j] = h.free[j], h.free[i] })
	return h
}

func (h *harness) close() {
	for _, p := range h.kv {
		h.b.Free(p.K)
		h.b.Free(p.V)
	}
}

// release returns a finished sequence's blocks to the free list.
func (h *harness) release(s *seq) {
	h.free = append(h.free, s.blocks...)
	s.blocks = nil
}

// step computes every work item in one Forward and returns, per item, the
// logits rows it asked for.
func (h *harness) step(ws []work) [][][]float32 {
	h.t.Helper()
	var batch hostBatch
	batch.QueryStart = []int32{0}
	var rowsPer []int
	for _, w := range ws {
		s := w.s
		end := s.computed + w.n
		if w.n <= 0 || end > len(s.tokens) {
			h.t.Fatalf("work of %d tokens from %d for a sequence of %d", w.n, s.computed, len(s.tokens))
		}
		for len(s.blocks)*h.blockSize < end {
			if len(h.free) == 0 {
				h.t.Fatal("out of KV blocks")
			}
			s.blocks = append(s.blocks, h.free[len(h.free)-1])
			h.free = h.free[:len(h.free)-1]
		}
		first := len(batch.Tokens)
		for p := s.computed; p < end; p++ {
			batch.Tokens = append(batch.Tokens, s.tokens[p])
			batch.Positions = append(batch.Positions, int32(p))
			batch.SlotMapping = append(batch.SlotMapping, s.blocks[p/h.blockSize]*int32(h.blockSize)+int32(p%h.blockSize))
		}
		batch.QueryStart = append(batch.QueryStart, int32(len(batch.Tokens)))
		batch.SeqLens = append(batch.SeqLens, int32(end))
		batch.BlockTables = append(batch.BlockTables, append([]int32(nil), s.blocks...))
		switch {
		case w.none:
			rowsPer = append(rowsPer, 0)
		case w.all:
			for r := first; r < len(batch.Tokens); r++ {
				batch.LogitsRows = append(batch.LogitsRows, int32(r))
			}
			rowsPer = append(rowsPer, w.n)
		default:
			batch.LogitsRows = append(batch.LogitsRows, int32(len(batch.Tokens)-1))
			rowsPer = append(rowsPer, 1)
		}
		s.computed = end
	}
	if err := batch.Validate(h.blockSize, h.numBlocks); err != nil {
		h.t.Fatal(err)
	}
	tables, width := batch.DenseBlockTables()
	var owned []backend.Tensor
	up := func(v []int32, shape ...int) backend.Tensor {
		t, err := h.b.Upload(backend.I32, shape, i32Bytes(v))
		if err != nil {
			h.t.Fatal(err)
		}
		owned = append(owned, t)
		return t
	}
	defer func() {
		for _, t := range owned {
			h.b.Free(t)
		}
	}()
	nt, ns, nl := batch.NumTokens(), batch.NumSeqs(), len(batch.LogitsRows)
	in := &model.DeviceBatch{
		Tokens: up(batch.Tokens, nt), Positions: up(batch.Positions, nt), SlotMapping: up(batch.SlotMapping, nt),
		QueryStart: up(batch.QueryStart, ns+1), SeqLens: up(batch.SeqLens, ns),
		BlockTables: up(tables, ns, width),
		NumTokens:   nt, NumSeqs: ns, NumLogits: nl, MaxSeqLen: batch.MaxSeqLen(),
	}
	if nl > 0 {
		in.LogitsRows = up(batch.LogitsRows, nl)
	}
	logits, err := h.m.Forward(in, h.kv)
	if err != nil {
		h.t.Fatal(err)
	}
	out := make([][][]float32, len(ws))
	if nl == 0 {
		if logits != nil {
			h.t.Fatal("logits returned for a step that wanted none")
		}
		return out
	}
	vocab := h.m.Config().VocabSize
	raw := make([]byte, 4*nl*vocab)
	if err := h.b.Read(logits, raw); err != nil {
		h.t.Fatal(err)
	}
	row := 0
	for i, n := range rowsPer {
		for range n {
			r := make([]float32, vocab)
			for j := range r {
				r[j] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*(row*vocab+j):]))
			}
			out[i] = append(out[i], r)
			row++
		}
	}
	return out
}

// argmax is greedy selection: the highest logit, the lowest id on ties.
func argmax(v []float32) int32 {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return int32(best)
}

func i32Bytes(v []int32) []byte {
	out := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(out[4*i:], uint32(x))
	}
	return out
}
