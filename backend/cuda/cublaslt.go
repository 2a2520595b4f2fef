package cuda

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// cuBLASLt constants (cublasLt.h, library_types.h).
const (
	cublasCompute32F         = 68
	cudaR32F                 = 0
	cudaR16F                 = 2
	cudaR16BF                = 14
	cublasOpN                = 0
	cublasOpT                = 1
	ltDescTransA             = 3
	ltDescTransB             = 4
	ltPrefMaxWorkspaceBytes  = 1
	ltHeuristicResultBytes   = 96 // algo [64]byte, workspaceSize u64, state i32, waves f32, reserved [4]i32
	ltWorkspaceBytes         = 32 << 20
	cublasStatusNotSupported = 15
)

// The FP8 scale attributes of cublasLtMatmulDescAttributes_t and the
// outer-vector mode of cublasLtMatmulMatrixScale_t (cuBLASLt 12.9 and
// later): with A's and B's modes both outer-vector, the A scale is an f32
// vector over op(A)'s M rows and the B scale one over op(B)'s N columns,
// D[i,j] = alpha * scaleA[i] * scaleB[j] * sum_l op(A)[i,l] op(B)[l,j].
const (
	ltDescAScalePointer = 17
	ltDescBScalePointer = 18
	ltDescAScaleMode    = 31
	ltDescBScaleMode    = 32
	ltScaleOuterVec32F  = 3
)

var cublasStatusNames = map[int]string{
	1: "CUBLAS_STATUS_NOT_INITIALIZED", 3: "CUBLAS_STATUS_ALLOC_FAILED", 7: "CUBLAS_STATUS_INVALID_VALUE",
	8: "CUBLAS_STATUS_ARCH_MISMATCH", 11: "CUBLAS_STATUS_MAPPING_ERROR", 13: "CUBLAS_STATUS_EXECUTION_FAILED",
	14: "CUBLAS_STATUS_INTERNAL_ERROR", 15: "CUBLAS_STATUS_NOT_SUPPORTED", 16: "CUBLAS_STATUS_LICENSE_ERROR",
}

// lt holds the cuBLASLt entry points.
type lt struct {
	create, destroy, descCreate, descDestroy, descSetAttr             uintptr
	layoutCreate, layoutDestroy, prefCreate, prefDestroy, prefSetAttr uintptr
	heuristic, matmul                                                 uintptr
	version                                                           uintptr // cublasLtGetVersion: major*10000 + minor*100 + patch
}

var (
	ltOnce sync.Once
	ltLib  *lt
	ltErr  error
)

func loadLt() (*lt, error) {
	ltOnce.Do(func() {
		h, path, err := openLib("libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so")
		if err != nil {
			ltErr = err
			return
		}
		l := &lt{}
		ltErr = symbols(h, path, map[string]*uintptr{
			"cublasLtCreate":                       &l.create,
			"cublasLtDestroy":                      &l.destroy,
			"cublasLtMatmulDescCreate":             &l.descCreate,
			"cublasLtMatmulDescDestroy":            &l.descDestroy,
			"cublasLtMatmulDescSetAttribute":       &l.descSetAttr,
			"cublasLtMatrixLayoutCreate":           &l.layoutCreate,
			"cublasLtMatrixLayoutDestroy":          &l.layoutDestroy,
			"cublasLtMatmulPreferenceCreate":       &l.prefCreate,
			"cublasLtMatmulPreferenceDestroy":      &l.prefDestroy,
			"cublasLtMatmulPreferenceSetAttribute": &l.prefSetAttr,
			"cublasLtMatmulAlgoGetHeuristic":       &l.heuristic,
			"cublasLtMatmul":                       &l.matmul,
			"cublasLtGetVersion":                   &l.version,
		})
		if ltErr == nil {
			ltLib = l
		}
	})
	return ltLib, ltErr
}

// call invokes a cuBLASLt entry point (uintptrescapes: see driver.call).
//
//go:uintptrescapes
func (l *lt) call(fn uintptr, args ...uintptr) int {
	r, _, _ := purego.SyscallN(fn, args...)
	return int(int32(r))
}

