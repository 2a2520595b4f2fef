package sample

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/samplerule"
)

// Sampler is one request choice's sampling state: its parameters, its
// random stream and the buffers its per-token work reuses. It is not safe
// for concurrent use.
type Sampler struct {
	p    Params
	seed uint64
	rng  *rand.Rand

	scratch samplerule.Scratch

	// Penalty state, kept between calls because prompt and output only
	// grow: the prompt's distinct tokens, and the output's token counts.
	promptLen, promptLast int
	promptIDs             []int32
	counted               int // output tokens folded into counts
	lastCounted           int32
	counts                map[int32]int32
	seen                  []uint64 // bitset over the vocabulary, all zero between calls
}

// NewSampler validates p and returns a Sampler. choice distinguishes the
// choices of one request (n > 1): with a fixed seed each choice gets its own
// reproducible stream. Without a seed a random one is drawn.
func NewSampler(p Params, choice int) (*Sampler, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if choice < 0 {
		return nil, fmt.Errorf("choice %d is negative", choice)
	}
	seed := rand.Uint64()
	if p.Seed != nil {
		seed = *p.Seed
	}
	p.Stop = append([]string(nil), p.Stop...)
	p.StopTokenIDs = append([]int32(nil), p.StopTokenIDs...)
	return &Sampler{
		p:         p,
		seed:      seed,
		rng:       rand.New(rand.NewPCG(seed, uint64(choice))),
		counts:    make(map[int32]int32),
		promptLen: -1,
	}, nil
}

// Params returns the sampler's parameters.
func (s *Sampler) Params() Params { return s.p }

// Seed returns the seed in use, drawn at random when Params.Seed was nil.
func (s *Sampler) Seed() uint64 { return s.seed }

// Row returns the sampling rule for the next token with a fresh U from the
// request's stream, for a device-side backend.Sample. Each call advances
// the stream, greedy or not, so a request's sequence of U does not depend on
// its temperature.
func (s *Sampler) Row() backend.SampleRow {
	row := backend.SampleRow{
		Temperature: s.p.Temperature,
		TopK:        max(s.p.TopK, 0),
		TopP:        s.p.TopP,
		MinP:        s.p.MinP,
		U:           s.rng.Float32(),
	}
	if row.Temperature < greedyBelow {
		row.Temperature = 0
	}
	return row
}

// Greedy reports whether the sampler picks the argmax (a temperature
// under the greedy threshold), without drawing from its stream.
func (s *Sampler) Greedy() bool { return s.p.Temperature < greedyBelow }

// Pick chooses the next token from logits (after penalties and masks) on
// the host, with the same rule as every backend's Sample.
func (s *Sampler) Pick(logits []float32) (int32, error) {
	return samplerule.Pick(logits, s.Row(), &s.scratch)
}

// ApplyPenalties applies the repetition penalty over the prompt and output
// tokens and the presence and frequency penalties over the output tokens,
// in place. It does nothing when all three are off.
//
// A Sampler remembers what it has counted, so prompt must be the same on
// every call and generated must only grow by appending. Both are checked
// cheaply: a prompt of another length or last token, or an output shorter
// than before or with another last counted token, is recounted from
// scratch; other rewrites go unnoticed.
func (s *Sampler) ApplyPenalties(logits []float32, generated, prompt []int32) error {
	rep, pres, freq := s.p.RepetitionPenalty, s.p.PresencePenalty, s.p.FrequencyPenalty
	if rep == 1 && pres == 0 && freq == 0 {
		return nil
	}
	vocab := len(logits)
	if err := s.count(generated, vocab); err != nil {
		return err
	}
	if rep != 1 {
		if err := s.distinctPrompt(prompt, vocab); err != nil {
			return err
		}
		if len(s.seen)*64 < vocab {
			s.seen = make([]uint64, (vocab+63)/64)
		}
		penalise := func(id int32) {
			if s.seen[id/64]&(1<<(id%64)) != 0 {
				return
			}
			s.seen[id/64] |= 1 << (id % 64)
			// Saturated at the largest float32 of its sign: a tiny
			// penalty (any positive one is valid) or a large logit
			// would otherwise overflow to an infinity, which Pick
			// rejects as a broken row.
			if l := logits[id]; l > 0 {
				logits[id] = min(l/rep, math.MaxFloat32)
			} else {
				logits[id] = max(l*rep, -math.MaxFloat32)
			}
		}
		for _, id := range s.promptIDs {
			penalise(id)
		}
		for id := range s.counts {
			penalise(id)
		}
		// Leave the bitset clear for the next call.
		for _, id := range s.promptIDs {
			s.seen[id/64] = 0
		}
		for id := range s.counts {
			s.seen[id/64] = 0
		}
	}
	if pres != 0 || freq != 0 {
		for id, n := range s.counts {
			logits[id] -= pres + freq*float32(n)
		}
	}
	return nil
}

