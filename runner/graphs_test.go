package runner

import (
	"errors"
	"slices"
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/cpu"
)

func TestDefaultBuckets(t *testing.T) {
	for _, tc := range []struct {
		maxSeqs int
		want    []int
	}{
		{1, []int{1}},
		{5, []int{1, 2, 4, 5}},
		{64, []int{1, 2, 4, 8, 16, 24, 32, 48, 64}},
		{200, []int{1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 200}},
	} {
		if got := DefaultBuckets(tc.maxSeqs); !slices.Equal(got, tc.want) {
			t.Errorf("DefaultBuckets(%d) = %v, want %v", tc.maxSeqs, got, tc.want)
		}
	}
}

type fakeGraph struct {
	fn     func() error
	closed *int
}

func (g fakeGraph) Launch() error { return g.fn() }
func (g fakeGraph) Close()        { *g.closed++ }

type capturing struct {
	backend.Backend
	closed int
}

func (c *capturing) CaptureGraph(fn func() error) (backend.Graph, error) {
	return fakeGraph{fn, &c.closed}, nil
}

// TestGraphCacheLRUAndPadding: decode steps pad to their bucket (padding
// rows write no KV and their logits are dropped), each bucket is eager
// once, then captured; beyond MaxGraphs the least recently used graph goes.
func TestGraphCacheLRUAndPadding(t *testing.T) {
	cb := &capturing{Backend: cpu.New(cpu.Options{Threads: 1})}
	m := &nopModel{b: cb}
	r, err := New(cb, m, Options{NumBlocks: 16, BlockSize: 4, MaxTokens: 16, MaxSeqs: 8, MaxSeqLen: 20,
		NumLayers: 1, NumKVHeads: 1, HeadDim: 8, Graphs: GraphOptions{Enabled: true, Buckets: []int{1, 2, 4, 8}, MaxGraphs: 2}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	decode := func(n int, graph bool) *Output {
		t.Helper()
		st := &Step{}
		for i := range n {
			st.Seqs = append(st.Seqs, Seq{Tokens: []int32{int32(i + 1)}, Start: 2, BlockTable: []int32{int32(i + 1)}, WantLogits: true})
		}
		out, err := r.Execute(st)
		if err != nil {
			t.Fatal(err)
		}
		if out.Graph != graph {
			t.Fatalf("decode of %d: Output.Graph %v, want %v", n, out.Graph, graph)
		}
		return out
	}
	out := decode(3, false) // bucket 4, eager
	if out.Rows != 3 || m.last.NumSeqs != 4 || m.last.MaxSeqLen != 20 {
		t.Fatalf("3 seqs: %d rows, forward saw %d seqs, MaxSeqLen %d; want 3, 4 (padded), 20", out.Rows, m.last.NumSeqs, m.last.MaxSeqLen)
	}
	if lg, err := out.Logits(2); err != nil || len(lg) != 5 {
		t.Fatalf("logits row 2: %v %v", lg, err)
	}
	decode(4, true)  // bucket 4 again: captured and replayed
	decode(2, false) // bucket 2: eager
	decode(2, true)  // captured
	decode(1, false) // bucket 1: eager
	decode(1, true)  // captured: the cache holds 2, so bucket 4 (least recent) goes
	decode(1, true)  // replayed from the cache
	st := r.GraphStats()
	if st.Captures != 3 || st.Evictions != 1 || st.Cached != 2 || st.EagerDecodes != 3 || cb.closed != 1 {
		t.Errorf("stats %+v, closed %d; want 3 captures, 1 eviction, 2 cached, 3 eager, 1 closed", st, cb.closed)
	}
	// A prefill step never takes the graph path.
	if out, err := r.Execute(&Step{Seqs: []Seq{{Tokens: []int32{1, 2}, BlockTable: []int32{1}, WantLogits: true}}}); err != nil {
		t.Fatal(err)
	} else if out.Graph {
		t.Error("prefill step: Output.Graph set")
	}
	if m.last.NumSeqs != 1 || m.last.MaxSeqLen != 2 {
		t.Errorf("prefill step: %d seqs, MaxSeqLen %d", m.last.NumSeqs, m.last.MaxSeqLen)
	}
}

func TestGraphsNeedCapturer(t *testing.T) {
	b := cpu.New(cpu.Options{Threads: 1})
	_, err := New(b, &nopModel{b: b}, Options{NumBlocks: 4, BlockSize: 4, MaxTokens: 4, MaxSeqs: 2, MaxSeqLen: 8,
		NumLayers: 1, NumKVHeads: 1, HeadDim: 8, Graphs: GraphOptions{Enabled: true}})
	if err == nil {
		t.Fatal("graphs on a backend that cannot capture: no error")
	}
}

// sizedGraph reports the device bytes it holds.
type sizedGraph struct {
	fakeGraph
	n int64
}

func (g sizedGraph) Bytes() int64 { return g.n }

type sizedCapturing struct{ capturing }

func (c *sizedCapturing) CaptureGraph(fn func() error) (backend.Graph, error) {
	return sizedGraph{fakeGraph{fn, &c.closed}, 100}, nil
}

// TestGraphMemoryBudgetAndVersions: graphs beyond the byte budget evict the
// least recently used; new weights or adapter versions drop stale graphs.
func TestGraphMemoryBudgetAndVersions(t *testing.T) {
	cb := &sizedCapturing{capturing{Backend: cpu.New(cpu.Options{Threads: 1})}}
	m := &nopModel{b: cb}
	r, err := New(cb, m, Options{NumBlocks: 16, BlockSize: 4, MaxTokens: 16, MaxSeqs: 8, MaxSeqLen: 20,
		NumLayers: 1, NumKVHeads: 1, HeadDim: 8, Graphs: GraphOptions{Enabled: true, Buckets: []int{1, 2, 4}, MemoryBudget: 250}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	decode := func(n int) {
		t.Helper()
		st := &Step{}
		for i := range n {
			st.Seqs = append(st.Seqs, Seq{Tokens: []int32{1}, Start: 0, BlockTable: []int32{int32(i + 1)}, WantLogits: true})
		}
		if _, err := r.Execute(st); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []int{1, 1, 2, 2, 4, 4} { // eager then capture, per bucket
		decode(n)
	}
	if st := r.GraphStats(); st.Cached != 2 || st.Bytes != 200 || st.Evictions != 1 {
		t.Errorf("after 3 captures of 100 bytes under a 250-byte budget: %+v; want 2 cached, 200 bytes, 1 eviction", st)
	}
	r.SetGraphVersions(1, 0)
	if st := r.GraphStats(); st.Cached != 0 || st.Bytes != 0 {
		t.Errorf("after a weights version change: %+v; want nothing cached", st)
	}
	decode(4) // warm already: captured again under the new version
	if st := r.GraphStats(); st.Cached != 1 || st.Captures != 4 {
		t.Errorf("after recapture: %+v", st)
	}
}

// TestTableWidthFollowsContexts: a step's block tables are as wide as its
// longest context needs (a power of two of blocks, at least 16), not the
// model's context, and decode graphs are keyed by that width: a context
// that outgrows it gets a new graph (eager once, then captured), with
// MaxSeqLen what the new width holds.
func TestTableWidthFollowsContexts(t *testing.T) {
	cb := &capturing{Backend: cpu.New(cpu.Options{Threads: 1})}
	m := &nopModel{b: cb}
	const bs = 4
	r, err := New(cb, m, Options{NumBlocks: 64, BlockSize: bs, MaxTokens: 16, MaxSeqs: 4, MaxSeqLen: 1024,
		NumLayers: 1, NumKVHeads: 1, HeadDim: 8, Graphs: GraphOptions{Enabled: true, Buckets: []int{2, 4}}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	decode := func(start int) {
		t.Helper()
		table := make([]int32, start/bs+1)
		for i := range table {
			table[i] = int32(i%60 + 1)
		}
		st := &Step{Seqs: []Seq{
			{Tokens: []int32{1}, Start: start, BlockTable: table, WantLogits: true},
			{Tokens: []int32{2}, Start: 3, BlockTable: []int32{61}, WantLogits: true},
		}}
		if _, err := r.Execute(st); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		start, width, maxSeqLen int
		captures, eager         uint64
	}{
		{10, 16, 64, 0, 1},  // eager: kernels load
		{11, 16, 64, 1, 1},  // captured
		{63, 16, 64, 1, 1},  // replayed: still within 16 blocks
		{64, 32, 128, 1, 2}, // the 17th block: a wider table, eager once
		{65, 32, 128, 2, 2}, // captured at the new width
	} {
		decode(c.start)
		if got := m.last.BlockTables.Shape(); got[0] != 2 || got[1] != c.width {
			t.Errorf("context %d: block tables %v, want [2 %d]", c.start+1, got, c.width)
		}
		if m.last.MaxSeqLen != c.maxSeqLen {
			t.Errorf("context %d: MaxSeqLen %d, want %d", c.start+1, m.last.MaxSeqLen, c.maxSeqLen)
		}
		if st := r.GraphStats(); st.Captures != c.captures || st.EagerDecodes != c.eager {
			t.Errorf("context %d: %+v, want %d captures and %d eager decodes", c.start+1, st, c.captures, c.eager)
		}
	}
}

// failingCapture refuses every capture, as a device short of memory for a
// graph's temporaries does.
type failingCapture struct {
	backend.Backend
	tries int
}

func (f *failingCapture) CaptureGraph(func() error) (backend.Graph, error) {
	f.tries++
	return nil, errors.New("capture refused")
}

// TestCaptureFailureRunsEagerly: a decode step whose graph cannot be
// captured runs eagerly instead of failing, and later steps of that shape
// do not try again.
func TestCaptureFailureRunsEagerly(t *testing.T) {
	fb := &failingCapture{Backend: cpu.New(cpu.Options{Threads: 1})}
	m := &nopModel{b: fb}
	r, err := New(fb, m, Options{NumBlocks: 16, BlockSize: 4, MaxTokens: 16, MaxSeqs: 4, MaxSeqLen: 20,
		NumLayers: 1, NumKVHeads: 1, HeadDim: 8, Graphs: GraphOptions{Enabled: true, Buckets: []int{2, 4}}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for i := range 4 {
		st := &Step{Seqs: []Seq{{Tokens: []int32{1}, Start: i, BlockTable: []int32{1, 2}, WantLogits: true}}}
		out, err := r.Execute(st)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if out.Rows != 1 || out.Graph {
			t.Fatalf("step %d: %d rows, graph %v; want 1 eager row", i, out.Rows, out.Graph)
		}
	}
	if st := r.GraphStats(); fb.tries != 1 || st.CaptureFailures != 1 || st.EagerDecodes != 4 || st.Captures != 0 {
		t.Errorf("%d capture tries, %+v; want 1 try, 1 failure, 4 eager decodes", fb.tries, st)
	}
}

// TestVerifyGraphs: with VerifyTokens, steps whose sequences all feed
// the same 1+k tokens and want every row's logits pad to their bucket with
// padding sequences of 1+k rows and replay a graph per (bucket, 1+k);
// other multi-token steps, k past the bound and buckets whose padded step
// would not fit MaxTokens run eagerly.
func TestVerifyGraphs(t *testing.T) {
	cb := &capturing{Backend: cpu.New(cpu.Options{Threads: 1})}
	m := &nopModel{b: cb}
	r, err := New(cb, m, Options{NumBlocks: 32, BlockSize: 4, MaxTokens: 12, MaxSeqs: 4, MaxSeqLen: 20,
		NumLayers: 1, NumKVHeads: 1, HeadDim: 8, Graphs: GraphOptions{Enabled: true, Buckets: []int{1, 2, 4}, VerifyTokens: 3}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	verify := func(lens []int, all bool, graph bool) {
		t.Helper()
		st := &Step{}
		for i, n := range lens {
			st.Seqs = append(st.Seqs, Seq{Tokens: make([]int32, n), Start: 2, BlockTable: []int32{int32(2*i + 1), int32(2*i + 2)}, AllLogits: all, WantLogits: !all})
		}
		out, err := r.Execute(st)
		if err != nil {
			t.Fatal(err)
		}
		if out.Graph != graph {
			t.Fatalf("step %v: Output.Graph %v, want %v", lens, out.Graph, graph)
		}
		rows := 0
		for _, n := range lens {
			rows += n
		}
		if !all {
			rows = len(lens)
		}
		if out.Rows != rows || len(out.Seq) != rows {
			t.Fatalf("step %v: %d rows (%d owners), want %d", lens, out.Rows, len(out.Seq), rows)
		}
	}
	verify([]int{3, 3, 3}, true, false) // bucket 4 of 3 rows: 12 tokens, eager first
	// A verify graph gathers its logits rows (LogitsAll false): it serves
	// uneven steps too, whose rows are not in token order.
	if m.last.NumSeqs != 4 || m.last.NumTokens != 12 || m.last.NumLogits != 12 || m.last.MaxQueryLen != 3 || m.last.MaxSeqLen != 20 || m.last.LogitsAll {
		t.Fatalf("padded verify step: %d seqs, %d tokens, %d logits, max query %d, MaxSeqLen %d, all %v; want 4, 12, 12, 3, 20, false",
			m.last.NumSeqs, m.last.NumTokens, m.last.NumLogits, m.last.MaxQueryLen, m.last.MaxSeqLen, m.last.LogitsAll)
	}
	verify([]int{3, 3, 3}, true, true) // captured and replayed
	verify([]int{3, 3}, true, false)   // bucket 2, another shape: eager first
	verify([]int{3, 3}, true, true)
	verify([]int{2, 2}, true, false) // k 1: a shape of its own
	verify([]int{2, 2}, true, true)
	verify([]int{4, 4, 4}, true, false) // bucket 4 x 4 rows > MaxTokens: eager always
	verify([]int{4, 4, 4}, true, false)
	verify([]int{5}, true, false) // k 4 > VerifyTokens
	verify([]int{5}, true, false)
	verify([]int{3, 2}, true, true) // uneven: padded to 3 rows a sequence, bucket 2's graph
	if m.last.NumSeqs != 2 || m.last.NumTokens != 6 || m.last.NumLogits != 6 {
		t.Errorf("padded uneven step: %d seqs, %d tokens, %d logits rows; want 2, 6, 6", m.last.NumSeqs, m.last.NumTokens, m.last.NumLogits)
	}
	verify([]int{2, 3, 1}, true, true) // bucket 4 of 3 rows: the first shape's graph
	verify([]int{3, 3}, false, false)  // prefill chunks wanting one row each: eager
	verify([]int{3, 3}, false, false)
	st := r.GraphStats()
	if st.Captures != 3 || st.Replays != 5 || st.PaddedVerifies != 2 {
		t.Errorf("stats %+v: want 3 captures, 5 replays, 2 padded verify steps", st)
	}
	// Verify steps do not feed Precapture's decode histogram.
	if n := r.graphs.steps; n != 0 {
		t.Errorf("%d decode steps counted, want 0", n)
	}
}
