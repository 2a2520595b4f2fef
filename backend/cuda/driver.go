package cuda

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// Driver API constants used here (cuda.h).
const (
	cuDevAttrMultiprocessorCount = 16
	cuDevAttrComputeCapMajor     = 75
	cuDevAttrComputeCapMinor     = 76

	cuMemHostAllocPortable  = 0x01
	cuMemHostAllocDeviceMap = 0x02

	cuStreamNonBlocking  = 0x1
	cuEventDisableTiming = 0x2

	// cuStreamCaptureModeRelaxed lets the CUDA thread allocate an op's
	// temporary (cuMemAlloc, when the pool has no free block of its size)
	// while it records: the graph keeps the block. Every call that waits on
	// the device is refused on the caller's side before it reaches the
	// CUDA thread (errCapturing), which the stricter modes would enforce.
	cuStreamCaptureModeRelaxed = 2
)

// CUDAError is a failed driver, NVRTC or cuBLASLt call. The message names
// the call and the library's own error name, as
// "cuLaunchKernel: CUDA_ERROR_INVALID_VALUE".
type CUDAError struct {
	Call string
	Code int
	Name string
}

func (e *CUDAError) Error() string { return e.Call + ": " + e.Name }

// driver holds the addresses of the driver API entry points. Every call
// goes through purego.SyscallN rather than RegisterLibFunc's reflective
// wrappers: a decode step makes hundreds of calls, and each wrapper call
// allocates.
type driver struct {
	cuInit, cuDeviceGetCount, cuDeviceGet, cuDeviceGetAttribute, cuDeviceGetName    uintptr
	cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRelease, cuCtxSetCurrent            uintptr
	cuMemAlloc, cuMemFree, cuMemHostAlloc, cuMemFreeHost, cuMemHostGetDevicePointer uintptr
	cuMemcpyHtoDAsync, cuMemcpyDtoHAsync, cuMemcpyDtoDAsync, cuMemsetD8Async        uintptr
	cuMemsetD32Async, cuMemGetInfo                                                  uintptr
	cuStreamCreate, cuStreamDestroy, cuStreamSynchronize                            uintptr
	cuEventCreate, cuEventDestroy, cuEventRecord, cuEventElapsedTime                uintptr
	cuEventSynchronize, cuEventQuery                                                uintptr
	cuModuleLoadData, cuModuleUnload, cuModuleGetFunction, cuLaunchKernel           uintptr
	cuFuncSetAttribute, cuGetErrorName                                              uintptr
	cuStreamBeginCapture, cuStreamEndCapture, cuGraphInstantiateWithFlags           uintptr
	cuGraphLaunch, cuGraphExecDestroy, cuGraphDestroy                               uintptr
	cuDriverGetVersion                                                              uintptr
	cuProfilerStart, cuProfilerStop                                                 uintptr
	// cuLaunchKernelEx (CUDA 12.0+) launches with attributes; 0 when the
	// driver lacks it, and launches fall back to cuLaunchKernel.
	cuLaunchKernelEx uintptr
	// cuOccupancyMaxActiveBlocksPerMultiprocessor: how many blocks of a
	// kernel fit on one SM; 0 when the driver lacks it.
	cuOccupancyMaxActiveBlocksPerMultiprocessor uintptr
}

var (
	drvOnce sync.Once
	drv     *driver
	drvErr  error
)

