package sample

import (
	"math"
	"slices"
	"strings"
)

// ReasonStop is the finish reason of a stop condition, as the OpenAI API
// names it.
const ReasonStop = "stop"

// StopChecker decides, token by token, whether a stop condition (EOS, a
// stop token id, a stop string) ends a request and which text may be
// streamed so far. The output bound (MaxTokens) is not one: the scheduler
// ends a sequence there, and the engine then flushes the checker.
//
// Text that could still be the beginning of a stop string is held back
// until it either completes the stop string (and is dropped with it) or
// stops matching (and is released), so a stream never shows a prefix of a
// stop string that later matches. Stop strings, stop token ids and EOS only
// count once MinTokens tokens exist; Mask keeps the model from choosing EOS
// or a stop id before then.
type StopChecker struct {
	stops     []string
	stopIDs   []int32
	eos       []int32 // nil with IgnoreEOS
	minTokens int

	generated int
	held      string // text withheld as a possible stop-string prefix
	done      bool
	reason    string
	matchStr  string
	matchID   int32
}

// NewStopChecker returns the checker for one choice of a request with
// parameters p on a model whose EOS tokens are eosIDs.
func NewStopChecker(p Params, eosIDs []int32) *StopChecker {
	c := &StopChecker{
		stops:     append([]string(nil), p.Stop...),
		stopIDs:   append([]int32(nil), p.StopTokenIDs...),
		minTokens: p.MinTokens,
		matchID:   -1,
	}
	if !p.IgnoreEOS {
		c.eos = append([]int32(nil), eosIDs...)
	}
	return c
}

// Mask sets the logits of EOS (unless ignored) and the stop token ids to
// -Inf while fewer than MinTokens tokens have been generated, so the model
// cannot end the request early. Call it before penalties and sampling.
func (c *StopChecker) Mask(logits []float32) {
	if c.generated >= c.minTokens {
		return
	}
	inf := float32(math.Inf(-1))
	for _, ids := range [][]int32{c.eos, c.stopIDs} {
		for _, id := range ids {
			if id >= 0 && int(id) < len(logits) {
				logits[id] = inf
			}
		}
	}
}

// Add records one generated token and its detokenized text delta (possibly
// empty, e.g. while a UTF-8 sequence is incomplete). It reports whether the
// request is now finished, why (ReasonStop), and the text
// that may be emitted now. The text of EOS and stop-id tokens and of stop
// strings (and anything after a stop string) is never emitted. Calls after
// the finish return done with no text.
func (c *StopChecker) Add(token int32, text string) (done bool, reason string, emit string) {
	if c.done {
		return true, c.reason, ""
	}
	c.generated++
	checking := c.generated >= c.minTokens
	if checking && (slices.Contains(c.eos, token) || slices.Contains(c.stopIDs, token)) {
		c.matchID = token
		return c.finish(ReasonStop, c.take(len(c.held)))
	}
	prev := len(c.held)
	c.held += text
	if checking {
		if at, s := c.firstStop(prev); at >= 0 {
			c.matchStr = s
			return c.finish(ReasonStop, c.take(at))
		}
	}
	return false, "", c.take(len(c.held) - c.holdBack())
}

// Flush returns the withheld text and forgets it, for a request that ends
// for a reason the checker does not see (MaxTokens reached, or the client
// went away).
func (c *StopChecker) Flush() string { return c.take(len(c.held)) }

// Generated returns the number of tokens added so far.
func (c *StopChecker) Generated() int { return c.generated }

// Match returns what stopped the request: the stop string (or "") and the
// token id (or -1) that matched.
func (c *StopChecker) Match() (stop string, tokenID int32) { return c.matchStr, c.matchID }

func (c *StopChecker) finish(reason, emit string) (bool, string, string) {
	c.done, c.reason, c.held = true, reason, ""
	return true, reason, emit
}

// take removes and returns the first n bytes of the held text.
func (c *StopChecker) take(n int) string {
	out := c.held[:n]
	c.held = c.held[n:]
	return out
}

// firstStop returns the earliest position of a stop string in c.held that
// ends in the new text (after byte prev), and that stop string. Matches
// wholly inside the old held text were either searched before or belong to
// text produced before MinTokens was reached.
func (c *StopChecker) firstStop(prev int) (int, string) {
	best, which := -1, ""
	for _, s := range c.stops {
		from := max(0, prev-len(s)+1)
		if i := strings.Index(c.held[from:], s); i >= 0 && (best < 0 || from+i < best) {
			best, which = from+i, s
		}
	}
	return best, which
}

// holdBack returns the length of the longest suffix of c.held that is a
// proper prefix of some stop string. Such a suffix always starts on a rune
// boundary, because a stop string's first byte does.
func (c *StopChecker) holdBack() int {
	n, h := 0, c.held
	for _, s := range c.stops {
		// Candidate suffixes start where s's first byte occurs; the
		// earliest that fits is the longest.
		for i := max(0, len(h)-len(s)+1); i < len(h)-n; i++ {
			if h[i] == s[0] && strings.HasPrefix(s, h[i:]) {
				n = len(h) - i
				break
			}
		}
	}
	return n
}
