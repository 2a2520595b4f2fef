package cuda

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/internal/datadriven"
)

// TestLowerScripts runs testdata/lower/*.txt: programs in, lowered
// programs out. It needs no GPU: lowering decides from the operands and
// the device's properties alone, and queues nothing. Commands:
//
//	device [cc=90] [sms=132]        the device the rules see
//	llama rows=N [seqs=N] [logits=N] [hidden=H] [heads=H] [kv-heads=K] [head-dim=D]
//	      [inter=I] [vocab=V] [weights=bf16|f32|q8_0] [act=bf16|f32]
//	                                declares one layer's tensors (names below)
//	tensor NAME DTYPE D0,D1,...     declares one more tensor
//	lower                           the input is a program, one op a line as
//	                                backend.FormatOp writes it; prints the lowered ops
//
// llama's tensors: activations resid, normed, delta, qkv, q, attn, gate_up,
// act, gathered [logits, hidden], logits; weights embed, final_norm,
// lm_head, L0.input_norm, L0.qkv, L0.qkv_bias, L0.q_norm, L0.k_norm, L0.o,
// L0.post_norm, L0.gate_up, L0.down; KV caches kc0, vc0; step inputs
// tokens, positions, slots, inv_freq, block_tables, seq_lens,
// query_start, logits_rows.
func TestLowerScripts(t *testing.T) {
	datadriven.RunScripts(t, "testdata/lower/*.txt", func(t *testing.T) func(c *datadriven.Case) string {
		h := &lowerHarness{names: map[string]*tensor{}, back: map[backend.Tensor]string{}}
		h.setDevice(90, 132)
		return func(c *datadriven.Case) string {
			out, err := h.do(c)
			if err != nil {
				return "error: " + err.Error()
			}
			return out
		}
	})
}

type lowerHarness struct {
	b     *Backend
	names map[string]*tensor
	back  map[backend.Tensor]string
	addr  uint64
}

// setDevice makes the device-less Backend the rules consult.
func (h *lowerHarness) setDevice(cc, sms int) {
	h.b = newLoweringBackend(cc, sms)
	// Tensors declared earlier belong to the new backend too.
	for _, t := range h.names {
		t.b = h.b
	}
}

func (h *lowerHarness) declare(name string, dt backend.DType, shape ...int) error {
	size, err := dt.Bytes(shape)
	if err != nil {
		return fmt.Errorf("tensor %s: %w", name, err)
	}
	if old, ok := h.names[name]; ok {
		delete(h.back, old)
	}
	// Fake device addresses, 256-byte aligned as the pool's are.
	h.addr = (h.addr + 255) &^ 255
	if h.addr == 0 {
		h.addr = 1 << 32
	}
	t := &tensor{b: h.b, dt: dt, shape: slices.Clone(shape), ptr: h.addr, bytes: size}
	h.addr += uint64(size)
	h.names[name] = t
	h.back[t] = name
	return nil
}

func (h *lowerHarness) name(t backend.Tensor) string { return h.back[t] }

func (h *lowerHarness) do(c *datadriven.Case) (string, error) {
	switch c.Cmd {
	case "device":
		cc, err := c.Int("cc", 90)
		if err != nil {
			return "", err
		}
		sms, err := c.Int("sms", 132)
		if err != nil {
			return "", err
		}
		h.setDevice(cc, sms)
		return "ok", nil
	case "llama":
		return "ok", h.llama(c)
	case "tensor":
		name, err := c.Positional(0)
		if err != nil {
			return "", err
		}
		dts, err := c.Positional(1)
		if err != nil {
			return "", err
		}
		dims, err := c.Positional(2)
		if err != nil {
			return "", err
		}
		dt, err := parseDType(dts)
		if err != nil {
			return "", err
		}
		var shape []int
		for _, d := range strings.Split(dims, ",") {
			v, err := strconv.Atoi(d)
			if err != nil {
				return "", fmt.Errorf("tensor %s: dim %q: %w", name, d, err)
			}
			shape = append(shape, v)
		}
		return "ok", h.declare(name, dt, shape...)
	case "lower":
		p, err := h.parseProgram(c.Input)
		if err != nil {
			return "", err
		}
		lowered, err := h.b.lower(p, nil)
		if err != nil {
			return "", err
		}
		return strings.TrimRight(formatLowered(p, lowered, h.name), "\n"), nil
	}
	return "", fmt.Errorf("unknown command %q", c.Cmd)
}