func (l *lt) check(name string, res int) error {
	if res == 0 {
		return nil
	}
	n, ok := cublasStatusNames[res]
	if !ok {
		n = fmt.Sprintf("cublasStatus(%d)", res)
	}
	return &CUDAError{Call: name, Code: res, Name: n}
}

// gemmKey identifies a cached cuBLASLt plan: y[n,m] = x[n,k] . w[m,k]^T
// with the given cudaDataType of w, x and y.
type gemmKey struct {
	m, n, k    int
	wt, xt, yt int
}

// gemmPlan is a cuBLASLt operation description and the algorithm the
// heuristic chose for it, kept for the life of the backend so the per-step
// path makes one cublasLtMatmul call and nothing else.
type gemmPlan struct {
	desc, a, b, d uintptr
	algo          []byte // the heuristic result's cublasLtMatmulAlgo_t (64 bytes), in pinned memory
	slot          int    // algo's slot in blas.scalars
	workspace     uint64
	// candidates holds the heuristic's results (ltHeuristicResultBytes
	// each) until the plan is tuned; nil once it is, or when not tuned.
	candidates []byte
	// gemv, when set by the tuner, is the own GEMV variant that beat
	// cuBLASLt on this shape (decode products of at most gemvMaxRows rows).
	gemv gemvConfig
	// gemvBest is the fastest GEMV variant the tuner timed, whether or not
	// it beat cuBLASLt: what fused products of the shape run (fusedGEMV).
	gemvBest gemvConfig
	// bulk, when set by the tuner, is the bulk-copy GEMV variant
	// (kernels/gemv_bulk.cu) that beat the other choices; bulkBest is the
	// fastest it timed and bulkMs that time.
	bulk, bulkBest bulkConfig
	bulkMs         float32
	// pinned is the GEMV variant FusedQKVRoPE ran for the shape instead
	// of the tuner's choice (Tuning.QKVGEMV), for reports; zero if none.
	pinned gemvConfig
	// tunedMs and gemvMs are the tuner's best times (cuBLASLt's kept
	// algorithm, the fastest GEMV variant), for reports; 0 until tuned.
	tunedMs, gemvMs float32
}

// Products of at most Tuning.TuneMaxRows rows (decode steps, where one
// product streams a whole weight matrix) are tuned: the heuristic's first
// tuneAlgos results are timed on the first eager call (until EndTuning)
// and the fastest is kept, since the heuristic's first choice for a
// decode shape can be a split-K algorithm that streams the weight well
// below what the others reach. The heuristic's choice stays unless
// another is tuneMargin faster (timing noise); tuneFlushBytes, written
// before each timed run, evicts the weight from L2 (over twice the L2 of
// the largest GPUs it runs on).
const (
	tuneAlgos      = 8
	tuneFlushBytes = 128 << 20
	tuneMargin     = 0.03
)

// blas is the per-backend cuBLASLt state. It is owned by the CUDA thread.
type blas struct {
	lib       *lt
	handle    uintptr
	pref      uintptr
	workspace uint64 // device buffer of ltWorkspaceBytes
	plans     map[gemmKey]*gemmPlan
	// scalars is pinned host memory: alpha = 1 at 0, beta = 0 at 4, then
	// the algo structs of the plans, in slots of 64 bytes: slots 1..used
	// have been handed out, free lists those given back.
	scalars []byte
	used    int
	free    []int
}

// drop destroys key's plan and removes it from the cache; its algorithm
// slot is the caller's to reuse.
func (g *blas) drop(key gemmKey) {
	p := g.plans[key]
	g.lib.call(g.lib.layoutDestroy, p.a)
	g.lib.call(g.lib.layoutDestroy, p.b)
	g.lib.call(g.lib.layoutDestroy, p.d)
	g.lib.call(g.lib.descDestroy, p.desc)
	delete(g.plans, key)
}

func (g *blas) close() {
	for key := range g.plans {
		g.drop(key)
	}
	g.plans, g.used, g.free = nil, 0, nil
	if g.pref != 0 {
		g.lib.call(g.lib.prefDestroy, g.pref)
		g.pref = 0
	}
	if g.handle != 0 {
		g.lib.call(g.lib.destroy, g.handle)
		g.handle = 0
	}
}

