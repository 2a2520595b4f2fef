package sim

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/cpu"
)

func f32b(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

func TestWindow(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const h, kv, d, bs, window = 8, 4, 128, 16, 128
	seqs := [][2]int{{700, 1}, {500, 130}, {90, 90}}
	c := cpu.New(cpu.Options{})
	nbTot := 0
	maxB := 0
	for _, s := range seqs {
		nb := (s[0] + bs - 1) / bs
		nbTot += nb
		maxB = max(maxB, nb)
	}
	numBlocks := nbTot + 1
	kvals := make([]float32, numBlocks*kv*bs*d)
	vvals := make([]float32, len(kvals))
	for i := range kvals {
		kvals[i] = float32(r.NormFloat64())
		vvals[i] = float32(r.NormFloat64())
	}
	n := 221
	q := make([]float32, n*h*d)
	for i := range q {
		q[i] = float32(r.NormFloat64())
	}
	tables := make([]int32, len(seqs)*maxB)
	lens := make([]int32, len(seqs))
	starts := make([]int32, len(seqs)+1)
	next := 1
	for i, s := range seqs {
		for j := 0; j < (s[0]+bs-1)/bs; j++ {
			tables[i*maxB+j] = int32(next)
			next++
		}
		lens[i] = int32(s[0])
		starts[i+1] = starts[i] + int32(s[1])
	}
	i32 := func(v []int32) []byte {
		b := make([]byte, 4*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint32(b[4*i:], uint32(x))
		}
		return b
	}
	up := func(dt backend.DType, shape []int, b []byte) backend.Tensor {
		x, err := c.Upload(dt, shape, b)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	out, _ := c.Alloc(backend.F32, n, h*d)
	err := c.Attention(backend.AttentionArgs{Out: out, Q: up(backend.F32, []int{n, h * d}, f32b(q)),
		KCache: up(backend.F32, []int{numBlocks, kv, bs, d}, f32b(kvals)), VCache: up(backend.F32, []int{numBlocks, kv, bs, d}, f32b(vvals)),
		BlockTables: up(backend.I32, []int{3, maxB}, i32(tables)), SeqLens: up(backend.I32, []int{3}, i32(lens)), QueryStart: up(backend.I32, []int{4}, i32(starts)),
		NumSeqs: 3, MaxSeqLen: 700, NumHeads: h, NumKVHeads: kv, HeadDim: d, Scale: float32(1 / math.Sqrt(d)), SlidingWindow: window})
	if err != nil {
		t.Fatal(err)
	}
	ob := make([]byte, n*h*d*4)
	c.Read(out, ob)
	got := make([]float32, n*h*d)
	for i := range got {
		got[i] = math.Float32frombits(binary.LittleEndian.Uint32(ob[4*i:]))
	}
	// naive
	var num, den float64
	row := 0
	for si, s := range seqs {
		L, ql := s[0], s[1]
		for i := 0; i < ql; i++ {
			pos := L - ql + i
			for hh := 0; hh < h; hh++ {
				kvh := hh / (h / kv)
				lo := max(0, pos-window+1)
				var sc []float64
				m := math.Inf(-1)
				for p := lo; p <= pos; p++ {
					blk := int(tables[si*maxB+p/bs])
					base := ((blk*kv+kvh)*bs + p%bs) * d
					dot := 0.0
					for e := 0; e < d; e++ {
						dot += float64(q[(row*h+hh)*d+e]) * float64(kvals[base+e])
					}
					dot /= math.Sqrt(d)
					sc = append(sc, dot)
					m = math.Max(m, dot)
				}
				o := make([]float64, d)
				sum := 0.0
				for j, p := 0, lo; p <= pos; j, p = j+1, p+1 {
					blk := int(tables[si*maxB+p/bs])
					base := ((blk*kv+kvh)*bs + p%bs) * d
					w := math.Exp(sc[j] - m)
					sum += w
					for e := 0; e < d; e++ {
						o[e] += w * float64(vvals[base+e])
					}
				}
				for e := 0; e < d; e++ {
					want := o[e] / sum
					g := float64(got[(row*h+hh)*d+e])
					num += (g - want) * (g - want)
					den += want * want
				}
			}
			row++
		}
	}
	t.Logf("cpu vs naive rel err %g", math.Sqrt(num/den))
}
