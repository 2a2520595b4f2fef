package cpu

import (
	"fmt"
	"math"
	"testing"

	"github.com/trigon-llm/trigon/backend"
)

// TestEmbedShard: a table split into row shards, each embedded with
// EmbedShard, sums to Embed of the whole table, and each shard's rows are
// those of Embed or zero.
func TestEmbedShard(t *testing.T) {
	r := newRand(t)
	for _, tableDT := range weightDTypes {
		for _, shards := range [][]int{{7}, {4, 3}, {3, 2, 2}} {
			t.Run(fmt.Sprintf("%v/%v", tableDT, shards), func(t *testing.T) {
				const dim, n = 64, 9
				rows := 0
				for _, s := range shards {
					rows += s
				}
				b := New(Options{Threads: 2})
				tb := encode(t, tableDT, randFloats(r, rows*dim, 2))
				full := upload(t, b, tableDT, []int{rows, dim}, tb)
				ids := make([]int32, n)
				for i := range ids {
					ids[i] = int32(r.IntN(rows))
				}
				idt := uploadI32(t, b, ids, n)
				want := alloc(t, b, backend.F32, n, dim)
				if err := b.Embed(want, full, idt); err != nil {
					t.Fatal(err)
				}
				ref := readF32(t, b, want)
				rowBytes := len(tb) / rows
				base := 0
				for _, s := range shards {
					shard := upload(t, b, tableDT, []int{s, dim}, tb[base*rowBytes:(base+s)*rowBytes])
					out := alloc(t, b, backend.F32, n, dim)
					if err := b.EmbedShard(out, shard, idt, base); err != nil {
						t.Fatal(err)
					}
					got := readF32(t, b, out)
					for i, id := range ids {
						mine := int(id) >= base && int(id) < base+s
						for j := range dim {
							w := float32(0)
							if mine {
								w = ref[i*dim+j]
							}
							if math.Float32bits(got[i*dim+j]) != math.Float32bits(w) {
								t.Fatalf("shard at %d: row %d (id %d) col %d = %v, want %v", base, i, id, j, got[i*dim+j], w)
							}
						}
					}
					base += s
				}
			})
		}
	}
	b := New(Options{Threads: 1})
	table := uploadF32(t, b, make([]float32, 8), 2, 4)
	out := alloc(t, b, backend.F32, 1, 4)
	if err := b.EmbedShard(out, table, uploadI32(t, b, []int32{-1}, 1), 0); !isShapeErr(err) {
		t.Errorf("negative id: %v, want a shape error", err)
	}
	if err := b.EmbedShard(out, table, uploadI32(t, b, []int32{0}, 1), -2); !isShapeErr(err) {
		t.Errorf("negative base: %v, want a shape error", err)
	}
}
