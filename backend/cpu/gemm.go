package cpu

import (
	"encoding/binary"
	"math"
	"unsafe"

	"github.com/trigon-llm/trigon/backend"
)

// gemmMinRowsPerJob keeps a job's share of x rows large enough that
// packing its weight panel stays a small part of the job.
const gemmMinRowsPerJob = 48

// gemm computes out = x . w^T through the vector micro-kernels: the
// weight is cut into panels of nr output features, each converted to f32
// once (whatever its encoding) and packed k-major so that the kernel reads
// nr consecutive features per step; the kernel then runs x rows against
// the panel mr at a time, with the 2*mr accumulators in registers.
//
// Jobs are panels, or panels times row blocks when there are too few
// panels to keep every worker busy; each job packs its own panel.
func (b *Backend) gemm(out, x []float32, w *tensor, n, inF, outF int) {
	nr, mr := b.k.nr, len(b.k.gemm)
	panels, rowBlocks, rowsPer := b.gemmJobs(n, outF, nr, mr)
	rowBytes := w.rowBytes()
	b.parallel(panels*rowBlocks, 1, func(worker, lo, hi int) {
		buf := b.floatScratch(worker, inF*nr+inF+mr*nr)
		panel, row, edge := buf[:inF*nr], buf[inF*nr:inF*nr+inF], buf[inF*nr+inF:]
		packed := -1
		for job := lo; job < hi; job++ {
			p, rb := job/rowBlocks, job%rowBlocks
			o0 := p * nr
			cols := min(nr, outF-o0)
			if p != packed {
				packPanel(panel, row, w, rowBytes, o0, cols, nr, inF)
				packed = p
			}
			i0, i1 := rb*rowsPer, min(n, (rb+1)*rowsPer)
			for i := i0; i < i1; i += mr {
				m := min(mr, i1-i)
				a := &x[i*inF]
				if cols == nr {
					b.k.gemm[m-1](a, uintptr(4*inF), &panel[0], &out[i*outF+o0], uintptr(4*outF), inF)
					continue
				}
				b.k.gemm[m-1](a, uintptr(4*inF), &panel[0], &edge[0], uintptr(4*nr), inF)
				for r := range m {
					copy(out[(i+r)*outF+o0:(i+r)*outF+o0+cols], edge[r*nr:r*nr+cols])
				}
			}
		}
	})
}

// gemmJobs cuts a product of n rows and outF features into jobs of one
// panel of nr features times a block of rowsPer rows (a multiple of the
// kernel's mr): panels*rowBlocks jobs, with row blocks only when there are
// too few panels to keep every worker busy.
func (b *Backend) gemmJobs(n, outF, nr, mr int) (panels, rowBlocks, rowsPer int) {
	panels = (outF + nr - 1) / nr
	rowBlocks = 1
	if panels < 4*b.threads {
		rowBlocks = max(1, min((4*b.threads+panels-1)/panels, n/gemmMinRowsPerJob))
	}
	rowsPer = (n + rowBlocks - 1) / rowBlocks
	rowsPer = (rowsPer + mr - 1) / mr * mr
	rowBlocks = (n + rowsPer - 1) / rowsPer
	return panels, rowBlocks, rowsPer
}

// packPanel writes weight rows o0..o0+cols-1 as f32 into panel k-major:
// panel[k*nr+j] = w[o0+j][k], zero for j >= cols. row is inF floats of
// scratch for converting one weight row.
func packPanel(panel, row []float32, w *tensor, rowBytes, o0, cols, nr, inF int) {
	for j := range nr {
		if j >= cols {
			for k := range inF {
				panel[k*nr+j] = 0
			}
			continue
		}
		src := w.data[(o0+j)*rowBytes : (o0+j+1)*rowBytes]
		r := row
		if w.dt == backend.F32 {
			r = bytesAs[float32](src)
		} else {
			toFloat32(w.dt, src, row)
		}
		r = r[:inF]
		for k, v := range r {
			panel[k*nr+j] = v
		}
	}
}

// decodeDot returns the dot product of x row i (of n rows of inF) with a
// weight row of dtype dt in its stored encoding, through the vector
// kernels where the set has one. For Q8_0 and Q4_0 it quantizes the x
// rows to int8 blocks first (into b.xq, b.xs), as llama.cpp does: the
// result then differs from the f32 product by at most
// sum over blocks of d_x/2 * sum|w| (quantizeQ8).
// quantizeDecodeX quantizes the n rows of x for the Q8_0/Q4_0 decode
// dots (quantizeQ8) into the backend's scratch, through the set's
// quantRows kernel where it has one (its scales are then taken from the
// meta words it writes).
func (b *Backend) quantizeDecodeX(x []float32, n, inF int) (xq []int8, xs []float32) {
	nb := inF / qk
	// Grown apart: the K-quant products keep fewer scales (kquantDot).
	if cap(b.xq) < n*inF {
		b.xq = make([]int8, n*inF)
	}
	if cap(b.xs) < n*nb {
		b.xs = make([]float32, n*nb)
	}
	xq, xs = b.xq[:n*inF], b.xs[:n*nb]
	if b.k.quantRows == nil || n*nb == 0 {
		quantizeQ8(x[:n*inF], xq, xs)
		return xq, xs
	}
	if cap(b.xm) < 2*n*nb {
		b.xm = make([]uint32, 2*n*nb)
	}
	xm := b.xm[:2*n*nb]
	b.k.quantRows(&x[0], &xq[0], &xm[0], n*nb)
	for blk := range xs {
		xs[blk] = math.Float32frombits(xm[2*blk])
	}
	return xq, xs
}

