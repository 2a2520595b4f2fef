package bench

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/collective"
	"github.com/trigon-llm/trigon/backend/cpu"
	"github.com/trigon-llm/trigon/model"
)

// TestSyntheticFillShard: a piece at (0, 0) of the whole shape is Fill's
// tensor; the same piece is the same wherever it is filled, another piece
// differs; a piece past the tensor is an error.
func TestSyntheticFillShard(t *testing.T) {
	cfg := tinyConfig(false, false)
	w := mustSynthetic(t, cfg, backend.BF16, 5)
	f, sf := w.(model.Filler), w.(model.ShardFiller)
	b := cpu.New(cpu.Options{Threads: 1})
	name := model.LayerName(0, model.SuffixK) // [32, 64]
	_, shape, _ := f.Spec(name)
	read := func(dst backend.Tensor) []byte {
		size, _ := dst.DType().Bytes(dst.Shape())
		raw := make([]byte, size)
		if err := b.Read(dst, raw); err != nil {
			t.Fatal(err)
		}
		return raw
	}
	fill := func(rows, cols, row0, col0 int) ([]byte, error) {
		dst, err := b.Alloc(backend.BF16, rows, cols)
		if err != nil {
			t.Fatal(err)
		}
		ok, err := sf.FillShard(b, name, dst, row0, col0)
		if err == nil && !ok {
			t.Fatal("FillShard said it cannot on the CPU backend")
		}
		return read(dst), err
	}
	whole, _ := b.Alloc(backend.BF16, shape...)
	if ok, err := f.Fill(b, name, whole); !ok || err != nil {
		t.Fatalf("Fill: %v, %v", ok, err)
	}
	got, err := fill(shape[0], shape[1], 0, 0)
	if err != nil || !bytes.Equal(got, read(whole)) {
		t.Errorf("the whole piece at (0, 0) differs from Fill's tensor (%v)", err)
	}
	a, _ := fill(16, shape[1], 16, 0)
	a2, _ := fill(16, shape[1], 16, 0)
	c, _ := fill(16, shape[1], 0, 0)
	if !bytes.Equal(a, a2) || bytes.Equal(a, c) {
		t.Error("pieces: the same corner must give the same values, another corner others")
	}
	if _, err := fill(16, shape[1], 24, 0); err == nil || !strings.Contains(err.Error(), "piece") {
		t.Errorf("a piece past the rows: %v", err)
	}
}

// TestLatencyTensorParallel: bench latency over 4 CPU ranks (tiny
// config's 2 KV heads replicated) runs, reports its size, and makes the
// ranks' pieces of the projections in place: no projection's host bytes
// are generated.
func TestLatencyTensorParallel(t *testing.T) {
	cfg := tinyConfig(false, false)
	w := mustSynthetic(t, cfg, backend.BF16, 1)
	bs := make([]backend.Backend, 4)
	for i := range bs {
		bs[i] = cpu.New(cpu.Options{Threads: 1})
	}
	cs, err := collective.New(bs)
	if err != nil {
		t.Fatal(err)
	}
	var comms []backend.Communicator
	for _, c := range cs {
		comms = append(comms, c)
	}
	res, err := RunLatency(context.Background(), LatencyOptions{
		Backend: bs[0], Config: cfg, Weights: w, Batch: 2, InputLen: 8, OutputLen: 4, Iters: 1, PeakBandwidth: 1e9,
		Ranks: bs, Comms: comms, Abort: cs[0].Group(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.TensorParallel != 4 || len(res.Tokens) != 2 || len(res.Tokens[0]) != 4 {
		t.Fatalf("tensor_parallel_size %d, tokens %v", res.TensorParallel, res.Tokens)
	}
	sw := w.(*synthWeights)
	for _, name := range []string{model.LayerName(0, model.SuffixQ), model.LayerName(1, model.SuffixDown), model.NameEmbed} {
		if sw.tensors[name].data != nil {
			t.Errorf("%s was generated on the host", name)
		}
	}
}
