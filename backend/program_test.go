package backend_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/backend"
)

// fakeTensor is a named handle; programs compare tensors by identity.
type fakeTensor struct {
	name  string
	dt    backend.DType
	shape []int
}

func (t *fakeTensor) DType() backend.DType { return t.dt }
func (t *fakeTensor) Shape() []int         { return t.shape }

func tensors(names ...string) map[string]*fakeTensor {
	m := map[string]*fakeTensor{}
	for _, n := range names {
		m[n] = &fakeTensor{name: n, dt: backend.BF16, shape: []int{4, 8}}
	}
	return m
}

func nameOf(t backend.Tensor) string {
	if f, ok := t.(*fakeTensor); ok {
		return f.name
	}
	return ""
}

// layer is one decoder layer's program over the fake tensors.
func layer(ts map[string]*fakeTensor) *backend.Program {
	p := &backend.Program{}
	p.Add(backend.Op{Kind: backend.OpAddRMSNorm, Layer: 0, Name: "input_norm", Out: ts["normed"], X: ts["resid"], W: ts["g1"]})
	p.Add(backend.Op{Kind: backend.OpMatMul, Layer: 0, Name: "qkv", Out: ts["qkv"], X: ts["normed"], W: ts["wqkv"]})
	p.Add(backend.Op{Kind: backend.OpRoPEStoreKV, Layer: 0, Name: "rope", RoPE: backend.RoPEArgs{
		Q: ts["q"], QKV: ts["qkv"], KCache: ts["kc"], VCache: ts["vc"], Positions: ts["pos"], SlotMapping: ts["slots"], InvFreq: ts["inv"]}})
	p.Add(backend.Op{Kind: backend.OpAttention, Layer: 0, Name: "attention", Attn: backend.AttentionArgs{
		Out: ts["attn"], Q: ts["q"], KCache: ts["kc"], VCache: ts["vc"], BlockTables: ts["bt"], SeqLens: ts["sl"], QueryStart: ts["qs"]}})
	p.Add(backend.Op{Kind: backend.OpMatMul, Layer: 0, Name: "o_proj", Out: ts["delta"], X: ts["attn"], W: ts["wo"]})
	p.Add(backend.Op{Kind: backend.OpAddRMSNorm, Layer: 0, Name: "post_norm", Out: ts["normed"], X: ts["delta"], Residual: ts["resid"], W: ts["g2"]})
	p.Add(backend.Op{Kind: backend.OpMatMul, Layer: 0, Name: "gate_up", Out: ts["gu"], X: ts["normed"], W: ts["wgu"]})
	p.Add(backend.Op{Kind: backend.OpSiLUMul, Layer: 0, Name: "silu_mul", Out: ts["act"], X: ts["gu"]})
	p.Add(backend.Op{Kind: backend.OpMatMul, Layer: 0, Name: "down_proj", Out: ts["delta"], X: ts["act"], W: ts["wd"]})
	return p
}

func TestProgramReadBefore(t *testing.T) {
	ts := tensors("normed", "resid", "g1", "g2", "qkv", "wqkv", "q", "kc", "vc", "pos", "slots", "inv",
		"attn", "bt", "sl", "qs", "delta", "wo", "gu", "wgu", "act", "wd")
	p := layer(ts)
	for _, c := range []struct {
		tensor string
		after  int
		want   bool
	}{
		{"qkv", 1, true},    // rope reads it
		{"qkv", 2, false},   // nothing after rope
		{"delta", 4, true},  // post_norm adds it
		{"delta", 5, false}, // down_proj overwrites it before any read
		{"normed", 5, true}, // gate_up reads post_norm's output
		{"resid", 0, true},  // post_norm reads (and writes) it
		{"resid", 5, false}, // nothing after post_norm
		{"kc", 2, true},     // attention reads the cache rope wrote
		{"q", 3, false},     // nothing after attention reads Q
		{"gu", 6, true},     // silu_mul
		{"act", 8, false},   // the last op
		{"missing", 0, false},
	} {
		var tt backend.Tensor
		if f, ok := ts[c.tensor]; ok {
			tt = f
		}
		if got := p.ReadBefore(tt, c.after); got != c.want {
			t.Errorf("ReadBefore(%s, %d) = %v, want %v", c.tensor, c.after, got, c.want)
		}
	}
}

