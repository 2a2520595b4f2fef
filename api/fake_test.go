package api

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The fake model and tokenizer: every token is a word, the next-token
// logits are a hash of the whole sequence so far. It is deterministic,
// cheap, and honours every sampling and stopping parameter, so tests can
// check the HTTP layer against references computed independently.

const (
	eosID int32 = 0
	bosID int32 = 1
	unkID int32 = 2
)

var fakeWords = []string{
	"<eos>", "<bos>", "<unk>",
	"<|system|>", "<|user|>", "<|assistant|>", "<|end|>",
	"the", "cat", "sat", "on", "mat", "dog", "ran", "far", "away", "héllo", "日本", "naïve", "😀",
	"ok", "yes", "no", "red", "blue", "green", "one", "two", "three", "four", "five", "six",
	"seven", "eight", "nine", "ten", "alpha", "beta", "gamma", "delta", "sun", "moon", "star",
	"sky", "sea", "rock", "tree", "leaf", "wind", "rain", "snow", "fire", "ice", "gold", "iron",
	"salt", "milk", "bread", "fish", "bird", "wolf", "bear", "fox", "owl", "__fail__",
}

type fakeTokenizer struct {
	index map[string]int32
}

func newFakeTokenizer() *fakeTokenizer {
	t := &fakeTokenizer{index: map[string]int32{}}
	for i, w := range fakeWords {
		t.index[w] = int32(i)
	}
	return t
}

func isSpecial(id int32) bool { return id == eosID || id == bosID || id == unkID }

func (t *fakeTokenizer) Encode(text string, addSpecial bool) ([]int32, error) {
	var ids []int32
	if addSpecial {
		ids = append(ids, bosID)
	}
	for _, w := range strings.Fields(text) {
		if w == "__fail__" {
			return nil, errors.New("fake tokenizer: cannot encode __fail__")
		}
		id, ok := t.index[w]
		if !ok {
			id = unkID
		}
		ids = append(ids, id)
	}
	return ids, nil
}

func (t *fakeTokenizer) Decode(ids []int32, skipSpecial bool) (string, error) {
	var b strings.Builder
	for _, id := range ids {
		s, ok := t.TokenString(id)
		if !ok {
			return "", fmt.Errorf("fake tokenizer: id %d out of range", id)
		}
		if skipSpecial && isSpecial(id) {
			continue
		}
		b.WriteString(s)
	}
	return b.String(), nil
}

func (t *fakeTokenizer) TokenString(id int32) (string, bool) {
	if id < 0 || int(id) >= len(fakeWords) {
		return "", false
	}
	if isSpecial(id) {
		return fakeWords[id], true
	}
	return " " + fakeWords[id], true
}

// ApplyChatTemplate renders "<|role|> content <|end|>" per message and, like
// many real templates, raises an error when two messages in a row share a
// role.
func (t *fakeTokenizer) ApplyChatTemplate(msgs []ChatMessage, addGen bool) (string, error) {
	var parts []string
	for i, m := range msgs {
		if i > 0 && msgs[i-1].Role == m.Role {
			return "", errors.New("conversation roles must alternate")
		}
		parts = append(parts, "<|"+m.Role+"|>", m.Content, "<|end|>")
	}
	if addGen {
		parts = append(parts, "<|assistant|>")
	}
	return strings.Join(parts, " "), nil
}

// fakeLogits is the fake model: logits in [-4, 4) from a hash of the
// sequence, so every context has its own distribution.
func fakeLogits(seq []int32) []float32 {
	h := fnv.New64a()
	var b [4]byte
	for _, id := range seq {
		b[0], b[1], b[2], b[3] = byte(id), byte(id>>8), byte(id>>16), byte(id>>24)
		h.Write(b[:])
	}
	base := h.Sum64()
	out := make([]float32, len(fakeWords))
	for v := range out {
		x := base ^ (uint64(v)+1)*0x9E3779B97F4A7C15
		x ^= x >> 30
		x *= 0xBF58476D1CE4E5B9
		x ^= x >> 27
		x *= 0x94D049BB133111EB
		x ^= x >> 31
		out[v] = float32(float64(x>>11)/(1<<53)*8 - 4)
	}
	return out
}

