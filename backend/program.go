package backend

import (
	"fmt"
	"strings"
)

// OpKind names one unfused op of a Program. Each kind is one method of
// Backend, and its operands are that method's.
type OpKind uint8

const (
	// OpEmbed is Embed(Out, X, IDs): X is the table (or activations to
	// gather rows of).
	OpEmbed OpKind = iota + 1
	// OpAddRMSNorm is AddRMSNorm(Out, X, Residual, W, Eps).
	OpAddRMSNorm
	// OpMatMul is MatMul(Out, X, W, Bias).
	OpMatMul
	// OpRoPEStoreKV is RoPEStoreKV(RoPE).
	OpRoPEStoreKV
	// OpAttention is Attention(Attn).
	OpAttention
	// OpSiLUMul is SiLUMul(Out, X).
	OpSiLUMul
	// OpEmbedShard is ShardEmbedder.EmbedShard(Out, X, IDs, Base): the
	// embedding of a rank's vocabulary shard (tensor parallelism).
	OpEmbedShard
	// OpAllReduce is Comm.AllReduce(X): X summed over the ranks, in place.
	OpAllReduce
	// OpAllGather is Comm.AllGather(Out, X, Widths): the ranks' X side by
	// side in Out.
	OpAllGather
)

var opNames = [...]string{
	OpEmbed:       "embed",
	OpAddRMSNorm:  "add_rmsnorm",
	OpMatMul:      "matmul",
	OpRoPEStoreKV: "rope_store_kv",
	OpAttention:   "attention",
	OpSiLUMul:     "silu_mul",
	OpEmbedShard:  "embed_shard",
	OpAllReduce:   "all_reduce",
	OpAllGather:   "all_gather",
}

func (k OpKind) String() string {
	if int(k) < len(opNames) && opNames[k] != "" {
		return opNames[k]
	}
	return fmt.Sprintf("op(%d)", k)
}

// Op is one step of a Program: a kind and its operands. The fields its
// kind does not use are nil or zero.
type Op struct {
	Kind OpKind
	// Layer is the decoder layer the op belongs to, -1 outside the
	// layers; Name says what it computes ("qkv", "o_proj", ...). Both
	// only name the op in errors and printed programs.
	Layer int
	Name  string

	Out      Tensor
	X        Tensor
	W        Tensor // MatMul's weight, AddRMSNorm's norm weight
	Bias     Tensor // MatMul's bias, or nil
	Residual Tensor // AddRMSNorm's residual, or nil
	IDs      Tensor // Embed's ids
	Eps      float32
	RoPE     RoPEArgs      // OpRoPEStoreKV
	Attn     AttentionArgs // OpAttention
	Base     int           // OpEmbedShard: the first vocabulary row of the table
	Comm     Communicator  // OpAllReduce, OpAllGather
	Widths   []int         // OpAllGather: every rank's width of X
}

// Label names the op for errors: "layer 3 qkv", "lm_head".
func (op *Op) Label() string {
	if op.Layer >= 0 {
		return fmt.Sprintf("layer %d %s", op.Layer, op.Name)
	}
	return op.Name
}

// Reads reports whether the op reads tensor t (compared by identity:
// programs name each buffer through one handle).
func (op *Op) Reads(t Tensor) bool {
	if t == nil {
		return false
	}
	switch op.Kind {
	case OpEmbed, OpEmbedShard:
		return op.X == t || op.IDs == t
	case OpAllReduce, OpAllGather:
		return op.X == t
	case OpAddRMSNorm:
		return op.X == t || op.Residual == t || op.W == t
	case OpMatMul:
		return op.X == t || op.W == t || op.Bias == t
	case OpSiLUMul:
		return op.X == t
	case OpRoPEStoreKV:
		a := &op.RoPE
		return a.QKV == t || a.Positions == t || a.SlotMapping == t || a.InvFreq == t ||
			a.QNorm == t || a.KNorm == t || a.KCache == t || a.VCache == t || a.KVAux.has(t)
	case OpAttention:
		a := &op.Attn
		return a.Q == t || a.KCache == t || a.VCache == t || a.BlockTables == t ||
			a.SeqLens == t || a.QueryStart == t || a.KVAux.has(t)
	}
	return false
}

// Writes reports whether the op writes tensor t: its output, the
// residual an AddRMSNorm adds into, the Q and caches RoPEStoreKV fills.
func (op *Op) Writes(t Tensor) bool {
	if t == nil {
		return false
	}
	switch op.Kind {
	case OpEmbed, OpEmbedShard, OpMatMul, OpSiLUMul, OpAllGather:
		return op.Out == t
	case OpAllReduce:
		return op.X == t
	case OpAddRMSNorm:
		return op.Out == t || op.Residual == t
	case OpRoPEStoreKV:
		// The scales: a dynamic FP8 cache's first write sets them.
		return op.RoPE.Q == t || op.RoPE.KCache == t || op.RoPE.VCache == t || op.RoPE.KVAux.writes(t)
	case OpAttention:
		return op.Attn.Out == t
	}
	return false
}

// Program is a forward pass as a list of unfused ops over tensors, run in
// order, each seeing the writes of those before it. A model writes its
// forward once as a Program; each backend lowers it: the CPU runs the ops
// as written, the CUDA backend first rewrites runs of ops into its fused
// kernels. A rewrite only ever replaces ops by a kernel that computes the
// same tensors, so running the ops as written is always correct.
//
// Buffers are named by identity: an op that reads the tensor another op
// wrote holds the same handle (the same view), so a backend can follow
// the data from op to op.
type Program struct {
	Ops []Op
}