// decodeRows is the kernel set's dot of consecutive Q8_0/Q4_0 rows, nil
// where it has none.
func (b *Backend) decodeRows(dt backend.DType) func(xq *int8, xm *uint32, w *byte, nb int, rows int, out *float32) {
	switch dt {
	case backend.Q8_0:
		return b.k.dotQ8Rows
	case backend.Q4_0:
		return b.k.dotQ4Rows
	}
	return nil
}

func (b *Backend) decodeDot(dt backend.DType, x []float32, n, inF int) func(i int, w []byte) float32 {
	k := b.k
	var fd floatDot
	switch dt {
	case backend.Q4_K, backend.Q5_K, backend.Q6_K:
		return b.kquantDot(dt, x, n, inF)
	case backend.Q8_0, backend.Q4_0:
		qd := k.dotQ8
		if dt == backend.Q4_0 {
			qd = k.dotQ4
		}
		if qd == nil {
			break
		}
		nb := inF / qk
		xq, xs := b.quantizeDecodeX(x, n, inF)
		return func(i int, w []byte) float32 {
			return qd(&xq[i*inF], &xs[i*nb], unsafe.SliceData(w), nb)
		}
	case backend.AWQ4G32, backend.AWQ4G64, backend.AWQ4G128:
		if k.dotAWQ4 == nil {
			break
		}
		g := backend.AWQGroup(dt)
		return func(i int, w []byte) float32 {
			return k.dotAWQ4(&x[i*inF], unsafe.SliceData(w), inF/g, g)
		}
	case backend.F8E4M3Row:
		// The format's rows are whole multiples of 16 codes (RowBytes).
		if k.dotF8 == nil || inF%16 != 0 {
			break
		}
		return func(i int, w []byte) float32 {
			return k.dotF8(&x[i*inF], unsafe.SliceData(w), inF) * backend.F8RowScale(w[:inF+16])
		}
	case backend.F32:
		fd = k.dotF32
	case backend.F16:
		fd = k.dotF16
	case backend.BF16:
		fd = k.dotBF16
	}
	ref := fusedDot(dt)
	if fd == nil || inF < k.lanes {
		return func(i int, w []byte) float32 { return ref(x[i*inF:(i+1)*inF], w) }
	}
	vec := inF / k.lanes * k.lanes
	el := dt.BlockBytes()
	return func(i int, w []byte) float32 {
		xr := x[i*inF : (i+1)*inF]
		s := fd(&xr[0], unsafe.Pointer(unsafe.SliceData(w)), vec)
		if vec < inF {
			s += ref(xr[vec:], w[vec*el:])
		}
		return s
	}
}

// qPanelBlockBytes is the size of one block of a packed int8 panel per
// feature: 32 weights and an f32 scale.
const qPanelBlockBytes = qk + 4

// gemmQ computes out = x . w^T for Q8_0 and Q4_0 weights as llama.cpp
// does: the x rows are quantized to int8 per 32-element block once, each
// panel of nr weight rows is repacked as int8 (packQPanel), and the
// integer micro-kernels sum each block exactly in int32 and apply both
// block scales in f32. The result differs from the f32 product by at most
// sum over blocks of d_x/2 * sum|w| (quantizeQ8). Jobs are cut as in gemm.
func (b *Backend) gemmQ(out, x []float32, w *tensor, n, inF, outF int) {
	nr, mr := b.k.nrQ, len(b.k.gemmQ)
	nb := inF / qk
	xq, xm := b.quantizeRows(x, n, inF)
	panels, rowBlocks, rowsPer := b.gemmJobs(n, outF, nr, mr)
	rowBytes := w.rowBytes()
	panelFloats := nb * nr * qPanelBlockBytes / 4
	b.parallel(panels*rowBlocks, 1, func(worker, lo, hi int) {
		buf := b.floatScratch(worker, panelFloats+mr*nr)
		panel := unsafe.Slice((*byte)(unsafe.Pointer(&buf[0])), 4*panelFloats)
		edge := buf[panelFloats:]
		packed := -1
		for job := lo; job < hi; job++ {
			p, rb := job/rowBlocks, job%rowBlocks
			o0 := p * nr
			cols := min(nr, outF-o0)
			if p != packed {
				packQPanel(panel, w, rowBytes, o0, cols, nr, nb, b.k.qFlip)
				packed = p
			}
			i0, i1 := rb*rowsPer, min(n, (rb+1)*rowsPer)
			for i := i0; i < i1; i += mr {
				m := min(mr, i1-i)
				a, meta := &xq[i*inF], &xm[2*i*nb]
				if cols == nr {
					b.k.gemmQ[m-1](a, uintptr(inF), meta, uintptr(8*nb), &panel[0], &out[i*outF+o0], uintptr(4*outF), nb)
					continue
				}
				b.k.gemmQ[m-1](a, uintptr(inF), meta, uintptr(8*nb), &panel[0], &edge[0], uintptr(4*nr), nb)
				for r := range m {
					copy(out[(i+r)*outF+o0:(i+r)*outF+o0+cols], edge[r*nr:r*nr+cols])
				}
			}
		}
	})
}

