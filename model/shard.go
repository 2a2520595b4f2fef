package model

import (
	"fmt"

	"github.com/trigon-llm/trigon/backend"
)

// Shard is the part of a Llama-family model that one rank of a
// tensor-parallel group holds (Megatron-style): its query heads with the
// KV heads they read, a range of the MLP's intermediate columns and a
// range of the vocabulary. Ranges are [start, start+count). The zero
// value and Size 1 are the whole model.
//
// How the model is cut, rank r of n:
//   - heads by KV group (a KV head and the query heads that read it): with
//     at least n KV heads each rank takes whole groups, the counts
//     differing by at most one; with fewer, n must be a multiple of the KV
//     heads and each KV head is replicated on n/numKVHeads ranks that
//     split its group's query heads evenly;
//   - the intermediate columns in units of the down projection's
//     quantization block (one element for float weights), balanced;
//   - the vocabulary rows balanced (the first vocab%n ranks one row more).
type Shard struct {
	Rank, Size         int
	QHead, NumHeads    int // query heads
	KVHead, NumKVHeads int // KV heads (replicated ones included)
	Inter, Intermed    int // intermediate (MLP) columns
	Vocab, VocabRows   int // vocabulary rows of the embedding and LM head
	// VocabWidths is every rank's VocabRows, in rank order: the widths
	// the logits are gathered from.
	VocabWidths []int
}

// Whole reports whether s is the whole model (no tensor parallelism).
func (s Shard) Whole() bool { return s.Size <= 1 }

