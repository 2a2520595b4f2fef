package runner

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/cpu"
	"github.com/trigon-llm/trigon/model"
)

// rowsModel records the host image of each forward's per-sequence inputs.
type rowsModel struct {
	b    backend.Backend
	seen []stepRows
}

type stepRows struct {
	seqs, maxQuery, stepKeys    int
	queryStart, seqLens, tables []int32
	positions, slots            []int32
	logitsRows                  []int32
	logitsAll                   bool
}

func (m *rowsModel) read(t backend.Tensor) []int32 {
	n := 1
	for _, d := range t.Shape() {
		n *= d
	}
	raw := make([]byte, 4*n)
	if err := m.b.Read(t, raw); err != nil {
		panic(err)
	}
	v := make([]int32, n)
	for i := range v {
		v[i] = int32(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	return v
}

func (m *rowsModel) Forward(in *model.DeviceBatch, _ []model.LayerKV) (backend.Tensor, error) {
	m.seen = append(m.seen, stepRows{seqs: in.NumSeqs, maxQuery: in.MaxQueryLen, stepKeys: in.StepKeys,
		queryStart: m.read(in.QueryStart), seqLens: m.read(in.SeqLens), tables: m.read(in.BlockTables),
		positions: m.read(in.Positions), slots: m.read(in.SlotMapping), logitsRows: m.read(in.LogitsRows), logitsAll: in.LogitsAll})
	return m.b.Alloc(backend.F32, in.NumLogits, 5)
}

// TestVerifyFlat: a verify step whose rows fit the decode buckets runs
// natively until its graph is captured, then as decode rows until theirs
// is, then times both graphs once and keeps a form. The flat form gives
// each row its own one-token sequence: its position's causal length, its
// sequence's block table, the same tokens, slots and logits rows.
func TestVerifyFlat(t *testing.T) {
	cb := &capturing{Backend: cpu.New(cpu.Options{Threads: 1})}
	m := &rowsModel{b: cb}
	r, err := New(cb, m, Options{NumBlocks: 32, BlockSize: 4, MaxTokens: 16, MaxSeqs: 8, MaxSeqLen: 20,
		NumLayers: 1, NumKVHeads: 1, HeadDim: 8, Graphs: GraphOptions{Enabled: true, Buckets: []int{1, 2, 4, 8}, VerifyTokens: 3}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// Two sequences of 3 rows at starts 5 and 2: bucket 2 natively, 6
	// decode rows (bucket 8) flat.
	step := &Step{Seqs: []Seq{
		{Tokens: []int32{7, 8, 9}, Start: 5, BlockTable: []int32{3, 4}, AllLogits: true},
		{Tokens: []int32{4, 5, 6}, Start: 2, BlockTable: []int32{9, 10}, AllLogits: true},
	}}
	for i := range 5 {
		m.seen = m.seen[:0]
		out, err := r.Execute(step)
		if err != nil {
			t.Fatal(err)
		}
		if out.Rows != 6 || fmt.Sprint(out.Seq) != "[0 0 0 1 1 1]" {
			t.Fatalf("step %d: %d rows of %v, want 6 of [0 0 0 1 1 1]", i, out.Rows, out.Seq)
		}
		if len(m.seen) == 0 {
			continue // a replay of a fake graph runs the forward: none means none ran
		}
		last := m.seen[len(m.seen)-1]
		switch i {
		case 0, 1: // native: eager, then captured
			if last.seqs != 2 || last.maxQuery != 3 || last.stepKeys != 0 {
				t.Errorf("step %d: %d seqs, max query %d, step keys %d; want the native 2, 3 and 0", i, last.seqs, last.maxQuery, last.stepKeys)
			}
		case 2, 3: // flat: eager, then captured
			if last.seqs != 8 || last.maxQuery != 1 {
				t.Fatalf("step %d: %d seqs, max query %d; want 8 decode rows (6 and 2 padding) of 1", i, last.seqs, last.maxQuery)
			}
			if last.stepKeys != 3 {
				t.Errorf("step %d: step keys %d, want 3: a flat row's context ends with up to 3 rows of its own step", i, last.stepKeys)
			}
			w := len(last.tables) / last.seqs
			if want := "[6 7 8 3 4 5]"; fmt.Sprint(last.seqLens[:6]) != want {
				t.Errorf("flat seq lens %v, want %s", last.seqLens[:6], want)
			}
			if want := "[0 1 2 3 4 5 6]"; fmt.Sprint(last.queryStart[:7]) != want {
				t.Errorf("flat query starts %v, want %s", last.queryStart[:7], want)
			}
			for row, blk := range []int32{3, 3, 3, 9, 9, 9} {
				if got := last.tables[row*w]; got != blk || (blk == 3 && last.tables[row*w+1] != 4) {
					t.Errorf("flat row %d's table starts %v, want its sequence's (%d...)", row, last.tables[row*w:row*w+2], blk)
				}
			}
			if want := "[5 6 7 2 3 4]"; fmt.Sprint(last.positions[:6]) != want {
				t.Errorf("flat positions %v, want %s", last.positions[:6], want)
			}
			if want := "[17 18 19 38 39 40]"; fmt.Sprint(last.slots[:6]) != want {
				t.Errorf("flat slots %v, want %s", last.slots[:6], want)
			}
		}
	}
	st := r.GraphStats()
	if st.VerifyTimings != 1 {
		t.Errorf("stats %+v: want one timing of the shape's two forms", st)
	}
	ch := r.graphs.verifyChoice[verifyKey{2, 3, r.width}]
	if !ch.decided || ch.trials != 5 {
		t.Errorf("choice %+v after 5 steps: want decided after 5 trials", ch)
	}
	// Decided: later steps take the chosen form without trials.
	if _, err := r.Execute(step); err != nil {
		t.Fatal(err)
	}
	if ch2 := r.graphs.verifyChoice[verifyKey{2, 3, r.width}]; ch2 != ch {
		t.Errorf("choice changed from %+v to %+v after deciding", ch, ch2)
	}
	// Rows beyond the sequence cap stay native: 3 x 3 = 9 > MaxSeqs 8.
	if fb := r.flatBucket(3, 3); fb != 0 {
		t.Errorf("flatBucket(3, 3) = %d with MaxSeqs 8, want 0", fb)
	}
}

// echoModel's logits row j is one-hot at the token of the row it
// computes (LogitsRows[j]), so greedy sampling returns each row's token.
type echoModel struct{ rowsModel }

const echoVocab = 64

func (m *echoModel) Forward(in *model.DeviceBatch, _ []model.LayerKV) (backend.Tensor, error) {
	if _, err := m.rowsModel.Forward(in, nil); err != nil { // records the step's rows
		return nil, err
	}
	toks, rows := m.read(in.Tokens), m.read(in.LogitsRows)
	host := make([]byte, 4*in.NumLogits*echoVocab)
	for j, row := range rows {
		binary.LittleEndian.PutUint32(host[4*(j*echoVocab+int(toks[row])%echoVocab):], 0x3f800000) // 1.0
	}
	t, err := m.b.Alloc(backend.F32, in.NumLogits, echoVocab)
	if err != nil {
		return nil, err
	}
	return t, m.b.Write(t, host)
}

// TestVerifyUnevenPadded: a verify step whose sequences feed different
// numbers of rows (drafts of different lengths, a sequence without one)
// replays the graph of the longest's shape, padded with rows that write no
// KV at the positions after each sequence's own; the graph gathers the
// step's logits rows first, so the Output's rows are the step's, in order,
// and no padding row's logits are among them.
func TestVerifyUnevenPadded(t *testing.T) {
	cb := &capturing{Backend: cpu.New(cpu.Options{Threads: 1})}
	m := &echoModel{rowsModel{b: cb}}
	r, err := New(cb, m, Options{NumBlocks: 32, BlockSize: 4, MaxTokens: 16, MaxSeqs: 2, MaxSeqLen: 20,
		NumLayers: 1, NumKVHeads: 1, HeadDim: 8, Graphs: GraphOptions{Enabled: true, Buckets: []int{1, 2}, VerifyTokens: 3}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	step := &Step{Seqs: []Seq{
		{Tokens: []int32{21}, Start: 2, BlockTable: []int32{9}, WantLogits: true},
		{Tokens: []int32{11, 12}, Start: 5, BlockTable: []int32{3, 4}, AllLogits: true},
	}}
	for i := range 3 {
		m.seen = m.seen[:0]
		out, err := r.Execute(step)
		if err != nil {
			t.Fatal(err)
		}
		if out.Rows != 3 || fmt.Sprint(out.Seq) != "[0 1 1]" {
			t.Fatalf("step %d: %d rows of %v, want 3 of [0 1 1]", i, out.Rows, out.Seq)
		}
		ids, err := out.Sample(make([]backend.SampleRow, 3))
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(ids) != "[21 11 12]" {
			t.Errorf("step %d: greedy ids %v, want each row's own token [21 11 12]", i, ids)
		}
		for row, tok := range []int{21, 11, 12} {
			l, err := out.Logits(row)
			if err != nil {
				t.Fatal(err)
			}
			if l[tok] != 1 {
				t.Errorf("step %d: logits row %d is not its token %d's", i, row, tok)
			}
		}
		if len(m.seen) == 0 {
			t.Fatalf("step %d: no forward ran (a replay of a fake graph runs it)", i)
		}
		last := m.seen[len(m.seen)-1]
		if last.seqs != 2 || fmt.Sprint(last.queryStart) != "[0 2 4]" || fmt.Sprint(last.seqLens) != "[4 7]" {
			t.Errorf("step %d: %d seqs, query starts %v, seq lens %v; want 2, [0 2 4], [4 7] (the first padded to 2 rows)",
				i, last.seqs, last.queryStart, last.seqLens)
		}
		if fmt.Sprint(last.positions) != "[2 3 5 6]" || fmt.Sprint(last.slots) != "[38 -1 17 18]" {
			t.Errorf("step %d: positions %v, slots %v; want [2 3 5 6] and [38 -1 17 18] (the padding row writes nothing)",
				i, last.positions, last.slots)
		}
		if fmt.Sprint(last.logitsRows) != "[0 2 3 1]" || last.logitsAll {
			t.Errorf("step %d: logits rows %v (taken as they are: %v); want [0 2 3 1], gathered: the step's rows, then the padding row",
				i, last.logitsRows, last.logitsAll)
		}
	}
	if st := r.GraphStats(); st.PaddedVerifies != 3 || st.Captures != 1 || st.Replays == 0 {
		t.Errorf("stats %+v: want 3 padded verify steps, one capture, replays", st)
	}
}
