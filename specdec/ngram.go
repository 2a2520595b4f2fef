package specdec

import "fmt"

// NGram is prompt lookup (vLLM's "ngram" method): the sequence's last n
// tokens, for n from PromptLookupMax down to PromptLookupMin, are searched
// for earlier in its tokens (prompt and output alike), and the tokens that
// followed the latest earlier occurrence of the longest matching n-gram are
// proposed. It pays where the output copies the input (editing code,
// quoting a document) and costs nothing to run on the device. It keeps no
// state.
type NGram struct {
	min, max int
}

// NewNGram returns the proposer of an "ngram" config.
func NewNGram(c Config) (*NGram, error) {
	if c.Method != MethodNGram {
		return nil, fmt.Errorf("specdec: ngram proposer for method %q", c.Method)
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &NGram{min: c.PromptLookupMin, max: c.PromptLookupMax}, nil
}

// Propose implements Proposer.
func (g *NGram) Propose(seqs []Seq) ([][]int32, error) {
	out := make([][]int32, len(seqs))
	for i, s := range seqs {
		out[i] = Lookup(s.Tokens, g.min, g.max, s.K)
	}
	return out, nil
}

// LikelyDraft implements Predictor: tokens end in an n-gram that occurs
// earlier (a proposal exists now). The next token then most likely
// continues that earlier occurrence, and the n-gram ending at it matches
// too. A match that only begins with the next token is missed for one
// step: the step after it sees it.
func (g *NGram) LikelyDraft(tokens []int32) bool {
	return Lookup(tokens, g.min, g.max, 1) != nil
}

// Forget implements Proposer; prompt lookup keeps nothing.
func (g *NGram) Forget(int64) {}

// Close implements Proposer.
func (g *NGram) Close() {}

// Lookup is prompt lookup over tokens: for n from maxN down to minN, the
// latest j < len(tokens)-n with tokens[j:j+n] equal to the last n tokens
// gives up to k tokens after it, tokens[j+n:j+n+k] (fewer where tokens
// end). The latest occurrence is the one nearest the text being written,
// so in an edit it is the copy most likely still being followed. It returns
// nil when no n-gram matches.
func Lookup(tokens []int32, minN, maxN, k int) []int32 {
	l := len(tokens)
	if k < 1 || minN < 1 || maxN < minN || l < 2 {
		return nil
	}
	// One backward scan over the candidate ends e (an occurrence must end
	// before the last token): m is how many tokens before and at e match
	// the sequence's end. The first e seen with the longest m is the
	// latest occurrence of the longest n-gram, so this is the longest n
	// first, latest occurrence for it, in one pass.
	best, bestM := -1, 0
	last := tokens[l-1]
	for e := l - 2; e >= 0; e-- {
		if tokens[e] != last {
			continue
		}
		m := 1
		for m < maxN && m <= e && tokens[e-m] == tokens[l-1-m] {
			m++
		}
		if m > bestM {
			best, bestM = e, m
			if m == maxN {
				break // nothing later in the scan is longer or later
			}
		}
	}
	if bestM < minN {
		return nil
	}
	end := min(best+1+k, l)
	return append([]int32(nil), tokens[best+1:end]...)
}
