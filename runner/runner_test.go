package runner

import (
	"slices"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/cpu"
	"github.com/trigon-llm/trigon/model"
)

// nopModel records the batch it was given and returns [NumLogits, 5]
// logits.
type nopModel struct {
	b    backend.Backend
	last *model.DeviceBatch
}

func (m *nopModel) Forward(in *model.DeviceBatch, _ []model.LayerKV) (backend.Tensor, error) {
	m.last = in
	if in.NumLogits == 0 {
		return nil, nil
	}
	return m.b.Alloc(backend.F32, in.NumLogits, 5)
}

func newTest(t *testing.T) (*Runner, *nopModel) {
	t.Helper()
	b := cpu.New(cpu.Options{Threads: 1})
	m := &nopModel{b: b}
	r, err := New(b, m, Options{
		NumBlocks: 10, BlockSize: 4, MaxTokens: 16, MaxSeqs: 3, MaxSeqLen: 20,
		NumLayers: 2, NumKVHeads: 1, HeadDim: 8,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r, m
}

func TestPackRejectsBadSteps(t *testing.T) {
	r, _ := newTest(t)
	for _, tc := range []struct {
		name string
		seqs []Seq
		want string
	}{
		{"empty", nil, "empty step"},
		{"too many seqs", []Seq{{Tokens: []int32{1}, BlockTable: []int32{1}}, {Tokens: []int32{1}, BlockTable: []int32{2}}, {Tokens: []int32{1}, BlockTable: []int32{3}}, {Tokens: []int32{1}, BlockTable: []int32{4}}}, "4 sequences"},
		{"no tokens", []Seq{{BlockTable: []int32{1}}}, "0 tokens"},
		{"short table", []Seq{{Tokens: make([]int32, 5), BlockTable: []int32{1}}}, "needs 2"},
		{"null block", []Seq{{Tokens: []int32{1}, BlockTable: []int32{0}}}, "out of range"},
		{"block past pool", []Seq{{Tokens: []int32{1}, BlockTable: []int32{10}}}, "out of range"},
		{"past context", []Seq{{Tokens: []int32{1}, Start: 20, BlockTable: []int32{1, 2, 3, 4, 5, 6}}}, "past the context"},
		{"too many tokens", []Seq{{Tokens: make([]int32, 17), BlockTable: []int32{1, 2, 3, 4, 5}}}, "more than 16 tokens"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := r.Execute(&Step{Seqs: tc.seqs})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// TestPackLayout checks the slot mapping, positions, query offsets,
// sequence lengths and logits rows of a mixed prefill/decode step.
func TestPackLayout(t *testing.T) {
	r, m := newTest(t)
	step := &Step{Seqs: []Seq{
		{Tokens: []int32{7, 8, 9}, Start: 3, BlockTable: []int32{5, 2}, WantLogits: true}, // positions 3..5
		{Tokens: []int32{4}, Start: 0, BlockTable: []int32{9}},                            // no logits
		{Tokens: []int32{1, 2}, Start: 0, BlockTable: []int32{3}, AllLogits: true},
	}}
	out, err := r.Execute(step)
	if err != nil {
		t.Fatal(err)
	}
	read := func(t2 backend.Tensor) []int32 {
		n := 1
		for _, d := range t2.Shape() {
			n *= d
		}
		raw := make([]byte, 4*n)
		if err := r.b.Read(t2, raw); err != nil {
			t.Fatal(err)
		}
		v := make([]int32, n)
		for i := range v {
			v[i] = int32(uint32(raw[4*i]) | uint32(raw[4*i+1])<<8 | uint32(raw[4*i+2])<<16 | uint32(raw[4*i+3])<<24)
		}
		return v
	}
	in := m.last
	for name, c := range map[string]struct{ got, want []int32 }{
		"tokens":     {read(in.Tokens), []int32{7, 8, 9, 4, 1, 2}},
		"positions":  {read(in.Positions), []int32{3, 4, 5, 0, 0, 1}},
		"slots":      {read(in.SlotMapping), []int32{5*4 + 3, 2*4 + 0, 2*4 + 1, 9 * 4, 3 * 4, 3*4 + 1}},
		"queryStart": {read(in.QueryStart), []int32{0, 3, 4, 6}},
		"seqLens":    {read(in.SeqLens), []int32{6, 1, 2}},
		"logitsRows": {read(in.LogitsRows), []int32{2, 4, 5}},
	} {
		if len(c.got) != len(c.want) {
			t.Errorf("%s: %v, want %v", name, c.got, c.want)
			continue
		}
		for i := range c.got {
			if c.got[i] != c.want[i] {
				t.Errorf("%s: %v, want %v", name, c.got, c.want)
				break
			}
		}
	}
	if got := out.Seq; len(got) != 3 || got[0] != 0 || got[1] != 2 || got[2] != 2 {
		t.Errorf("logits rows map to seqs %v, want [0 2 2]", got)
	}
	if tb := read(in.BlockTables); tb[0] != 5 || tb[1] != 2 || tb[5] != 9 || tb[10] != 3 || tb[2] != 0 {
		t.Errorf("block tables %v", tb)
	}
	if in.LogitsAll {
		t.Error("LogitsAll set for a step whose logits rows are 2, 4, 5")
	}
	// A decode step wants every row in order: the model may skip the gather.
	if _, err := r.Execute(&Step{Seqs: []Seq{
		{Tokens: []int32{3}, Start: 6, BlockTable: []int32{5, 2}, WantLogits: true},
		{Tokens: []int32{5}, Start: 1, BlockTable: []int32{9}, WantLogits: true},
	}}); err != nil {
		t.Fatal(err)
	}
	if in := m.last; !in.LogitsAll || !slices.Equal(read(in.LogitsRows), []int32{0, 1}) {
		t.Errorf("decode step: LogitsAll %v, logits rows %v; want true, [0 1]", in.LogitsAll, read(in.LogitsRows))
	}
}

// capturingFeeder is a capturing backend that also feeds sampled ids.
type capturingFeeder struct {
	capturing
	backend.DeviceSampler
}

// TestGraphReplaysReadEachStep decodes with graphs (the fake capturer
// replays a bucket's first forward, as a CUDA graph replays the captured
// addresses) and without: the ids must agree, fed and not, while the
// batch moves between buckets, so every step of a bucket must put its
// inputs where the captured views read them.
func TestGraphReplaysReadEachStep(t *testing.T) {
	run := func(graphs, feed bool) [][]int32 {
		cpuB := cpu.New(cpu.Options{Threads: 1})
		cb := &capturingFeeder{capturing: capturing{Backend: cpuB}, DeviceSampler: cpuB}
		r, err := New(cb, &argmaxModel{b: cb, withPos: true}, Options{
			NumBlocks: 20, BlockSize: 4, MaxTokens: 16, MaxSeqs: 4, MaxSeqLen: 24, NumLayers: 1, NumKVHeads: 1, HeadDim: 8,
			Graphs: GraphOptions{Enabled: graphs, Buckets: []int{1, 2, 4}},
		})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		cur := []int32{0, 1, 2, 3}
		var got [][]int32
		var out *Output
		for k := range 12 {
			n := []int{3, 3, 3, 2, 2, 2, 3, 3, 4, 1, 1, 3}[k]
			fed := feed && out != nil && out.Rows == n
			var wait func() ([]int32, error)
			if fed {
				if wait, err = out.SampleNext(make([]backend.SampleRow, n)); err != nil {
					t.Fatal(err)
				}
			} else if out != nil {
				ids, err := out.Sample(make([]backend.SampleRow, out.Rows))
				if err != nil {
					t.Fatal(err)
				}
				copy(cur, ids)
			}
			st := &Step{FedTokens: fed}
			for i := range n {
				st.Seqs = append(st.Seqs, Seq{Tokens: []int32{cur[i]}, Start: k, BlockTable: []int32{int32(1 + 4*i), int32(2 + 4*i), int32(3 + 4*i), int32(4 + 4*i)}, WantLogits: true})
			}
			if out, err = r.Execute(st); err != nil {
				t.Fatal(err)
			}
			if fed {
				ids, err := wait()
				if err != nil {
					t.Fatal(err)
				}
				copy(cur, ids)
			}
			got = append(got, slices.Clone(cur[:n]))
		}
		if graphs && r.GraphStats().Replays == 0 {
			t.Fatal("no graph was replayed")
		}
		return got
	}
	want := run(false, false)
	for _, c := range []struct{ graphs, feed bool }{{true, false}, {true, true}, {false, true}} {
		if got := run(c.graphs, c.feed); !slices.EqualFunc(got, want, slices.Equal) {
			t.Errorf("graphs %v, fed %v: ids %v, want %v", c.graphs, c.feed, got, want)
		}
	}
}

// TestStepAllocationsIndependentOfTokens: the per-step host path allocates
// a fixed number of small objects (the step's tensor views and its
// Output), none per token: a step of 3 tokens and one of 16 allocate the
// same.
func TestStepAllocationsIndependentOfTokens(t *testing.T) {
	r, _ := newTest(t)
	allocs := func(perSeq []int) float64 {
		step := &Step{}
		for i, n := range perSeq {
			step.Seqs = append(step.Seqs, Seq{Tokens: make([]int32, n), Start: 0, BlockTable: []int32{int32(1 + 3*i), int32(2 + 3*i), int32(3 + 3*i)}, WantLogits: true})
		}
		return testing.AllocsPerRun(20, func() {
			if _, err := r.Execute(step); err != nil {
				t.Fatal(err)
			}
		})
	}
	small, large := allocs([]int{1, 1, 1}), allocs([]int{6, 5, 5})
	if small != large {
		t.Errorf("a step of 3 tokens allocates %.0f objects, one of 16 tokens %.0f: something allocates per token", small, large)
	}
	t.Logf("allocations per step: %.0f", small)
}

// argmaxModel returns logits whose argmax for token row i is
// (token id + 1) % 5: a deterministic "next token" the fed path must
// reproduce.
// With withPos the row's position is added to the token id, so a step
// that read another step's positions would pick differently.
type argmaxModel struct {
	b       backend.Backend
	withPos bool
}

func (m *argmaxModel) Forward(in *model.DeviceBatch, _ []model.LayerKV) (backend.Tensor, error) {
	raw := make([]byte, 4*in.NumTokens)
	if err := m.b.Read(in.Tokens, raw); err != nil {
		return nil, err
	}
	if m.withPos {
		pos := make([]byte, 4*in.NumTokens)
		if err := m.b.Read(in.Positions, pos); err != nil {
			return nil, err
		}
		for i := 0; i < len(raw); i += 4 {
			raw[i] = (raw[i] + pos[i]) % 5
		}
	}
	rows := make([]byte, 4*in.NumLogits)
	if err := m.b.Read(in.LogitsRows, rows); err != nil {
		return nil, err
	}
	logits := make([]float32, 5*in.NumLogits)
	for i := range in.NumLogits {
		row := int(int32(rows[4*i]) | int32(rows[4*i+1])<<8 | int32(rows[4*i+2])<<16 | int32(rows[4*i+3])<<24)
		tok := int(raw[4*row]) // ids < 5
		logits[5*i+(tok+1)%5] = 1
	}
	buf := make([]byte, 4*len(logits))
	for i, v := range logits {
		if v != 0 {
			buf[4*i+3], buf[4*i+2] = 0x3f, 0x80 // 1.0
		}
	}
	return m.b.Upload(backend.F32, []int{in.NumLogits, 5}, buf)
}

// TestFedTokens decodes three sequences for several steps twice: sampling
// on the host's side (Sample, then the ids as the next step's tokens) and
// feeding on the device (SampleNext, then FedTokens): the ids must agree.
// It also checks that a fed step needs a SampleNext of its size just
// before it.
func TestFedTokens(t *testing.T) {
	b := cpu.New(cpu.Options{Threads: 1})
	r, err := New(b, &argmaxModel{b: b}, Options{
		NumBlocks: 10, BlockSize: 4, MaxTokens: 16, MaxSeqs: 3, MaxSeqLen: 20,
		NumLayers: 1, NumKVHeads: 1, HeadDim: 8,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if !r.CanFeed() {
		t.Fatal("the CPU backend cannot feed")
	}
	greedy := make([]backend.SampleRow, 3)
	step := func(cur []int32, k int, fed bool) *Step {
		s := &Step{FedTokens: fed}
		for i := range 3 {
			s.Seqs = append(s.Seqs, Seq{Tokens: []int32{cur[i]}, Start: k, BlockTable: []int32{int32(1 + 3*i), int32(2 + 3*i), int32(3 + 3*i)}, WantLogits: true})
		}
		return s
	}
	run := func(feed bool) [][]int32 {
		cur := []int32{0, 2, 4}
		var got [][]int32
		out, err := r.Execute(step(cur, 0, false))
		if err != nil {
			t.Fatal(err)
		}
		for k := 1; k <= 6; k++ {
			if feed {
				wait, err := out.SampleNext(greedy)
				if err != nil {
					t.Fatal(err)
				}
				if out, err = r.Execute(step([]int32{9, 9, 9}, k, true)); err != nil { // placeholders: not read
					t.Fatal(err)
				}
				if cur, err = wait(); err != nil {
					t.Fatal(err)
				}
			} else {
				if cur, err = out.Sample(greedy); err != nil {
					t.Fatal(err)
				}
				if out, err = r.Execute(step(cur, k, false)); err != nil {
					t.Fatal(err)
				}
			}
			got = append(got, cur)
		}
		return got
	}
	host, dev := run(false), run(true)
	for k := range host {
		for i := range host[k] {
			if host[k][i] != dev[k][i] || host[k][i] != int32((int(host[0][i])+k)%5) {
				t.Fatalf("step %d: host-sampled %v, fed %v", k+1, host[k], dev[k])
			}
		}
	}
	// A fed step without a SampleNext before it, or of another size.
	if _, err := r.Execute(step([]int32{0, 0, 0}, 7, true)); err == nil || !strings.Contains(err.Error(), "fed 0 sampled tokens") {
		t.Fatalf("fed step with nothing fed: %v", err)
	}
	out, err := r.Execute(step([]int32{0, 1, 2}, 7, false))
	if err != nil {
		t.Fatal(err)
	}
	wait, err := out.SampleNext(greedy)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wait(); err != nil {
		t.Fatal(err)
	}
	two := step([]int32{0, 0, 0}, 8, true)
	two.Seqs = two.Seqs[:2]
	if _, err := r.Execute(two); err == nil || !strings.Contains(err.Error(), "2 sequences fed 3") {
		t.Fatalf("fed step of more sequences' ids than it has: %v", err)
	}
	// A partial feed: a one-sequence step's pick is the first of three
	// sequences' tokens, the other two come from the host.
	one := step([]int32{3, 0, 0}, 9, false)
	one.Seqs = one.Seqs[:1]
	if out, err = r.Execute(one); err != nil {
		t.Fatal(err)
	}
	if wait, err = out.SampleNext(greedy[:1]); err != nil {
		t.Fatal(err)
	}
	if out, err = r.Execute(step([]int32{9, 1, 2}, 10, true)); err != nil { // 9: a placeholder, not read
		t.Fatal(err)
	}
	first, err := wait()
	if err != nil || len(first) != 1 || first[0] != 4 {
		t.Fatalf("the one-sequence step picked %v (%v), want [4]", first, err)
	}
	got, err := out.Sample(greedy)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int32{0, 2, 3}; !slices.Equal(got, want) {
		t.Fatalf("partially fed step picked %v, want %v (the fed token 4, then the host's 1 and 2, each plus one mod 5)", got, want)
	}
}
