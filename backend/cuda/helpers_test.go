package cuda

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/cpu"
)

// pair runs an op on the CPU reference and on the GPU. The CPU gets F32
// activations holding the same bf16-rounded values the GPU gets as BF16;
// weights, caches and indices are the same bytes on both.
type pair struct {
	t   *testing.T
	c   *cpu.Backend
	g   *Backend
	r   *rand.Rand
	gts []backend.Tensor
}

func newPair(t *testing.T) *pair {
	t.Helper()
	return newPairOn(t, sharedBackend(t, true))
}

// newPairOn is newPair with the GPU backend g.
func newPairOn(t *testing.T, g *Backend) *pair {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	t.Logf("random seed %d", seed)
	p := &pair{t: t, c: cpu.New(cpu.Options{}), g: g, r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
	t.Cleanup(func() {
		for _, x := range p.gts {
			g.Free(x)
		}
		if err := g.Sync(); err != nil {
			t.Errorf("sync after test: %v", err)
		}
	})
	return p
}

// normal returns n values ~ N(0, scale^2) rounded to bf16.
func (p *pair) normal(n int, scale float32) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = backend.BF16ToF32(backend.F32ToBF16(float32(p.r.NormFloat64()) * scale))
	}
	return v
}

func encode(dt backend.DType, v []float32) []byte {
	switch dt {
	case backend.F32:
		b := make([]byte, 4*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
		}
		return b
	case backend.BF16, backend.F16:
		b := make([]byte, 2*len(v))
		for i, x := range v {
			h := backend.F32ToBF16(x)
			if dt == backend.F16 {
				h = backend.F32ToF16(x)
			}
			binary.LittleEndian.PutUint16(b[2*i:], h)
		}
		return b
	case backend.Q8_0:
		b, err := backend.QuantizeQ8_0(v)
		if err != nil {
			panic(err)
		}
		return b
	case backend.Q4_0:
		b, err := backend.QuantizeQ4_0(v)
		if err != nil {
			panic(err)
		}
		return b
	case backend.Q4_K, backend.Q5_K, backend.Q6_K:
		b, err := backend.Quantize(dt, v)
		if err != nil {
			panic(err)
		}
		return b
	}
	panic(fmt.Sprintf("encode %v", dt))
}

func i32Bytes(v []int32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(x))
	}
	return b
}

