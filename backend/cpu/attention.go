package cpu

import (
	"unsafe"

	"github.com/trigon-llm/trigon/backend"
)

// Attention implements backend.Backend: paged causal attention for a varlen
// batch, with GQA (query head h reads KV head h/(NumHeads/NumKVHeads)) and
// an optional sliding window.
//
// Work is split over (sequence, head) pairs. Each pair gathers the K and V
// rows it needs from the paged caches into contiguous f32 scratch through
// the block table, then for each query row computes f32 scores, a softmax
// stabilised by the row maximum, and the probability-weighted sum of V.
// Output rows past QueryStart[NumSeqs] are left untouched (batch padding).
// All metadata (query starts, lengths, block ids) is checked before any
// row is computed.
//
//	Out         [numTokens, numHeads*headDim] F32 (may be Q itself)
//	Q           [numTokens, numHeads*headDim] F32
//	KCache      [numBlocks, numKVHeads, blockSize, headDim] in KV's format
//	VCache      same shape as KCache
//	KVAux       the scales and window KV names
//
// Quantized caches are decoded to f32 on the gather (backend.KVSpec
// says how); everything after it is the same for every format.
//
//	BlockTables [numSeqs, maxBlocksPerSeq] I32
//	SeqLens     [numSeqs] I32
//	QueryStart  [numSeqs+1] I32
func (b *Backend) Attention(a backend.AttentionArgs) error {
	const op = "attention"
	o, err := tensorOf(op, "Out", a.Out)
	if err != nil {
		return err
	}
	q, err := tensorOf(op, "Q", a.Q)
	if err != nil {
		return err
	}
	kc, err := tensorOf(op, "KCache", a.KCache)
	if err != nil {
		return err
	}
	vc, err := tensorOf(op, "VCache", a.VCache)
	if err != nil {
		return err
	}
	bt, err := tensorOf(op, "BlockTables", a.BlockTables)
	if err != nil {
		return err
	}
	sl, err := tensorOf(op, "SeqLens", a.SeqLens)
	if err != nil {
		return err
	}
	qs, err := tensorOf(op, "QueryStart", a.QueryStart)
	if err != nil {
		return err
	}
	dims, err := backend.CheckAttention(a)
	if err != nil {
		return opErr(err)
	}
	h, kvh, d, ns := a.NumHeads, a.NumKVHeads, a.HeadDim, a.NumSeqs
	numTokens, numBlocks, blockSize, maxBlocks := dims.NumTokens, dims.NumBlocks, dims.BlockSize, dims.MaxBlocksPerSeq
	if err := checkF32(op, []string{"Q", "Out"}, q, o); err != nil {
		return err
	}
	if overlaps(o.data, q.data) && &o.data[0] != &q.data[0] {
		return backend.ShapeError("cpu: "+op, "Out", "partially overlaps Q")
	}
	tables, lens, starts := bt.i32(), sl.i32(), qs.i32()
	if starts[0] != 0 {
		return backend.ShapeError("cpu: "+op, "QueryStart", "QueryStart[0] = %d, want 0", starts[0])
	}
	for s := range ns {
		qLen, seqLen := int(starts[s+1])-int(starts[s]), int(lens[s])
		switch {
		case qLen < 0 || int(starts[s+1]) > numTokens:
			return backend.ShapeError("cpu: "+op, "QueryStart", "sequence %d owns rows [%d, %d) of %d", s, starts[s], starts[s+1], numTokens)
		case seqLen < qLen:
			return backend.ShapeError("cpu: "+op, "SeqLens", "SeqLens[%d] = %d is shorter than its %d query rows", s, seqLen, qLen)
		case seqLen > a.MaxSeqLen:
			return backend.ShapeError("cpu: "+op, "SeqLens", "SeqLens[%d] = %d exceeds MaxSeqLen %d", s, seqLen, a.MaxSeqLen)
		case a.MaxQueryLen > 0 && qLen > a.MaxQueryLen:
			return backend.ShapeError("cpu: "+op, "QueryStart", "sequence %d has %d query rows, MaxQueryLen is %d", s, qLen, a.MaxQueryLen)
		case (seqLen+blockSize-1)/blockSize > maxBlocks:
			return backend.ShapeError("cpu: "+op, "BlockTables", "SeqLens[%d] = %d needs %d blocks, tables hold %d", s, seqLen, (seqLen+blockSize-1)/blockSize, maxBlocks)
		}
		for j := range (seqLen + blockSize - 1) / blockSize {
			id := tables[s*maxBlocks+j]
			if id < 0 || int(id) >= numBlocks {
				return backend.ShapeError("cpu: "+op, "BlockTables", "BlockTables[%d][%d] = %d outside %d blocks", s, j, id, numBlocks)
			}
			if a.KV.Scales == backend.KVScaleKIVI {
				// A block that is not full has no int4 K: it must be in the window pool.
				w, nw := a.KVAux.WindowMap.(*tensor).i32()[id], a.KVAux.KWindow.Shape()[0]
				if int(w) >= nw || (w < 0 && (j+1)*blockSize > seqLen) {
					return backend.ShapeError("cpu: "+op, "WindowMap", "block %d (sequence %d, block %d of %d tokens) has window block %d of %d", id, s, j, seqLen, w, nw)
				}
			}
		}
	}

	qv, ov := q.f32(), o.f32()
	group := h / kvh
	kp, vp := newKVPool(kc, a.KV, a.KVAux, true, kvh, d), newKVPool(vc, a.KV, a.KVAux, false, kvh, d)
	window := a.SlidingWindow
	maxQ := 0
	for s := range ns {
		maxQ = max(maxQ, int(starts[s+1])-int(starts[s]))
	}
	// Decode steps (a query row or a few per sequence) gain nothing from
	// packing K and V into panels; prefill chunks do.
	if b.k.gemm != nil && d%b.k.nr == 0 && maxQ >= attnGEMMMinRows {
		b.attentionGEMM(attnJob{
			q: qv, out: ov, tables: tables, lens: lens, starts: starts,
			kp: kp, vp: vp, h: h, group: group, d: d, maxBlocks: maxBlocks,
			window: window, scale: a.Scale,
		}, ns)
		return nil
	}
	// An unquantized F32 cache's rows are read in place, and each job is
	// one (sequence, query head); other formats decode each needed row
	// once per (sequence, KV head) into scratch, which that KV head's
	// query heads then read in one job.
	direct := a.KV.Scales == backend.KVNoScales && a.KV.DType == backend.F32
	bs := a.KV.BlockSize
	per := group // query heads a job
	if direct {
		per = 1
	}
	jobs := h / per // a sequence's
	b.parallel(ns*jobs, 1, func(w, lo, hi int) {
		for unit := lo; unit < hi; unit++ {
			s, head0 := unit/jobs, unit%jobs*per
			qLen, seqLen := int(starts[s+1])-int(starts[s]), int(lens[s])
			if qLen == 0 {
				continue
			}
			kvHead := head0 / group
			// Keys needed by any of this sequence's query rows.
			first := 0
			if window > 0 {
				first = max(0, seqLen-qLen-window+1)
			}
			nk := seqLen - first
			table := tables[s*maxBlocks : (s+1)*maxBlocks]
			var ks, vs, scores []float32
			if direct {
				scores = b.floatScratch(w, nk)
			} else {
				buf := b.floatScratch(w, 2*nk*d+nk)
				ks, vs, scores = buf[:nk*d], buf[nk*d:2*nk*d], buf[2*nk*d:]
				for p := first; p < seqLen; p++ {
					kp.load(table, p, seqLen, kvHead, ks[(p-first)*d:(p-first+1)*d])
					vp.load(table, p, seqLen, kvHead, vs[(p-first)*d:(p-first+1)*d])
				}
			}
			// kRow and vRow are position p's K and V of the head.
			kRow := func(p int) []float32 {
				if direct {
					return bytesAs[float32](kp.row(int(table[p/bs]), kvHead, p%bs))
				}
				return ks[(p-first)*d : (p-first+1)*d]
			}
			vRow := func(p int) []float32 {
				if direct {
					return bytesAs[float32](vp.row(int(table[p/bs]), kvHead, p%bs))
				}
				return vs[(p-first)*d : (p-first+1)*d]
			}
			for head := head0; head < head0+per; head++ {
				for i := range qLen {
					t := int(starts[s]) + i
					pos := seqLen - qLen + i
					lo := first
					if window > 0 {
						lo = max(first, pos-window+1)
					}
					qrow := qv[(t*h+head)*d : (t*h+head+1)*d]
					sc := scores[:pos-lo+1]
					// In place, a block's rows of the head are consecutive, and
					// decoded rows all are: one kernel call takes such a run.
					rows := b.k.dotRows != nil && d%b.k.lanes == 0
					run := func(p int) int {
						if direct {
							return min(pos+1, (p/bs+1)*bs) - p
						}
						return pos + 1 - p
					}
					for p := lo; p <= pos; {
						n := 1
						if rows {
							n = run(p)
							b.k.dotRows(&qrow[0], &kRow(p)[0], d, n, &sc[p-lo])
						} else {
							sc[p-lo] = b.dotF32(qrow, kRow(p))
						}
						p += n
					}
					inv := b.k.softmaxRow(sc, a.Scale)
					// qrow is fully read; out may alias it from here on.
					orow := ov[(t*h+head)*d : (t*h+head+1)*d]
					clear(orow)
					for p := lo; p <= pos; {
						n := 1
						if rows {
							n = run(p)
							b.k.axpyRows(&orow[0], &sc[p-lo], &vRow(p)[0], d, n)
						} else {
							b.axpyF32(orow, sc[p-lo], vRow(p))
						}
						p += n
					}
					for c := range orow {
						orow[c] *= inv
					}
				}
			}
		}
	})
	return nil
}

