package bench

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/model"
)

// chunkElems is the unit of parallel generation: each chunk of a tensor
// draws from its own generator seeded by (tensor, chunk index), so the bytes
// do not depend on how many goroutines made them. A multiple of the
// quantization blocks (32, and the K-quants' 256).
const chunkElems = 1 << 16

// SyntheticWeights returns deterministic random weights of cfg's shapes,
// generated on first use of each tensor (Tensor) and kept until Close, so a
// benchmark needs no checkpoint and no download.
//
// Projections and embeddings are stored in dt (BF16, F16, F32, Q8_0,
// Q4_0 or a K-quant) with roughly normal values of standard deviation 1/sqrt(fan_in),
// which keeps activations of every layer at unit scale; norm weights are
// 1 + N(0, 0.05^2) and biases N(0, 0.02^2), stored as BF16 (F32/F16 when dt
// is). The same (cfg, dt, seed) gives the same bytes on every machine.
//
// Element i of a tensor is backend.SyntheticValue(tensor seed, i, mean,
// std). The weights are a model.Filler: on a backend.RandomFiller (the
// CUDA and CPU backends) the model constructor has the backend make BF16
// and F32 matrices in place, so an 8B model is never generated or held on the
// host nor copied over PCIe; the bytes are the same as Tensor's, which
// makes them on the host on every core (norms, biases, quantized dtypes
// and backends without FillNormal).
func SyntheticWeights(cfg model.Config, dt backend.DType, seed uint64) (model.Weights, error) {
	return newSynthetic(cfg, dt, seed, runtime.GOMAXPROCS(0))
}

// synthTensor is one tensor's recipe and, once made, its bytes.
type synthTensor struct {
	spec model.WeightSpec
	dt   backend.DType
	std  float64 // of the random part
	mean float64 // added to every value (1 for norm weights)
	once sync.Once
	data []byte
	err  error
}

// synthWeights implements model.Weights over generated tensors.
type synthWeights struct {
	seed    uint64
	workers int
	mu      sync.Mutex // guards tensors against Close
	tensors map[string]*synthTensor
	names   []string
}

func newSynthetic(cfg model.Config, dt backend.DType, seed uint64, workers int) (*synthWeights, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("synthetic weights: %w", err)
	}
	var small backend.DType // dtype of norms and biases
	switch dt {
	case backend.BF16, backend.Q8_0, backend.Q4_0, backend.Q4_K, backend.Q5_K, backend.Q6_K:
		small = backend.BF16
	case backend.F32, backend.F16:
		small = dt
	default:
		return nil, fmt.Errorf("synthetic weights: dtype %v not supported (BF16, F16, F32, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K)", dt)
	}
	w := &synthWeights{seed: seed, workers: max(1, workers), tensors: map[string]*synthTensor{}}
	for _, s := range model.ExpectedWeights(cfg) {
		t := &synthTensor{spec: s, dt: small}
		switch {
		case s.Matrix:
			t.dt = dt
			t.std = 1 / math.Sqrt(float64(s.Shape[len(s.Shape)-1]))
			if inner := s.Shape[len(s.Shape)-1]; inner%dt.BlockSize() != 0 {
				return nil, fmt.Errorf("synthetic weights: %s rows of %d values are not whole %v blocks of %d", s.Name, inner, dt, dt.BlockSize())
			}
		case isNormWeight(s.Name):
			t.mean, t.std = 1, 0.05
		default: // biases
			t.std = 0.02
		}
		if _, err := t.dt.Bytes(s.Shape); err != nil {
			return nil, fmt.Errorf("synthetic weights: %s: %w", s.Name, err)
		}
		w.tensors[s.Name] = t
		w.names = append(w.names, s.Name)
	}
	sort.Strings(w.names)
	return w, nil
}

func isNormWeight(name string) bool {
	for _, suffix := range []string{"norm.weight", "layernorm.weight"} {
		if len(name) >= len(suffix) && name[len(name)-len(suffix):] == suffix {
			return true
		}
	}
	return false
}

