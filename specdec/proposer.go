package specdec

// Seq asks for one sequence's draft.
type Seq struct {
	// ID names the sequence while it lives (the scheduler's id); a
	// stateful proposer keeps its state under it until Forget.
	ID int64
	// Tokens are the prompt and the output so far; the last one is the
	// token the target feeds next. Read-only: it aliases the caller's.
	Tokens []int32
	// K is the most tokens to propose (>= 1).
	K int
}

// Proposer guesses the tokens that follow each sequence. Proposals never
// change what the output is (the target verifies every one), only how many
// tokens a step yields, so a proposer may return fewer than K tokens, or
// none, whenever it has no good guess or no room.
type Proposer interface {
	// Propose returns one draft per seq, in order, each of at most seq.K
	// tokens; the caller owns the slices. Every proposal is a point mass
	// (the proposer's single guess), so acceptance uses q = 1 for it.
	Propose(seqs []Seq) ([][]int32, error)
	// Forget drops what the proposer keeps for a sequence that ended.
	Forget(id int64)
	// Close frees the proposer's resources (a draft model's KV cache).
	Close()
}

// Predictor is an optional Proposer interface, for queueing decode steps
// ahead while speculating (engine.Options.QueueAhead). A step queued on
// the device before the host has the token it feeds carries no draft, so
// the engine queues the next step ahead only while no sequence is likely
// to have one. LikelyDraft reports whether Propose would likely return a
// draft for a sequence once one more token follows tokens (its prompt and
// output so far; read-only). It must cost far less than a step: it is
// asked for every sequence of every step. It only moves speed: a wrong
// guess costs a step without its draft, or a step not queued ahead.
type Predictor interface {
	LikelyDraft(tokens []int32) bool
}
