package cuda

import (
	"fmt"
	"strings"

	"github.com/trigon-llm/trigon/backend"
)

// Lowering: Run rewrites a program's unfused ops into this backend's
// kernels before queuing them. Each rule matches a short run of ops that
// hand a buffer from one to the next, asks the fused kernel's planner
// whether it takes these operands (dtypes, rows, alignment, device), and
// replaces the run by that kernel; where no rule matches, or the planner
// declines, the ops run as written. A rule never changes what a tensor
// the program reads later holds, so a declined rule costs speed, never
// correctness.
//
//	rule        ops                                   kernel
//	qkv_rope    matmul(qkv) rope_store_kv(qkv)        the QKV product with RoPE and the KV write in its epilogue
//	matmul_add  matmul(d) add_rmsnorm(x=d, resid=r)   r += x . w^T, then the norm of r alone
//	gateup_silu matmul(g) silu_mul(g)                 the gate/up product with SiLU x mul in its epilogue
//
// Then two attributes are set on the lowered list:
//
//	prefetch    an add_rmsnorm whose output the next product reads asks L2
//	            for the start of that product's weight
//	early       the QKV kernel before attention, and the gate/up kernel
//	            before the down product, let their successor launch at
//	            their start (every kernel waits for its predecessor's data)

// kernel is what a lowered op runs.
type kernel uint8

const (
	kOp         kernel = iota // the op as written, through its Backend method
	kQKVRoPE                  // FusedQKVRoPE's kernel: src = matmul, rope_store_kv
	kMatMulAdd                // MatMulAdd's kernel: src = matmul (the add of the norm after it)
	kGateUpSiLU               // GateUpSiLU's kernel: src = matmul, silu_mul
)

var kernelNames = [...]string{kOp: "op", kQKVRoPE: "qkv_rope", kMatMulAdd: "matmul_add", kGateUpSiLU: "gateup_silu"}

// lop is one lowered op.
type lop struct {
	kernel kernel
	// src are the program's indices of the ops this one computes; the
	// second is -1 for a single op.
	src [2]int
	// op is the op as it runs, for kOp: the norm after a MatMulAdd has
	// lost its residual add (its x is the residual).
	op backend.Op
	// next is the weight an add_rmsnorm prefetches into L2, or nil.
	next backend.Tensor
	// early lets the next kernel launch at this one's start.
	early bool

	qkv  qkvPlan
	add  addPlan
	silu siluPlan
}

// rule tries to lower the ops at p.Ops[i:], appending what it makes to
// out. It returns the number of ops consumed, 0 where it does not match
// (having appended nothing).
type rule struct {
	name  string
	apply func(b *Backend, p *backend.Program, i int, out []lop) ([]lop, int, error)
}

// rules are tried in order at each op; the first that matches wins.
var rules = [...]rule{
	{"qkv_rope", lowerQKVRoPE},
	{"matmul_add", lowerMatMulAdd},
	{"gateup_silu", lowerGateUpSiLU},
}

// Run implements backend.Lowerer: it lowers p (rules above) and queues
// the lowered ops in order.
func (b *Backend) Run(p *backend.Program) error {
	lowered, err := b.lower(p, b.lowered[:0])
	b.lowered = lowered[:0]
	if err != nil {
		return err
	}
	for i := range lowered {
		if err := b.runLowered(p, &lowered[i]); err != nil {
			return err
		}
	}
	return nil
}

// lower rewrites p into out (reused storage). It queues nothing.
func (b *Backend) lower(p *backend.Program, out []lop) ([]lop, error) {
	for i := 0; i < len(p.Ops); {
		n := 0
		for _, r := range rules {
			var err error
			if out, n, err = r.apply(b, p, i, out); err != nil {
				return out, fmt.Errorf("%s (lowering rule %s): %w", p.Ops[i].Label(), r.name, err)
			}
			if n > 0 {
				break
			}
		}
		if n == 0 {
			out = append(out, lop{kernel: kOp, src: [2]int{i, -1}, op: p.Ops[i]})
			n = 1
		}
		i += n
	}
	for i := range out {
		l := &out[i]
		var succ *lop
		if i+1 < len(out) {
			succ = &out[i+1]
		}
		switch {
		case l.kernel == kOp && l.op.Kind == backend.OpAddRMSNorm && b.normPrefetches(rowsOf(l.op.Out)):
			l.next = prefetchTarget(out[i+1:], l.op.Out)
		case l.kernel == kQKVRoPE:
			l.early = succ != nil && succ.kernel == kOp && succ.op.Kind == backend.OpAttention
		case l.kernel == kGateUpSiLU:
			l.early = succ != nil && (succ.kernel == kMatMulAdd || succ.kernel == kOp && succ.op.Kind == backend.OpMatMul)
		}
	}
	return out, nil
}

// rowsOf is t's outermost dimension, 0 for a nil or scalar tensor.
func rowsOf(t backend.Tensor) int {
	if t == nil || len(t.Shape()) == 0 {
		return 0
	}
	return t.Shape()[0]
}

// prefetchTarget is the weight of the product that reads normed first
// among next (directly, or through one gather of its rows: the LM head's),
// or nil.
func prefetchTarget(next []lop, normed backend.Tensor) backend.Tensor {
	x := normed
	for i := 0; i < len(next) && i < 2; i++ {
		l := &next[i]
		if i == 0 && l.kernel == kOp && l.op.Kind == backend.OpEmbed && l.op.X == normed {
			x = l.op.Out
			continue
		}
		if px, w := l.product(); px != nil && px == x {
			return w
		}
		return nil
	}
	return nil
}

