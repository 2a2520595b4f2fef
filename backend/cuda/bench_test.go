package cuda

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/trigon-llm/trigon/backend"
)

// benchBackend returns the shared GPU backend or skips.
func benchBackend(b *testing.B) *Backend {
	g := sharedBackend(b, true)
	return g
}

// randomBF16 fills a new BF16 tensor with N(0, scale^2) values (never
// zeros: zeros can run faster than real data).
func randomBF16(b *testing.B, g *Backend, scale float64, shape ...int) backend.Tensor {
	b.Helper()
	n, err := backend.NumElements(shape)
	if err != nil {
		b.Fatal(err)
	}
	r := rand.New(rand.NewPCG(uint64(n), 7))
	buf := make([]byte, 2*n)
	for i := 0; i < n; i++ {
		binary.LittleEndian.PutUint16(buf[2*i:], uint16(math.Float32bits(float32(r.NormFloat64()*scale))>>16))
	}
	t, err := g.Upload(backend.BF16, shape, buf)
	if err != nil {
		b.Fatal(err)
	}
	return t
}

// timeOps runs op b.N times between two syncs and reports bytes/s of the
// given traffic per op. The ops are queued back to back, so with
// GPU-bound ops the host time equals the device time.
func timeOps(b *testing.B, g *Backend, bytesPerOp float64, op func() error) {
	b.Helper()
	for range 3 { // warm: kernel load, cuBLASLt plan
		if err := op(); err != nil {
			b.Fatal(err)
		}
	}
	if err := g.Sync(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := op(); err != nil {
			b.Fatal(err)
		}
	}
	if err := g.Sync(); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	if bytesPerOp > 0 {
		b.ReportMetric(bytesPerOp*float64(b.N)/b.Elapsed().Seconds()/1e12, "TB/s")
	}
	b.ReportMetric(b.Elapsed().Seconds()*1e6/float64(b.N), "us/op")
}

