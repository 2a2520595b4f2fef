package sched

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/trigon-llm/trigon/kvcache"
)

// SeqID names one sequence. The engine picks ids; each live sequence (and
// each pending fork) must have a distinct one.
type SeqID int64

// Policy orders the waiting queue and picks preemption victims.
type Policy uint8

const (
	// FCFS admits in arrival order and preempts the newest arrival.
	FCFS Policy = iota
	// Priority admits by Request.Priority (lower value first, then
	// arrival) and preempts the lowest priority, newest first.
	Priority
)

func (p Policy) String() string {
	switch p {
	case FCFS:
		return "fcfs"
	case Priority:
		return "priority"
	}
	return fmt.Sprintf("Policy(%d)", uint8(p))
}

// Config bounds each step.
type Config struct {
	// MaxNumSeqs caps the running sequences (pending forks included), so
	// that every running decode fits every step.
	MaxNumSeqs int
	// MaxNumBatchedTokens is the token budget of one step. It must be at
	// least MaxNumSeqs: each running decode costs one token.
	MaxNumBatchedTokens int
	// ChunkSize caps the tokens one sequence gets in a step (the long
	// prefill threshold); 0 means MaxNumBatchedTokens. Smaller chunks let
	// more prompts progress side by side.
	ChunkSize int
	Policy    Policy
	// MixedCap bounds the prefill of steps that carry decodes:
	// MixedCap[d] is the most prefill tokens a step with d decode tokens
	// (drafts included) may take, d past the end reading the last entry;
	// MixedCap[0] is unused, as a step with no decodes keeps the whole
	// budget (no stream waits on it). Nil bounds nothing. A step that
	// prefills beside decodes is the long token gap of every stream in
	// it; the engine derives the caps from the step costs it measures at
	// load (engine/mixed.go). Every entry from 1 on must be at least 1, so
	// prompts always advance.
	MixedCap []int
}

// prefillCap is the most prefill tokens a step with decodeTokens decode
// tokens beside them may take; math.MaxInt without a cap or decodes.
func (c *Config) prefillCap(decodeTokens int) int {
	if len(c.MixedCap) < 2 || decodeTokens == 0 {
		return math.MaxInt
	}
	return c.MixedCap[min(decodeTokens, len(c.MixedCap)-1)]
}

// Request is a new sequence.
type Request struct {
	ID     SeqID
	Prompt []int32 // copied by Add
	// MaxTokens is the number of tokens to generate at most (>= 1), as
	// the engine resolved it (sample.LengthRule); Add only checks it is a
	// bound the scheduler can keep.
	MaxTokens int
	// Priority matters under the Priority policy: lower runs first.
	Priority int
	// CacheSalt separates prefix caches (adapter, tenant): prompts share
	// cached KV only with equal salts.
	CacheSalt string
	// Forks are the ids of the other samples of an n>1 request. The prompt
	// is prefilled once; the step that completes it samples one token for
	// the request and one for each fork from the same logits, and the forks
	// then run as sequences of their own sharing the prompt's KV blocks.
	Forks []SeqID
}

// FinishReason says why a sequence finished.
type FinishReason uint8

const (
	// FinishStop: the engine saw EOS or a stop condition (StepOutput).
	FinishStop FinishReason = iota + 1
	// FinishLength: MaxTokens tokens generated (or the engine said so).
	FinishLength
	// FinishError: the sequence could not go on; Finished.Err says why.
	FinishError
)

func (r FinishReason) String() string {
	switch r {
	case FinishStop:
		return "stop"
	case FinishLength:
		return "length"
	case FinishError:
		return "error"
	}
	return fmt.Sprintf("FinishReason(%d)", uint8(r))
}

// Finished reports a sequence that left the scheduler (aborts excepted:
// their caller knows).
type Finished struct {
	ID     SeqID
	Reason FinishReason
	// Output holds the generated tokens; the caller owns it.
	Output []int32
	Err    error
}

// ErrTooLarge is wrapped by Add when a request can never run: its prompt
// plus MaxTokens need more KV blocks than the pool has, or its forks more
// sequences than MaxNumSeqs.
var ErrTooLarge = errors.New("sched: request can never fit")