func decode(dt backend.DType, b []byte) []float32 {
	switch dt {
	case backend.F32:
		v := make([]float32, len(b)/4)
		for i := range v {
			v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
		return v
	case backend.BF16, backend.F16:
		v := make([]float32, len(b)/2)
		for i := range v {
			h := binary.LittleEndian.Uint16(b[2*i:])
			if dt == backend.F16 {
				v[i] = backend.F16ToF32(h)
			} else {
				v[i] = backend.BF16ToF32(h)
			}
		}
		return v
	}
	panic(fmt.Sprintf("decode %v", dt))
}

// cpuT uploads data to the CPU backend.
func (p *pair) cpuT(dt backend.DType, shape []int, data []byte) backend.Tensor {
	p.t.Helper()
	t, err := p.c.Upload(dt, shape, data)
	if err != nil {
		p.t.Fatalf("cpu upload %v%v: %v", dt, shape, err)
	}
	return t
}

// gpuT uploads data to the GPU backend.
func (p *pair) gpuT(dt backend.DType, shape []int, data []byte) backend.Tensor {
	p.t.Helper()
	t, err := p.g.Upload(dt, shape, data)
	if err != nil {
		p.t.Fatalf("gpu upload %v%v: %v", dt, shape, err)
	}
	p.gts = append(p.gts, t)
	return t
}

// same uploads identical bytes to both backends.
func (p *pair) same(dt backend.DType, shape []int, data []byte) (backend.Tensor, backend.Tensor) {
	p.t.Helper()
	return p.cpuT(dt, shape, data), p.gpuT(dt, shape, data)
}

// act uploads activation values: F32 to the CPU, gdt (usually BF16) to
// the GPU. vals must already be representable in gdt.
func (p *pair) act(gdt backend.DType, shape []int, vals []float32) (backend.Tensor, backend.Tensor) {
	p.t.Helper()
	return p.cpuT(backend.F32, shape, encode(backend.F32, vals)), p.gpuT(gdt, shape, encode(gdt, vals))
}

// poisoned allocates a GPU tensor filled with NaN (or 0x7fffffff for I32),
// so unwritten outputs show.
func (p *pair) poisoned(dt backend.DType, shape ...int) backend.Tensor {
	p.t.Helper()
	n, err := backend.NumElements(shape)
	if err != nil {
		p.t.Fatal(err)
	}
	size, _ := dt.Bytes(shape)
	buf := make([]byte, size)
	for i := 0; i < n; i++ {
		switch dt {
		case backend.F32, backend.I32:
			binary.LittleEndian.PutUint32(buf[4*i:], 0x7fc00001)
		default:
			binary.LittleEndian.PutUint16(buf[2*i:], 0x7fc1)
		}
	}
	return p.gpuT(dt, shape, buf)
}

// cpuOut allocates an F32 CPU output.
func (p *pair) cpuOut(shape ...int) backend.Tensor {
	p.t.Helper()
	t, err := p.c.Alloc(backend.F32, shape...)
	if err != nil {
		p.t.Fatal(err)
	}
	return t
}

// read returns a tensor of either backend as f32 values.
func read(t *testing.T, b backend.Backend, x backend.Tensor) []float32 {
	t.Helper()
	size, _ := x.DType().Bytes(x.Shape())
	buf := make([]byte, size)
	if err := b.Read(x, buf); err != nil {
		t.Fatalf("%s read: %v", b.Name(), err)
	}
	return decode(x.DType(), buf)
}

func readBytes(t *testing.T, b backend.Backend, x backend.Tensor) []byte {
	t.Helper()
	size, _ := x.DType().Bytes(x.Shape())
	buf := make([]byte, size)
	if err := b.Read(x, buf); err != nil {
		t.Fatalf("%s read: %v", b.Name(), err)
	}
	return buf
}

// relErr is ||got - want|| / ||want||, computed in f64. A NaN in got
// (an element the kernel never wrote, or a real NaN) is an error.
func relErr(got, want []float32) (float64, error) {
	if len(got) != len(want) {
		return 0, fmt.Errorf("%d values, want %d", len(got), len(want))
	}
	var num, den float64
	for i := range got {
		if math.IsNaN(float64(got[i])) || math.IsInf(float64(got[i]), 0) {
			return 0, fmt.Errorf("element %d is %v (want %v): not written or not finite", i, got[i], want[i])
		}
		d := float64(got[i]) - float64(want[i])
		num += d * d
		den += float64(want[i]) * float64(want[i])
	}
	if den == 0 {
		return math.Sqrt(num), nil
	}
	return math.Sqrt(num / den), nil
}

// bf16Tol is the relative norm error allowed for bf16 outputs of f32
// accumulations on the same bf16 inputs.
const bf16Tol = 1e-2

func (p *pair) expectClose(what string, got, want []float32, tol float64) {
	p.t.Helper()
	e, err := relErr(got, want)
	if err != nil {
		p.t.Fatalf("%s: %v", what, err)
	}
	if e > tol {
		p.t.Fatalf("%s: relative error %.3g > %.3g", what, e, tol)
	}
	p.t.Logf("%s: relative error %.3g", what, e)
}

func (p *pair) must(what string, err error) {
	p.t.Helper()
	if err != nil {
		p.t.Fatalf("%s: %v", what, err)
	}
}

// The fused kernels as single calls, for the kernel tests: plan as the
// lowering does, then queue the run with the early attribute the
// lowering gives them before their usual successors. false: the planner
// declined (nothing queued).

func (b *Backend) fusedQKVRoPE(x, w, bias backend.Tensor, a backend.RoPEArgs) (bool, error) {
	p, ok, err := b.planQKVRoPE(x, w, bias, a)
	if err != nil || !ok {
		return false, err
	}
	return true, b.post(func() error { return b.runQKVRoPE(&p, true) })
}

func (b *Backend) matMulAdd(resid, x, w backend.Tensor) (bool, error) {
	p, ok, err := b.planMatMulAdd(resid, x, w)
	if err != nil || !ok {
		return false, err
	}
	return true, b.post(func() error { return b.runMatMulAdd(&p) })
}

func (b *Backend) gateUpSiLU(out, x, w backend.Tensor) (bool, error) {
	p, ok, err := b.planGateUpSiLU(out, x, w)
	if err != nil || !ok {
		return false, err
	}
	return true, b.post(func() error { return b.runGateUpSiLU(&p, true) })
}

// kvOf is the spec of the plain head-major cache k is a pool of: its
// dtype, and its block size from its shape [blocks, heads, blockSize, dim].
func kvOf(k backend.Tensor) backend.KVSpec {
	return backend.PlainKV(k.DType(), k.Shape()[2])
}