func TestProgramFormat(t *testing.T) {
	ts := tensors("normed", "resid", "g1", "g2", "qkv", "wqkv", "q", "kc", "vc", "pos", "slots", "inv",
		"attn", "bt", "sl", "qs", "delta", "wo", "gu", "wgu", "act", "wd")
	got := layer(ts).Format(nameOf)
	want := `layer 0 input_norm: add_rmsnorm normed <- resid w=g1
layer 0 qkv: matmul qkv <- normed w=wqkv
layer 0 rope: rope_store_kv q k=kc v=vc <- qkv
layer 0 attention: attention attn <- q k=kc v=vc
layer 0 o_proj: matmul delta <- attn w=wo
layer 0 post_norm: add_rmsnorm normed residual=resid <- delta w=g2
layer 0 gate_up: matmul gu <- normed w=wgu
layer 0 silu_mul: silu_mul act <- gu
layer 0 down_proj: matmul delta <- act w=wd
`
	if got != want {
		t.Errorf("Format:\n%s\nwant:\n%s", got, want)
	}
}

// recorder is a Backend that records the ops it is asked to run and
// fails the one named fail.
type recorder struct {
	backend.Backend
	ran  []string
	fail string
}

func (r *recorder) op(name string) error {
	r.ran = append(r.ran, name)
	if name == r.fail {
		return errors.New("refused")
	}
	return nil
}

func (r *recorder) Embed(out, table, ids backend.Tensor) error { return r.op("embed " + nameOf(out)) }
func (r *recorder) AddRMSNorm(out, x, res, w backend.Tensor, eps float32) error {
	return r.op("add_rmsnorm " + nameOf(out))
}
func (r *recorder) MatMul(out, x, w, bias backend.Tensor) error { return r.op("matmul " + nameOf(out)) }
func (r *recorder) RoPEStoreKV(a backend.RoPEArgs) error        { return r.op("rope " + nameOf(a.Q)) }
func (r *recorder) Attention(a backend.AttentionArgs) error {
	return r.op("attention " + nameOf(a.Out))
}
func (r *recorder) Name() string                             { return "recorder" }
func (r *recorder) SiLUMul(out, gateUp backend.Tensor) error { return r.op("silu_mul " + nameOf(out)) }

func TestRunOps(t *testing.T) {
	ts := tensors("normed", "resid", "g1", "g2", "qkv", "wqkv", "q", "kc", "vc", "pos", "slots", "inv",
		"attn", "bt", "sl", "qs", "delta", "wo", "gu", "wgu", "act", "wd")
	r := &recorder{}
	if err := backend.RunOps(r, layer(ts)); err != nil {
		t.Fatal(err)
	}
	want := "add_rmsnorm normed, matmul qkv, rope q, attention attn, matmul delta, add_rmsnorm normed, matmul gu, silu_mul act, matmul delta"
	if got := strings.Join(r.ran, ", "); got != want {
		t.Errorf("ran %s\nwant %s", got, want)
	}

	// A failing op stops the program and its error names the op.
	r = &recorder{fail: "matmul gu"}
	err := backend.RunOps(r, layer(ts))
	if err == nil || !strings.Contains(err.Error(), "layer 0 gate_up: refused") {
		t.Fatalf("RunOps with a failing gate_up: %v", err)
	}
	if len(r.ran) != 7 {
		t.Errorf("ran %d ops after the failure, want it to stop at the 7th: %v", len(r.ran), r.ran)
	}
}