// loadDriver opens libcuda once per process and calls cuInit.
func loadDriver() (*driver, error) {
	drvOnce.Do(func() {
		h, path, err := openLib("libcuda.so.1", "libcuda.so")
		if err != nil {
			drvErr = err
			return
		}
		d := &driver{}
		err = symbols(h, path, map[string]*uintptr{
			"cuInit":                       &d.cuInit,
			"cuDriverGetVersion":           &d.cuDriverGetVersion,
			"cuDeviceGetCount":             &d.cuDeviceGetCount,
			"cuDeviceGet":                  &d.cuDeviceGet,
			"cuDeviceGetAttribute":         &d.cuDeviceGetAttribute,
			"cuDeviceGetName":              &d.cuDeviceGetName,
			"cuDevicePrimaryCtxRetain":     &d.cuDevicePrimaryCtxRetain,
			"cuDevicePrimaryCtxRelease_v2": &d.cuDevicePrimaryCtxRelease,
			"cuCtxSetCurrent":              &d.cuCtxSetCurrent,
			"cuMemAlloc_v2":                &d.cuMemAlloc,
			"cuMemFree_v2":                 &d.cuMemFree,
			"cuMemHostAlloc":               &d.cuMemHostAlloc,
			"cuMemFreeHost":                &d.cuMemFreeHost,
			"cuMemHostGetDevicePointer_v2": &d.cuMemHostGetDevicePointer,
			"cuMemcpyHtoDAsync_v2":         &d.cuMemcpyHtoDAsync,
			"cuMemcpyDtoHAsync_v2":         &d.cuMemcpyDtoHAsync,
			"cuMemcpyDtoDAsync_v2":         &d.cuMemcpyDtoDAsync,
			"cuMemsetD8Async":              &d.cuMemsetD8Async,
			"cuMemsetD32Async":             &d.cuMemsetD32Async,
			"cuMemGetInfo_v2":              &d.cuMemGetInfo,
			"cuStreamCreate":               &d.cuStreamCreate,
			"cuStreamDestroy_v2":           &d.cuStreamDestroy,
			"cuStreamSynchronize":          &d.cuStreamSynchronize,
			"cuEventCreate":                &d.cuEventCreate,
			"cuEventDestroy_v2":            &d.cuEventDestroy,
			"cuEventRecord":                &d.cuEventRecord,
			"cuEventSynchronize":           &d.cuEventSynchronize,
			"cuEventQuery":                 &d.cuEventQuery,
			"cuModuleLoadData":             &d.cuModuleLoadData,
			"cuModuleUnload":               &d.cuModuleUnload,
			"cuModuleGetFunction":          &d.cuModuleGetFunction,
			"cuLaunchKernel":               &d.cuLaunchKernel,
			"cuFuncSetAttribute":           &d.cuFuncSetAttribute,
			"cuGetErrorName":               &d.cuGetErrorName,
			"cuStreamBeginCapture_v2":      &d.cuStreamBeginCapture,
			"cuStreamEndCapture":           &d.cuStreamEndCapture,
			"cuGraphInstantiateWithFlags":  &d.cuGraphInstantiateWithFlags,
			"cuGraphLaunch":                &d.cuGraphLaunch,
			"cuGraphExecDestroy":           &d.cuGraphExecDestroy,
			"cuGraphDestroy":               &d.cuGraphDestroy,
			"cuProfilerStart":              &d.cuProfilerStart,
			"cuProfilerStop":               &d.cuProfilerStop,
		})
		if err != nil {
			drvErr = err
			return
		}
		if p, e := dlsym(h, "cuLaunchKernelEx"); e == nil {
			d.cuLaunchKernelEx = p
		}
		if p, e := dlsym(h, "cuOccupancyMaxActiveBlocksPerMultiprocessor"); e == nil {
			d.cuOccupancyMaxActiveBlocksPerMultiprocessor = p
		}
		// cuEventElapsedTime_v2 is CUDA 12.8+; older drivers only have the
		// unversioned symbol, with the same signature.
		for _, name := range []string{"cuEventElapsedTime_v2", "cuEventElapsedTime"} {
			if p, e := dlsym(h, name); e == nil && p != 0 {
				d.cuEventElapsedTime = p
				break
			}
		}
		if d.cuEventElapsedTime == 0 {
			drvErr = fmt.Errorf("%s lacks cuEventElapsedTime", path)
			return
		}
		if err := d.check("cuInit", d.call(d.cuInit, 0)); err != nil {
			drvErr = err
			return
		}
		drv = d
	})
	return drv, drvErr
}

// call invokes a driver entry point; the CUresult is the low 32 bits.
// Like purego.SyscallN it is marked uintptrescapes: a Go pointer converted
// to uintptr in the argument list is moved to the heap and kept alive for
// the call, so a stack move in between cannot leave C a stale address.
//
//go:uintptrescapes
func (d *driver) call(fn uintptr, args ...uintptr) int {
	r, _, _ := purego.SyscallN(fn, args...)
	return int(int32(r))
}

// check turns a CUresult into an error carrying the call and error name.
func (d *driver) check(name string, res int) error {
	if res == 0 {
		return nil
	}
	return &CUDAError{Call: name, Code: res, Name: d.errName(res)}
}

func (d *driver) errName(res int) string {
	var p uintptr
	if d.cuGetErrorName != 0 {
		if r, _, _ := purego.SyscallN(d.cuGetErrorName, uintptr(res), uintptr(unsafe.Pointer(&p))); int32(r) == 0 && p != 0 {
			return goString(p)
		}
	}
	return fmt.Sprintf("CUresult(%d)", res)
}

// deviceAttr reads one CU_DEVICE_ATTRIBUTE_* of dev.
func (d *driver) deviceAttr(dev int32, attr int) (int, error) {
	var v int32
	if err := d.check("cuDeviceGetAttribute", d.call(d.cuDeviceGetAttribute, uintptr(unsafe.Pointer(&v)), uintptr(attr), uintptr(dev))); err != nil {
		return 0, err
	}
	return int(v), nil
}

func (d *driver) deviceName(dev int32) string {
	var buf [128]byte
	if d.call(d.cuDeviceGetName, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), uintptr(dev)) != 0 {
		return "unknown"
	}
	n := 0
	for n < len(buf) && buf[n] != 0 {
		n++
	}
	return string(buf[:n])
}
