package cuda

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/trigon-llm/trigon/backend"
)

// NCCL constants (nccl.h).
const (
	ncclFloat32  = 7
	ncclBfloat16 = 9
	ncclSum      = 0
)

// ncclUniqueID is ncclUniqueId: 128 opaque bytes, passed by value to
// ncclCommInitRank.
type ncclUniqueID struct{ internal [128]byte }

// ncclLib holds libnccl's entry points. The collectives go through
// purego.SyscallN (they are queued every step); ncclCommInitRank, which
// takes the unique id by value, through a RegisterFunc wrapper.
type ncclLib struct {
	getUniqueID, allReduce, broadcast, groupStart, groupEnd, commDestroy, getErrorString uintptr
	initRank                                                                             func(comm *uintptr, nranks int32, id ncclUniqueID, rank int32) int32
	// memcpy2D is the driver's cuMemcpy2DAsync_v2, for the all-gather's
	// strided copies.
	memcpy2D uintptr
}

var (
	ncclOnce sync.Once
	ncclL    *ncclLib
	ncclErr  error
)

// loadNCCL opens libnccl.so.2 once per process.
func loadNCCL() (*ncclLib, error) {
	ncclOnce.Do(func() {
		h, path, err := openLib("libnccl.so.2", "libnccl.so")
		if err != nil {
			ncclErr = err
			return
		}
		l := &ncclLib{}
		var initRank uintptr
		if err := symbols(h, path, map[string]*uintptr{
			"ncclGetUniqueId":    &l.getUniqueID,
			"ncclAllReduce":      &l.allReduce,
			"ncclBroadcast":      &l.broadcast,
			"ncclGroupStart":     &l.groupStart,
			"ncclGroupEnd":       &l.groupEnd,
			"ncclCommDestroy":    &l.commDestroy,
			"ncclGetErrorString": &l.getErrorString,
			"ncclCommInitRank":   &initRank,
		}); err != nil {
			ncclErr = err
			return
		}
		purego.RegisterFunc(&l.initRank, initRank)
		dh, dpath, err := openLib("libcuda.so.1", "libcuda.so")
		if err == nil {
			err = symbols(dh, dpath, map[string]*uintptr{"cuMemcpy2DAsync_v2": &l.memcpy2D})
		}
		if err != nil {
			ncclErr = err
			return
		}
		ncclL = l
	})
	return ncclL, ncclErr
}

// call invokes an NCCL entry point (uintptrescapes: see driver.call).
//
//go:uintptrescapes
func (l *ncclLib) call(fn uintptr, args ...uintptr) int {
	r, _, _ := purego.SyscallN(fn, args...)
	return int(int32(r))
}

func (l *ncclLib) check(name string, res int) error {
	if res == 0 {
		return nil
	}
	msg := fmt.Sprintf("ncclResult %d", res)
	if p, _, _ := purego.SyscallN(l.getErrorString, uintptr(res)); p != 0 {
		msg = goString(p)
	}
	return fmt.Errorf("%s: %s", name, msg)
}

// NCCLAvailable reports why NCCL cannot be used here, or nil.
func NCCLAvailable() error {
	_, err := loadNCCL()
	return err
}

// NCCLComm is one rank's end of an NCCL communicator, over the backend of
// that rank's GPU: its collectives are queued on the backend's stream in
// order with its other ops, so a decode graph captured on that stream
// replays them. It implements backend.Communicator.
type NCCLComm struct {
	b          *Backend
	lib        *ncclLib
	comm       uintptr // ncclComm_t; CUDA thread only after init
	rank, size int
}

var _ backend.Communicator = (*NCCLComm)(nil)

// NewNCCLGroup makes the communicators of a group over bs, rank r on bs[r]
// (one GPU each, one process): one unique id, and every rank's
// ncclCommInitRank called at once, each on its backend's CUDA thread
// where its device's context is current (each call returns once all
// ranks have joined).
func NewNCCLGroup(bs []*Backend) ([]*NCCLComm, error) {
	if len(bs) == 0 {
		return nil, errors.New("nccl: a group needs at least one rank")
	}
	l, err := loadNCCL()
	if err != nil {
		return nil, fmt.Errorf("nccl: %w", err)
	}
	var id ncclUniqueID
	if err := l.check("ncclGetUniqueId", l.call(l.getUniqueID, uintptr(unsafe.Pointer(&id)))); err != nil {
		return nil, fmt.Errorf("nccl: %w", err)
	}
	comms := make([]*NCCLComm, len(bs))
	errs := make([]error, len(bs))
	var wg sync.WaitGroup
	for r, b := range bs {
		c := &NCCLComm{b: b, lib: l, rank: r, size: len(bs)}
		comms[r] = c
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = b.call(func() error {
				return l.check("ncclCommInitRank", int(l.initRank(&c.comm, int32(len(bs)), id, int32(r))))
			})
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, c := range comms {
			c.Close()
		}
		return nil, fmt.Errorf("nccl: %w", err)
	}
	return comms, nil
}

// Rank implements backend.Communicator.
func (c *NCCLComm) Rank() int { return c.rank }