// product is the x and weight of the product a lowered op starts with,
// or nils.
func (l *lop) product() (x, w backend.Tensor) {
	switch l.kernel {
	case kQKVRoPE, kMatMulAdd, kGateUpSiLU:
		return l.op.X, l.op.W
	case kOp:
		if l.op.Kind == backend.OpMatMul {
			return l.op.X, l.op.W
		}
	}
	return nil, nil
}

// lowerQKVRoPE: matmul(out=qkv) then rope_store_kv(QKV=qkv), qkv read by
// nothing later (the fused kernel may leave it unwritten).
func lowerQKVRoPE(b *Backend, p *backend.Program, i int, out []lop) ([]lop, int, error) {
	if i+1 >= len(p.Ops) {
		return out, 0, nil
	}
	mm, rope := &p.Ops[i], &p.Ops[i+1]
	if mm.Kind != backend.OpMatMul || rope.Kind != backend.OpRoPEStoreKV || rope.RoPE.QKV != mm.Out || p.ReadBefore(mm.Out, i+1) {
		return out, 0, nil
	}
	plan, ok, err := b.planQKVRoPE(mm.X, mm.W, mm.Bias, rope.RoPE)
	if err != nil || !ok {
		return out, 0, err
	}
	return append(out, lop{kernel: kQKVRoPE, src: [2]int{i, i + 1}, op: *mm, qkv: plan}), 2, nil
}

// lowerMatMulAdd: matmul(out=d) without a bias, then add_rmsnorm(x=d,
// residual=r), d read by nothing later: r += x . w^T in the product, and
// the norm then normalises r alone.
func lowerMatMulAdd(b *Backend, p *backend.Program, i int, out []lop) ([]lop, int, error) {
	if i+1 >= len(p.Ops) {
		return out, 0, nil
	}
	mm, norm := &p.Ops[i], &p.Ops[i+1]
	if mm.Kind != backend.OpMatMul || mm.Bias != nil || norm.Kind != backend.OpAddRMSNorm ||
		norm.Residual == nil || norm.X != mm.Out || p.ReadBefore(mm.Out, i+1) {
		return out, 0, nil
	}
	plan, ok, err := b.planMatMulAdd(norm.Residual, mm.X, mm.W)
	if err != nil || !ok {
		return out, 0, err
	}
	normOnly := *norm
	normOnly.X, normOnly.Residual = norm.Residual, nil
	return append(out,
		lop{kernel: kMatMulAdd, src: [2]int{i, -1}, op: *mm, add: plan},
		lop{kernel: kOp, src: [2]int{i + 1, -1}, op: normOnly}), 2, nil
}

// lowerGateUpSiLU: matmul(out=g) without a bias, then silu_mul(x=g), g
// read by nothing later.
func lowerGateUpSiLU(b *Backend, p *backend.Program, i int, out []lop) ([]lop, int, error) {
	if i+1 >= len(p.Ops) {
		return out, 0, nil
	}
	mm, silu := &p.Ops[i], &p.Ops[i+1]
	if mm.Kind != backend.OpMatMul || mm.Bias != nil || silu.Kind != backend.OpSiLUMul || silu.X != mm.Out || p.ReadBefore(mm.Out, i+1) {
		return out, 0, nil
	}
	plan, ok, err := b.planGateUpSiLU(silu.Out, mm.X, mm.W)
	if err != nil || !ok {
		return out, 0, err
	}
	return append(out, lop{kernel: kGateUpSiLU, src: [2]int{i, i + 1}, op: *mm, silu: plan}), 2, nil
}

// runLowered queues one lowered op.
func (b *Backend) runLowered(p *backend.Program, l *lop) error {
	var err error
	switch l.kernel {
	case kOp:
		if l.next != nil {
			err = b.addRMSNormPrefetch(l.op.Out, l.op.X, l.op.Residual, l.op.W, l.op.Eps, l.next)
			if err != nil {
				err = fmt.Errorf("%s: %w", l.op.Label(), err)
			}
			return err
		}
		return backend.RunOp(b, &l.op)
	// The closures copy their plans: the lowered list is reused by the
	// next Run while the CUDA thread may not have run them yet.
	case kQKVRoPE:
		plan, early := l.qkv, l.early
		err = b.post(func() error { return b.runQKVRoPE(&plan, early) })
	case kMatMulAdd:
		plan := l.add
		err = b.post(func() error { return b.runMatMulAdd(&plan) })
	case kGateUpSiLU:
		plan, early := l.silu, l.early
		err = b.post(func() error { return b.runGateUpSiLU(&plan, early) })
	default:
		err = fmt.Errorf("lowered kernel %d", l.kernel)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", p.Ops[l.src[0]].Label(), err)
	}
	return nil
}

// formatLowered writes lowered one op a line: the kernel, the labels of
// the program ops it computes, and its attributes.
func formatLowered(p *backend.Program, lowered []lop, name func(backend.Tensor) string) string {
	var sb strings.Builder
	for i := range lowered {
		l := &lowered[i]
		labels := p.Ops[l.src[0]].Label()
		if l.src[1] >= 0 {
			labels += " + " + p.Ops[l.src[1]].Name
		}
		switch l.kernel {
		case kOp:
			sb.WriteString(backend.FormatOp(&l.op, name))
		default:
			fmt.Fprintf(&sb, "%s: %s", labels, kernelNames[l.kernel])
		}
		if l.next != nil {
			fmt.Fprintf(&sb, " prefetch=%s", name(l.next))
		}
		if l.early {
			sb.WriteString(" early")
		}
		sb.WriteByte('\n')
	}
	return sb.String()
}
