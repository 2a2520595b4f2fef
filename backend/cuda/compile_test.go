package cuda

import (
	"errors"
	"io/fs"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/trigon-llm/trigon/backend"
)

// testCompiler returns a compiler for the device's architecture when a GPU
// is present, otherwise for the newest architecture NVRTC supports up to
// Hopper, so kernels are compile-checked on machines with NVRTC but no GPU.
func testCompiler(t *testing.T, dir string) *compiler {
	t.Helper()
	nv, err := loadNVRTC()
	if err != nil {
		t.Skipf("NVRTC not available, kernels not compiled: %v", err)
	}
	cc := 0
	if b := sharedBackend(t, false); b != nil {
		cc = b.cc
	} else {
		for _, a := range nv.archs {
			if a <= 90 && a > cc {
				cc = a
			}
		}
	}
	c, err := newCompiler(nv, cc, dir)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestFileParams checks every kernel file has an entry in fileParams and
// that no entry names more constants than modSpec holds (defines would
// index past p).
func TestFileParams(t *testing.T) {
	files, err := fs.Glob(kernelFS, "kernels/*.cu")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		name := strings.TrimSuffix(strings.TrimPrefix(f, "kernels/"), ".cu")
		params, ok := fileParams[name]
		if !ok {
			t.Errorf("%s: no fileParams entry", f)
		} else if len(params) > len(modSpec{}.p) {
			t.Errorf("%s: %d constants, modSpec holds %d", f, len(params), len(modSpec{}.p))
		}
	}
}

// TestKernelsCompile builds one module of every kernel file (all of
// WarmKernels' set when a GPU is present) and checks the cache serves the
// second build.
func TestKernelsCompile(t *testing.T) {
	dir := t.TempDir()
	c := testCompiler(t, dir)
	tune, err := Tuning{}.resolve()
	if err != nil {
		t.Fatal(err)
	}
	specs := warmSpecs(tune)
	if sharedBackend(t, false) == nil && os.Getenv("TRIGON_TEST_ALL_KERNELS") == "" {
		// No GPU: NVRTC takes seconds per module on a small machine, so CI
		// checks four (the bulk GEMV's sm_90 statements and the wgmma
		// prefill kernel, which must compile, to a trap, for targets other
		// than sm_90a since WarmKernels builds it for every target, are
		// the ones a change breaks unseen otherwise);
		// TRIGON_TEST_ALL_KERNELS=1 compiles every one.
		specs = []modSpec{{file: "embed", p: [8]int{dtBF16, dtBF16}}, {file: "rope", p: [8]int{64, 16, dtBF16, dtBF16, dtBF16}},
			bulkConfigs[0].spec(1, dtBF16), prefillWGModule(128, backend.PlainKV(backend.BF16, 16))}
	} else {
		specs = append(specs, quantKVSpecs(tune)...)
	}
	for _, s := range specs {
		t.Run(s.String(), func(t *testing.T) {
			t.Parallel() // NVRTC is thread-safe
			start := time.Now()
			img, cached, err := c.build(s, false)
			if err != nil {
				t.Fatal(err)
			}
			if cached || len(img) == 0 {
				t.Fatalf("first build: cached=%v, %d bytes", cached, len(img))
			}
			t.Logf("%s for %s: %d bytes in %v", s, c.arch, len(img), time.Since(start))
			img2, cached, err := c.build(s, false)
			if err != nil || !cached || string(img2) != string(img) {
				t.Fatalf("second build: cached=%v err=%v same=%v", cached, err, string(img2) == string(img))
			}
		})
	}
}