// count folds new output tokens into s.counts.
func (s *Sampler) count(generated []int32, vocab int) error {
	if len(generated) < s.counted || (s.counted > 0 && generated[s.counted-1] != s.lastCounted) {
		clear(s.counts)
		s.counted = 0
	}
	for i, id := range generated[s.counted:] {
		if id < 0 || int(id) >= vocab {
			clear(s.counts)
			s.counted = 0
			return fmt.Errorf("penalties: generated token %d is %d, outside the vocabulary of %d", s.counted+i, id, vocab)
		}
		s.counts[id]++
	}
	s.counted = len(generated)
	if s.counted > 0 {
		s.lastCounted = generated[s.counted-1]
	}
	return nil
}

// distinctPrompt caches the prompt's distinct tokens.
func (s *Sampler) distinctPrompt(prompt []int32, vocab int) error {
	last := -1
	if len(prompt) > 0 {
		last = int(prompt[len(prompt)-1])
	}
	if len(prompt) == s.promptLen && last == s.promptLast {
		return nil
	}
	seen := make(map[int32]struct{}, len(prompt))
	s.promptIDs = s.promptIDs[:0]
	for i, id := range prompt {
		if id < 0 || int(id) >= vocab {
			s.promptLen = -1
			return fmt.Errorf("penalties: prompt token %d is %d, outside the vocabulary of %d", i, id, vocab)
		}
		if _, ok := seen[id]; !ok {
			seen[id] = struct{}{}
			s.promptIDs = append(s.promptIDs, id)
		}
	}
	s.promptLen, s.promptLast = len(prompt), last
	return nil
}

// TokenLogprob is a token and its log-probability.
type TokenLogprob struct {
	ID      int32
	Logprob float32
}

// Logprobs returns the log-probability of chosen and the n most likely
// tokens (ties by lower id) under the log-softmax of logits. As vLLM does by
// default, pass the raw logits, before penalties, masks and temperature.
func (s *Sampler) Logprobs(logits []float32, chosen int32, n int) (float32, []TokenLogprob, error) {
	if n < 0 || n > MaxLogprobs {
		return 0, nil, fmt.Errorf("logprobs: n = %d outside [0, %d]", n, MaxLogprobs)
	}
	if chosen < 0 || int(chosen) >= len(logits) {
		return 0, nil, fmt.Errorf("logprobs: token %d outside the vocabulary of %d", chosen, len(logits))
	}
	m := math.Inf(-1)
	for i, l := range logits {
		if l != l || l > math.MaxFloat32 {
			return 0, nil, fmt.Errorf("logprobs: logit %d is %v", i, l)
		}
		m = max(m, float64(l))
	}
	if math.IsInf(m, -1) {
		return 0, nil, fmt.Errorf("logprobs: every logit is -Inf")
	}
	var sum float64
	for _, l := range logits {
		sum += math.Exp(float64(l) - m)
	}
	lse := m + math.Log(sum)
	// Insertion into a short sorted list: n is at most 20.
	top := make([]TokenLogprob, 0, n)
	for i, l := range logits {
		if n == 0 || (len(top) == n && l <= top[n-1].Logprob) {
			continue
		}
		j := len(top)
		for j > 0 && top[j-1].Logprob < l {
			j--
		}
		if len(top) < n {
			top = append(top, TokenLogprob{})
		}
		copy(top[j+1:], top[j:len(top)-1])
		top[j] = TokenLogprob{ID: int32(i), Logprob: l}
	}
	for i := range top {
		top[i].Logprob = float32(float64(top[i].Logprob) - lse)
	}
	return float32(float64(logits[chosen]) - lse), top, nil
}
