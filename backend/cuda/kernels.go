package cuda

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/trigon-llm/trigon/backend"
)

//go:embed kernels/*.cu kernels/*.cuh
var kernelFS embed.FS

// fileParams names, per kernel file, the -D constants a module of that
// file is specialised with, in the order of modSpec.p. The files that
// include kernels/kv.cuh take the KV format's dtype as KV_DT and its
// block size as BS (both from the backend.KVSpec of the call); those that
// read or write quantized caches also its int8 (or int4 V) channel group
// as KV_G (kvGroup). An int4 cache's window is a launch argument, not a
// constant.
var fileParams = map[string][]string{
	"embed":           {"TT", "OT"},
	"norm":            {"XT", "OT", "WT"},
	"act":             {"IT", "OT"},
	"rope":            {"HD", "BS", "QT", "KV_DT", "NT", "KV_G"},
	"attention":       {"HD", "BS", "KV_DT", "GC", "UR"},
	"attn_prefill":    {"HD", "BS", "KV_DT", "BM", "BN", "NW", "QR", "KV_G"},
	"attn_prefill_wg": {"HD", "BS", "KV_DT"},
	"attn_decode":     {"HD", "BS", "KV_DT", "ST", "KV_G"},
	"sample":          {},
	"copy":            {},
	"quant":           {"WT", "OT"},
	"kquant":          {"WT", "OT"},
	"wquant":          {"WT", "OT", "NT"},
	"gemv":            {"NT", "NW", "UR", "OT"},
	"gemv_bulk":       {"NT", "CW", "CK", "ST", "OT", "MB"},
}

// modSpec identifies one compiled module: a kernel file and the values of
// its specialisation constants. It is comparable, so launchers look
// functions up without building strings. p holds as many constants as
// the longest list in fileParams; a file's module uses the first
// len(fileParams[file]) of them and leaves the rest zero, so the -D
// options (and with them the cache key, see compiler.key) name exactly
// the file's constants.
type modSpec struct {
	file string
	p    [8]int
}

func (s modSpec) defines() []string {
	names := fileParams[s.file]
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = fmt.Sprintf("-D%s=%d", n, s.p[i])
	}
	return out
}

func (s modSpec) String() string {
	d := s.defines()
	for i := range d {
		d[i] = strings.TrimPrefix(d[i], "-D")
	}
	return s.file + "(" + strings.Join(d, ",") + ")"
}

// KernelReport describes one module WarmKernels prepared.
type KernelReport struct {
	Name        string        // kernel file and constants, as "attention(HD=128,BS=16,GC=4,UR=4)"
	Options     []string      // NVRTC options
	Arch        string        // target, as "sm_90a"
	CompileTime time.Duration // time to compile, or to load from the cache
	Cached      bool          // loaded from the on-disk cache
}

// compiler turns modSpecs into loadable images. It needs NVRTC but no
// device, so it also runs (and is tested) on machines without a GPU.
type compiler struct {
	nv    *nvrtc
	arch  string
	cubin bool
	cache diskCache
}

func newCompiler(nv *nvrtc, cc int, cacheDir string) (*compiler, error) {
	arch, cubin, err := nv.target(cc)
	if err != nil {
		return nil, err
	}
	return &compiler{nv: nv, arch: arch, cubin: cubin, cache: diskCache{dir: cacheDir}}, nil
}

func (c *compiler) options(s modSpec) []string {
	opts := []string{"--gpu-architecture=" + c.arch, "-std=c++17", "-lineinfo"}
	return append(opts, s.defines()...)
}

// source returns the kernel file's text and the headers it may include.
func source(file string) (string, []header, error) {
	src, err := kernelFS.ReadFile("kernels/" + file + ".cu")
	if err != nil {
		return "", nil, fmt.Errorf("kernel source %s: %w", file, err)
	}
	var hs []header
	names, err := fs.Glob(kernelFS, "kernels/*.cuh")
	if err != nil {
		return "", nil, err
	}
	sort.Strings(names)
	for _, n := range names {
		b, err := kernelFS.ReadFile(n)
		if err != nil {
			return "", nil, err
		}
		hs = append(hs, header{name: strings.TrimPrefix(n, "kernels/"), src: string(b)})
	}
	return string(src), hs, nil
}

// key is the cache key of s: sources, options, target and NVRTC version.
func (c *compiler) key(s modSpec) (string, error) {
	src, hs, err := source(s.file)
	if err != nil {
		return "", err
	}
	parts := []string{src}
	for _, h := range hs {
		parts = append(parts, h.name, h.src)
	}
	parts = append(parts, strings.Join(c.options(s), " "), c.arch, c.nv.version(), fmt.Sprint(c.cubin))
	return cacheKey(parts...), nil
}