// balanced is rank r's part of n units split over size ranks, the first
// n%size ranks one unit more.
func balanced(n, size, r int) (start, count int) {
	q, rem := n/size, n%size
	return r*q + min(r, rem), q + btoi(r < rem)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// PlanShards cuts c into size shards (see Shard), reading the dtypes of
// w's projections where they constrain the cut: quantized projections
// split their input columns on block boundaries only. Shapes that do not
// split are refused with an error naming the shape.
func PlanShards(c Config, w Weights, size int) ([]Shard, error) {
	if size < 1 {
		return nil, fmt.Errorf("tensor parallel size %d: want at least 1", size)
	}
	if size == 1 {
		return []Shard{{Rank: 0, Size: 1, NumHeads: c.NumHeads, NumKVHeads: c.NumKVHeads, Intermed: c.Intermediate,
			VocabRows: c.VocabSize, VocabWidths: []int{c.VocabSize}}}, nil
	}
	fail := func(format string, args ...any) ([]Shard, error) {
		return nil, fmt.Errorf("tensor parallel size %d: %s", size, fmt.Sprintf(format, args...))
	}
	nH, nKV := c.NumHeads, c.NumKVHeads
	if nKV <= 0 || nH%nKV != 0 {
		return fail("%d query heads in %d KV groups", nH, nKV)
	}
	group := nH / nKV
	perKV := 1 // ranks sharing one KV head
	if nKV < size {
		if size%nKV != 0 {
			return fail("%d KV heads cannot be replicated evenly over %d ranks (the size must be a multiple of the KV heads, or at most their number)", nKV, size)
		}
		if perKV = size / nKV; group%perKV != 0 {
			return fail("the %d query heads of a KV group do not split over the %d ranks that share its KV head", group, perKV)
		}
	}
	oBlock, err := blockOf(w, LayerName(0, SuffixO))
	if err != nil {
		return nil, err
	}
	if c.HeadDim%oBlock != 0 {
		return fail("o_proj's %d-element quantization blocks straddle the %d-wide heads", oBlock, c.HeadDim)
	}
	unit, err := blockOf(w, LayerName(0, SuffixDown))
	if err != nil {
		return nil, err
	}
	if c.Intermediate%unit != 0 || c.Intermediate/unit < size {
		return fail("the intermediate size %d does not split into %d parts of whole %d-element blocks", c.Intermediate, size, unit)
	}
	if c.VocabSize < size {
		return fail("a vocabulary of %d rows", c.VocabSize)
	}
	shards := make([]Shard, size)
	widths := make([]int, size)
	for r := range shards {
		s := Shard{Rank: r, Size: size}
		if perKV == 1 {
			s.KVHead, s.NumKVHeads = balanced(nKV, size, r)
			s.QHead, s.NumHeads = s.KVHead*group, s.NumKVHeads*group
		} else {
			s.KVHead, s.NumKVHeads = r/perKV, 1
			s.NumHeads = group / perKV
			s.QHead = s.KVHead*group + (r%perKV)*s.NumHeads
		}
		s.Inter, s.Intermed = balanced(c.Intermediate/unit, size, r)
		s.Inter, s.Intermed = s.Inter*unit, s.Intermed*unit
		s.Vocab, s.VocabRows = balanced(c.VocabSize, size, r)
		widths[r] = s.VocabRows
		shards[r] = s
	}
	for r := range shards {
		shards[r].VocabWidths = widths
	}
	return shards, nil
}

// blockOf is the quantization block (elements per block along a row) of
// tensor name's dtype: 1 for float dtypes.
func blockOf(w Weights, name string) (int, error) {
	var dt backend.DType
	if f, ok := w.(Filler); ok {
		d, _, ok := f.Spec(name)
		if !ok {
			return 0, fmt.Errorf("weights: tensor %s is missing", name)
		}
		dt = d
	} else {
		t, ok := w.Tensor(name)
		if !ok {
			return 0, fmt.Errorf("weights: tensor %s is missing", name)
		}
		dt = t.DType
	}
	if dt.Quantized() {
		return dt.BlockSize(), nil
	}
	return 1, nil
}

// ShardFiller is an optional Weights interface beside Filler, for weights
// made on the device (bench's synthetic ones): FillShard makes the piece
// of tensor name that starts at row row0 and column col0 and has dst's
// shape (a tensor-parallel rank's rows or columns), in dst. The values
// have the tensor's distribution and are the same wherever the same
// piece is filled (ranks that replicate a KV head agree); the piece at
// (0, 0) of the whole shape is what Filler.Fill makes. It reports false,
// having done nothing, where it cannot.
type ShardFiller interface {
	FillShard(b backend.Backend, name string, dst backend.Tensor, row0, col0 int) (bool, error)
}

// SliceRows is rows [start, start+n) of a 2-D weight, sharing its bytes
// (rows are contiguous in every dtype, quantized ones included).
func SliceRows(w Weight, start, n int) (Weight, error) {
	if len(w.Shape) != 2 || start < 0 || n <= 0 || start+n > w.Shape[0] {
		return Weight{}, fmt.Errorf("%s: rows [%d, %d) of %v", w.Name, start, start+n, w.Shape)
	}
	rb := len(w.Data) / w.Shape[0]
	return Weight{Name: w.Name, DType: w.DType, Shape: []int{n, w.Shape[1]}, Data: w.Data[start*rb : (start+n)*rb]}, nil
}

// SliceCols is columns [start, start+n) of a 2-D weight, copied (a column
// range is not contiguous). Quantized weights split on block boundaries
// only.
func SliceCols(w Weight, start, n int) (Weight, error) {
	if len(w.Shape) != 2 || start < 0 || n <= 0 || start+n > w.Shape[1] {
		return Weight{}, fmt.Errorf("%s: columns [%d, %d) of %v", w.Name, start, start+n, w.Shape)
	}
	skip, err := w.DType.RowBytes(start)
	if err != nil {
		return Weight{}, fmt.Errorf("%s: columns from %d: %w", w.Name, start, err)
	}
	width, err := w.DType.RowBytes(n)
	if err != nil {
		return Weight{}, fmt.Errorf("%s: %d columns: %w", w.Name, n, err)
	}
	rows, rb := w.Shape[0], len(w.Data)/w.Shape[0]
	data := make([]byte, 0, rows*width)
	if w.DType == backend.F8E4M3Row {
		// A row is its e4m3 bytes then its scale's trailer: the columns'
		// bytes, then the whole row's trailer.
		trailer := rb - w.Shape[1]
		for r := range rows {
			row := w.Data[r*rb : (r+1)*rb]
			data = append(data, row[start:start+n]...)
			data = append(data, row[w.Shape[1]:]...)
		}
		if trailer <= 0 || len(data) != rows*width {
			return Weight{}, fmt.Errorf("%s: %v rows of %d bytes for %d columns", w.Name, w.DType, rb, w.Shape[1])
		}
		return Weight{Name: w.Name, DType: w.DType, Shape: []int{rows, n}, Data: data}, nil
	}
	for r := range rows {
		data = append(data, w.Data[r*rb+skip:r*rb+skip+width]...)
	}
	return Weight{Name: w.Name, DType: w.DType, Shape: []int{rows, n}, Data: data}, nil
}
