package model_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/model"
)

// dtypeWeights is a model.Filler that knows only the dtypes of o_proj and
// down_proj, all PlanShards reads.
type dtypeWeights struct{ o, down backend.DType }

func (w dtypeWeights) Tensor(string) (model.Weight, bool) { return model.Weight{}, false }
func (w dtypeWeights) Names() []string                    { return nil }
func (w dtypeWeights) Close() error                       { return nil }
func (w dtypeWeights) Fill(backend.Backend, string, backend.Tensor) (bool, error) {
	return false, nil
}
func (w dtypeWeights) Spec(name string) (backend.DType, []int, bool) {
	switch name {
	case model.LayerName(0, model.SuffixO):
		return w.o, nil, true
	case model.LayerName(0, model.SuffixDown):
		return w.down, nil, true
	}
	return 0, nil, false
}

func TestPlanShards(t *testing.T) {
	f32 := dtypeWeights{backend.F32, backend.F32}
	q8 := dtypeWeights{backend.Q8_0, backend.Q8_0}
	cfg := func(nH, nKV, hd, inter, vocab int) model.Config {
		return model.Config{NumHeads: nH, NumKVHeads: nKV, HeadDim: hd, Intermediate: inter, VocabSize: vocab}
	}
	type r = model.Shard
	for _, c := range []struct {
		name string
		cfg  model.Config
		w    model.Weights
		size int
		want []r // QHead, NumHeads, KVHead, NumKVHeads, Inter, Intermed, Vocab, VocabRows
		err  string
	}{
		{"one rank", cfg(8, 2, 16, 100, 10), f32, 1, []r{{0, 1, 0, 8, 0, 2, 0, 100, 0, 10, nil}}, ""},
		{"even", cfg(8, 4, 16, 100, 10), f32, 2, []r{{0, 2, 0, 4, 0, 2, 0, 50, 0, 5, nil}, {1, 2, 4, 4, 2, 2, 50, 50, 5, 5, nil}}, ""},
		{"uneven groups and vocab", cfg(10, 5, 32, 864, 11), f32, 2,
			[]r{{0, 2, 0, 6, 0, 3, 0, 432, 0, 6, nil}, {1, 2, 6, 4, 3, 2, 432, 432, 6, 5, nil}}, ""},
		{"quantized intermediate in blocks", cfg(10, 5, 32, 864, 8), q8, 2,
			[]r{{0, 2, 0, 6, 0, 3, 0, 448, 0, 4, nil}, {1, 2, 6, 4, 3, 2, 448, 416, 4, 4, nil}}, ""},
		{"replicated KV heads", cfg(8, 2, 16, 64, 8), f32, 4, []r{
			{0, 4, 0, 2, 0, 1, 0, 16, 0, 2, nil}, {1, 4, 2, 2, 0, 1, 16, 16, 2, 2, nil},
			{2, 4, 4, 2, 1, 1, 32, 16, 4, 2, nil}, {3, 4, 6, 2, 1, 1, 48, 16, 6, 2, nil}}, ""},
		{"KV heads not a divisor", cfg(8, 2, 16, 64, 8), f32, 3, nil, "2 KV heads cannot be replicated"},
		{"group does not split", cfg(4, 2, 16, 64, 8), f32, 8, nil, "query heads of a KV group"},
		{"quantized heads straddle blocks", cfg(4, 4, 16, 64, 8), q8, 2, nil, "straddle"},
		{"intermediate too small", cfg(4, 4, 32, 64, 8), q8, 4, nil, "intermediate size 64"},
		{"vocabulary too small", cfg(4, 4, 16, 64, 2), f32, 4, nil, "vocabulary of 2"},
		{"size zero", cfg(4, 4, 16, 64, 8), f32, 0, nil, "at least 1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := model.PlanShards(c.cfg, c.w, c.size)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("PlanShards error %v, want one containing %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(c.want) {
				t.Fatalf("%d shards, want %d", len(got), len(c.want))
			}
			for i, s := range got {
				if len(s.VocabWidths) != c.size {
					t.Errorf("shard %d: %d vocabulary widths", i, len(s.VocabWidths))
				}
				s.VocabWidths = nil
				if !reflect.DeepEqual(s, c.want[i]) {
					t.Errorf("shard %d = %+v, want %+v", i, s, c.want[i])
				}
			}
		})
	}
}

func TestSliceCols(t *testing.T) {
	w := model.Weight{Name: "w", DType: backend.F32, Shape: []int{2, 3}, Data: []byte{
		1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0,
		4, 0, 0, 0, 5, 0, 0, 0, 6, 0, 0, 0}}
	s, err := model.SliceCols(w, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	if want := []byte{2, 0, 0, 0, 3, 0, 0, 0, 5, 0, 0, 0, 6, 0, 0, 0}; string(s.Data) != string(want) || s.Shape[1] != 2 {
		t.Errorf("columns 1..3 = %v %v", s.Shape, s.Data)
	}
	r, err := model.SliceRows(w, 1, 1)
	if err != nil || r.Data[0] != 4 || len(r.Data) != 12 {
		t.Errorf("row 1 = %v, %v", r, err)
	}
	q := model.Weight{Name: "q", DType: backend.Q8_0, Shape: []int{1, 64}, Data: make([]byte, 68)}
	if _, err := model.SliceCols(q, 16, 32); err == nil {
		t.Error("Q8_0 columns from 16: want an error (not a block boundary)")
	}
	if _, err := model.SliceRows(w, 1, 2); err == nil {
		t.Error("rows past the end: want an error")
	}
	// FP8 rows carry their scale in a 16-byte trailer: a column range
	// keeps each row's trailer.
	f := model.Weight{Name: "f", DType: backend.F8E4M3Row, Shape: []int{2, 48}}
	for r := range 2 {
		for i := range 48 + 16 {
			f.Data = append(f.Data, byte(64*r+i))
		}
	}
	fs, err := model.SliceCols(f, 16, 16)
	if err != nil {
		t.Fatal(err)
	}
	var want []byte
	for r := range 2 {
		for i := range 16 {
			want = append(want, byte(64*r+16+i))
		}
		for i := range 16 {
			want = append(want, byte(64*r+48+i))
		}
	}
	if string(fs.Data) != string(want) || fs.Shape[1] != 16 {
		t.Errorf("FP8 columns 16..32 = %v %v, want %v", fs.Shape, fs.Data, want)
	}
}