// build returns s's image from the cache or, failing that (absent,
// corrupt, or skipCache), from NVRTC, storing the result.
func (c *compiler) build(s modSpec, skipCache bool) (img []byte, cached bool, err error) {
	key, err := c.key(s)
	if err != nil {
		return nil, false, err
	}
	if !skipCache {
		// Absent, corrupt or unreadable entries all mean: compile.
		if img, err := c.cache.load(key); err == nil {
			return img, true, nil
		}
	}
	src, hs, err := source(s.file)
	if err != nil {
		return nil, false, err
	}
	img, _, err = c.nv.compile(s.file+".cu", src, hs, c.options(s), c.cubin)
	if err != nil {
		return nil, false, fmt.Errorf("kernel %v: %w", s, err)
	}
	if !c.cubin {
		img = append(img, 0) // cuModuleLoadData wants NUL-terminated PTX
	}
	// A cache that cannot be written costs compile time, not correctness.
	_ = c.cache.store(key, img)
	return img, false, nil
}

// module is a loaded CUDA module and its functions.
type module struct {
	handle uintptr
	funcs  map[string]uintptr
}

// moduleFor returns the loaded module of s, compiling or reading the cache
// on first use. A cached image the driver rejects is recompiled.
// CUDA thread only.
func (b *Backend) moduleFor(s modSpec) (*module, *KernelReport, error) {
	if m, ok := b.mods[s]; ok {
		return m, nil, nil
	}
	start := time.Now()
	img, cached, err := b.comp.build(s, false)
	if err != nil {
		return nil, nil, err
	}
	h, err := b.loadModule(img)
	if err != nil && cached {
		img, cached, err = b.comp.build(s, true)
		if err == nil {
			h, err = b.loadModule(img)
		}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("load kernel %v: %w", s, err)
	}
	m := &module{handle: h, funcs: map[string]uintptr{}}
	b.mods[s] = m
	rep := &KernelReport{Name: s.String(), Options: b.comp.options(s), Arch: b.comp.arch, CompileTime: time.Since(start), Cached: cached}
	return m, rep, nil
}

func (b *Backend) loadModule(img []byte) (uintptr, error) {
	var h uintptr
	if err := b.d.check("cuModuleLoadData", b.d.call(b.d.cuModuleLoadData, uintptr(unsafe.Pointer(&h)), uintptr(unsafe.Pointer(&img[0])))); err != nil {
		return 0, err
	}
	return h, nil
}

// fnKey names a kernel function of a module.
type fnKey struct {
	mod  modSpec
	name string
}

// fn returns the CUfunction for k. CUDA thread only.
func (b *Backend) fn(k fnKey) (uintptr, error) {
	if f, ok := b.fns[k]; ok {
		return f, nil
	}
	m, _, err := b.moduleFor(k.mod)
	if err != nil {
		return 0, err
	}
	name := cString(k.name)
	var f uintptr
	if err := b.d.check("cuModuleGetFunction", b.d.call(b.d.cuModuleGetFunction, uintptr(unsafe.Pointer(&f)), m.handle, uintptr(unsafe.Pointer(&name[0])))); err != nil {
		return 0, fmt.Errorf("kernel %s in %v: %w", k.name, k.mod, err)
	}
	m.funcs[k.name] = f
	b.fns[k] = f
	if b.pdl && pdlKernels[k.name] {
		if b.pdlFns == nil {
			b.pdlFns = map[uintptr]bool{}
		}
		b.pdlFns[f] = true
	}
	return f, nil
}

// cuFuncAttributeMaxDynamicSharedSizeBytes is CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES.
const cuFuncAttributeMaxDynamicSharedSizeBytes = 8

// fnSmem returns the function k for launches with smem bytes of dynamic
// shared memory. A function may use more than 48 KB only once it opts in,
// so the limit is raised when the function is first fetched (a failure
// forgets the function, so the next call tries again). CUDA thread only.
func (b *Backend) fnSmem(k fnKey, smem int) (uintptr, error) {
	if f, ok := b.fns[k]; ok {
		return f, nil
	}
	f, err := b.fn(k)
	if err != nil {
		return 0, err
	}
	if smem > 48<<10 {
		if err := b.d.check("cuFuncSetAttribute", b.d.call(b.d.cuFuncSetAttribute, f, cuFuncAttributeMaxDynamicSharedSizeBytes, uintptr(smem))); err != nil {
			delete(b.fns, k)
			return 0, fmt.Errorf("%s in %v: %d bytes of shared memory: %w", k.name, k.mod, smem, err)
		}
	}
	return f, nil
}