// logSoftmax in float64, the reference the tests compare logprobs with.
func logSoftmax(l []float32) []float64 {
	m := math.Inf(-1)
	for _, v := range l {
		m = math.Max(m, float64(v))
	}
	var s float64
	for _, v := range l {
		s += math.Exp(float64(v) - m)
	}
	out := make([]float64, len(l))
	for i, v := range l {
		out[i] = float64(v) - m - math.Log(s)
	}
	return out
}

// fakeEngine runs the fake model with one goroutine per choice, so events
// of different choices interleave as in the real engine.
type fakeEngine struct {
	tok *fakeTokenizer

	ready     atomic.Bool
	genErr    error         // returned by Generate
	failAfter int           // > 0: choice 0 ends with failErr after this many tokens
	failErr   error         // error of failAfter
	delay     time.Duration // per decode step
	perEvent  int           // tokens per event (default 1)
	cached    int           // CachedPromptTokens on final events
	// skipFinal closes the channel without final events (a broken engine).
	skipFinal bool

	mu        sync.Mutex
	requests  []*GenerateRequest
	cancelled chan struct{}
	once      sync.Once
	seedCtr   atomic.Uint64
}

func newFakeEngine(tok *fakeTokenizer) *fakeEngine {
	e := &fakeEngine{tok: tok, cancelled: make(chan struct{}), perEvent: 1}
	e.ready.Store(true)
	return e
}

func (e *fakeEngine) Ready() bool { return e.ready.Load() }

func (e *fakeEngine) lastRequest() *GenerateRequest {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.requests) == 0 {
		return nil
	}
	return e.requests[len(e.requests)-1]
}

func (e *fakeEngine) noteCancel() { e.once.Do(func() { close(e.cancelled) }) }

func (e *fakeEngine) Generate(ctx context.Context, req *GenerateRequest) (<-chan Event, error) {
	e.mu.Lock()
	e.requests = append(e.requests, req)
	e.mu.Unlock()
	if e.genErr != nil {
		return nil, e.genErr
	}
	if req.N < 1 || len(req.Prompt) == 0 || req.Sampling.MaxTokens < 1 {
		return nil, fmt.Errorf("%w: fake engine got an invalid request", ErrBadRequest)
	}
	ch := make(chan Event) // unbuffered: the api must keep reading
	var wg sync.WaitGroup
	for i := range req.N {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.runChoice(ctx, req, i, ch)
		}()
	}
	go func() {
		wg.Wait()
		close(ch)
	}()
	return ch, nil
}

func (e *fakeEngine) runChoice(ctx context.Context, req *GenerateRequest, choice int, ch chan<- Event) {
	sp := req.Sampling
	var seed uint64
	if sp.Seed != nil {
		seed = *sp.Seed + uint64(choice)
	} else {
		seed = uint64(time.Now().UnixNano()) ^ e.seedCtr.Add(0x9E3779B97F4A7C15)
	}
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	seq := slices.Clone(req.Prompt)
	var out []int32
	text := ""
	emitted := 0
	var ids []int32
	var lps []TokenLogprob
	send := func(ev Event) bool {
		select {
		case ch <- ev:
			return true
		case <-ctx.Done():
			e.noteCancel()
			return false
		}
	}
	for {
		if ctx.Err() != nil {
			e.noteCancel()
			return
		}
		if e.delay > 0 {
			select {
			case <-time.After(e.delay):
			case <-ctx.Done():
				e.noteCancel()
				return
			}
		}
		if e.failAfter > 0 && choice == 0 && len(out) == e.failAfter {
			send(Event{Choice: choice, TokenIDs: ids, Logprobs: lps, FinishReason: FinishError, Err: e.failErr})
			return
		}
		raw := fakeLogits(seq)
		id := fakeSample(raw, sp, seq, out, rng)
		seq = append(seq, id)
		out = append(out, id)
		ids = append(ids, id)
		if req.Logprobs {
			lps = append(lps, fakeLogprob(raw, id, req.TopLogprobs))
		}
		finish := ""
		switch {
		case id == eosID && !sp.IgnoreEOS:
			finish = FinishStop
		case slices.Contains(sp.StopTokenIDs, id):
			finish = FinishStop
		default:
			if !(isSpecial(id) && sp.SkipSpecialTokens) {
				s, _ := e.tok.TokenString(id)
				text += s
			}
			if at := firstStop(text, sp.Stop); at >= 0 {
				text = text[:at]
				finish = FinishStop
			}
		}
		if finish == "" && len(out) >= sp.MaxTokens {
			finish = FinishLength
		}
		safe := len(text)
		if finish == "" {
			safe -= holdBack(text, sp.Stop)
		}
		if finish != "" || len(ids) >= e.perEvent {
			ev := Event{Choice: choice, Text: text[emitted:safe], TokenIDs: ids, Logprobs: lps, FinishReason: finish}
			emitted = safe
			ids, lps = nil, nil
			if finish != "" {
				ev.CachedPromptTokens = e.cached
				if e.skipFinal {
					return
				}
			}
			if !send(ev) {
				return
			}
		}
		if finish != "" {
			return
		}
	}
}