func TestKVSpec(t *testing.T) {
	pool := func(dt backend.DType, shape ...int) backend.Tensor { return &fakeTensor{dt: dt, shape: shape} }
	plain := backend.PlainKV(backend.BF16, 16)
	for _, c := range []struct {
		name   string
		spec   backend.KVSpec
		k, v   backend.Tensor
		blocks int
		err    string
	}{
		{"ok", plain, pool(backend.BF16, 10, 8, 16, 128), pool(backend.BF16, 10, 8, 16, 128), 10, ""},
		{"zero spec", backend.KVSpec{}, pool(backend.BF16, 10, 8, 16, 128), pool(backend.BF16, 10, 8, 16, 128), 0, "dtype"},
		{"quantized dtype", backend.PlainKV(backend.Q8_0, 16), pool(backend.Q8_0, 10, 8, 16, 128), pool(backend.Q8_0, 10, 8, 16, 128), 0, "dtype"},
		{"window without a format", backend.KVSpec{DType: backend.BF16, BlockSize: 16, Layout: backend.KVHeadMajor, Scales: backend.KVNoScales, Window: 128},
			pool(backend.BF16, 10, 8, 16, 128), pool(backend.BF16, 10, 8, 16, 128), 0, "window"},
		{"pool dtype", plain, pool(backend.F32, 10, 8, 16, 128), pool(backend.BF16, 10, 8, 16, 128), 0, "KCache: dtype F32"},
		{"block size", plain, pool(backend.BF16, 10, 8, 32, 128), pool(backend.BF16, 10, 8, 32, 128), 0, "KCache: shape"},
		{"heads", plain, pool(backend.BF16, 10, 4, 16, 128), pool(backend.BF16, 10, 4, 16, 128), 0, "KCache: shape"},
		{"v differs", plain, pool(backend.BF16, 10, 8, 16, 128), pool(backend.BF16, 9, 8, 16, 128), 0, "VCache: shape"},
		{"nil v", plain, pool(backend.BF16, 10, 8, 16, 128), nil, 0, "VCache: nil"},
	} {
		t.Run(c.name, func(t *testing.T) {
			n, err := c.spec.CheckPools("op", c.k, c.v, backend.KVAux{}, 8, 128)
			if c.err == "" {
				if err != nil || n != c.blocks {
					t.Fatalf("CheckPools = %d, %v; want %d, nil", n, err, c.blocks)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.err) || !errors.Is(err, backend.ErrShape) {
				t.Fatalf("CheckPools error %v, want an ErrShape containing %q", err, c.err)
			}
		})
	}
	if got := plain.BlockBytes(8, 128); got != 8*16*128*2 {
		t.Errorf("BlockBytes = %d, want %d", got, 8*16*128*2)
	}
}

// fakeComm records the collectives it is asked to run.
type fakeComm struct{ ran []string }

func (c *fakeComm) Rank() int { return 0 }
func (c *fakeComm) Size() int { return 2 }
func (c *fakeComm) AllReduce(t backend.Tensor) error {
	c.ran = append(c.ran, "all_reduce "+nameOf(t))
	return nil
}
func (c *fakeComm) AllGather(out, x backend.Tensor, widths []int) error {
	c.ran = append(c.ran, "all_gather "+nameOf(out)+" <- "+nameOf(x))
	return nil
}

// TestCollectiveOps: the tensor-parallel ops read and write what they
// say, print, and run through their communicator; one without a
// communicator, or an embed_shard on a backend that cannot, is an error.
func TestCollectiveOps(t *testing.T) {
	ts := tensors("delta", "resid", "part", "logits", "table", "ids")
	comm := &fakeComm{}
	p := &backend.Program{}
	p.Add(backend.Op{Kind: backend.OpAllReduce, Layer: 0, Name: "o_proj_sum", X: ts["delta"], Comm: comm})
	p.Add(backend.Op{Kind: backend.OpAddRMSNorm, Layer: 0, Name: "post_norm", Out: ts["resid"], X: ts["delta"], W: ts["table"]})
	p.Add(backend.Op{Kind: backend.OpAllGather, Layer: -1, Name: "logits_gather", Out: ts["logits"], X: ts["part"], Widths: []int{4, 4}, Comm: comm})
	if !p.Ops[0].Reads(ts["delta"]) || !p.Ops[0].Writes(ts["delta"]) {
		t.Error("all_reduce must read and write its tensor")
	}
	if !p.Ops[2].Reads(ts["part"]) || p.Ops[2].Reads(ts["logits"]) || !p.Ops[2].Writes(ts["logits"]) || p.Ops[2].Writes(ts["part"]) {
		t.Error("all_gather reads X and writes Out only")
	}
	if !p.ReadBefore(ts["delta"], 0) {
		t.Error("post_norm reads the reduced delta")
	}
	want := "layer 0 o_proj_sum: all_reduce delta <- delta\n" +
		"layer 0 post_norm: add_rmsnorm resid <- delta w=table\n" +
		"logits_gather: all_gather logits <- part\n"
	if got := p.Format(nameOf); got != want {
		t.Errorf("Format:\n%s\nwant:\n%s", got, want)
	}
	r := &recorder{}
	if err := backend.RunOps(r, p); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(comm.ran, ", "); got != "all_reduce delta, all_gather logits <- part" {
		t.Errorf("communicator ran %s", got)
	}
	bad := backend.Op{Kind: backend.OpAllReduce, Layer: 1, Name: "down_sum", X: ts["delta"]}
	if err := backend.RunOp(r, &bad); err == nil || !strings.Contains(err.Error(), "layer 1 down_sum") {
		t.Errorf("all_reduce without a communicator: %v", err)
	}
	shard := backend.Op{Kind: backend.OpEmbedShard, Layer: -1, Name: "embed", Out: ts["resid"], X: ts["table"], IDs: ts["ids"]}
	if err := backend.RunOp(r, &shard); err == nil || !strings.Contains(err.Error(), "vocabulary shard") {
		t.Errorf("embed_shard on a backend without EmbedShard: %v", err)
	}
}
