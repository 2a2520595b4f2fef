package runner

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/cpu"
)

// TestCopyBlocks fills every layer's K and V pool with random bytes, runs
// copies (one of them reading a block an earlier one wrote), and checks
// every block of every pool: each destination holds its source's bytes as
// they were when its copy ran, and every other block is untouched.
func TestCopyBlocks(t *testing.T) {
	for _, dt := range []backend.DType{backend.F32, backend.BF16} {
		t.Run(dt.String(), func(t *testing.T) {
			b := cpu.New(cpu.Options{Threads: 2})
			const numBlocks, layers = 9, 3
			r, err := New(b, &nopModel{b: b}, Options{
				NumBlocks: numBlocks, BlockSize: 4, MaxTokens: 8, MaxSeqs: 2, MaxSeqLen: 16,
				KVDType: dt, NumLayers: layers, NumKVHeads: 2, HeadDim: 8,
			})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			rng := rand.New(rand.NewPCG(1, 2))
			var pools []backend.Tensor
			for _, kv := range r.KV() {
				pools = append(pools, kv.K, kv.V)
			}
			bytesOf := func(p backend.Tensor) []byte {
				n, _ := p.DType().Bytes(p.Shape())
				out := make([]byte, n)
				if err := b.Read(p, out); err != nil {
					t.Fatal(err)
				}
				return out
			}
			// want[p][blk] is the bytes block blk of pool p must hold.
			var want [][][]byte
			for _, p := range pools {
				data := bytesOf(p)
				for i := range data {
					data[i] = byte(rng.Uint32())
				}
				if err := b.Write(p, data); err != nil {
					t.Fatal(err)
				}
				per := len(data) / numBlocks
				var blocks [][]byte
				for blk := range numBlocks {
					blocks = append(blocks, bytes.Clone(data[blk*per:(blk+1)*per]))
				}
				want = append(want, blocks)
			}
			copies := []BlockCopy{{Src: 3, Dst: 5}, {Src: 5, Dst: 7}, {Src: 8, Dst: 1}}
			for _, c := range copies {
				for p := range want {
					want[p][c.Dst] = want[p][c.Src]
				}
			}
			if err := r.CopyBlocks(copies); err != nil {
				t.Fatal(err)
			}
			for p, pool := range pools {
				data := bytesOf(pool)
				per := len(data) / numBlocks
				for blk := range numBlocks {
					if !bytes.Equal(data[blk*per:(blk+1)*per], want[p][blk]) {
						t.Errorf("layer %d %s: block %d differs", p/2, [2]string{"K", "V"}[p%2], blk)
					}
				}
			}
		})
	}
}

func TestCopyBlocksRejectsBadIDs(t *testing.T) {
	r, _ := newTest(t) // 10 blocks
	for _, c := range []BlockCopy{{Src: 0, Dst: 2}, {Src: 2, Dst: 0}, {Src: 10, Dst: 2}, {Src: 2, Dst: 10}, {Src: -1, Dst: 2}} {
		err := r.CopyBlocks([]BlockCopy{{Src: 1, Dst: 2}, c})
		if err == nil || !strings.Contains(err.Error(), "outside [1, 10)") {
			t.Errorf("copy %+v: error %v, want one about the ids", c, err)
		}
	}
	if err := r.CopyBlocks(nil); err != nil {
		t.Errorf("no copies: %v", err)
	}
}