// timeGraphOps times op from a CUDA graph holding reps copies of it, so
// that the host's launch cost (several microseconds an op) does not hide
// kernels shorter than that; it reports the same metrics as timeOps, per
// op, and returns the seconds an op took.
func timeGraphOps(b *testing.B, g *Backend, bytesPerOp float64, reps int, op func() error) (secsPerOp float64) {
	b.Helper()
	if err := op(); err != nil { // load the kernels outside the capture
		b.Fatal(err)
	}
	graph, err := g.Capture(func() error {
		for range reps {
			if err := op(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	defer graph.Close()
	if err := graph.Launch(); err != nil {
		b.Fatal(err)
	}
	if err := g.Sync(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := graph.Launch(); err != nil {
			b.Fatal(err)
		}
	}
	if err := g.Sync(); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	ops := float64(b.N * reps)
	if bytesPerOp > 0 {
		b.ReportMetric(bytesPerOp*ops/b.Elapsed().Seconds()/1e12, "TB/s")
	}
	b.ReportMetric(b.Elapsed().Seconds()*1e6/ops, "us/op")
	return b.Elapsed().Seconds() / ops
}

// timeGraphProduct times y[n,out] = x[n,in] . w^T from a graph over
// enough copies of the weight (each made by newW, weightBytes on the
// device) that none is still in L2 when its turn comes again, reporting
// weight bytes streamed per second.
func timeGraphProduct(b *testing.B, g *Backend, n, in, out, weightBytes int, newW func() backend.Tensor) (secsPerOp float64) {
	copies := min(8, max(2, (256<<20)/weightBytes))
	ws := make([]backend.Tensor, copies)
	for i := range ws {
		ws[i] = newW()
	}
	x := randomBF16(b, g, 1, n, in)
	y, _ := g.Alloc(backend.BF16, n, out)
	defer func() {
		for _, w := range ws {
			g.Free(w)
		}
		g.Free(x)
		g.Free(y)
	}()
	next := 0
	return timeGraphOps(b, g, float64(weightBytes), 4*copies, func() error {
		next = (next + 1) % copies
		return g.MatMul(y, x, ws[next], nil)
	})
}

// BenchmarkMatMulLargeBatch times Llama-3-8B's five products at the row
// counts of large decode batches (128 and 256 sequences), as
// BenchmarkMatMulDecode's graph cases, with cuBLASLt's heuristic choice
// (the default: Tuning.TuneMaxRows is below these rows) and with the
// tuner timing the heuristic's candidates (TuneMaxRows raised), reporting
// TFLOP/s: at these rows a product is bound by arithmetic, not bytes, and
// the output features of the smaller products fill few tiles.
func BenchmarkMatMulLargeBatch(b *testing.B) {
	for _, n := range []int{128, 256} {
		for _, s := range []struct {
			name    string
			in, out int
		}{{"qkv", 4096, 6144}, {"o", 4096, 4096}, {"gate_up", 4096, 28672}, {"down", 14336, 4096}, {"lm_head", 4096, 128256}} {
			for _, tuned := range []bool{false, true} {
				b.Run(fmt.Sprintf("%s_n%d_%dx%d_tuned=%v", s.name, n, s.in, s.out, tuned), func(b *testing.B) {
					var tune Tuning
					if tuned {
						tune.TuneMaxRows = 1 << 20
					}
					g := backendWith(b, tune, "")
					secs := timeGraphProduct(b, g, n, s.in, s.out, s.in*s.out*2, func() backend.Tensor { return randomBF16(b, g, 0.02, s.out, s.in) })
					b.ReportMetric(2*float64(n)*float64(s.in)*float64(s.out)/secs/1e12, "TFLOP/s")
				})
			}
		}
	}
}

// BenchmarkMatMulDecode times decode-shaped products (a few rows against
// a large weight) and reports weight bytes streamed per second.
func BenchmarkMatMulDecode(b *testing.B) {
	g := benchBackend(b)
	for _, s := range []struct{ n, in, out int }{{1, 4096, 14336}, {4, 4096, 14336}, {4, 14336, 4096}, {8, 4096, 4096}, {64, 4096, 14336}} {
		b.Run(fmt.Sprintf("bf16_n%d_%dx%d", s.n, s.in, s.out), func(b *testing.B) {
			w := randomBF16(b, g, 0.02, s.out, s.in)
			x := randomBF16(b, g, 1, s.n, s.in)
			y, _ := g.Alloc(backend.BF16, s.n, s.out)
			defer func() { g.Free(w); g.Free(x); g.Free(y) }()
			timeOps(b, g, float64(s.out*s.in*2), func() error { return g.MatMul(y, x, w, nil) })
		})
	}
	// Llama-3-8B's four products at batch 4, timed from a graph (the small
	// ones take less than a host launch) over enough copies of the weight
	// that none is still in L2 when its turn comes again.
	for _, s := range []struct {
		name       string
		n, in, out int
	}{{"qkv", 4, 4096, 6144}, {"o", 4, 4096, 4096}, {"gate_up", 4, 4096, 28672}, {"down", 4, 14336, 4096},
		{"o", 1, 4096, 4096}, {"down", 1, 14336, 4096}, {"o", 16, 4096, 4096}, {"lm_head", 4, 4096, 128256}} {
		b.Run(fmt.Sprintf("graph_%s_n%d_%dx%d", s.name, s.n, s.in, s.out), func(b *testing.B) {
			timeGraphProduct(b, g, s.n, s.in, s.out, s.in*s.out*2, func() backend.Tensor { return randomBF16(b, g, 0.02, s.out, s.in) })
		})
	}
	for _, c := range g.GEMMChoices() {
		b.Log(c)
	}
	for _, dt := range []backend.DType{backend.Q8_0, backend.Q4_0} {
		b.Run(fmt.Sprintf("%v_n4_4096x14336", dt), func(b *testing.B) {
			const in, out = 4096, 14336
			wb, _ := dt.Bytes([]int{out, in})
			buf := make([]byte, wb)
			r := rand.New(rand.NewPCG(1, 2))
			for i := range buf {
				buf[i] = byte(r.IntN(256))
			}
			bs := dt.BlockBytes()
			for i := 0; i < len(buf); i += bs { // sane f16 scales
				binary.LittleEndian.PutUint16(buf[i:], 0x2000|uint16(r.IntN(0x400)))
			}
			w, err := g.Upload(dt, []int{out, in}, buf)
			if err != nil {
				b.Fatal(err)
			}
			x := randomBF16(b, g, 1, 4, in)
			y, _ := g.Alloc(backend.BF16, 4, out)
			defer func() { g.Free(w); g.Free(x); g.Free(y) }()
			timeOps(b, g, float64(wb), func() error { return g.MatMul(y, x, w, nil) })
		})
	}
}

// BenchmarkMatMulWQuant times the weight-quantized decode products at
// Llama-3-8B's shapes from a graph (as BenchmarkMatMulDecode's graph
// cases, over enough copies of the weight that none stays in L2), for
// AWQ4 group 128 and FP8 row weights, reporting packed weight bytes per
// second: the decode floor of these formats is their packed bytes at the
// copy ceiling. Products of at most 16 rows (awq_dec, f8_dec) run at each
// tuning of wqDecodeTunings (ksplit: Tuning.WQDecodeKSplit, dwaves:
// Tuning.WQDecodeWaves, 0 the default); the 32-row case (awq_mma, f8_mma)
// at each Tuning.WQWaves of the list.
func BenchmarkMatMulWQuant(b *testing.B) {
	pool := make([]float32, 1<<20) // values tiled into each weight: the data does not change the work, zeros would
	r := rand.New(rand.NewPCG(3, 4))
	for i := range pool {
		pool[i] = float32(r.NormFloat64() * 0.02)
	}
	for _, dt := range []backend.DType{backend.AWQ4G128, backend.F8E4M3Row} {
		for _, s := range []struct {
			name       string
			n, in, out int
		}{{"qkv", 1, 4096, 6144}, {"gate_up", 1, 4096, 28672}, {"down", 1, 14336, 4096}, {"o", 1, 4096, 4096},
			{"qkv", 4, 4096, 6144}, {"down", 4, 14336, 4096}, {"gate_up", 8, 4096, 28672}, {"down", 16, 14336, 4096}, {"down", 32, 14336, 4096}} {
			var enc []byte
			for row := range s.out {
				off := (row * 7919) % (len(pool) - s.in)
				enc = append(enc, encodeWQ(b, dt, pool[off:off+s.in], 1, s.in)...)
			}
			var tunes []Tuning
			if s.n <= wqDecMaxRows {
				tunes = wqDecodeTunings
			} else {
				tunes = []Tuning{{WQWaves: 2}, {WQWaves: 4}, {WQWaves: 8}}
			}
			for _, tune := range tunes {
				name := fmt.Sprintf("%v_%s_n%d_%dx%d_waves%d", dt, s.name, s.n, s.in, s.out, tune.WQWaves)
				if s.n <= wqDecMaxRows {
					name = fmt.Sprintf("%v_%s_n%d_%dx%d_ksplit%d_dwaves%d", dt, s.name, s.n, s.in, s.out, tune.WQDecodeKSplit, tune.WQDecodeWaves)
				}
				b.Run(name, func(b *testing.B) {
					g := backendWith(b, tune, "")
					timeGraphProduct(b, g, s.n, s.in, s.out, len(enc), func() backend.Tensor {
						w, err := g.Upload(dt, []int{s.out, s.in}, enc)
						if err != nil {
							b.Fatal(err)
						}
						return w
					})
				})
			}
		}
	}
}

// wqDecodeTunings are the decode kernels' tunings BenchmarkMatMulWQuant
// times: the default, each k split inside a block, and k split across
// blocks too.
var wqDecodeTunings = []Tuning{{}, {WQDecodeKSplit: 2}, {WQDecodeKSplit: 4}, {WQDecodeKSplit: 8}, {WQDecodeWaves: 2}, {WQDecodeWaves: 4}}

// BenchmarkAttentionDecode times one decode step of attention (one query
// row per sequence, Llama-3-8B's 32 query and 8 KV heads of 128 dims),
// reporting KV bytes read per second, for the tensor-core kernel
// (stages=2..4, Tuning.DecodeStages; 3 is the default) and the CUDA-core
// one (stages=-1). From a graph: at batch 4 and context 2048 the kernels
// take less time than the host needs to launch them. The graph cycles over
// enough copies of the cache that none is still in L2 when its turn comes
// again.
func BenchmarkAttentionDecode(b *testing.B) {
	const h, kv, d = 32, 8, 128
	type shape struct{ seqs, ctx, stages int }
	var cases []shape
	for _, c := range []shape{{1, 8192, -1}, {4, 2048, -1}, {4, 32768, -1}, {64, 2048, -1}} {
		cases = append(cases, c, shape{c.seqs, c.ctx, 3})
	}
	cases = append(cases, shape{4, 2048, 2}, shape{4, 2048, 4}, shape{1, 8192, 4}, shape{64, 2048, 2})
	for _, c := range cases {
		s := c
		b.Run(fmt.Sprintf("b%d_ctx%d_h%d_kv%d_d%d_stages%d", s.seqs, s.ctx, h, kv, d, s.stages), func(b *testing.B) {
			benchDecodeAttention(b, backendWith(b, Tuning{DecodeStages: s.stages}, ""), s.seqs, s.ctx)
		})
	}
}

// BenchmarkAttentionDecodeQuant is BenchmarkAttentionDecode over each KV
// format at the quantized cache's issue shapes (batch 16 at 32k, batch 4
// at 2k), reporting the format's bytes (values and scales) per second.
func BenchmarkAttentionDecodeQuant(b *testing.B) {
	for _, spec := range []backend.KVSpec{backend.PlainKV(backend.BF16, 16), backend.FP8KV(16), backend.Int8KV(16, 32), backend.Int4KV(16, 32, 128)} {
		for _, s := range []struct{ seqs, ctx int }{{16, 32768}, {4, 2048}} {
			b.Run(fmt.Sprintf("%s_b%d_ctx%d", spec.Name(), s.seqs, s.ctx), func(b *testing.B) {
				benchDecodeAttentionKV(b, sharedBackend(b, true), spec, s.seqs, s.ctx)
			})
		}
	}
	// int4's ring depth (twice Tuning.DecodeStages, fitted to the blocks
	// an SM its kernel is compiled for, 3 at head dim 128: 6 slots for the
	// default tuning and for 4) against a shallower one: tuning 2, 4 slots.
	for _, st := range []int{2} {
		for _, s := range []struct{ seqs, ctx int }{{16, 32768}, {4, 2048}} {
			b.Run(fmt.Sprintf("int4_tuning%d_b%d_ctx%d", st, s.seqs, s.ctx), func(b *testing.B) {
				benchDecodeAttentionKV(b, backendWith(b, Tuning{DecodeStages: st}, ""), backend.Int4KV(16, 32, 128), s.seqs, s.ctx)
			})
		}
	}
}

// benchDecodeAttention times decode attention of seqs sequences of ctx
// tokens with Llama-3-8B's heads from a graph that cycles over enough
// cache copies to leave L2, reporting KV bytes read per second.
func benchDecodeAttention(b *testing.B, g *Backend, seqs, ctx int) {
	benchDecodeAttentionKV(b, g, backend.PlainKV(backend.BF16, 16), seqs, ctx)
}

// benchDecodeAttentionKV is benchDecodeAttention over caches of format
// spec (random bytes: a quantized cache's values and scales are read, not
// interpreted, by the cost). An int4 cache's window map gives every
// block a window block (a pool as large as the cache: random bf16), so
// exactly each sequence's newest spec.Window tokens and partial block are
// read in bf16, as in serving; the bytes reported are the int4 blocks',
// the window's rows not counted.
func benchDecodeAttentionKV(b *testing.B, g *Backend, spec backend.KVSpec, seqs, ctx int) {
	const h, kv, d = 32, 8, 128
	bs := spec.BlockSize
	nbPer := (ctx + bs - 1) / bs
	numBlocks := seqs*nbPer + 1
	kvBytes := seqs * nbPer * spec.LayerBlockBytes(kv, d)
	copies := min(4, max(1, (128<<20+kvBytes-1)/kvBytes))
	ksh, vsh, sdt := spec.ScaleShapes(numBlocks, kv, d)
	var ks, vs []backend.Tensor
	var aux []backend.KVAux
	var all []backend.Tensor
	for range copies {
		k, v := randomBF16(b, g, 1, numBlocks, kv, bs, d), randomBF16(b, g, 1, numBlocks, kv, bs, d)
		if spec.Scales != backend.KVNoScales {
			// Reinterpret the bytes of the first half of a BF16 pool as the
			// 1-byte values, and small positive scales.
			k, v = g.reinterpret(b, k, spec.DType, numBlocks, kv, bs, d), g.reinterpret(b, v, spec.DType, numBlocks, kv, bs, d)
			a := backend.KVAux{KScale: constTensor(b, g, sdt, ksh, 0.01), VScale: constTensor(b, g, sdt, vsh, 0.01)}
			all = append(all, a.KScale, a.VScale)
			if spec.Scales == backend.KVScaleKIVI {
				a.KWindow, a.VWindow = randomBF16(b, g, 0.05, numBlocks, kv, bs, d), randomBF16(b, g, 0.05, numBlocks, kv, bs, d)
				ids := make([]int32, numBlocks)
				for i := range ids {
					ids[i] = int32(i)
				}
				wm, err := g.Upload(backend.I32, []int{numBlocks}, i32Bytes(ids))
				if err != nil {
					b.Fatal(err)
				}
				a.WindowMap = wm
				all = append(all, a.KWindow, a.VWindow, wm)
			}
			aux = append(aux, a)
		} else {
			aux = append(aux, backend.KVAux{})
		}
		ks, vs = append(ks, k), append(vs, v)
		all = append(all, k, v)
	}
	q := randomBF16(b, g, 1, seqs, h*d)
	out, _ := g.Alloc(backend.BF16, seqs, h*d)
	bt, sl, qs := benchBatch(b, g, seqs, ctx, 1, nbPer, numBlocks, 3)
	defer func() {
		for _, t := range append(all, q, out, bt, sl, qs) {
			g.Free(t)
		}
	}()
	args := backend.AttentionArgs{Out: out, Q: q, KV: spec, BlockTables: bt, SeqLens: sl, QueryStart: qs, NumSeqs: seqs,
		MaxSeqLen: ctx, MaxQueryLen: 1, NumHeads: h, NumKVHeads: kv, HeadDim: d, Scale: float32(1 / math.Sqrt(d))}
	if p, err := g.planDecode(seqs, h, kv, d, spec, ctx); err == nil && p.decode == "attn_decode_mma" {
		st := p.mod.p[3]
		b.Logf("%s: grid %v, %d splits, %d+%d bytes of shared memory a block, %d slots a warp, %d blocks an SM",
			p.decode, p.grid, p.nsplit, p.smem, decodeMMAStaticSmem(spec, st), st, decodeMMAPerSM(g.cc, d, spec, st))
	}
	next := 0
	timeGraphOps(b, g, float64(kvBytes), 4*copies, func() error {
		next = (next + 1) % copies
		args.KCache, args.VCache, args.KVAux = ks[next], vs[next], aux[next]
		return g.Attention(args)
	})
}

// reinterpret is a view of t's first bytes as a [shape] tensor of dtype dt
// (1-byte KV values), sharing t's memory.
func (g *Backend) reinterpret(b *testing.B, t backend.Tensor, dt backend.DType, shape ...int) backend.Tensor {
	b.Helper()
	ct := t.(*tensor)
	n, err := dt.Bytes(shape)
	if err != nil || n > ct.bytes {
		b.Fatalf("reinterpret %v%v as %v%v: %v", ct.dt, ct.shape, dt, shape, err)
	}
	v := *ct
	v.dt, v.shape, v.bytes = dt, shape, n
	return &v
}

// constTensor uploads a [shape] tensor of dtype dt (F16 or F32) holding v.
func constTensor(b *testing.B, g *Backend, dt backend.DType, shape []int, v float32) backend.Tensor {
	b.Helper()
	n, _ := backend.NumElements(shape)
	vals := make([]float32, n)
	for i := range vals {
		vals[i] = v
	}
	t, err := g.Upload(dt, shape, encode(dt, vals))
	if err != nil {
		b.Fatal(err)
	}
	return t
}

// benchBatch uploads the attention metadata of seqs sequences of ctx
// tokens each with qlen query rows: block tables over a random permutation
// of the cache blocks 1..numBlocks-1 (nbPer per sequence), the lengths and
// the query offsets. seed varies the permutation.
//
//	BlockTables [seqs, nbPer]; SeqLens [seqs]; QueryStart [seqs+1]
func benchBatch(b *testing.B, g *Backend, seqs, ctx, qlen, nbPer, numBlocks int, seed uint64) (bt, sl, qs backend.Tensor) {
	b.Helper()
	perm := rand.New(rand.NewPCG(seed, seed+1)).Perm(numBlocks - 1)
	tables := make([]byte, 4*seqs*nbPer)
	lens := make([]byte, 4*seqs)
	starts := make([]byte, 4*(seqs+1))
	for i := range seqs {
		for j := range nbPer {
			binary.LittleEndian.PutUint32(tables[4*(i*nbPer+j):], uint32(perm[i*nbPer+j]+1))
		}
		binary.LittleEndian.PutUint32(lens[4*i:], uint32(ctx))
		binary.LittleEndian.PutUint32(starts[4*(i+1):], uint32((i+1)*qlen))
	}
	var err error
	if bt, err = g.Upload(backend.I32, []int{seqs, nbPer}, tables); err != nil {
		b.Fatal(err)
	}
	if sl, err = g.Upload(backend.I32, []int{seqs}, lens); err != nil {
		b.Fatal(err)
	}
	if qs, err = g.Upload(backend.I32, []int{seqs + 1}, starts); err != nil {
		b.Fatal(err)
	}
	return bt, sl, qs
}

// BenchmarkAttentionPrefill times causal prefill attention of whole
// prompts (no cached prefix) and reports TFLOP/s, counting the causal
// half of the two products: 4*S*S/2*D per head and sequence. The launch
// also carries the decode kernels, which return at once for these rows.
func BenchmarkAttentionPrefill(b *testing.B) {
	g := benchBackend(b)
	const h, kv, d, bs = 32, 8, 128, 16
	kernel := "mma"
	if _, ok := g.prefillWGSpec(d, backend.PlainKV(backend.BF16, bs)); ok {
		kernel = "wg"
	}
	for _, c := range []struct{ seqs, len int }{{4, 2048}, {1, 8192}} {
		b.Run(fmt.Sprintf("b%d_s%d_h%d_kv%d_d%d_%s", c.seqs, c.len, h, kv, d, kernel), func(b *testing.B) {
			nbPer := (c.len + bs - 1) / bs
			numBlocks := c.seqs*nbPer + 1
			rows := c.seqs * c.len
			k := randomBF16(b, g, 1, numBlocks, kv, bs, d)
			v := randomBF16(b, g, 1, numBlocks, kv, bs, d)
			q := randomBF16(b, g, 1, rows, h*d)
			out, err := g.Alloc(backend.BF16, rows, h*d)
			if err != nil {
				b.Fatal(err)
			}
			bt, sl, qs := benchBatch(b, g, c.seqs, c.len, c.len, nbPer, numBlocks, 5)
			defer func() {
				for _, t := range []backend.Tensor{k, v, q, out, bt, sl, qs} {
					g.Free(t)
				}
			}()
			args := backend.AttentionArgs{Out: out, Q: q, KCache: k, VCache: v, KV: kvOf(k), BlockTables: bt, SeqLens: sl, QueryStart: qs,
				NumSeqs: c.seqs, MaxSeqLen: c.len, MaxQueryLen: c.len, NumHeads: h, NumKVHeads: kv, HeadDim: d,
				Scale: float32(1 / math.Sqrt(d))}
			const reps = 4
			timeGraphOps(b, g, 0, reps, func() error { return g.Attention(args) })
			flops := 4 * float64(c.len) * float64(c.len) / 2 * d * h * float64(c.seqs)
			b.ReportMetric(flops*float64(b.N*reps)/b.Elapsed().Seconds()/1e12, "TFLOP/s")
		})
	}
}

// BenchmarkOpOverhead measures what one queued op costs the caller: a tiny
// SiLUMul, queued back to back (the host side dominates).
func BenchmarkOpOverhead(b *testing.B) {
	g := benchBackend(b)
	x := randomBF16(b, g, 1, 1, 64)
	y, _ := g.Alloc(backend.BF16, 1, 32)
	defer func() { g.Free(x); g.Free(y) }()
	b.ReportAllocs()
	timeOps(b, g, 0, func() error { return g.SiLUMul(y, x) })
}

// BenchmarkSyncRoundTrip measures one synchronous trip to the CUDA thread
// and back with an empty stream.
func BenchmarkSyncRoundTrip(b *testing.B) {
	g := benchBackend(b)
	b.ReportAllocs()
	for b.Loop() {
		if err := g.Sync(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSample times sampling 8 rows of a 128k vocabulary with
// top-p and top-k.
func BenchmarkSample(b *testing.B) {
	g := benchBackend(b)
	const n, vocab = 8, 128256
	r := rand.New(rand.NewPCG(5, 6))
	buf := make([]byte, 4*n*vocab)
	for i := 0; i < n*vocab; i++ {
		binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(float32(r.NormFloat64()*3)))
	}
	l, _ := g.Upload(backend.F32, []int{n, vocab}, buf)
	defer g.Free(l)
	rows := make([]backend.SampleRow, n)
	for i := range rows {
		rows[i] = backend.SampleRow{Temperature: 0.8, TopK: 50, TopP: 0.95, U: r.Float32()}
	}
	for b.Loop() {
		if _, err := g.Sample(backend.SampleArgs{Logits: l, Rows: rows}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGraphReplay replays a graph of 100 tiny kernels and reports the
// cost per kernel, to set against BenchmarkOpOverhead's queued launches.
func BenchmarkGraphReplay(b *testing.B) {
	g := benchBackend(b)
	x := randomBF16(b, g, 1, 1, 64)
	y, _ := g.Alloc(backend.BF16, 1, 32)
	defer func() { g.Free(x); g.Free(y) }()
	if err := g.SiLUMul(y, x); err != nil {
		b.Fatal(err)
	}
	const kernels = 100
	graph, err := g.Capture(func() error {
		for range kernels {
			if err := g.SiLUMul(y, x); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	defer graph.Close()
	timeOps(b, g, 0, graph.Launch)
	b.ReportMetric(b.Elapsed().Seconds()*1e6/float64(b.N)/kernels, "us/kernel")
}

// BenchmarkPrefetchL2 asks whether the idle HBM during a decode step's
// add+RMSNorm (4 rows: a chain of memory latencies) can start the next
// product's weight stream: a graph of norm-then-product pairs, the norm
// launched with extra blocks that prefetch the first pf MB of the
// product's weight into L2 (pf0: none). The weights cycle through enough
// copies to leave L2 between uses.
func BenchmarkPrefetchL2(b *testing.B) {
	g := benchBackend(b)
	const rows = 4
	for _, p := range []struct {
		name string
		m, k int
	}{{"qkv", 6144, 4096}, {"o", 4096, 4096}, {"down", 4096, 14336}} {
		for _, mb := range []int{0, 4, 8, 16, 24} {
			b.Run(fmt.Sprintf("%s_%dx%d_pf%dMB", p.name, p.k, p.m, mb), func(b *testing.B) {
				wBytes := p.m * p.k * 2
				copies := max(2, (256<<20)/wBytes+1)
				var ws []backend.Tensor
				for range copies {
					ws = append(ws, randomBF16(b, g, 0.02, p.m, p.k))
				}
				x := randomBF16(b, g, 1, rows, p.k)
				res := randomBF16(b, g, 1, rows, p.k)
				gw := randomBF16(b, g, 1, p.k)
				normed, _ := g.Alloc(backend.BF16, rows, p.k)
				y, _ := g.Alloc(backend.BF16, rows, p.m)
				defer func() {
					for _, t := range append(ws, x, res, gw, normed, y) {
						g.Free(t)
					}
				}()
				next := 0
				timeGraphOps(b, g, float64(wBytes), 2*copies, func() error {
					next = (next + 1) % copies
					if err := normPrefetch(g, normed, x, res, gw, ws[next], mb<<20); err != nil {
						return err
					}
					return g.MatMul(y, normed, ws[next], nil)
				})
			})
		}
	}
}

// normPrefetch queues AddRMSNorm(out, x, res, w) of BF16 operands with
// pfBytes of pf prefetched into L2 by the same launch.
func normPrefetch(g *Backend, out, x, res, w, pf backend.Tensor, pfBytes int) error {
	var ts [5]*tensor
	for i, t := range []backend.Tensor{out, x, res, w, pf} {
		var err error
		if ts[i], err = g.tensorOf("normprefetch", "operand", t); err != nil {
			return err
		}
	}
	rows, dim := ts[1].shape[0], ts[1].shape[1]
	k := fnKey{modSpec{file: "norm", p: [8]int{dtBF16, dtBF16, dtBF16}}, "add_rmsnorm"}
	pfBytes = min(pfBytes, ts[4].bytes)
	return g.post(func() error {
		return g.addRMSNorm(k, rows, normThreads(dim, rows), ts[0], ts[1], ts[2], ts[3], dim, 1e-5, 1, ts[4].ptr, pfBytes)
	})
}

// BenchmarkF8Prefill times the FP8 (W8A8) product of prefill-sized rows
// at Llama-3-8B's gate/up and down shapes against the BF16 one: the
// product as MatMul runs it (fp8: the scales inside cuBLASLt where it
// takes outer-vector scales) and on the F32 GEMM and f8_epilogue
// (fp8_epipath), and each pass alone: the activations' quantizer, the
// GEMM with the scales in it (scaled_gemm; skipped where cuBLASLt refuses
// them), cuBLASLt's FP8 GEMM into F32 and the epilogue that scales it into
// BF16, and the gather of the weight's scales (row_scales, once a weight).
// It reports TFLOP/s of the product's arithmetic for every case, so the
// passes' shares of the FP8 product's time add up.
func BenchmarkF8Prefill(b *testing.B) {
	g := benchBackend(b)
	if g.cc < 89 {
		b.Skipf("compute capability %d: no FP8 tensor cores", g.cc)
	}
	r := rand.New(rand.NewPCG(7, 8))
	for _, s := range []struct {
		name    string
		n, k, m int
	}{{"gate_up", 2048, 4096, 28672}, {"down", 2048, 14336, 4096}, {"gate_up", 8192, 4096, 28672}} {
		flops := 2 * float64(s.n) * float64(s.k) * float64(s.m)
		vals := make([]float32, s.m*s.k)
		for i := range vals {
			vals[i] = float32(r.NormFloat64() * 0.02)
		}
		w8, err := g.Upload(backend.F8E4M3Row, []int{s.m, s.k}, encodeWQ(b, backend.F8E4M3Row, vals, s.m, s.k))
		if err != nil {
			b.Fatal(err)
		}
		wb := randomBF16(b, g, 0.02, s.m, s.k)
		x := randomBF16(b, g, 1, s.n, s.k)
		y, _ := g.Alloc(backend.BF16, s.n, s.m)
		report := func(b *testing.B) {
			b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e12, "TFLOP/s")
		}
		var plan *f8Plan
		if err := g.call(func() (err error) { plan, err = g.f8PlanFor(s.n, s.m, s.k, backend.BF16); return err }); err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("%s_n%d_bf16", s.name, s.n), func(b *testing.B) {
			timeOps(b, g, 0, func() error { return g.MatMul(y, x, wb, nil) })
			report(b)
		})
		b.Run(fmt.Sprintf("%s_n%d_fp8", s.name, s.n), func(b *testing.B) {
			timeOps(b, g, 0, func() error { return g.MatMul(y, x, w8, nil) })
			report(b)
			var path f8Path
			var why string
			_ = g.call(func() error { path, why = plan.path, plan.refused; return nil })
			b.Logf("path: %v (%s)", path, why)
		})
		b.Run(fmt.Sprintf("%s_n%d_fp8_epipath", s.name, s.n), func(b *testing.B) {
			var was f8Path
			_ = g.call(func() error { was, plan.path = plan.path, min(plan.path, f8Epilogue); return nil })
			defer func() { _ = g.call(func() error { plan.path = was; return nil }) }()
			timeOps(b, g, 0, func() error { return g.MatMul(y, x, w8, nil) })
			report(b)
		})
		// The passes alone, on buffers of their own.
		xq, _ := g.Alloc(backend.I32, (s.n*s.k+4*s.n+16+3)/4)
		acc, _ := g.Alloc(backend.F32, s.n, s.m)
		sws, _ := g.Alloc(backend.F32, s.m)
		wt, _ := g.tensorOf("bench", "w", w8)
		xt, _ := g.tensorOf("bench", "x", x)
		qt, _ := g.tensorOf("bench", "xq", xq)
		at, _ := g.tensorOf("bench", "acc", acc)
		yt, _ := g.tensorOf("bench", "y", y)
		st, _ := g.tensorOf("bench", "sw", sws)
		sx := qt.ptr + uint64((s.n*s.k+15)/16*16)
		spec := modSpec{file: "wquant", p: [8]int{int(backend.F8E4M3Row), int(backend.BF16), 1}}
		pass := func(name string, run func() error) {
			b.Run(fmt.Sprintf("%s_n%d_fp8_%s", s.name, s.n, name), func(b *testing.B) {
				timeOps(b, g, 0, func() error { return g.call(run) })
				report(b)
			})
		}
		pass("quant", func() error {
			f, err := g.fn(fnKey{spec, "f8_act_quant"})
			if err != nil {
				return err
			}
			return g.launch(f, [3]int{s.n, 1, 1}, 256, 0, qt.ptr, sx, xt.ptr, i32(s.n), i32(s.k))
		})
		pass("row_scales", func() error {
			f, err := g.fn(fnKey{spec, "f8_row_scales"})
			if err != nil {
				return err
			}
			return g.launch(f, [3]int{g.gridFor(s.m), 1, 1}, 256, 0, st.ptr, wt.ptr, i32(s.m), i32(s.k))
		})
		var scaled bool
		_ = g.call(func() error { scaled = plan.scaled.desc != 0 && plan.path == f8Scaled; return nil })
		if scaled {
			pass("scaled_gemm", func() error {
				return g.blas.lib.check("cublasLtMatmul", g.f8GemmCall(&plan.scaled, wt.ptr, qt.ptr, st.ptr, sx, yt.ptr))
			})
		} else {
			b.Logf("%s_n%d: no scaled_gemm: %s", s.name, s.n, plan.refused)
		}
		pass("gemm", func() error {
			if plan.path < f8Epilogue {
				return fmt.Errorf("no FP8 GEMM: %s", plan.refused)
			}
			return g.blas.lib.check("cublasLtMatmul", g.f8GemmCall(&plan.plain, wt.ptr, qt.ptr, 0, 0, at.ptr))
		})
		pass("epilogue", func() error {
			f, err := g.fn(fnKey{spec, "f8_epilogue"})
			if err != nil {
				return err
			}
			return g.launch(f, [3]int{(s.m + 255) / 256, (s.n + f8EpiRows - 1) / f8EpiRows, 1}, 256, 0, yt.ptr, at.ptr, sx, wt.ptr, i32(s.n), i32(s.m), i32(s.k))
		})
		for _, t := range []backend.Tensor{w8, wb, x, y, xq, acc, sws} {
			g.Free(t)
		}
	}
}