// dotF32 is x . y (equal lengths) through the kernel set's vector dot
// where it has one.
func (b *Backend) dotF32(x, y []float32) float32 {
	n := len(x)
	if b.k.dotF32 == nil || n < b.k.lanes {
		return dot(x, y)
	}
	vec := n / b.k.lanes * b.k.lanes
	s := b.k.dotF32(&x[0], unsafe.Pointer(&y[0]), vec)
	if vec < n {
		s += dot(x[vec:], y[vec:n])
	}
	return s
}

// axpyF32 adds a*x to y (equal lengths) through the kernel set's vector
// axpy where it has one.
func (b *Backend) axpyF32(y []float32, a float32, x []float32) {
	n := len(y)
	if b.k.axpy == nil || n < b.k.lanes {
		axpy(y, a, x)
		return
	}
	vec := n / b.k.lanes * b.k.lanes
	b.k.axpy(&y[0], &x[0], a, vec)
	if vec < n {
		axpy(y[vec:], a, x[vec:n])
	}
}

// axpy adds a*x to y (equal lengths).
func axpy(y []float32, a float32, x []float32) {
	x = x[:len(y)]
	k := 0
	for ; k+3 < len(y); k += 4 {
		y[k] += a * x[k]
		y[k+1] += a * x[k+1]
		y[k+2] += a * x[k+2]
		y[k+3] += a * x[k+3]
	}
	for ; k < len(y); k++ {
		y[k] += a * x[k]
	}
}