// Stats are the scheduler's counters.
type Stats struct {
	NumWaiting  int
	NumRunning  int
	Steps       uint64
	Preemptions uint64
	// KVUsage is the fraction of KV blocks in use.
	KVUsage float64
	// PrefixQueryTokens and PrefixHitTokens count prompt tokens looked up
	// in the prefix cache on admission and those served from it.
	PrefixQueryTokens uint64
	PrefixHitTokens   uint64
}

// Scheduler is the continuous-batching state machine. It is deterministic
// and not safe for concurrent use: the engine's step loop owns it.
type Scheduler struct {
	cfg  Config
	pool *kvcache.Pool

	seqs      map[SeqID]*sequence // live sequences, waiting or running
	forkOwner map[SeqID]*sequence // pending fork id -> its parent
	waiting   []*sequence         // sorted by s.before
	running   []*sequence         // in admission order

	pending  *Plan      // scheduled, not yet updated
	ahead    *Plan      // scheduled by ScheduleAhead behind pending
	deferred []Finished // finished during Schedule, returned by Update
	// drafts are the proposals SetDraft gave for the next Schedule, which
	// consumes them.
	drafts      map[SeqID][]int32
	step        uint64
	nextArrival uint64
	preemptions uint64
}

// sequence is the scheduler's state of one sequence.
type sequence struct {
	id        SeqID
	tokens    []int32 // prompt, then generated tokens; only ever appended (but see ahead)
	numPrompt int     // len of the original prompt
	maxTokens int
	priority  int
	arrival   uint64 // Add order; forks inherit their parent's
	forkIndex int    // 0 for a request, 1+i for its i-th fork

	// numComputed tokens have their KV in table. Each step schedules
	// tokens[numComputed:] (or a chunk of it): one rule for prefill,
	// chunked prefill, recompute after preemption and decode.
	numComputed int
	table       *kvcache.BlockTable
	forks       []SeqID             // not yet forked
	copies      []kvcache.BlockCopy // owed to the runner before this sequence's next step
	running     bool
	// ahead: ScheduleAhead appended a placeholder for the token the
	// outstanding step samples; that step's Update writes it.
	ahead bool

	// Position in the plan being built this step, if scheduled.
	schedStep uint64
	entry     int
}

func (q *sequence) numOutput() int { return len(q.tokens) - q.numPrompt }

// slots is how many sequences q stands for against MaxNumSeqs.
func (q *sequence) slots() int { return 1 + len(q.forks) }

// New returns a scheduler over pool. The pool belongs to the scheduler from
// now on: nothing else may allocate from it.
func New(cfg Config, pool *kvcache.Pool) (*Scheduler, error) {
	if pool == nil {
		return nil, errors.New("sched: nil pool")
	}
	if cfg.MaxNumSeqs < 1 {
		return nil, fmt.Errorf("sched: MaxNumSeqs %d < 1", cfg.MaxNumSeqs)
	}
	if cfg.MaxNumBatchedTokens < cfg.MaxNumSeqs {
		return nil, fmt.Errorf("sched: MaxNumBatchedTokens %d < MaxNumSeqs %d: running decodes would not fit a step", cfg.MaxNumBatchedTokens, cfg.MaxNumSeqs)
	}
	if cfg.ChunkSize < 0 {
		return nil, fmt.Errorf("sched: ChunkSize %d < 0", cfg.ChunkSize)
	}
	if cfg.ChunkSize == 0 || cfg.ChunkSize > cfg.MaxNumBatchedTokens {
		cfg.ChunkSize = cfg.MaxNumBatchedTokens
	}
	for d, c := range cfg.MixedCap {
		if d > 0 && c < 1 {
			return nil, fmt.Errorf("sched: MixedCap[%d] = %d: want at least 1", d, c)
		}
	}
	if cfg.Policy != FCFS && cfg.Policy != Priority {
		return nil, fmt.Errorf("sched: unknown policy %v", cfg.Policy)
	}
	return &Scheduler{
		cfg:       cfg,
		pool:      pool,
		seqs:      make(map[SeqID]*sequence),
		forkOwner: make(map[SeqID]*sequence),
		drafts:    make(map[SeqID][]int32),
	}, nil
}