// plan returns the cached plan for key, creating descriptors and running
// the heuristic on first use: its first tuneAlgos candidates, kept for
// the tuner, where the product has at most tuneMaxRows rows.
func (g *blas) plan(key gemmKey, algoMem []byte, tuneMaxRows int) (*gemmPlan, error) {
	if p, ok := g.plans[key]; ok {
		return p, nil
	}
	l := g.lib
	p := &gemmPlan{}
	fail := func(err error) (*gemmPlan, error) {
		if p.a != 0 {
			l.call(l.layoutDestroy, p.a)
		}
		if p.b != 0 {
			l.call(l.layoutDestroy, p.b)
		}
		if p.d != 0 {
			l.call(l.layoutDestroy, p.d)
		}
		if p.desc != 0 {
			l.call(l.descDestroy, p.desc)
		}
		return nil, fmt.Errorf("cuBLASLt plan m=%d n=%d k=%d: %w", key.m, key.n, key.k, err)
	}
	if err := l.check("cublasLtMatmulDescCreate", l.call(l.descCreate, uintptr(unsafe.Pointer(&p.desc)), cublasCompute32F, cudaR32F)); err != nil {
		return fail(err)
	}
	transA, transB := int32(cublasOpT), int32(cublasOpN)
	if err := l.check("cublasLtMatmulDescSetAttribute", l.call(l.descSetAttr, p.desc, ltDescTransA, uintptr(unsafe.Pointer(&transA)), 4)); err != nil {
		return fail(err)
	}
	if err := l.check("cublasLtMatmulDescSetAttribute", l.call(l.descSetAttr, p.desc, ltDescTransB, uintptr(unsafe.Pointer(&transB)), 4)); err != nil {
		return fail(err)
	}
	// Column-major view: W row-major [m,k] is col-major k x m (ld k), used
	// transposed; x row-major [n,k] is col-major k x n (ld k); y row-major
	// [n,m] is col-major m x n (ld m).
	if err := l.check("cublasLtMatrixLayoutCreate", l.call(l.layoutCreate, uintptr(unsafe.Pointer(&p.a)), uintptr(key.wt), uintptr(key.k), uintptr(key.m), uintptr(key.k))); err != nil {
		return fail(err)
	}
	if err := l.check("cublasLtMatrixLayoutCreate", l.call(l.layoutCreate, uintptr(unsafe.Pointer(&p.b)), uintptr(key.xt), uintptr(key.k), uintptr(key.n), uintptr(key.k))); err != nil {
		return fail(err)
	}
	if err := l.check("cublasLtMatrixLayoutCreate", l.call(l.layoutCreate, uintptr(unsafe.Pointer(&p.d)), uintptr(key.yt), uintptr(key.m), uintptr(key.n), uintptr(key.m))); err != nil {
		return fail(err)
	}
	var res [tuneAlgos * ltHeuristicResultBytes]byte
	var count int32
	want := 1
	if key.n <= tuneMaxRows {
		want = tuneAlgos
	}
	if err := l.check("cublasLtMatmulAlgoGetHeuristic", l.call(l.heuristic, g.handle, p.desc, p.a, p.b, p.d, p.d, g.pref, uintptr(want),
		uintptr(unsafe.Pointer(&res[0])), uintptr(unsafe.Pointer(&count)))); err != nil {
		return fail(err)
	}
	if count > 1 {
		p.candidates = append([]byte(nil), res[:int(count)*ltHeuristicResultBytes]...)
	}
	if count < 1 {
		return fail(&CUDAError{Call: "cublasLtMatmulAlgoGetHeuristic", Code: cublasStatusNotSupported, Name: "no algorithm"})
	}
	p.algo = algoMem[:64]
	copy(p.algo, res[:64])
	p.workspace = *(*uint64)(unsafe.Pointer(&res[64]))
	if p.workspace > ltWorkspaceBytes {
		return fail(fmt.Errorf("heuristic wants %d workspace bytes, have %d", p.workspace, ltWorkspaceBytes))
	}
	g.plans[key] = p
	return p, nil
}
