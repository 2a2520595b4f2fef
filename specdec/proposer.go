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
