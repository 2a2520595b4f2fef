package cpu

import (
	"fmt"
	"math"
	"testing"

	"github.com/trigon-llm/trigon/backend"
)

// refRotate rotates x (rotate-half layout) by pos in f64; the angle is the
// f32 product HF computes, the rest is exact.
func refRotate(x []float64, pos int32, invFreq []float32) (out, scale []float64) {
	half := len(x) / 2
	out, scale = make([]float64, len(x)), make([]float64, len(x))
	for i := range half {
		ang := float64(float32(pos) * invFreq[i])
		c, s := math.Cos(ang), math.Sin(ang)
		out[i] = x[i]*c - x[i+half]*s
		out[i+half] = x[i+half]*c + x[i]*s
		scale[i] = math.Abs(x[i]) + math.Abs(x[i+half])
		scale[i+half] = scale[i]
	}
	return out, scale
}

func TestRoPEStoreKV(t *testing.T) {
	r := newRand(t)
	cases := []struct {
		tokens, heads, kvHeads, headDim int
		norm                            bool
		cacheDT                         backend.DType
		blockSize, numBlocks            int
		maxPos                          int
	}{
		{1, 1, 1, 2, false, backend.F32, 1, 1, 10},
		{5, 4, 4, 8, false, backend.F32, 4, 3, 50},
		{7, 8, 2, 64, true, backend.BF16, 16, 4, 100000},
		{12, 16, 2, 128, false, backend.F16, 16, 5, 4096},
		{9, 12, 1, 32, true, backend.F32, 5, 7, 300},
		{33, 6, 3, 16, true, backend.F16, 3, 20, 40},
	}
	for _, c := range cases {
		name := fmt.Sprintf("T=%d/H=%d/KV=%d/D=%d/norm=%v/%v/bs=%d", c.tokens, c.heads, c.kvHeads, c.headDim, c.norm, c.cacheDT, c.blockSize)
		t.Run(name, func(t *testing.T) {
			b := New(Options{Threads: 3})
			h, kv, d := c.heads, c.kvHeads, c.headDim
			width := (h + 2*kv) * d
			qkv := randFloats(r, c.tokens*width, 2)
			pos := make([]int32, c.tokens)
			for i := range pos {
				pos[i] = int32(r.IntN(c.maxPos + 1))
			}
			// Distinct random slots; about one token in five is padding.
			perm := r.Perm(c.numBlocks * c.blockSize)
			slots := make([]int32, c.tokens)
			for i := range slots {
				slots[i] = -1
				if i < len(perm) && (r.IntN(5) != 0 || i == 0) {
					slots[i] = int32(perm[i])
				}
			}
			base := []float64{10000, 500000}[r.IntN(2)]
			invFreq := make([]float32, d/2)
			for i := range invFreq {
				invFreq[i] = float32(math.Pow(base, -2*float64(i)/float64(d)))
			}
			var qn, kn []float32
			args := backend.RoPEArgs{
				Q:           alloc(t, b, backend.F32, c.tokens, h*d),
				QKV:         uploadF32(t, b, qkv, c.tokens, width),
				Positions:   uploadI32(t, b, pos, c.tokens),
				SlotMapping: uploadI32(t, b, slots, c.tokens),
				KCache:      alloc(t, b, c.cacheDT, c.numBlocks, kv, c.blockSize, d),
				VCache:      alloc(t, b, c.cacheDT, c.numBlocks, kv, c.blockSize, d),
				KV:          backend.PlainKV(c.cacheDT, c.blockSize),
				InvFreq:     uploadF32(t, b, invFreq, d/2),
				NumHeads:    h, NumKVHeads: kv, HeadDim: d, NormEps: 1e-6,
			}
			if c.norm {
				qn, kn = randFloats(r, d, 1), randFloats(r, d, 1)
				args.QNorm, args.KNorm = uploadF32(t, b, qn, d), uploadF32(t, b, kn, d)
			}
			if err := b.RoPEStoreKV(args); err != nil {
				t.Fatal(err)
			}

			var wantQ, scaleQ []float64
			kcache := args.KCache.(*tensor)
			vcache := args.VCache.(*tensor)
			kGot := decodeRef(t, c.cacheDT, kcache.data, len(kcache.data)/c.cacheDT.BlockBytes())
			vGot := decodeRef(t, c.cacheDT, vcache.data, len(vcache.data)/c.cacheDT.BlockBytes())
			written := make([]bool, len(kGot))
			// Storing rounds once to the cache dtype.
			relStore := map[backend.DType]float64{backend.F32: 0, backend.BF16: 1.0 / 256, backend.F16: 1.0 / 2048}[c.cacheDT]
			for tok := range c.tokens {
				row := widen(qkv[tok*width : (tok+1)*width])
				head := func(j int) []float64 { return row[j*d : (j+1)*d] }
				for j := range h {
					x := head(j)
					if c.norm {
						x = refRMSNorm(x, widen(qn), 1e-6)
					}
					o, s := refRotate(x, pos[tok], invFreq)
					wantQ, scaleQ = append(wantQ, o...), append(scaleQ, s...)
				}
				if slots[tok] < 0 {
					continue
				}
				blk, off := int(slots[tok])/c.blockSize, int(slots[tok])%c.blockSize
				for j := range kv {
					x := head(h + j)
					if c.norm {
						x = refRMSNorm(x, widen(kn), 1e-6)
					}
					wantK, scaleK := refRotate(x, pos[tok], invFreq)
					at := ((blk*kv+j)*c.blockSize + off) * d
					for e := range d {
						written[at+e] = true
						if diff := math.Abs(kGot[at+e] - wantK[e]); !(diff <= 2e-6*scaleK[e]+relStore*math.Abs(wantK[e])+1e-6*relStore) {
							t.Fatalf("token %d kv head %d: K[%d] = %v, want %v", tok, j, e, kGot[at+e], wantK[e])
						}
						wantV := head(h + kv + j)[e]
						if diff := math.Abs(vGot[at+e] - wantV); !(diff <= relStore*math.Abs(wantV)+1e-6*relStore) {
							t.Fatalf("token %d kv head %d: V[%d] = %v, want %v", tok, j, e, vGot[at+e], wantV)
						}
					}
				}
			}
			checkClose(t, "Q", readF32(t, b, args.Q), wantQ, scaleQ, 2e-6, 1e-30)
			for i, w := range written {
				if !w && (!math.IsNaN(kGot[i]) || !math.IsNaN(vGot[i])) {
					t.Fatalf("cache element %d written but no token maps to it", i)
				}
			}
		})
	}
}