// Reset empties p, keeping its storage for the next step.
func (p *Program) Reset() { p.Ops = p.Ops[:0] }

// Add appends op.
func (p *Program) Add(op Op) { p.Ops = append(p.Ops, op) }

// ReadBefore reports whether an op of p after index i reads t before an
// op writes it again (after i, t's current value is still wanted).
func (p *Program) ReadBefore(t Tensor, i int) bool {
	for j := i + 1; j < len(p.Ops); j++ {
		op := &p.Ops[j]
		if op.Reads(t) {
			return true
		}
		if op.Writes(t) {
			return false
		}
	}
	return false
}

// RunOp runs one op through b's op methods.
func RunOp(b Backend, op *Op) error {
	var err error
	switch op.Kind {
	case OpEmbed:
		err = b.Embed(op.Out, op.X, op.IDs)
	case OpAddRMSNorm:
		err = b.AddRMSNorm(op.Out, op.X, op.Residual, op.W, op.Eps)
	case OpMatMul:
		err = b.MatMul(op.Out, op.X, op.W, op.Bias)
	case OpRoPEStoreKV:
		err = b.RoPEStoreKV(op.RoPE)
	case OpAttention:
		err = b.Attention(op.Attn)
	case OpSiLUMul:
		err = b.SiLUMul(op.Out, op.X)
	case OpEmbedShard:
		err = runEmbedShard(b, op)
	case OpAllReduce, OpAllGather:
		err = runCollective(op)
	default:
		err = fmt.Errorf("unknown op kind %d", op.Kind)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", op.Label(), err)
	}
	return nil
}

// Lowerer is an optional Backend interface: a backend that rewrites runs
// of a program's ops into fused kernels computing the same tensors
// (backend/cuda's lowering rules) before queuing them. Errors come back
// labelled with the op (Op.Label).
type Lowerer interface {
	Run(p *Program) error
}

// Run queues p on b: through b's lowering where b is a Lowerer, else op
// by op as written (RunOps). The model calls this, never the op methods,
// so a program has one path whatever the backend.
func Run(b Backend, p *Program) error {
	if l, ok := b.(Lowerer); ok {
		return l.Run(p)
	}
	return RunOps(b, p)
}

// RunOps runs p's ops one by one as written, through b's op methods.
func RunOps(b Backend, p *Program) error {
	for i := range p.Ops {
		if err := RunOp(b, &p.Ops[i]); err != nil {
			return err
		}
	}
	return nil
}

// Format writes p one op a line, naming tensors through name (which
// returns "" for tensors it does not know; those print as "?"). Tests of
// rewrite rules print programs this way.
func (p *Program) Format(name func(Tensor) string) string {
	var sb strings.Builder
	for i := range p.Ops {
		sb.WriteString(FormatOp(&p.Ops[i], name))
		sb.WriteByte('\n')
	}
	return sb.String()
}

// FormatOp is one op as Format writes it: the label, the kind, then the
// operands that are set, as "label: kind out <- in, in".
func FormatOp(op *Op, name func(Tensor) string) string {
	n := func(t Tensor) string {
		if s := name(t); s != "" {
			return s
		}
		return "?"
	}
	var outs, ins []string
	add := func(list *[]string, key string, t Tensor) {
		if t != nil {
			*list = append(*list, key+n(t))
		}
	}
	switch op.Kind {
	case OpEmbed, OpEmbedShard:
		add(&outs, "", op.Out)
		add(&ins, "", op.X)
		add(&ins, "ids=", op.IDs)
	case OpAllReduce:
		add(&outs, "", op.X)
		add(&ins, "", op.X)
	case OpAllGather:
		add(&outs, "", op.Out)
		add(&ins, "", op.X)
	case OpAddRMSNorm:
		add(&outs, "", op.Out)
		add(&outs, "residual=", op.Residual)
		add(&ins, "", op.X)
		add(&ins, "w=", op.W)
	case OpMatMul:
		add(&outs, "", op.Out)
		add(&ins, "", op.X)
		add(&ins, "w=", op.W)
		add(&ins, "bias=", op.Bias)
	case OpSiLUMul:
		add(&outs, "", op.Out)
		add(&ins, "", op.X)
	case OpRoPEStoreKV:
		a := &op.RoPE
		add(&outs, "", a.Q)
		add(&outs, "k=", a.KCache)
		add(&outs, "v=", a.VCache)
		add(&ins, "", a.QKV)
		add(&ins, "qnorm=", a.QNorm)
		add(&ins, "knorm=", a.KNorm)
	case OpAttention:
		a := &op.Attn
		add(&outs, "", a.Out)
		add(&ins, "", a.Q)
		add(&ins, "k=", a.KCache)
		add(&ins, "v=", a.VCache)
	}
	return fmt.Sprintf("%s: %s %s <- %s", op.Label(), op.Kind, strings.Join(outs, " "), strings.Join(ins, " "))
}

// has reports whether t is one of the side tensors.
func (x *KVAux) has(t Tensor) bool {
	return x.KScale == t || x.VScale == t || x.KWindow == t || x.VWindow == t || x.WindowMap == t
}

// writes reports whether RoPEStoreKV may write t: all but the window map.
func (x *KVAux) writes(t Tensor) bool {
	return x.KScale == t || x.VScale == t || x.KWindow == t || x.VWindow == t
}