// firstStop returns where the earliest stop string starts in text, or -1.
func firstStop(text string, stops []string) int {
	at := -1
	for _, s := range stops {
		if i := strings.Index(text, s); i >= 0 && (at < 0 || i < at) {
			at = i
		}
	}
	return at
}

// holdBack is the length of the longest suffix of text that could still
// grow into a stop string.
func holdBack(text string, stops []string) int {
	best := 0
	for _, s := range stops {
		for k := min(len(s)-1, len(text)); k > best; k-- {
			if strings.HasPrefix(s, text[len(text)-k:]) {
				best = k
				break
			}
		}
	}
	return best
}

// fakeSample applies penalties, masks and the truncation samplers, then
// samples (or takes the argmax at temperature 0).
func fakeSample(raw []float32, sp SamplingParams, seq, out []int32, rng *rand.Rand) int32 {
	l := make([]float64, len(raw))
	for i, v := range raw {
		l[i] = float64(v)
	}
	if sp.RepetitionPenalty != 1 {
		seen := map[int32]bool{}
		for _, id := range seq {
			seen[id] = true
		}
		for id := range seen {
			if l[id] > 0 {
				l[id] /= float64(sp.RepetitionPenalty)
			} else {
				l[id] *= float64(sp.RepetitionPenalty)
			}
		}
	}
	counts := map[int32]int{}
	for _, id := range out {
		counts[id]++
	}
	for id, c := range counts {
		l[id] -= float64(sp.FrequencyPenalty)*float64(c) + float64(sp.PresencePenalty)
	}
	ninf := math.Inf(-1)
	l[bosID], l[unkID] = ninf, ninf
	if sp.IgnoreEOS || len(out) < sp.MinTokens {
		l[eosID] = ninf
	}
	if len(out) < sp.MinTokens {
		for _, id := range sp.StopTokenIDs {
			l[id] = ninf
		}
	}
	if sp.Temperature == 0 {
		best := 0
		for i := range l {
			if l[i] > l[best] {
				best = i
			}
		}
		return int32(best)
	}
	order := make([]int, len(l))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return l[order[a]] > l[order[b]] })
	if sp.TopK > 0 && sp.TopK < len(order) {
		order = order[:sp.TopK]
	}
	p := make([]float64, len(order))
	var sum float64
	for i, id := range order {
		p[i] = math.Exp((l[id] - l[order[0]]) / float64(sp.Temperature))
		sum += p[i]
	}
	keep := len(order)
	var cum float64
	for i := range p {
		p[i] /= sum
		cum += p[i]
		if cum >= float64(sp.TopP) {
			keep = i + 1
			break
		}
	}
	order, p = order[:keep], p[:keep]
	if sp.MinP > 0 {
		n := 0
		for i := range p {
			if p[i] >= float64(sp.MinP)*p[0] {
				n = i + 1
			}
		}
		order, p = order[:n], p[:n]
	}
	var tot float64
	for _, v := range p {
		tot += v
	}
	r := rng.Float64() * tot
	for i, v := range p {
		if r < v {
			return int32(order[i])
		}
		r -= v
	}
	return int32(order[len(order)-1])
}

// fakeLogprob is log-softmax of the raw logits: the chosen token and the
// top k alternatives, most likely first, ties by lower id.
func fakeLogprob(raw []float32, id int32, k int) TokenLogprob {
	lp := logSoftmax(raw)
	tl := TokenLogprob{ID: id, Logprob: float32(lp[id])}
	order := make([]int32, len(lp))
	for i := range order {
		order[i] = int32(i)
	}
	sort.SliceStable(order, func(a, b int) bool { return lp[order[a]] > lp[order[b]] })
	for _, t := range order[:k] {
		tl.Top = append(tl.Top, TopLogprob{ID: t, Logprob: float32(lp[t])})
	}
	return tl
}