func TestRoPEStoreKVErrors(t *testing.T) {
	b := New(Options{})
	const n, h, kv, d = 3, 4, 2, 8
	good := func() backend.RoPEArgs {
		return backend.RoPEArgs{
			Q:           alloc(t, b, backend.F32, n, h*d),
			QKV:         alloc(t, b, backend.F32, n, (h+2*kv)*d),
			Positions:   uploadI32(t, b, []int32{0, 1, 2}, n),
			SlotMapping: uploadI32(t, b, []int32{0, -1, 5}, n),
			KCache:      alloc(t, b, backend.BF16, 2, kv, 4, d),
			VCache:      alloc(t, b, backend.BF16, 2, kv, 4, d),
			KV:          backend.PlainKV(backend.BF16, 4),
			InvFreq:     alloc(t, b, backend.F32, d/2),
			NumHeads:    h, NumKVHeads: kv, HeadDim: d,
		}
	}
	if err := b.RoPEStoreKV(good()); err != nil {
		t.Fatalf("valid args: %v", err)
	}
	for _, c := range []struct {
		name   string
		mutate func(*backend.RoPEArgs)
	}{
		{"slot past the cache", func(a *backend.RoPEArgs) { a.SlotMapping = uploadI32(t, b, []int32{0, 8, 1}, n) }},
		{"negative position", func(a *backend.RoPEArgs) { a.Positions = uploadI32(t, b, []int32{0, -3, 1}, n) }},
		{"odd head dim", func(a *backend.RoPEArgs) { a.HeadDim = 7 }},
		{"heads not a multiple", func(a *backend.RoPEArgs) { a.NumKVHeads = 3 }},
		{"QKV width", func(a *backend.RoPEArgs) { a.QKV = alloc(t, b, backend.F32, n, (h+kv)*d) }},
		{"Q rows", func(a *backend.RoPEArgs) { a.Q = alloc(t, b, backend.F32, n+1, h*d) }},
		{"cache heads", func(a *backend.RoPEArgs) { a.KCache = alloc(t, b, backend.BF16, 2, kv+1, 4, d) }},
		{"V cache differs from K", func(a *backend.RoPEArgs) { a.VCache = alloc(t, b, backend.BF16, 3, kv, 4, d) }},
		{"quantized cache", func(a *backend.RoPEArgs) { a.KCache = alloc(t, b, backend.Q8_0, 2, kv, 4, 32) }},
		{"InvFreq length", func(a *backend.RoPEArgs) { a.InvFreq = alloc(t, b, backend.F32, d) }},
		{"KNorm length", func(a *backend.RoPEArgs) { a.KNorm = alloc(t, b, backend.F32, d-1) }},
		{"positions length", func(a *backend.RoPEArgs) { a.Positions = uploadI32(t, b, []int32{0, 1}, 2) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := good()
			c.mutate(&a)
			if err := b.RoPEStoreKV(a); !isShapeErr(err) {
				t.Fatalf("error %v, want a shape error", err)
			}
		})
	}
}