// warmSpecs lists the modules a typical BF16 model uses with tuning t:
// head dims 64 and 128, the BF16 cache of 16-token blocks the runner
// allocates by default, the GQA group sizes 1..8, and the weight dtypes.
// The KV modules are built by the functions the ops fetch them with, so
// the list names the modules a launch looks up.
func warmSpecs(t tuning) []modSpec {
	bf, f32 := int(dtBF16), int(dtF32)
	kv := backend.PlainKV(backend.BF16, 16)
	specs := []modSpec{
		{file: "embed", p: [8]int{bf, bf}},
		{file: "embed", p: [8]int{int(dtQ8_0), bf}},
		{file: "embed", p: [8]int{int(dtQ4_0), bf}},
		{file: "norm", p: [8]int{bf, bf, bf}},
		{file: "norm", p: [8]int{bf, bf, f32}},
		{file: "act", p: [8]int{bf, bf}},
		{file: "act", p: [8]int{f32, bf}},
		{file: "act", p: [8]int{bf, f32}},
		{file: "sample"},
		{file: "copy"},
		{file: "quant", p: [8]int{int(dtQ8_0), bf}},
		{file: "quant", p: [8]int{int(dtQ4_0), bf}},
		{file: "quant", p: [8]int{int(dtQ8_0), f32}},
		// Q4_K_M files: Q4_K matrices, a Q6_K LM head (or embedding).
		{file: "kquant", p: [8]int{int(backend.Q4_K), bf}},
		{file: "kquant", p: [8]int{int(backend.Q6_K), bf}},
		{file: "kquant", p: [8]int{int(backend.Q6_K), f32}},
		{file: "embed", p: [8]int{int(backend.Q4_K), bf}},
		{file: "embed", p: [8]int{int(backend.Q6_K), bf}},
	}
	// The GEMV variants the decode tuner times: one and two 8-row tiles,
	// BF16 out; one tile with F32 out (logits).
	for _, c := range gemvConfigs {
		specs = append(specs,
			modSpec{file: "gemv", p: [8]int{1, c.nw, c.ur, bf}},
			modSpec{file: "gemv", p: [8]int{2, c.nw, c.ur, bf}},
			modSpec{file: "gemv", p: [8]int{1, c.nw, c.ur, f32}})
	}
	// The bulk-copy GEMV variants (sm_90 kernels, compiled for every
	// architecture: their bodies trap below sm_90, where no launch goes).
	for _, c := range bulkConfigs {
		specs = append(specs, c.spec(1, bf), c.spec(9, bf), c.spec(1, f32))
	}
	for _, hd := range []int{64, 128} {
		specs = append(specs,
			ropeModule(hd, kv, backend.BF16, backend.BF16),
			ropeModule(hd, kv, backend.BF16, backend.F32))
		for _, gc := range []int{1, 2, 4, 8} {
			specs = append(specs, decodeCoreModule(hd, kv, gc, t.decodeUnroll))
		}
		specs = append(specs, prefillTiling(hd).spec(hd, kv), prefillWGModule(hd, kv))
		if st, ok := decodeMMAStages(90, hd, kv, t.decodeStages); ok {
			specs = append(specs, decodeMMAModule(hd, kv, st))
		}
	}
	return specs
}

// PrepareKernels is WarmKernels without the reports: what a server runs
// at load (engine.KernelPreparer).
func (b *Backend) PrepareKernels(ctx context.Context) error {
	_, err := b.WarmKernels(ctx)
	return err
}

// WarmKernels compiles (or loads from the on-disk cache) and loads the
// kernel modules a typical model needs, so the first request does not pay
// for NVRTC. NVRTC runs on all cores in parallel (it needs no context);
// the modules are then loaded on the CUDA thread. It backs the
// `trigon kernels` command.
func (b *Backend) WarmKernels(ctx context.Context) ([]KernelReport, error) {
	specs := warmSpecs(b.tune)
	type result struct {
		img    []byte
		cached bool
		dur    time.Duration
		err    error
	}
	results := make([]result, len(specs))
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	for i, s := range specs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			if err := ctx.Err(); err != nil {
				results[i].err = err
				return
			}
			start := time.Now()
			img, cached, err := b.comp.build(s, false)
			results[i] = result{img: img, cached: cached, dur: time.Since(start), err: err}
		}()
	}
	wg.Wait()
	reps := make([]KernelReport, 0, len(specs))
	for i, s := range specs {
		r := results[i]
		if r.err != nil {
			return reps, r.err
		}
		err := b.call(func() error {
			if _, ok := b.mods[s]; ok {
				return nil
			}
			start := time.Now()
			h, err := b.loadModule(r.img)
			if err != nil && r.cached {
				// A cached image the driver rejects: compile afresh.
				img, _, berr := b.comp.build(s, true)
				if berr != nil {
					return berr
				}
				r.cached = false
				h, err = b.loadModule(img)
			}
			if err != nil {
				return fmt.Errorf("load kernel %v: %w", s, err)
			}
			r.dur += time.Since(start)
			b.mods[s] = &module{handle: h, funcs: map[string]uintptr{}}
			return nil
		})
		if err != nil {
			return reps, err
		}
		reps = append(reps, KernelReport{Name: s.String(), Options: b.comp.options(s), Arch: b.comp.arch, CompileTime: r.dur, Cached: r.cached})
	}
	return reps, nil
}