// quantizeRows quantizes the n rows of x (inF a multiple of 32) as
// quantizeQ8 does (through the set's kernel where it has one), spread
// over the workers, into b.xq, and writes b.xm: per row and
// block the scale's f32 bits and -128 times the block's sum of q, the
// correction for the kernels' unsigned weights (w+128).
func (b *Backend) quantizeRows(x []float32, n, inF int) ([]int8, []uint32) {
	nb := inF / qk
	if cap(b.xq) < n*inF {
		b.xq = make([]int8, n*inF)
	}
	if cap(b.xs) < n*nb {
		b.xs = make([]float32, n*nb)
	}
	if cap(b.xm) < 2*n*nb {
		b.xm = make([]uint32, 2*n*nb)
	}
	xq, xs, xm := b.xq[:n*inF], b.xs[:n*nb], b.xm[:2*n*nb]
	b.parallel(n, b.grainFor(n, minWork/(64*inF)), func(_, lo, hi int) {
		if b.k.quantRows != nil {
			b.k.quantRows(&x[lo*inF], &xq[lo*inF], &xm[2*lo*nb], (hi-lo)*nb)
			return
		}
		quantizeQ8(x[lo*inF:hi*inF], xq[lo*inF:hi*inF], xs[lo*nb:hi*nb])
		for blk := lo * nb; blk < hi*nb; blk++ {
			var sum int32
			for _, v := range xq[blk*qk : blk*qk+qk] {
				sum += int32(v)
			}
			xm[2*blk] = math.Float32bits(xs[blk])
			xm[2*blk+1] = uint32(-128 * sum)
		}
	})
	return xq, xm
}

// packQPanel writes weight rows o0..o0+cols-1 (Q8_0 or Q4_0, nb blocks)
// into panel for the int8 kernels: per block, 8 groups of nr features x 4
// consecutive weights as the byte w+flip (0x80: unsigned w+128 for
// vpdpbusd; 0: signed), then the nr block scales as f32. Features from
// cols to nr get zero scales, so they contribute nothing.
func packQPanel(panel []byte, w *tensor, rowBytes, o0, cols, nr, nb int, flip byte) {
	if w.dt == backend.Q4_K || w.dt == backend.Q5_K {
		packKPanel(panel, w, rowBytes, o0, cols, nr, nb, flip)
		return
	}
	f16 := backend.F16Table()
	blkBytes := w.dt.BlockBytes()
	stride := nr * qPanelBlockBytes
	// Four weights at a time as one little-endian word; a Q4_0 nibble n
	// becomes n+0x78 = (n-8)+128 in each byte (no carry between bytes),
	// and xoring bit 7 then removes the 128 where flip is 0.
	flip32 := uint32(flip) * 0x01010101
	q4fix := flip32 ^ 0x80808080
	le := binary.LittleEndian
	for j := range nr {
		if j >= cols {
			for blk := range nb {
				base := blk*stride + 4*j
				for grp := range 8 {
					le.PutUint32(panel[base+grp*4*nr:], 0)
				}
				le.PutUint32(panel[base+qk*nr:], 0)
			}
			continue
		}
		row := w.data[(o0+j)*rowBytes : (o0+j+1)*rowBytes]
		for blk := range nb {
			src := row[blk*blkBytes : (blk+1)*blkBytes]
			d := f16[le.Uint16(src)]
			q := src[2:]
			base := blk*stride + 4*j
			if w.dt == backend.Q8_0 {
				for grp := range 8 {
					le.PutUint32(panel[base+grp*4*nr:], le.Uint32(q[4*grp:])^flip32)
				}
			} else {
				// Byte t holds weights t (low nibble) and t+16.
				for grp := range 4 {
					v := le.Uint32(q[4*grp:])
					le.PutUint32(panel[base+grp*4*nr:], (v&0x0f0f0f0f+0x78787878)^q4fix)
					le.PutUint32(panel[base+(grp+4)*4*nr:], (v>>4&0x0f0f0f0f+0x78787878)^q4fix)
				}
			}
			le.PutUint32(panel[base+qk*nr:], math.Float32bits(d))
		}
	}
}
