package cpu

import (
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
	panels := (outF + nr - 1) / nr
	rowBlocks := 1
	if panels < 4*b.threads {
		rowBlocks = max(1, min((4*b.threads+panels-1)/panels, n/gemmMinRowsPerJob))
	}
	rowsPer := (n + rowBlocks - 1) / rowBlocks
	rowsPer = (rowsPer + mr - 1) / mr * mr
	rowBlocks = (n + rowsPer - 1) / rowsPer
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
func (b *Backend) decodeDot(dt backend.DType, x []float32, n, inF int) func(i int, w []byte) float32 {
	k := b.k
	var fd floatDot
	switch dt {
	case backend.Q8_0, backend.Q4_0:
		qd := k.dotQ8
		if dt == backend.Q4_0 {
			qd = k.dotQ4
		}
		if qd == nil {
			break
		}
		nb := inF / qk
		if cap(b.xq) < n*inF {
			b.xq, b.xs = make([]int8, n*inF), make([]float32, n*nb)
		}
		xq, xs := b.xq[:n*inF], b.xs[:n*nb]
		quantizeQ8(x[:n*inF], xq, xs)
		return func(i int, w []byte) float32 {
			return qd(&xq[i*inF], &xs[i*nb], unsafe.SliceData(w), nb)
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
