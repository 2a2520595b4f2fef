package specdec

import (
	"fmt"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/samplerule"
)

// Dist is a distribution over token ids as samplerule.Filter returns it:
// the kept ids with probabilities summing to 1; an id not listed has
// probability 0. Its order is the sampling order of the rule (draws walk
// the cumulative sum in it), which keeps draws reproducible for a seed.
type Dist = []samplerule.Candidate

// PointMass is the distribution of a proposer's single guess: the draft
// "probability" q is 1 for tok. Both trigon proposers are point masses
// (prompt lookup, and a draft model decoding greedily).
func PointMass(tok int32) Dist { return Dist{{ID: tok, Prob: 1}} }

// Prob is d's probability of tok.
func Prob(d Dist, tok int32) float64 {
	for _, c := range d {
		if c.ID == tok {
			return c.Prob
		}
	}
	return 0
}

// Accept is the acceptance test of speculative sampling for a token tok
// drawn from the draft distribution q, against the target distribution p:
// accept with probability min(1, p(tok)/q(tok)), u uniform in [0, 1). With
// a point-mass q that is probability p(tok); with a greedy p (the argmax
// with probability 1) it accepts exactly the argmax.
func Accept(p, q Dist, tok int32, u float64) bool {
	qt := Prob(q, tok)
	if qt <= 0 {
		return false // q could not have drawn tok: never accept what p may not give
	}
	return u*qt < Prob(p, tok)
}

// Residual draws the token that replaces a rejected draft token: one from
// norm(max(0, p - q)), u uniform in [0, 1), in p's order. Together with
// Accept it makes the emitted token distributed as p exactly, whatever q
// is: P(x) = q(x) min(1, p(x)/q(x)) + (1 - sum_y min(p(y), q(y))) r(x) =
// min(p, q)(x) + max(0, p(x) - q(x)) = p(x). With a point-mass q on tok, the
// residual is p with tok removed, renormalised.
//
// The residual has mass wherever a rejection can happen: a rejection needs
// p(tok) < q(tok), so some x has p(x) > q(x). Rounding aside it is never
// empty; if it is (p and q agree to the last bit), p's most likely token is
// returned.
func Residual(p, q Dist, u float64) int32 {
	total := 0.0
	for _, c := range p {
		total += max(0, c.Prob-Prob(q, c.ID))
	}
	if total <= 0 || len(p) == 0 {
		return mostLikely(p)
	}
	target := u * total
	acc := 0.0
	last := int32(-1)
	for _, c := range p {
		r := max(0, c.Prob-Prob(q, c.ID))
		if r <= 0 {
			continue
		}
		acc += r
		last = c.ID
		if acc > target {
			return c.ID
		}
	}
	return last // u*total past the rounded cumulative sum
}

func mostLikely(p Dist) int32 {
	best, id := -1.0, int32(0)
	for _, c := range p {
		if c.Prob > best {
			best, id = c.Prob, c.ID
		}
	}
	return id
}

// Verify applies the acceptance rule to one sequence's step: logits(i) is
// the target's row i (the distribution after its fed token i: row 0 judges
// draft[0]), draft the proposer's point-mass guesses, next the sequence's
// sampling rule, called once per draw with a fresh U (sample.Sampler.Row).
// It returns the tokens the step yields, in order: the accepted prefix of
// draft, then either the residual draw that replaces the first rejected
// token or, with every token accepted, a bonus token sampled from row
// len(draft) by the ordinary rule. len(draft)+1 rows must exist.
//
// Each yielded token is distributed as the target's sampling distribution
// (temperature, top-k, top-p and min-p applied: samplerule.Filter) given
// the tokens before it, as without speculation.
func Verify(logits func(i int) ([]float32, error), draft []int32, next func() backend.SampleRow, s *samplerule.Scratch) ([]int32, error) {
	if s == nil {
		s = new(samplerule.Scratch)
	}
	out := make([]int32, 0, len(draft)+1)
	for i, d := range draft {
		l, err := logits(i)
		if err != nil {
			return nil, err
		}
		row := next()
		p, err := samplerule.Filter(l, row, s)
		if err != nil {
			return nil, fmt.Errorf("specdec: verify row %d: %w", i, err)
		}
		q := PointMass(d)
		if Accept(p, q, d, float64(row.U)) {
			out = append(out, d)
			continue
		}
		return append(out, Residual(p, q, float64(next().U))), nil
	}
	l, err := logits(len(draft))
	if err != nil {
		return nil, err
	}
	tok, err := samplerule.Pick(l, next(), s)
	if err != nil {
		return nil, fmt.Errorf("specdec: bonus row %d: %w", len(draft), err)
	}
	return append(out, tok), nil
}

// Greedy is Verify for greedy rows whose argmax ids are known (sampled on
// the device): the accepted prefix of draft, where draft[i] == argmax[i],
// then argmax at the first mismatch, or argmax[len(draft)] (the bonus).
func Greedy(argmax, draft []int32) []int32 {
	out := make([]int32, 0, len(draft)+1)
	for i, d := range draft {
		if d != argmax[i] {
			break
		}
		out = append(out, d)
	}
	return append(out, argmax[len(out)])
}
