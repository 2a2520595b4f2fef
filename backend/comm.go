package backend

import "fmt"

// Communicator is one rank's end of a tensor-parallel group: the ranks run
// the same program over their own shards of the weights, each on its own
// backend, and meet at the program's collective ops (OpAllReduce,
// OpAllGather). Every rank must call the same collectives in the same
// order with tensors of the same shape and dtype; a call returns once this
// rank's part is queued on its backend (in queue order with its other
// ops), not necessarily once the data has arrived.
//
// Implementations: backend/collective (in-process, over any backends: the
// CPU mode and the oracle) and backend/cuda's NCCL communicator.
type Communicator interface {
	// Rank is this end's index in [0, Size).
	Rank() int
	// Size is the number of ranks.
	Size() int
	// AllReduce replaces t on every rank by the sum over the ranks of t,
	// computed in f32.
	//   t [rows, dim] F32 or BF16
	AllReduce(t Tensor) error
	// AllGather writes the ranks' x side by side along the last dimension,
	// in rank order, into out on every rank: rank r's x is [rows,
	// widths[r]] and lands in columns [sum of widths[:r], + widths[r]).
	//   out [rows, sum of widths] F32
	//   x   [rows, widths[Rank()]] F32
	AllGather(out, x Tensor, widths []int) error
}

// ShardEmbedder is an optional Backend interface: the embedding of a table
// split over its rows (the vocabulary) between ranks.
type ShardEmbedder interface {
	// EmbedShard is Embed for a table holding rows [base, base+rows) of
	// the whole: out[i] = table[ids[i]-base], and a zero row where ids[i]
	// lies outside the shard (another rank has it; the ranks' outputs are
	// then summed). Negative ids are an error, as in Embed.
	//   out   [n, dim]
	//   table [rows, dim]
	//   ids   [n] I32
	EmbedShard(out, table, ids Tensor, base int) error
}

// CheckAllGather checks AllGather's operands against rank's width.
func CheckAllGather(out, x Tensor, widths []int, rank int) error {
	const op = "all_gather"
	if rank < 0 || rank >= len(widths) {
		return ShapeError(op, "widths", "%d widths for rank %d", len(widths), rank)
	}
	total := 0
	for r, w := range widths {
		if w <= 0 {
			return ShapeError(op, "widths", "rank %d has width %d", r, w)
		}
		total += w
	}
	if err := checkOperand(op, "x", x, []DType{F32}, -1, widths[rank]); err != nil {
		return err
	}
	return checkOperand(op, "out", out, []DType{F32}, x.Shape()[0], total)
}

// CheckAllReduce checks AllReduce's operand.
func CheckAllReduce(t Tensor) error {
	return checkOperand("all_reduce", "t", t, []DType{F32, BF16}, -1, -1)
}

// runCollective runs a collective op through its communicator.
func runCollective(op *Op) error {
	if op.Comm == nil {
		return fmt.Errorf("%v without a communicator", op.Kind)
	}
	switch op.Kind {
	case OpAllReduce:
		return op.Comm.AllReduce(op.X)
	case OpAllGather:
		return op.Comm.AllGather(op.Out, op.X, op.Widths)
	}
	return fmt.Errorf("%v is not a collective", op.Kind)
}

// runEmbedShard runs OpEmbedShard on b, which must be a ShardEmbedder.
func runEmbedShard(b Backend, op *Op) error {
	s, ok := b.(ShardEmbedder)
	if !ok {
		return fmt.Errorf("the %s backend cannot embed over a vocabulary shard", b.Name())
	}
	return s.EmbedShard(op.Out, op.X, op.IDs, op.Base)
}
