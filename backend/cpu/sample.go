package cpu

import (
	"fmt"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/samplerule"
)

// Sample implements backend.Backend with samplerule.Pick, one row per worker.
//
//	Logits [n, vocab] F32
func (b *Backend) Sample(a backend.SampleArgs) ([]int32, error) {
	const op = "sample"
	lt, err := tensorOf(op, "Logits", a.Logits)
	if err != nil {
		return nil, err
	}
	dims, err := backend.CheckSample(a)
	if err != nil {
		return nil, opErr(err)
	}
	n, vocab := dims.N, dims.Vocab
	lv := lt.f32()
	ids := make([]int32, n)
	errs := make([]error, n)
	b.parallel(n, 1, func(w, lo, hi int) {
		for i := lo; i < hi; i++ {
			ids[i], errs[i] = samplerule.Pick(lv[i*vocab:(i+1)*vocab], a.Rows[i], &b.samplers[w])
		}
	})
	for i, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("cpu: sample row %d: %w", i, err)
		}
	}
	return ids, nil
}

var _ backend.DeviceSampler = (*Backend)(nil)

// SampleTo implements backend.DeviceSampler: Sample, then the ids written
// into ids [n] I32. The CPU backend runs ops as they are called, so
// nothing is left to wait for.
func (b *Backend) SampleTo(ids backend.Tensor, a backend.SampleArgs) error {
	const op = "sampleto"
	it, err := tensorOf(op, "ids", ids)
	if err != nil {
		return err
	}
	if err := backend.CheckDType(op, "ids", it, backend.I32); err != nil {
		return opErr(err)
	}
	if err := backend.CheckShape(op, "ids", it, len(a.Rows)); err != nil {
		return opErr(err)
	}
	picked, err := b.Sample(a)
	if err != nil {
		return err
	}
	copy(it.i32(), picked)
	return nil
}

// ReadAsync implements backend.DeviceSampler: the read happens now; wait
// only reports its error.
func (b *Backend) ReadAsync(t backend.Tensor, dst []byte) (func() error, error) {
	if len(dst) > backend.MaxAsyncRead {
		return nil, backend.ShapeError("cpu: readasync", "dst", "%d bytes, at most %d", len(dst), backend.MaxAsyncRead)
	}
	err := b.Read(t, dst)
	return func() error { return err }, nil
}