// Add queues a request. It fails, changing nothing, on an invalid request,
// on an id in use, and with ErrTooLarge on a request that could never run
// even alone.
func (s *Scheduler) Add(req Request) error {
	if len(req.Prompt) == 0 {
		return fmt.Errorf("sched: request %d: empty prompt", req.ID)
	}
	if req.MaxTokens < 1 {
		return fmt.Errorf("sched: request %d: MaxTokens %d < 1", req.ID, req.MaxTokens)
	}
	if req.MaxTokens > math.MaxInt-len(req.Prompt) {
		return fmt.Errorf("sched: request %d: prompt %d + MaxTokens %d overflows", req.ID, len(req.Prompt), req.MaxTokens)
	}
	ids := append([]SeqID{req.ID}, req.Forks...)
	for i, id := range ids {
		if s.seqs[id] != nil || s.forkOwner[id] != nil || slices.Contains(ids[:i], id) {
			return fmt.Errorf("sched: request %d: sequence id %d is in use", req.ID, id)
		}
	}
	if len(ids) > s.cfg.MaxNumSeqs {
		return fmt.Errorf("sched: request %d: %d samples exceed MaxNumSeqs %d: %w", req.ID, len(ids), s.cfg.MaxNumSeqs, ErrTooLarge)
	}
	// The last generated token is never fed back, so its KV never exists.
	maxKV := len(req.Prompt) + req.MaxTokens - 1
	if need, have := s.pool.BlocksFor(maxKV), s.pool.NumBlocks()-1; need > have {
		return fmt.Errorf("sched: request %d: %d tokens need %d KV blocks, the pool has %d: %w", req.ID, maxKV, need, have, ErrTooLarge)
	}
	q := &sequence{
		id:        req.ID,
		tokens:    slices.Clone(req.Prompt),
		numPrompt: len(req.Prompt),
		maxTokens: req.MaxTokens,
		priority:  req.Priority,
		arrival:   s.nextArrival,
		table:     kvcache.NewBlockTable(req.CacheSalt),
		forks:     slices.Clone(req.Forks),
	}
	s.nextArrival++
	s.seqs[q.id] = q
	for _, id := range q.forks {
		s.forkOwner[id] = q
	}
	s.insertWaiting(q)
	s.checkInvariants()
	return nil
}

// Abort removes a sequence at once and frees its blocks. Aborting a
// sequence whose forks are not created yet drops them too; aborting a
// pending fork id drops just that fork. It reports whether id was known.
// Abort may come between Schedule and Update: Update then skips the
// aborted sequence.
func (s *Scheduler) Abort(id SeqID) bool {
	if parent := s.forkOwner[id]; parent != nil {
		delete(s.forkOwner, id)
		parent.forks = slices.DeleteFunc(parent.forks, func(f SeqID) bool { return f == id })
		s.checkInvariants()
		return true
	}
	q := s.seqs[id]
	if q == nil {
		return false
	}
	s.remove(q)
	s.checkInvariants()
	return true
}

// remove takes q out of every structure and frees its blocks.
func (s *Scheduler) remove(q *sequence) {
	if q.running {
		i := slices.Index(s.running, q)
		s.running = slices.Delete(s.running, i, i+1)
		q.running = false
	} else if i := slices.Index(s.waiting, q); i >= 0 {
		s.waiting = slices.Delete(s.waiting, i, i+1)
	}
	s.pool.Free(q.table)
	for _, id := range q.forks {
		delete(s.forkOwner, id)
	}
	q.forks, q.copies = nil, nil
	delete(s.seqs, q.id)
	delete(s.drafts, q.id)
}

// finish removes q and reports it, with its unforked forks as errors.
func (s *Scheduler) finish(q *sequence, reason FinishReason, err error, out []Finished) []Finished {
	forks := q.forks
	s.remove(q)
	out = append(out, Finished{ID: q.id, Reason: reason, Output: q.tokens[q.numPrompt:], Err: err})
	for _, id := range forks {
		out = append(out, Finished{ID: id, Reason: FinishError, Err: fmt.Errorf("sched: sequence %d finished before its fork %d was created: %w", q.id, id, errOrStop(err))})
	}
	return out
}

// errOrStop describes why forks die with their parent.
func errOrStop(err error) error {
	if err != nil {
		return err
	}
	return errors.New("parent finished")
}

// before is the queue order of the policy.
func (s *Scheduler) before(a, b *sequence) bool {
	if s.cfg.Policy == Priority && a.priority != b.priority {
		return a.priority < b.priority
	}
	if a.arrival != b.arrival {
		return a.arrival < b.arrival
	}
	return a.forkIndex < b.forkIndex
}