// Size implements backend.Communicator.
func (c *NCCLComm) Size() int { return c.size }

// Close destroys the communicator (after the backend's queued work).
func (c *NCCLComm) Close() error {
	return c.b.call(func() error {
		if c.comm == 0 {
			return nil
		}
		err := c.lib.check("ncclCommDestroy", c.lib.call(c.lib.commDestroy, c.comm))
		c.comm = 0
		return err
	})
}

// ncclType is the NCCL datatype of dt.
func ncclType(dt backend.DType) (uintptr, error) {
	switch dt {
	case backend.F32:
		return ncclFloat32, nil
	case backend.BF16:
		return ncclBfloat16, nil
	}
	return 0, fmt.Errorf("nccl: dtype %v", dt)
}

// AllReduce implements backend.Communicator: ncclAllReduce in place on the
// backend's stream. NCCL sums bf16 in f32 and rounds once.
func (c *NCCLComm) AllReduce(t backend.Tensor) error {
	tt, err := c.b.tensorOf("all_reduce", "t", t)
	if err != nil {
		return err
	}
	if err := backend.CheckAllReduce(tt); err != nil {
		return opErr(err)
	}
	dt, err := ncclType(tt.dt)
	if err != nil {
		return err
	}
	n, _ := backend.NumElements(tt.shape)
	b, l := c.b, c.lib
	return b.post(func() error {
		return l.check("ncclAllReduce", l.call(l.allReduce, uintptr(tt.ptr), uintptr(tt.ptr), uintptr(n), dt, ncclSum, c.comm, b.stream))
	})
}

// cudaMemcpy2D is CUDA_MEMCPY2D (cuda.h): the memory types are 4-byte
// enums padded to 8.
type cudaMemcpy2D struct {
	srcXInBytes, srcY uintptr
	srcMemoryType     uintptr
	srcHost           uintptr
	srcDevice         uint64
	srcArray          uintptr
	srcPitch          uintptr
	dstXInBytes, dstY uintptr
	dstMemoryType     uintptr
	dstHost           uintptr
	dstDevice         uint64
	dstArray          uintptr
	dstPitch          uintptr
	widthInBytes      uintptr
	height            uintptr
}

const cuMemoryTypeDevice = 2

// AllGather implements backend.Communicator: every rank broadcasts its x
// (one NCCL group) into a staging buffer, [rows, widths[r]] after
// another, and strided copies put each into its columns of out.
func (c *NCCLComm) AllGather(out, x backend.Tensor, widths []int) error {
	o, err := c.b.tensorOf("all_gather", "out", out)
	if err != nil {
		return err
	}
	xt, err := c.b.tensorOf("all_gather", "x", x)
	if err != nil {
		return err
	}
	if err := backend.CheckAllGather(o, xt, widths, c.rank); err != nil {
		return opErr(err)
	}
	if len(widths) != c.size {
		return backend.ShapeError("all_gather", "widths", "%d widths for %d ranks", len(widths), c.size)
	}
	rows, total := o.shape[0], o.shape[1]
	ws := append([]int(nil), widths...)
	b, l := c.b, c.lib
	return b.post(func() error {
		staging, err := b.tmpGet(4 * rows * total)
		if err != nil {
			return err
		}
		defer b.tmpPut(staging)
		if err := l.check("ncclGroupStart", l.call(l.groupStart)); err != nil {
			return err
		}
		off := uint64(0)
		var bcastErr error
		for r, w := range ws {
			recv := staging + off
			send := recv
			if r == c.rank {
				send = xt.ptr
			}
			if bcastErr == nil {
				bcastErr = l.check("ncclBroadcast", l.call(l.broadcast, uintptr(send), uintptr(recv), uintptr(rows*w), ncclFloat32, uintptr(r), c.comm, b.stream))
			}
			off += uint64(4 * rows * w)
		}
		if err := l.check("ncclGroupEnd", l.call(l.groupEnd)); err != nil || bcastErr != nil {
			return errors.Join(bcastErr, err)
		}
		off, col := uint64(0), 0
		for _, w := range ws {
			cp := cudaMemcpy2D{
				srcMemoryType: cuMemoryTypeDevice, srcDevice: staging + off, srcPitch: uintptr(4 * w),
				dstMemoryType: cuMemoryTypeDevice, dstDevice: o.ptr + uint64(4*col), dstPitch: uintptr(4 * total),
				widthInBytes: uintptr(4 * w), height: uintptr(rows),
			}
			if err := b.d.check("cuMemcpy2DAsync", b.d.call(l.memcpy2D, uintptr(unsafe.Pointer(&cp)), b.stream)); err != nil {
				return err
			}
			off += uint64(4 * rows * w)
			col += w
		}
		return nil
	})
}

// DeviceCount is the number of CUDA devices the driver sees.
func DeviceCount() (int, error) {
	d, err := loadDriver()
	if err != nil {
		return 0, fmt.Errorf("%w: %v", errNoGPU, err)
	}
	var n int32
	if err := d.check("cuDeviceGetCount", d.call(d.cuDeviceGetCount, uintptr(unsafe.Pointer(&n)))); err != nil {
		return 0, err
	}
	return int(n), nil
}