// quantKVSpecs are the modules of the quantized KV formats at the default
// group sizes and window (head dims 64 and 128, 16-token blocks) and of
// int4's other groups and 32-token blocks at head dim 128: the writer,
// the tensor-core decode kernel with the ring depth the planner picks on
// sm_90, and the prefill kernel. WarmKernels does not build them (a BF16
// model's server never launches them); TestKernelsCompile does.
func quantKVSpecs(t tuning) []modSpec {
	kvs := []backend.KVSpec{backend.FP8KV(16), backend.Int8KV(16, backend.DefaultKVInt8Group),
		backend.Int4KV(16, backend.DefaultKVInt4Group, backend.DefaultKVWindow)}
	var specs []modSpec
	add := func(hd int, kv backend.KVSpec) {
		specs = append(specs, ropeModule(hd, kv, backend.BF16, backend.BF16), prefillTiling(hd).spec(hd, kv))
		if st, ok := decodeMMAStages(90, hd, kv, decodeRingStages(kv, t.decodeStages)); ok {
			specs = append(specs, decodeMMAModule(hd, kv, st))
		}
	}
	for _, hd := range []int{64, 128} {
		for _, kv := range kvs {
			add(hd, kv)
		}
	}
	for _, kv := range []backend.KVSpec{backend.Int4KV(16, 8, 0), backend.Int4KV(16, 16, 32), backend.Int4KV(16, 128, 128), backend.Int4KV(32, 32, 128)} {
		add(128, kv)
	}
	return specs
}

// TestKVReadersRefuseOtherFormats builds every reader module for an F32
// cache and expects kv.cuh's static check to refuse it (the kernels
// read BF16 caches, and some FP8, INT8 and INT4 ones), and the writer
// (rope) to build for one; the BF16-only readers refuse INT8 and INT4
// caches, and the quantized readers and the writer build for FP8, INT8
// and INT4.
func TestKVReadersRefuseOtherFormats(t *testing.T) {
	c := testCompiler(t, "")
	f32 := backend.PlainKV(backend.F32, 16)
	i8, f8, i4 := backend.Int8KV(16, 32), backend.FP8KV(16), backend.Int4KV(16, 32, 128)
	for _, tc := range []struct {
		s      modSpec
		refuse bool
	}{
		{decodeCoreModule(64, f32, 1, 2), true},
		{decodeMMAModule(64, f32, 2), true},
		{prefillTiling(64).spec(64, f32), true},
		{prefillWGModule(64, f32), true},
		{ropeModule(64, f32, backend.BF16, backend.BF16), false},
		{decodeCoreModule(64, i8, 1, 2), true},
		{prefillWGModule(64, i8), true},
		{decodeMMAModule(64, i8, 2), false},
		{prefillTiling(64).spec(64, i8), false},
		{ropeModule(64, i8, backend.BF16, backend.BF16), false},
		{decodeMMAModule(64, f8, 2), false},
		{prefillTiling(64).spec(64, f8), false},
		{ropeModule(64, f8, backend.BF16, backend.F32), false},
		{decodeCoreModule(64, i4, 1, 2), true},
		{prefillWGModule(64, i4), true},
		{decodeMMAModule(64, i4, 2), false},
		{prefillTiling(64).spec(64, i4), false},
		{ropeModule(64, i4, backend.BF16, backend.BF16), false},
	} {
		t.Run(tc.s.String(), func(t *testing.T) {
			t.Parallel()
			_, _, err := c.build(tc.s, true)
			switch {
			case tc.refuse && (err == nil || !strings.Contains(err.Error(), "reads BF16")):
				t.Errorf("err %v, want kv.cuh's format error", err)
			case !tc.refuse && err != nil:
				t.Errorf("%v", err)
			}
		})
	}
}

// TestKernelCacheCorrupt damages a cache entry in each way load checks and
// expects a recompile that rewrites a valid entry.
func TestKernelCacheCorrupt(t *testing.T) {
	dir := t.TempDir()
	c := testCompiler(t, dir)
	s := modSpec{file: "embed", p: [8]int{dtBF16, dtBF16}}
	want, _, err := c.build(s, false)
	if err != nil {
		t.Fatal(err)
	}
	key, err := c.key(s)
	if err != nil {
		t.Fatal(err)
	}
	path := c.cache.path(key)
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		damage func([]byte) []byte
	}{
		{"bad magic", func(b []byte) []byte { b[0] ^= 0xff; return b }},
		{"truncated", func(b []byte) []byte { return b[:len(b)-7] }},
		{"flipped payload byte", func(b []byte) []byte { b[cacheHeader+len(b[cacheHeader:])/2] ^= 0x10; return b }},
		{"header only", func(b []byte) []byte { return b[:cacheHeader-1] }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := tc.damage(append([]byte(nil), good...))
			if err := os.WriteFile(path, bad, 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := c.cache.load(key); !errors.Is(err, errCorrupt) {
				t.Fatalf("load of damaged entry: %v, want errCorrupt", err)
			}
			img, cached, err := c.build(s, false)
			if err != nil {
				t.Fatal(err)
			}
			if cached {
				t.Fatal("damaged entry was served from the cache")
			}
			if string(img) != string(want) {
				// NVRTC output is deterministic for the same input.
				t.Fatal("recompiled image differs from the first build")
			}
			if g := sharedBackend(t, false); g != nil {
				if err := g.call(func() error {
					h, err := g.loadModule(img)
					if err == nil {
						g.d.call(g.d.cuModuleUnload, h)
					}
					return err
				}); err != nil {
					t.Fatalf("driver rejects the recompiled image: %v", err)
				}
			}
			if _, err := c.cache.load(key); err != nil {
				t.Fatalf("entry not rewritten: %v", err)
			}
		})
	}
}