// Tensor implements model.Weights; the first call for a name generates it.
// Construction rules out every encoding error, so a tensor that still fails
// to generate is reported missing (ValidateWeights then names it).
func (w *synthWeights) Tensor(name string) (model.Weight, bool) {
	w.mu.Lock()
	t, ok := w.tensors[name]
	w.mu.Unlock()
	if !ok {
		return model.Weight{}, false
	}
	t.once.Do(func() { t.data, t.err = w.generate(t) })
	if t.err != nil {
		return model.Weight{}, false
	}
	return model.Weight{Name: name, DType: t.dt, Shape: append([]int(nil), t.spec.Shape...), Data: t.data}, true
}

// Spec implements model.Filler.
func (w *synthWeights) Spec(name string) (backend.DType, []int, bool) {
	w.mu.Lock()
	t, ok := w.tensors[name]
	w.mu.Unlock()
	if !ok {
		return 0, nil, false
	}
	return t.dt, append([]int(nil), t.spec.Shape...), true
}

// Fill implements model.Filler: BF16 and F32 tensors on a
// backend.RandomFiller, with the values Tensor would make.
func (w *synthWeights) Fill(b backend.Backend, name string, dst backend.Tensor) (bool, error) {
	rf, ok := b.(backend.RandomFiller)
	w.mu.Lock()
	t, known := w.tensors[name]
	w.mu.Unlock()
	if !ok || !known || (t.dt != backend.BF16 && t.dt != backend.F32) {
		return false, nil
	}
	n, err := backend.NumElements(t.spec.Shape)
	if err != nil {
		return false, err
	}
	if dst.DType() != t.dt {
		return false, fmt.Errorf("synthetic weights: fill %s: destination is %v, the tensor %v", name, dst.DType(), t.dt)
	}
	if m, err := backend.NumElements(dst.Shape()); err != nil || m != n {
		return false, fmt.Errorf("synthetic weights: fill %s: destination %v holds %d elements, the tensor %d", name, dst.Shape(), m, n)
	}
	if err := rf.FillNormal(dst, w.tensorSeed(name), float32(t.mean), float32(t.std)); err != nil {
		return false, fmt.Errorf("synthetic weights: fill %s: %w", name, err)
	}
	return true, nil
}

// FillShard implements model.ShardFiller: a [rows, cols] piece at (row0,
// col0) of a BF16 or F32 tensor, seeded by the tensor's seed and the
// piece's corner (the whole tensor's seed at (0, 0)).
func (w *synthWeights) FillShard(b backend.Backend, name string, dst backend.Tensor, row0, col0 int) (bool, error) {
	rf, ok := b.(backend.RandomFiller)
	w.mu.Lock()
	t, known := w.tensors[name]
	w.mu.Unlock()
	if !ok || !known || (t.dt != backend.BF16 && t.dt != backend.F32) {
		return false, nil
	}
	full, shape := t.spec.Shape, dst.Shape()
	if dst.DType() != t.dt || len(full) != 2 || len(shape) != 2 || row0 < 0 || col0 < 0 ||
		row0+shape[0] > full[0] || col0+shape[1] > full[1] {
		return false, fmt.Errorf("synthetic weights: fill %s: a %v %v piece at (%d, %d) of %v %v", name, dst.DType(), shape, row0, col0, t.dt, full)
	}
	seed := w.tensorSeed(name)
	if row0 != 0 || col0 != 0 {
		seed = splitmix(seed ^ splitmix(uint64(row0)<<32|uint64(col0)))
	}
	if err := rf.FillNormal(dst, seed, float32(t.mean), float32(t.std)); err != nil {
		return false, fmt.Errorf("synthetic weights: fill %s: %w", name, err)
	}
	return true, nil
}

// Names implements model.Weights.
func (w *synthWeights) Names() []string { return append([]string(nil), w.names...) }

// Close drops the generated bytes. Tensors handed out must no longer be used.
func (w *synthWeights) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.tensors = map[string]*synthTensor{}
	w.names = nil
	return nil
}

// tensorSeed mixes the run's seed with the tensor's name, so each tensor has
// its own stream and adding a tensor does not shift the others.
func (w *synthWeights) tensorSeed(name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return splitmix(w.seed ^ splitmix(h.Sum64()))
}