func parseDType(s string) (backend.DType, error) {
	for _, dt := range []backend.DType{backend.F32, backend.F16, backend.BF16, backend.Q8_0, backend.Q4_0, backend.I32} {
		if strings.EqualFold(dt.String(), s) {
			return dt, nil
		}
	}
	return 0, fmt.Errorf("unknown dtype %q", s)
}

func (h *lowerHarness) llama(c *datadriven.Case) error {
	get := func(key string, def int) int {
		v, err := c.Int(key, def)
		if err != nil {
			panic(err)
		}
		return v
	}
	rows := get("rows", 4)
	seqs := get("seqs", rows)
	nl := get("logits", seqs)
	hidden, heads, kvh, hd := get("hidden", 4096), get("heads", 32), get("kv-heads", 8), get("head-dim", 128)
	inter, vocab := get("inter", 14336), get("vocab", 128256)
	wdt, err := parseDType(c.Str("weights", "bf16"))
	if err != nil {
		return err
	}
	act, err := parseDType(c.Str("act", "bf16"))
	if err != nil {
		return err
	}
	qkvw := (heads + 2*kvh) * hd
	const blocks, blockSize, maxBlocks = 64, 16, 128
	for _, d := range []struct {
		name  string
		dt    backend.DType
		shape []int
	}{
		{"resid", act, []int{rows, hidden}}, {"normed", act, []int{rows, hidden}}, {"delta", act, []int{rows, hidden}},
		{"qkv", act, []int{rows, qkvw}}, {"q", act, []int{rows, heads * hd}}, {"attn", act, []int{rows, heads * hd}},
		{"gate_up", act, []int{rows, 2 * inter}}, {"act", act, []int{rows, inter}},
		{"gathered", act, []int{nl, hidden}}, {"logits", backend.F32, []int{nl, vocab}},
		{"embed", wdt, []int{vocab, hidden}}, {"final_norm", backend.F32, []int{hidden}}, {"lm_head", wdt, []int{vocab, hidden}},
		{"L0.input_norm", backend.F32, []int{hidden}}, {"L0.qkv", wdt, []int{qkvw, hidden}}, {"L0.qkv_bias", backend.F32, []int{qkvw}},
		{"L0.q_norm", backend.F32, []int{hd}}, {"L0.k_norm", backend.F32, []int{hd}},
		{"L0.o", wdt, []int{hidden, heads * hd}}, {"L0.post_norm", backend.F32, []int{hidden}},
		{"L0.gate_up", wdt, []int{2 * inter, hidden}}, {"L0.down", wdt, []int{hidden, inter}},
		{"kc0", act, []int{blocks, kvh, blockSize, hd}}, {"vc0", act, []int{blocks, kvh, blockSize, hd}},
		{"tokens", backend.I32, []int{rows}}, {"positions", backend.I32, []int{rows}}, {"slots", backend.I32, []int{rows}},
		{"inv_freq", backend.F32, []int{hd / 2}}, {"block_tables", backend.I32, []int{seqs, maxBlocks}},
		{"seq_lens", backend.I32, []int{seqs}}, {"query_start", backend.I32, []int{seqs + 1}}, {"logits_rows", backend.I32, []int{nl}},
	} {
		if err := h.declare(d.name, d.dt, d.shape...); err != nil {
			return err
		}
	}
	return nil
}

// parseProgram reads FormatOp's lines back: "label: kind outs <- ins",
// each operand a name or role=name. attention takes maxq=N (its
// MaxQueryLen) among its inputs.
func (h *lowerHarness) parseProgram(text string) (*backend.Program, error) {
	p := &backend.Program{}
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		op, err := h.parseOp(line)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", line, err)
		}
		p.Add(op)
	}
	return p, nil
}