func (s *Scheduler) insertWaiting(q *sequence) {
	i, _ := slices.BinarySearchFunc(s.waiting, q, func(w, q *sequence) int {
		if s.before(w, q) {
			return -1
		}
		return 1
	})
	s.waiting = slices.Insert(s.waiting, i, q)
}

// NumWaiting counts queued sequences (new and preempted).
func (s *Scheduler) NumWaiting() int { return len(s.waiting) }

// NumRunning counts sequences holding KV blocks.
func (s *Scheduler) NumRunning() int { return len(s.running) }

// Stats returns the counters.
func (s *Scheduler) Stats() Stats {
	ps := s.pool.Stats()
	return Stats{
		NumWaiting:        len(s.waiting),
		NumRunning:        len(s.running),
		Steps:             s.step,
		Preemptions:       s.preemptions,
		KVUsage:           s.pool.Usage(),
		PrefixQueryTokens: ps.PrefixQueryTokens,
		PrefixHitTokens:   ps.PrefixHitTokens,
	}
}

// DraftSeq is a running sequence whose next step is a decode, so that it
// may verify a draft in it (speculative decoding).
type DraftSeq struct {
	ID SeqID
	// Tokens are the prompt and the output so far; the last is the token
	// the step feeds. Read-only; valid until the next Update.
	Tokens []int32
	// MaxDraft is the most draft tokens its step can take: a step yields
	// up to 1+MaxDraft tokens, within MaxTokens, and carries at most
	// ChunkSize. Schedule may take fewer (the token budget, free blocks).
	MaxDraft int
}

// DraftCandidates lists, in running order, the sequences whose next
// Schedule would give them one decode token and that may still take a
// draft (MaxDraft >= 1). Call it between Update and Schedule, then
// SetDraft for the ones the proposer has a guess for.
func (s *Scheduler) DraftCandidates() []DraftSeq {
	var out []DraftSeq
	for _, q := range s.running {
		// Pending forks are created from the step that samples after the
		// prompt, from one logits row: that step verifies no draft.
		if len(q.tokens)-q.numComputed != 1 || q.ahead || len(q.forks) > 0 {
			continue
		}
		if k := min(s.cfg.ChunkSize-1, q.maxTokens-q.numOutput()-1); k >= 1 {
			out = append(out, DraftSeq{ID: q.id, Tokens: q.tokens[:len(q.tokens):len(q.tokens)], MaxDraft: k})
		}
	}
	return out
}

// Tokens returns sequence id's prompt and output so far as the host knows
// them, nil for an id the scheduler does not hold: while a ScheduleAhead
// plan waits for the outstanding step's token, without its placeholder.
// Read-only; valid until the next Update.
func (s *Scheduler) Tokens(id SeqID) []int32 {
	q := s.seqs[id]
	if q == nil {
		return nil
	}
	n := len(q.tokens)
	if q.ahead {
		n--
	}
	return q.tokens[:n:n]
}

// SetDraft proposes draft tokens for running sequence id's next decode:
// the next Schedule feeds its last token and the draft (as far as
// DraftCandidates' bound, the token budget and the free blocks allow) in
// one step and marks the entry with NumDraft. Update then rolls back what
// the engine did not accept. Drafts not scheduled by the next Schedule are
// dropped. It fails, changing nothing, for a sequence that is not a draft
// candidate (forks still to create included), while a plan is
// outstanding, and for a negative token id.
func (s *Scheduler) SetDraft(id SeqID, draft []int32) error {
	if s.pending != nil {
		return fmt.Errorf("sched: draft for sequence %d while plan %d is outstanding", id, s.pending.Step)
	}
	q := s.seqs[id]
	if q == nil || !q.running || len(q.tokens)-q.numComputed != 1 || q.ahead || len(q.forks) > 0 {
		return fmt.Errorf("sched: draft for sequence %d, which does not decode next (or has forks to create)", id)
	}
	for _, t := range draft {
		if t < 0 {
			return fmt.Errorf("sched: draft for sequence %d: token %d", id, t)
		}
	}
	if len(draft) == 0 {
		delete(s.drafts, id)
		return nil
	}
	s.drafts[id] = slices.Clone(draft)
	return nil
}