// generate fills one tensor chunk by chunk on w.workers goroutines.
func (w *synthWeights) generate(t *synthTensor) ([]byte, error) {
	n, err := backend.NumElements(t.spec.Shape)
	if err != nil {
		return nil, err
	}
	size, err := t.dt.Bytes(t.spec.Shape)
	if err != nil {
		return nil, err
	}
	data := make([]byte, size)
	seed := w.tensorSeed(t.spec.Name)
	chunks := (n + chunkElems - 1) / chunkElems
	var next atomic.Int64
	var wg sync.WaitGroup
	var firstErr error
	var errOnce sync.Once
	for range min(w.workers, chunks) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			vals := make([]float32, chunkElems)
			for {
				c := int(next.Add(1) - 1)
				if c >= chunks {
					return
				}
				lo := c * chunkElems
				m := min(chunkElems, n-lo)
				for j := range m {
					vals[j] = backend.SyntheticValue(seed, int64(lo+j), float32(t.mean), float32(t.std))
				}
				if err := encodeChunk(data, t.dt, lo, vals[:m]); err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return nil, fmt.Errorf("generate %s: %w", t.spec.Name, firstErr)
	}
	return data, nil
}

// encodeChunk writes vals, the elements [lo, lo+len(vals)) of a tensor, in
// dt's encoding into data. Quantized chunks start on a block boundary
// (chunkElems is a multiple of 32 and rows are whole blocks), so a chunk's
// blocks are contiguous in the row-major block layout.
func encodeChunk(data []byte, dt backend.DType, lo int, vals []float32) error {
	le := binary.LittleEndian
	switch dt {
	case backend.F32:
		for i, v := range vals {
			le.PutUint32(data[4*(lo+i):], math.Float32bits(v))
		}
	case backend.BF16:
		for i, v := range vals {
			le.PutUint16(data[2*(lo+i):], backend.F32ToBF16(v))
		}
	case backend.F16:
		for i, v := range vals {
			le.PutUint16(data[2*(lo+i):], backend.F32ToF16(v))
		}
	case backend.Q8_0, backend.Q4_0, backend.Q4_K, backend.Q5_K, backend.Q6_K:
		q, err := backend.Quantize(dt, vals)
		if err != nil {
			return err
		}
		copy(data[lo/dt.BlockSize()*dt.BlockBytes():], q)
	default:
		return errors.New("unsupported dtype " + dt.String())
	}
	return nil
}

// fillNormal writes mean + std*z to vals, z roughly standard normal: the
// sum of four 16-bit uniforms (Irwin-Hall, variance 1/3) rescaled. It is
// bounded at 3.46 sigma, which for random weights is a feature: no
// outliers to overflow low-precision formats. The stream is a splitmix64
// sequence seeded by (seed, chunk).
func fillNormal(vals []float32, seed, chunk uint64, mean, std float64) {
	state := splitmix(seed ^ (chunk+1)*0x9e3779b97f4a7c15)
	const inv = 1.0 / 65536
	scale := std * math.Sqrt(3)
	for i := range vals {
		state += 0x9e3779b97f4a7c15
		r := mixBits(state)
		s := float64(r&0xffff) + float64(r>>16&0xffff) + float64(r>>32&0xffff) + float64(r>>48)
		// Each uniform is (k+0.5)/65536 so the sum is symmetric around 2.
		z := (s+2)*inv - 2
		vals[i] = float32(mean + scale*z)
	}
}

// splitmix is one step of splitmix64 from x.
func splitmix(x uint64) uint64 { return mixBits(x + 0x9e3779b97f4a7c15) }

// mixBits is splitmix64's output function.
func mixBits(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// HostOnly hides a model.Filler: the model constructor then uploads every
// tensor from host bytes (`bench latency --weights-on-device=false`, to compare the
// two paths or to step around a device without a working FillNormal).
func HostOnly(w model.Weights) model.Weights { return hostOnly{w} }

type hostOnly struct{ model.Weights }