func (h *lowerHarness) parseOp(line string) (backend.Op, error) {
	op := backend.Op{Layer: -1, Eps: 1e-5}
	label, rest, ok := strings.Cut(line, ": ")
	if !ok {
		return op, fmt.Errorf("want 'label: kind outs <- ins'")
	}
	if l, name, ok := strings.Cut(label, " "); ok && strings.HasPrefix(label, "layer ") {
		num, name2, _ := strings.Cut(name, " ")
		n, err := strconv.Atoi(num)
		if err != nil {
			return op, fmt.Errorf("label %q: %w", label, err)
		}
		_ = l
		op.Layer, op.Name = n, name2
	} else {
		op.Name = label
	}
	outs, ins, ok := strings.Cut(rest, " <- ")
	if !ok {
		return op, fmt.Errorf("no ' <- '")
	}
	fields := strings.Fields(outs)
	if len(fields) == 0 {
		return op, fmt.Errorf("no kind")
	}
	kindName := fields[0]
	operands := map[string]string{}
	positional := func(list []string, prefix string) {
		n := 0
		for _, f := range list {
			if k, v, ok := strings.Cut(f, "="); ok {
				operands[k] = v
			} else {
				operands[fmt.Sprintf("%s%d", prefix, n)] = f
				n++
			}
		}
	}
	positional(fields[1:], "out")
	positional(strings.Fields(ins), "in")
	var err error
	t := func(key string) backend.Tensor {
		name, ok := operands[key]
		if !ok || err != nil {
			return nil
		}
		delete(operands, key)
		tt, ok := h.names[name]
		if !ok {
			err = fmt.Errorf("unknown tensor %q", name)
			return nil
		}
		return tt
	}
	named := func(name string) backend.Tensor {
		tt, ok := h.names[name]
		if !ok && err == nil {
			err = fmt.Errorf("the harness has no %s", name)
		}
		if !ok {
			return nil
		}
		return tt
	}
	switch kindName {
	case "embed":
		op.Kind, op.Out, op.X, op.IDs = backend.OpEmbed, t("out0"), t("in0"), t("ids")
	case "add_rmsnorm":
		op.Kind, op.Out, op.Residual, op.X, op.W = backend.OpAddRMSNorm, t("out0"), t("residual"), t("in0"), t("w")
	case "matmul":
		op.Kind, op.Out, op.X, op.W, op.Bias = backend.OpMatMul, t("out0"), t("in0"), t("w"), t("bias")
	case "silu_mul":
		op.Kind, op.Out, op.X = backend.OpSiLUMul, t("out0"), t("in0")
	case "all_reduce": // in place, "all_reduce t <- t"; lowering runs nothing, so no communicator
		out, in := t("out0"), t("in0")
		if err == nil && out != in {
			err = fmt.Errorf("all_reduce is in place: its out must be its in")
		}
		op.Kind, op.X = backend.OpAllReduce, in
	case "rope_store_kv":
		op.Kind = backend.OpRoPEStoreKV
		a := &op.RoPE
		a.Q, a.KCache, a.VCache, a.QKV, a.QNorm, a.KNorm = t("out0"), t("k"), t("v"), t("in0"), t("qnorm"), t("knorm")
		a.Positions, a.SlotMapping, a.InvFreq, a.NormEps = named("positions"), named("slots"), named("inv_freq"), 1e-6
		if err == nil {
			kc := a.KCache.Shape()
			a.NumKVHeads, a.HeadDim = kc[1], kc[3]
			a.NumHeads = a.Q.Shape()[1] / a.HeadDim
			a.KV = backend.PlainKV(a.KCache.DType(), kc[2])
		}
	case "attention":
		op.Kind = backend.OpAttention
		a := &op.Attn
		a.Out, a.Q, a.KCache, a.VCache = t("out0"), t("in0"), t("k"), t("v")
		a.BlockTables, a.SeqLens, a.QueryStart = named("block_tables"), named("seq_lens"), named("query_start")
		if q, ok := operands["maxq"]; ok {
			delete(operands, "maxq")
			if a.MaxQueryLen, err = strconv.Atoi(q); err != nil {
				return op, err
			}
		}
		if err == nil {
			kc := a.KCache.Shape()
			a.NumKVHeads, a.HeadDim = kc[1], kc[3]
			a.NumHeads = a.Q.Shape()[1] / a.HeadDim
			a.KV = backend.PlainKV(a.KCache.DType(), kc[2])
			a.NumSeqs = a.SeqLens.Shape()[0]
			a.MaxSeqLen, a.Scale = 2048, 1/float32(a.HeadDim)
		}
	default:
		return op, fmt.Errorf("unknown op kind %q", kindName)
	}
	if err != nil {
		return op, err
	}
	if len(operands) > 0 {
		return op, fmt.Errorf("operands %v not used by %s", operands, kindName)
	}
	return op, nil
}

// newLoweringBackend is a Backend with no device behind it, for the
// lowering rules: they read only its properties (compute capability, SM
// count, tuning) and its tensors' metadata. Nothing may be queued on it.
func newLoweringBackend(cc, sms int) *Backend {
	tune, err := Tuning{}.resolve()
	if err != nil {
		panic(err)
	}
	return &Backend{name: "cuda:lowering", cc: cc, sms: sms, tune: tune}
}