// attnJob is what attentionGEMM needs of one Attention call.
type attnJob struct {
	q, out               []float32
	tables, lens, starts []int32
	kp, vp               kvPool
	h, group, d          int
	maxBlocks, window    int
	scale                float32
}

// attnGEMMMinRows is the longest query of a batch below which Attention
// runs the plain loops.
const attnGEMMMinRows = 8

// attnQueryBlock is how many query rows share one pass over the keys.
const attnQueryBlock = 48

// attentionGEMM is Attention through the GEMM micro-kernels, for head
// sizes that are whole panels (d % nr == 0). Per (sequence, head) it
// gathers K packed as panels of nr keys (panel[c*nr+j] = K[j][c]) and V
// as panels of nr channels (V itself, cut by columns), then for each
// block of query rows computes the scores Q.K^T of the keys any row of
// the block sees, masks and exponentiates them row by row, and multiplies
// the probabilities by V straight into Out. Out may be Q: a block's Q
// rows of this head are read only before its output rows are written.
func (b *Backend) attentionGEMM(j attnJob, ns int) {
	nr, mr := b.k.nr, len(b.k.gemm)
	h, d := j.h, j.d
	b.parallel(ns*h, 1, func(w, lo, hi int) {
		for unit := lo; unit < hi; unit++ {
			s, head := unit/h, unit%h
			qLen, seqLen := int(j.starts[s+1])-int(j.starts[s]), int(j.lens[s])
			if qLen == 0 {
				continue
			}
			kvHead := head / j.group
			first := 0
			if j.window > 0 {
				first = max(0, seqLen-qLen-j.window+1)
			}
			nk := seqLen - first
			nkPad := (nk + nr - 1) / nr * nr
			qb := min(qLen, attnQueryBlock)
			buf := b.floatScratch(w, 2*nkPad*d+qb*nkPad+d+qb)
			kpan, vpan := buf[:nkPad*d], buf[nkPad*d:2*nkPad*d]
			sc := buf[2*nkPad*d : 2*nkPad*d+qb*nkPad]
			row, inv := buf[2*nkPad*d+qb*nkPad:][:d], buf[2*nkPad*d+qb*nkPad+d:][:qb]
			table := j.tables[s*j.maxBlocks : (s+1)*j.maxBlocks]
			for p := range nkPad {
				kb := kpan[(p/nr)*nr*d:]
				if p >= nk {
					for cb := 0; cb < d; cb += nr {
						clear(vpan[cb*nkPad+p*nr : cb*nkPad+(p+1)*nr])
					}
					for c := range d {
						kb[c*nr+p%nr] = 0
					}
					continue
				}
				j.kp.load(table, first+p, seqLen, kvHead, row[:d])
				for c, v := range row[:d] {
					kb[c*nr+p%nr] = v
				}
				// V panel cb/nr holds channels cb.. of every key, nr per key.
				j.vp.load(table, first+p, seqLen, kvHead, row[:d])
				for cb := 0; cb < d; cb += nr {
					copy(vpan[cb*nkPad+p*nr:cb*nkPad+(p+1)*nr], row[cb:cb+nr])
				}
			}
			ld := uintptr(4 * h * d)
			for i0 := 0; i0 < qLen; i0 += qb {
				i1 := min(qLen, i0+qb)
				t0 := int(j.starts[s]) + i0
				// Keys [kLo, kHi) relative to first cover every row of the block.
				kHi := seqLen - qLen + i1 - first
				kLo := 0
				if j.window > 0 {
					kLo = max(0, seqLen-qLen+i0-j.window+1-first)
				}
				kLo = kLo / nr * nr
				kHiPad := (kHi + nr - 1) / nr * nr
				width := kHiPad - kLo
				ldc := uintptr(4 * width)
				for r := i0; r < i1; r += mr {
					m := min(mr, i1-r)
					a := &j.q[((t0+r-i0)*h+head)*d]
					for pb := kLo; pb < kHiPad; pb += nr {
						b.k.gemm[m-1](a, ld, &kpan[pb*d], &sc[(r-i0)*width+pb-kLo], ldc, d)
					}
				}
				for r := i0; r < i1; r++ {
					pos := seqLen - qLen + r
					lo := first
					if j.window > 0 {
						lo = max(first, pos-j.window+1)
					}
					srow := sc[(r-i0)*width : (r-i0+1)*width]
					keyLo, keyHi := lo-first-kLo, pos+1-first-kLo
					clear(srow[:keyLo])
					clear(srow[keyHi:])
					inv[r-i0] = b.k.softmaxRow(srow[keyLo:keyHi], j.scale)
				}
				for r := i0; r < i1; r += mr {
					m := min(mr, i1-r)
					for cb := 0; cb < d; cb += nr {
						c := &j.out[((t0+r-i0)*h+head)*d+cb]
						b.k.gemm[m-1](&sc[(r-i0)*width], ldc, &vpan[cb*nkPad+kLo*nr], c, ld, width)
					}
				}
				for r := i0; r < i1; r++ {
					orow := j.out[((t0+r-i0)*h+head)*d : ((t0+r-i0)*h+head+1)*d]
					for c := range orow {
						orow[c] *= inv[r-i0]
					}
				}
			}
		}
	})
}
