package sched_test

import (
	"fmt"
	"slices"

	"github.com/trigon-llm/trigon/kvcache"
	"github.com/trigon-llm/trigon/sched"
)

// fakeModel stands in for runner and model. Its "KV" of position p is a
// hash of the KV of position p-1, the token and p, so it depends on every
// earlier token; it reads position p-1 through the plan's block table
// before writing p, and the logits of a sequence are its last KV. Wrong
// block tables, a prefix hit on the wrong blocks, a missing fork copy or a
// recompute that differs from the first computation all change the sampled
// tokens, which the tests compare with a run of each sequence alone.
type fakeModel struct {
	bs    int
	vocab int32
	eos   int32 // -1: none
	slots []fakeSlot
}

type fakeSlot struct {
	pos int
	tok int32
	kv  uint64 // 0: never written
}

func mix(a, b uint64) uint64 {
	z := a ^ (b+0x9e3779b97f4a7c15)*0xbf58476d1ce4e5b9
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

func kvOf(prev uint64, tok int32, pos int) uint64 {
	return mix(mix(prev, uint64(uint32(tok))), uint64(pos)) | 1
}

// sampleOf is the "sampler": a function of the logits (last KV) and the
// sequence's own seed (its id), like a seeded RNG per sequence.
func (m *fakeModel) sampleOf(kv uint64, id sched.SeqID) int32 {
	return int32(mix(kv, uint64(id)) % uint64(m.vocab))
}

func (m *fakeModel) slot(blocks []kvcache.BlockID, pos int) (*fakeSlot, error) {
	if pos/m.bs >= len(blocks) {
		return nil, fmt.Errorf("position %d beyond a block table of %d blocks", pos, len(blocks))
	}
	b := blocks[pos/m.bs]
	if b == kvcache.NullBlock {
		return nil, fmt.Errorf("position %d in the null block", pos)
	}
	i := int(b)*m.bs + pos%m.bs
	for len(m.slots) <= i {
		m.slots = append(m.slots, fakeSlot{})
	}
	return &m.slots[i], nil
}

// execute runs a plan as the runner would: copies first, then each
// sequence's tokens, then sampling.
func (m *fakeModel) execute(plan *sched.Plan) (sched.StepOutput, error) {
	out := sched.StepOutput{Tokens: map[sched.SeqID]int32{}, Finish: map[sched.SeqID]sched.FinishReason{}, Accepted: map[sched.SeqID][]int32{}}
	for _, c := range plan.Copies {
		for off := range m.bs {
			src, err := m.slot([]kvcache.BlockID{c.Src}, off)
			if err != nil {
				return out, err
			}
			dst, err := m.slot([]kvcache.BlockID{c.Dst}, off)
			if err != nil {
				return out, err
			}
			*dst = *src
		}
	}
	for _, e := range plan.Seqs {
		var kv uint64
		for i, tok := range e.Tokens {
			pos := e.Start + i
			if pos > 0 {
				prev, err := m.slot(e.Blocks, pos-1)
				if err != nil {
					return out, fmt.Errorf("sequence %d: %w", e.ID, err)
				}
				if prev.kv == 0 || prev.pos != pos-1 {
					return out, fmt.Errorf("sequence %d: KV of position %d missing (slot holds position %d)", e.ID, pos-1, prev.pos)
				}
				kv = prev.kv
			}
			sl, err := m.slot(e.Blocks, pos)
			if err != nil {
				return out, fmt.Errorf("sequence %d: %w", e.ID, err)
			}
			kv = kvOf(kv, tok, pos)
			*sl = fakeSlot{pos: pos, tok: tok, kv: kv}
		}
		if !e.Sample {
			continue
		}
		// Attention reads the whole context: every slot must still hold
		// this sequence's chain.
		var prev uint64
		for pos := range e.Start + len(e.Tokens) {
			sl, err := m.slot(e.Blocks, pos)
			if err != nil {
				return out, fmt.Errorf("sequence %d: %w", e.ID, err)
			}
			if sl.pos != pos || sl.kv != kvOf(prev, sl.tok, pos) {
				return out, fmt.Errorf("sequence %d: KV of position %d is not its own", e.ID, pos)
			}
			prev = sl.kv
		}
		if e.NumDraft > 0 {
			m.verify(e, out)
			continue
		}
		for _, id := range append([]sched.SeqID{e.ID}, e.Forks...) {
			tok := m.sampleOf(kv, id)
			out.Tokens[id] = tok
			if tok == m.eos {
				out.Finish[id] = sched.FinishStop
			}
		}
	}
	return out, nil
}

// verify accepts e's draft greedily, as the engine does: row i's sample
// (the logits after token i) must be draft token i; the first mismatch is
// replaced by that sample, and all accepted earn the last row's sample.
// The output stops at EOS.
func (m *fakeModel) verify(e sched.ScheduledSeq, out sched.StepOutput) {
	var toks []int32
	for i := range e.Tokens {
		sl, _ := m.slot(e.Blocks, e.Start+i) // written above
		tok := m.sampleOf(sl.kv, e.ID)
		toks = append(toks, tok)
		if tok == m.eos {
			out.Finish[e.ID] = sched.FinishStop
			break
		}
		if i+1 == len(e.Tokens) || e.Tokens[i+1] != tok {
			break
		}
	}
	if len(toks) > 1 {
		out.Accepted[e.ID] = toks[:len(toks)-1]
	}
	out.Tokens[e.ID] = toks[len(toks)-1]
}

// propose is the test's drafter: for each candidate, the sequence's true
// continuation (what the fake model will sample) for a pseudo-random
// number of tokens, then wrong tokens up to k, so that steps accept every
// length from none to all.
func (m *fakeModel) propose(c sched.DraftSeq, k int, round uint64) []int32 {
	k = min(k, c.MaxDraft)
	var kv uint64
	for p, tok := range c.Tokens {
		kv = kvOf(kv, tok, p)
	}
	right := int(mix(uint64(c.ID), round) % uint64(k+1))
	draft := make([]int32, 0, k)
	for i := range k {
		tok := m.sampleOf(kv, c.ID)
		if i >= right {
			tok = (tok + 1) % m.vocab // wrong
		}
		draft = append(draft, tok)
		kv = kvOf(kv, tok, len(c.Tokens)+i)
	}
	return draft
}

// executeFed runs an ahead plan (ScheduleAhead) as the runner does with
// fed tokens: each sequence's one token is the one prev (the outstanding
// plan's output) sampled for it, not the plan's placeholder.
func (m *fakeModel) executeFed(plan *sched.Plan, prev sched.StepOutput) (sched.StepOutput, error) {
	fed := *plan
	fed.Seqs = slices.Clone(plan.Seqs)
	for i := range fed.Seqs {
		tok, ok := prev.Tokens[fed.Seqs[i].ID]
		if !ok {
			return sched.StepOutput{}, fmt.Errorf("sequence %d: nothing sampled to feed", fed.Seqs[i].ID)
		}
		fed.Seqs[i].Tokens = []int32{tok}
	}
	return m.execute(&fed)
}

// solo is the reference: sequence id generating alone from prompt.
func (m *fakeModel) solo(prompt []int32, id sched.SeqID, maxTokens int) ([]int32, sched.FinishReason) {
	var kv uint64
	for p, tok := range prompt {
		kv = kvOf(kv, tok, p)
	}
	var out []int32
	for {
		tok := m.sampleOf(kv, id)
		out = append(out, tok)
		if tok == m.eos {
			return out, sched.FinishStop
		}
		if len(out) == maxTokens {
			return out, sched.FinishLength
		}
		kv = kvOf(kv, tok, len(prompt)+len(out)-1)
	}
}

// idList prints ids compactly: 1-4 7 9-10.
func idList(ids []sched.SeqID) string {
	ids = slices.Clone(ids)
	slices.Sort(ids)
	var s string
	for i := 0; i < len(ids); {
		j := i
		for j+1 < len(ids) && ids[j+1] == ids[j]+1 {
			j++
		}
		if s != "" {
			s += " "
		}
		if j > i {
			s += fmt.Sprintf("%d-%d", ids[i], ids[j])
		} else {
			s += fmt.Sprint(ids[i])
		}
		i = j + 1
	}
	return s
}
