package cuda

import (
	"fmt"
	"runtime"
	"sort"
	"strings"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// nvrtc holds the NVRTC entry points. NVRTC needs no device or context,
// so kernels can be compiled (and the cache exercised) on a machine that
// has the library but no GPU.
type nvrtc struct {
	path                                                  string
	major, minor                                          int
	archs                                                 []int // compute capabilities it can emit SASS for, as 80, 90, ...
	nvrtcVersion, nvrtcCreateProgram, nvrtcCompileProgram uintptr
	nvrtcDestroyProgram, nvrtcGetProgramLogSize           uintptr
	nvrtcGetProgramLog, nvrtcGetPTXSize, nvrtcGetPTX      uintptr
	nvrtcGetCUBINSize, nvrtcGetCUBIN, nvrtcGetErrorString uintptr
	nvrtcGetNumSupportedArchs, nvrtcGetSupportedArchs     uintptr
}

var (
	nvrtcOnce sync.Once
	nvrtcLib  *nvrtc
	nvrtcErr  error
)

// loadNVRTC opens the newest NVRTC found once per process.
func loadNVRTC() (*nvrtc, error) {
	nvrtcOnce.Do(func() {
		h, path, err := openLib("libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so", "libnvrtc.so.11.2")
		if err != nil {
			nvrtcErr = err
			return
		}
		n := &nvrtc{path: path}
		err = symbols(h, path, map[string]*uintptr{
			"nvrtcVersion":              &n.nvrtcVersion,
			"nvrtcCreateProgram":        &n.nvrtcCreateProgram,
			"nvrtcCompileProgram":       &n.nvrtcCompileProgram,
			"nvrtcDestroyProgram":       &n.nvrtcDestroyProgram,
			"nvrtcGetProgramLogSize":    &n.nvrtcGetProgramLogSize,
			"nvrtcGetProgramLog":        &n.nvrtcGetProgramLog,
			"nvrtcGetPTXSize":           &n.nvrtcGetPTXSize,
			"nvrtcGetPTX":               &n.nvrtcGetPTX,
			"nvrtcGetCUBINSize":         &n.nvrtcGetCUBINSize,
			"nvrtcGetCUBIN":             &n.nvrtcGetCUBIN,
			"nvrtcGetErrorString":       &n.nvrtcGetErrorString,
			"nvrtcGetNumSupportedArchs": &n.nvrtcGetNumSupportedArchs,
			"nvrtcGetSupportedArchs":    &n.nvrtcGetSupportedArchs,
		})
		if err != nil {
			nvrtcErr = err
			return
		}
		var major, minor int32
		if err := n.check("nvrtcVersion", n.call(n.nvrtcVersion, uintptr(unsafe.Pointer(&major)), uintptr(unsafe.Pointer(&minor)))); err != nil {
			nvrtcErr = err
			return
		}
		n.major, n.minor = int(major), int(minor)
		var count int32
		if err := n.check("nvrtcGetNumSupportedArchs", n.call(n.nvrtcGetNumSupportedArchs, uintptr(unsafe.Pointer(&count)))); err != nil {
			nvrtcErr = err
			return
		}
		if count > 0 && count < 1024 {
			archs := make([]int32, count)
			if err := n.check("nvrtcGetSupportedArchs", n.call(n.nvrtcGetSupportedArchs, uintptr(unsafe.Pointer(&archs[0])))); err != nil {
				nvrtcErr = err
				return
			}
			for _, a := range archs {
				n.archs = append(n.archs, int(a))
			}
			sort.Ints(n.archs)
		}
		nvrtcLib = n
	})
	return nvrtcLib, nvrtcErr
}

// call invokes an NVRTC entry point (uintptrescapes: see driver.call).
//
//go:uintptrescapes
func (n *nvrtc) call(fn uintptr, args ...uintptr) int {
	r, _, _ := purego.SyscallN(fn, args...)
	return int(int32(r))
}

func (n *nvrtc) check(name string, res int) error {
	if res == 0 {
		return nil
	}
	msg := fmt.Sprintf("nvrtcResult(%d)", res)
	if r, _, _ := purego.SyscallN(n.nvrtcGetErrorString, uintptr(res)); r != 0 {
		msg = goString(r)
	}
	return &CUDAError{Call: name, Code: res, Name: msg}
}

// version is NVRTC's version as "13.0"; it is part of the kernel cache key.
func (n *nvrtc) version() string { return fmt.Sprintf("%d.%d", n.major, n.minor) }

// target picks what to compile for a device of compute capability cc
// (as 90): SASS for the device's own architecture when NVRTC knows it
// (sm_90a on Hopper, so wgmma and setmaxnreg are usable), otherwise PTX for
// the newest architecture NVRTC knows below it, which the driver JITs.
func (n *nvrtc) target(cc int) (arch string, cubin bool, err error) {
	for _, a := range n.archs {
		if a == cc {
			if cc == 90 && n.major >= 12 {
				return "sm_90a", true, nil
			}
			return fmt.Sprintf("sm_%d", cc), true, nil
		}
	}
	best := 0
	for _, a := range n.archs {
		if a <= cc && a > best {
			best = a
		}
	}
	if best == 0 {
		return "", false, fmt.Errorf("NVRTC %s (%s) cannot target compute capability %d.%d", n.version(), n.path, cc/10, cc%10)
	}
	return fmt.Sprintf("compute_%d", best), false, nil
}

// header is an in-memory include file handed to NVRTC.
type header struct{ name, src string }

// compile builds src with NVRTC and returns the CUBIN (or PTX when cubin is
// false) and the compiler log. The option and header arrays are Go memory
// holding the addresses of other Go memory: every piece is pinned with a
// runtime.Pinner for the duration of the calls, as cgo's rules ask.
func (n *nvrtc) compile(name, src string, headers []header, opts []string, cubin bool) ([]byte, string, error) {
	var pin runtime.Pinner
	defer pin.Unpin()
	cstr := func(s string) uintptr {
		b := cString(s)
		pin.Pin(&b[0])
		return uintptr(unsafe.Pointer(&b[0]))
	}
	ptrs := func(ss []string) uintptr {
		if len(ss) == 0 {
			return 0
		}
		a := make([]uintptr, len(ss))
		for i, s := range ss {
			a[i] = cstr(s)
		}
		pin.Pin(&a[0])
		return uintptr(unsafe.Pointer(&a[0]))
	}
	var hsrc, hname []string
	for _, h := range headers {
		hsrc = append(hsrc, h.src)
		hname = append(hname, h.name)
	}
	var prog uintptr
	if err := n.check("nvrtcCreateProgram", n.call(n.nvrtcCreateProgram, uintptr(unsafe.Pointer(&prog)), cstr(src), cstr(name),
		uintptr(len(headers)), ptrs(hsrc), ptrs(hname))); err != nil {
		return nil, "", err
	}
	defer n.call(n.nvrtcDestroyProgram, uintptr(unsafe.Pointer(&prog)))
	res := n.call(n.nvrtcCompileProgram, prog, uintptr(len(opts)), ptrs(opts))
	log := n.log(prog)
	if err := n.check("nvrtcCompileProgram", res); err != nil {
		return nil, log, fmt.Errorf("compile %s (%s): %w\n%s", name, strings.Join(opts, " "), err, log)
	}
	sizeFn, getFn, what := n.nvrtcGetPTXSize, n.nvrtcGetPTX, "nvrtcGetPTX"
	if cubin {
		sizeFn, getFn, what = n.nvrtcGetCUBINSize, n.nvrtcGetCUBIN, "nvrtcGetCUBIN"
	}
	var size uint64
	if err := n.check(what+"Size", n.call(sizeFn, prog, uintptr(unsafe.Pointer(&size)))); err != nil {
		return nil, log, err
	}
	if size == 0 || size > 1<<30 {
		return nil, log, fmt.Errorf("compile %s: %s returned %d bytes", name, what, size)
	}
	out := make([]byte, size)
	if err := n.check(what, n.call(getFn, prog, uintptr(unsafe.Pointer(&out[0])))); err != nil {
		return nil, log, err
	}
	return out, log, nil
}

func (n *nvrtc) log(prog uintptr) string {
	var size uint64
	if n.call(n.nvrtcGetProgramLogSize, prog, uintptr(unsafe.Pointer(&size))) != 0 || size <= 1 || size > 1<<24 {
		return ""
	}
	b := make([]byte, size)
	if n.call(n.nvrtcGetProgramLog, prog, uintptr(unsafe.Pointer(&b[0]))) != 0 {
		return ""
	}
	return strings.TrimRight(string(b), "\x00\n ")
}
