package runner

import (
	"bytes"
	"encoding/binary"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/collective"
	"github.com/trigon-llm/trigon/backend/cpu"
	"github.com/trigon-llm/trigon/model"
)

// sumModel is one rank of a group: it sums rank+1 over the ranks (an
// all-reduce) and returns logits whose argmax is that sum mod 5, so the
// token sampled depends on every rank having run. fail makes it fail
// before the collective.
type sumModel struct {
	b    backend.Backend
	comm backend.Communicator
	fail atomic.Bool
}

func (m *sumModel) Forward(in *model.DeviceBatch, _ []model.LayerKV) (backend.Tensor, error) {
	if m.fail.Load() {
		return nil, errBoom
	}
	v := make([]byte, 16)
	for i := range 4 {
		binary.LittleEndian.PutUint32(v[4*i:], math.Float32bits(float32(m.comm.Rank()+1)))
	}
	x, err := m.b.Upload(backend.F32, []int{1, 4}, v)
	if err != nil {
		return nil, err
	}
	if err := m.comm.AllReduce(x); err != nil {
		return nil, err
	}
	raw := make([]byte, 16)
	if err := m.b.Read(x, raw); err != nil {
		return nil, err
	}
	sum := int(math.Float32frombits(binary.LittleEndian.Uint32(raw)))
	logits := make([]byte, 4*5*in.NumLogits)
	for i := range in.NumLogits {
		binary.LittleEndian.PutUint32(logits[4*(5*i+sum%5):], math.Float32bits(1))
	}
	return m.b.Upload(backend.F32, []int{in.NumLogits, 5}, logits)
}

type boom struct{}

func (boom) Error() string { return "boom" }

var errBoom error = boom{}

func newGroupTest(t *testing.T, n int) (*Runner, []*sumModel) {
	t.Helper()
	bs := make([]backend.Backend, n)
	for i := range bs {
		bs[i] = cpu.New(cpu.Options{Threads: 1})
	}
	comms, err := collective.New(bs)
	if err != nil {
		t.Fatal(err)
	}
	var ms []*sumModel
	var rs []*Runner
	for i, b := range bs {
		m := &sumModel{b: b, comm: comms[i]}
		r, err := New(b, m, Options{NumBlocks: 6, BlockSize: 4, MaxTokens: 8, MaxSeqs: 2, MaxSeqLen: 16, NumLayers: 1, NumKVHeads: 1, HeadDim: 8})
		if err != nil {
			t.Fatal(err)
		}
		ms, rs = append(ms, m), append(rs, r)
	}
	g, err := NewGroup(rs, comms[0].Group())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	return g, ms
}

// execute runs step on g, failing the test if it does not return.
func execute(t *testing.T, g *Runner, step *Step) (*Output, error) {
	t.Helper()
	type res struct {
		out *Output
		err error
	}
	done := make(chan res, 1)
	go func() {
		out, err := g.Execute(step)
		done <- res{out, err}
	}()
	select {
	case r := <-done:
		return r.out, r.err
	case <-time.After(30 * time.Second):
		t.Fatal("the group's Execute did not return: a rank is left waiting")
		return nil, nil
	}
}

// TestGroupExecute: every rank runs the step (the sampled token needs
// all of them); a rank that fails before the collective fails the step
// without leaving the others waiting, and the group runs again after.
func TestGroupExecute(t *testing.T) {
	g, ms := newGroupTest(t, 3)
	if g.Ranks() != 3 {
		t.Fatalf("Ranks = %d", g.Ranks())
	}
	step := &Step{Seqs: []Seq{{Tokens: []int32{1, 2}, BlockTable: []int32{1}, WantLogits: true}}}
	sample := func() int32 {
		out, err := execute(t, g, step)
		if err != nil {
			t.Fatal(err)
		}
		ids, err := out.Sample([]backend.SampleRow{{}})
		if err != nil {
			t.Fatal(err)
		}
		return ids[0]
	}
	if got := sample(); got != (1+2+3)%5 {
		t.Fatalf("sampled %d, want %d (the sum over 3 ranks)", got, (1+2+3)%5)
	}
	ms[1].fail.Store(true)
	if _, err := execute(t, g, step); err == nil || !strings.Contains(err.Error(), "rank 1") || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("a failing rank 1: %v", err)
	}
	ms[1].fail.Store(false)
	if got := sample(); got != (1+2+3)%5 {
		t.Fatalf("after the failure: sampled %d, want %d", got, (1+2+3)%5)
	}
}

// TestGroupCopyBlocks: a block copy moves the block in every rank's pools.
func TestGroupCopyBlocks(t *testing.T) {
	g, _ := newGroupTest(t, 2)
	ranks := append([]*Runner{g}, g.peers...)
	for i, r := range ranks {
		src, err := r.b.View(r.kv[0].K, 1, 1)
		if err != nil {
			t.Fatal(err)
		}
		data := bytes.Repeat([]byte{byte(i + 1), 0, 0x80, 0x3f}, 4*8)
		if err := r.b.Write(src, data); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.CopyBlocks([]BlockCopy{{Src: 1, Dst: 3}}); err != nil {
		t.Fatal(err)
	}
	for i, r := range ranks {
		dst, _ := r.b.View(r.kv[0].K, 3, 1)
		raw := make([]byte, 4*4*8)
		if err := r.b.Read(dst, raw); err != nil {
			t.Fatal(err)
		}
		if raw[0] != byte(i+1) {
			t.Errorf("rank %d: block 3 after the copy starts %v", i, raw[:4])
		}
	}
}