// TestWarmKernels checks that WarmKernels (already run once when the shared
// backend was made) reports every module, now from the disk cache.
func TestWarmKernels(t *testing.T) {
	g := sharedBackend(t, true)
	if g.comp.cache.dir == "" {
		t.Skip("kernel cache disabled")
	}
	reps, err := g.WarmKernels(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(reps) != len(warmSpecs(g.tune)) {
		t.Fatalf("%d reports for %d modules", len(reps), len(warmSpecs(g.tune)))
	}
	for _, r := range reps {
		if !r.Cached || r.Arch != g.comp.arch || len(r.Options) == 0 {
			t.Errorf("report %+v: want a cached module for %s", r, g.comp.arch)
		}
	}
	t.Logf("%s: %d modules for %s", g.Device(), len(reps), g.comp.arch)
}

// TestKernelsWaitForPredecessor checks the rule programmatic dependent
// launch rests on (launch.go): the first statement of every kernel is
// grid_dep_sync(), grid_dep_wait() or grid_dep_launch_wait() (the listed
// exceptions read only pristine weights or prefetch first), so no kernel reads memory its
// predecessor in the stream may still be writing, and a kernel that only
// waits lets its successor in with grid_dep_launch() (common.cuh).
func TestKernelsWaitForPredecessor(t *testing.T) {
	files, err := fs.Glob(kernelFS, "kernels/*.cu")
	if err != nil || len(files) == 0 {
		t.Fatalf("kernel sources: %v (%d files)", err, len(files))
	}
	kernels := 0
	for _, f := range files {
		src, err := fs.ReadFile(kernelFS, f)
		if err != nil {
			t.Fatal(err)
		}
		s := string(src)
		for _, loc := range globalRe.FindAllStringSubmatchIndex(s, -1) {
			body := strings.Index(s[loc[1]:], "{")
			if body < 0 {
				t.Fatalf("%s: kernel at byte %d has no body", f, loc[0])
			}
			rest := strings.TrimSpace(s[loc[1]+body+1:])
			name := s[loc[2]:loc[3]]
			if early, ok := earlyReaders[name]; ok {
				// Reads pristine weights first, then waits: both branches
				// must be there, the early one guarded by the host's flag.
				// A kernel that takes the lowering's early bit may first let
				// its dependents launch, and must then clear the bit.
				if launch := "if (" + early + " & 2) grid_dep_launch();"; strings.HasPrefix(rest, launch) {
					_, after, _ := strings.Cut(rest, "\n")
					after = strings.TrimSpace(after)
					if !strings.HasPrefix(after, early+" &= 1;") {
						t.Errorf("%s: kernel %q must clear %s's bit 1 (`%s &= 1;`) right after `%s`", f, name, early, early, launch)
					}
					_, rest, _ = strings.Cut(after, "\n")
					rest = strings.TrimSpace(rest)
				}
				if !strings.HasPrefix(rest, "if (!"+early+") grid_dep_wait();") ||
					!strings.Contains(rest, "if ("+early+") grid_dep_wait();") {
					t.Errorf("%s: kernel %q must start with `if (!%s) grid_dep_wait();` and wait after its early loads", f, name, early)
				}
			} else if early, ok := producerWaiters[name]; ok {
				// Its shared body's producer streams pristine weights before
				// waiting, guarded by the host's flag; the consumers wait
				// before their first read of x.
				body := s[strings.Index(s, "void gemvb("):]
				pw, cp := strings.Index(body, "if (!"+early+") grid_dep_wait();"), strings.Index(body, "bulk_copy(")
				cw, xr := strings.Index(body, "\n  grid_dep_wait();"), strings.Index(body, "*(const uint4*)(xp[t] +")
				if pw < 0 || cp < pw || cw < 0 || xr < cw || strings.Contains(rest[:strings.Index(rest, "gemvb<")], "grid_dep") {
					t.Errorf("%s: kernel %q must leave the waits to gemvb: `if (!%s) grid_dep_wait();` before its producer's first copy, grid_dep_wait() before its consumers read x", f, name, early)
				}
			} else if late, ok := lateWaiters[name]; ok {
				// Its shared body waits itself, after the step's metadata and
				// the cache rows earlier steps wrote, before the first read of
				// what the predecessor writes (late).
				body := s[strings.Index(s, "void "+sharedBodies[name]+"("):]
				w, r := strings.Index(body, "grid_dep_wait();"), strings.Index(body, late)
				if w < 0 || r < 0 || r < w || strings.Contains(rest[:strings.Index(rest, sharedBodies[name])], "grid_dep") {
					t.Errorf("%s: kernel %q must leave the wait to %s, which must call grid_dep_wait() before %q", f, name, sharedBodies[name], late)
				}
			} else if pre, ok := prefetchFirst[name]; ok {
				// Its prefetching blocks ask L2 for a weight and leave
				// before the wait; nothing else comes before it.
				w := strings.Index(rest, "grid_dep_launch_wait();")
				if w < 0 || !strings.HasPrefix(rest, pre) || kernelDataRe.MatchString(rest[:w]) {
					t.Errorf("%s: kernel %q must start with %q (its prefetching blocks) and read no operand before grid_dep_launch_wait();", f, name, pre)
				}
			} else if !strings.HasPrefix(rest, "grid_dep_sync();") && !strings.HasPrefix(rest, "grid_dep_wait();") &&
				!strings.HasPrefix(rest, "grid_dep_launch_wait();") {
				t.Errorf("%s: kernel %q does not start with grid_dep_sync();, grid_dep_wait(); or grid_dep_launch_wait();", f, name)
			}
			// A kernel that only waits must let the next one in itself.
			end := len(s)
			if next := globalRe.FindStringIndex(s[loc[1]:]); next != nil {
				end = loc[1] + next[0]
			}
			span := s[loc[1]:end]
			if body, ok := sharedBodies[name]; ok {
				// The kernel runs a device function shared with others: the
				// launch may be there, between its definition and the first
				// kernel after it.
				def := strings.Index(s, "void "+body+"(")
				if def < 0 || !strings.Contains(span, body+"<") && !strings.Contains(span, body+"(") {
					t.Errorf("%s: kernel %q does not call %s, or the file does not define it", f, name, body)
				} else {
					defEnd := len(s)
					if next := globalRe.FindStringIndex(s[def:]); next != nil {
						defEnd = def + next[0]
					}
					span += s[def:defEnd]
				}
			}
			if strings.Contains(span, "grid_dep_wait();") && !strings.Contains(span, "grid_dep_launch();") {
				t.Errorf("%s: kernel %q waits with grid_dep_wait() but never calls grid_dep_launch()", f, name)
			}
			kernels++
		}
	}
	if kernels < 10 {
		t.Fatalf("found only %d kernels: the pattern no longer matches the sources", kernels)
	}
	t.Logf("checked %d kernels in %d files", kernels, len(files))
}

// sharedBodies are kernels that run a device function several kernels
// share, which calls grid_dep_launch() itself (and, for lateWaiters,
// grid_dep_wait()).
var sharedBodies = map[string]string{
	"attn_decode_mma": "attn_decode_body",
	"gemvb_bf16":      "gemvb", "gemvb_add_bf16": "gemvb", "gemvb_silu_bf16": "gemvb",
}

// producerWaiters are the bulk-copy GEMV kernels (sharedBodies: gemvb),
// whose producer thread streams the weights the host flags as pristine
// (named by the flag parameter) before it waits, and whose consumer warps
// wait before they read x.
var producerWaiters = map[string]string{
	"gemvb_bf16": "early_w", "gemvb_add_bf16": "early_w", "gemvb_silu_bf16": "early_w",
}

// lateWaiters are the kernels whose shared body (sharedBodies) reads the
// step's metadata and the KV-cache rows of earlier steps before it waits,
// then the newest row and Q (the text given, its first read of Q: the
// int4 form's, which comes first, or the others') after.
var lateWaiters = map[string]string{"attn_decode_mma": "*)(q + ((i64)q0"}

// earlyReaders are the kernels allowed to load, before grid_dep_sync, the
// weights the host flags as pristine (never written by a kernel), named by
// the flag parameter.
var earlyReaders = map[string]string{
	"gemv_bf16": "early_w", "qkv_rope_bf16": "early_w", "gemv_add_bf16": "early_w",
	"awq_dec": "early", "f8_dec": "early",
}

// prefetchFirst are the kernels whose extra blocks prefetch a weight into
// L2 (a hint: L2 is coherent, so no wait is needed) before the others
// wait, with the text the kernel starts with.
var prefetchFirst = map[string]string{"add_rmsnorm": "if ((int)blockIdx.x >= rows) {"}

// kernelDataRe matches add_rmsnorm's operands (out, x, res, w), which
// nothing may read before the kernel waits.
var kernelDataRe = regexp.MustCompile(`(^|[^.\w])(out|x|res|w)\b`)

// globalRe matches a kernel's declaration up to its parameter list.
var globalRe = regexp.MustCompile(`extern "C" __global__ void (?:__launch_bounds__\([^)]*\) )?(\w+)\(`)

// TestLaunchConfigLayout checks the Go mirrors of cuda.h's launch structs.
func TestLaunchConfigLayout(t *testing.T) {
	if s := unsafe.Sizeof(launchConfig{}); s != 56 {
		t.Errorf("launchConfig is %d bytes, CUlaunchConfig 56", s)
	}
	if s := unsafe.Sizeof(launchAttr{}); s != 72 {
		t.Errorf("launchAttr is %d bytes, CUlaunchAttribute 72", s)
	}
	if o := unsafe.Offsetof(launchConfig{}.stream); o != 32 {
		t.Errorf("launchConfig.stream at %d, hStream at 32", o)
	}
	if o := unsafe.Offsetof(launchConfig{}.numAttrs); o != 48 {
		t.Errorf("launchConfig.numAttrs at %d, numAttrs at 48", o)
	}
}

// TestPrefillWGCompile builds the wgmma prefill modules on a Hopper GPU
// with ptxas's verbose report and fails when ptxas serialised the wgmma
// instructions (it does so, with a warning, when it cannot keep the
// accumulators in place across the asynchronous multiply) or spilled.
// With TRIGON_TEST_CUBIN_DIR set it writes each module's CUBIN there, for
// cuobjdump.
func TestPrefillWGCompile(t *testing.T) {
	b := sharedBackend(t, true)
	if b.comp.arch != "sm_90a" {
		t.Skipf("%s: the wgmma kernel is compiled for sm_90a only", b.comp.arch)
	}
	for _, d := range []int{128, 64} {
		s := prefillWGModule(d, backend.PlainKV(backend.BF16, 16))
		src, hs, err := source(s.file)
		if err != nil {
			t.Fatal(err)
		}
		img, log, err := b.comp.nv.compile(s.file+".cu", src, hs, append(b.comp.options(s), "--ptxas-options=-v"), true)
		if err != nil {
			t.Fatalf("%v: %v", s, err)
		}
		t.Logf("%v: %d bytes; ptxas:\n%s", s, len(img), log)
		if strings.Contains(log, "serialized") || regexp.MustCompile(`[1-9]\d* bytes spill`).MatchString(log) {
			t.Errorf("%v: wgmma serialised or registers spilled", s)
		}
		if dir := os.Getenv("TRIGON_TEST_CUBIN_DIR"); dir != "" {
			if err := os.WriteFile(dir+"/"+strings.NewReplacer("(", "_", ")", "", ",", "_", "=", "").Replace(s.String())+".cubin", img, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}
