package cuda

import (
	"fmt"
	"unsafe"

	"github.com/trigon-llm/trigon/backend"
)

var _ backend.DeviceSampler = (*Backend)(nil)

// SampleTo implements backend.DeviceSampler: sample_rows writes its picks
// straight into ids, and the call returns once the launch is queued.
//
//	ids [n] I32;  args as for Sample
func (b *Backend) SampleTo(ids backend.Tensor, a backend.SampleArgs) error {
	const op = "sampleto"
	it, err := b.tensorOf(op, "ids", ids)
	if err != nil {
		return err
	}
	lt, params, err := b.sampleOperands(op, a)
	if err != nil {
		return err
	}
	if err := opErr(backend.CheckDType(op, "ids", it, backend.I32)); err != nil {
		return err
	}
	if err := opErr(backend.CheckShape(op, "ids", it, lt.shape[0])); err != nil {
		return err
	}
	return b.post(func() error { return b.sampleLaunch(lt, params, it.ptr) })
}

// asyncRead is one pending ReadAsync: a pinned buffer the copy lands in
// and the event recorded after it.
type asyncRead struct {
	mem  pinned
	dev  uint64 // mem's device address (host-mapped)
	ev   uintptr
	busy bool // queued and not yet waited for
}

// ReadAsync implements backend.DeviceSampler: a copy into one of
// MaxAsyncReads host-mapped pinned buffers (copy_words, or
// cuMemcpyDtoHAsync where copyKernel declines), then an event; wait synchronises on the
// event (not the stream, so work queued after the read keeps running),
// copies the bytes out and checks the device-side error flag.
func (b *Backend) ReadAsync(t backend.Tensor, dst []byte) (func() error, error) {
	const op = "readasync"
	ct, err := b.tensorOf(op, "t", t)
	if err != nil {
		return nil, err
	}
	if len(dst) != ct.bytes || len(dst) > backend.MaxAsyncRead {
		return nil, backend.ShapeError("cuda: "+op, "dst", "%d bytes for a %v%v tensor of %d bytes (at most %d)",
			len(dst), ct.dt, ct.shape, ct.bytes, backend.MaxAsyncRead)
	}
	if b.hostCapturing {
		return nil, fmt.Errorf("cuda: %s: %w", op, errCapturing)
	}
	// Set by the queued copy, read by wait (which runs after it on the
	// CUDA thread): the buffer, or why there was none (that error is this
	// read's, not one for whichever wait or Sync comes first).
	var slot *asyncRead
	var noSlot error
	if err := b.post(func() error {
		for i := range b.reads {
			if !b.reads[i].busy {
				slot = &b.reads[i]
				break
			}
		}
		if slot == nil {
			noSlot = fmt.Errorf("cuda: %s: more than %d reads pending", op, backend.MaxAsyncReads)
			return nil
		}
		d := b.d
		if slot.mem.b == nil {
			var err error
			if slot.mem, err = b.hostAlloc(backend.MaxAsyncRead, cuMemHostAllocDeviceMap|cuMemHostAllocPortable); err != nil {
				return err
			}
			if err := d.check("cuMemHostGetDevicePointer", d.call(d.cuMemHostGetDevicePointer, uintptr(unsafe.Pointer(&slot.dev)), slot.mem.host, 0)); err != nil {
				return err
			}
			if err := d.check("cuEventCreate", d.call(d.cuEventCreate, uintptr(unsafe.Pointer(&slot.ev)), cuEventDisableTiming)); err != nil {
				return err
			}
		}
		// A kernel writes the bytes into the mapped buffer (copyKernel);
		// its completion, which the event marks, makes them visible.
		if ok, err := b.copyKernel(slot.dev, ct.ptr, len(dst)); err != nil {
			return err
		} else if !ok {
			if err := d.check("cuMemcpyDtoHAsync", d.call(d.cuMemcpyDtoHAsync, slot.mem.host, uintptr(ct.ptr), uintptr(len(dst)), b.stream)); err != nil {
				return err
			}
		}
		if err := d.check("cuEventRecord", d.call(d.cuEventRecord, slot.ev, b.stream)); err != nil {
			return err
		}
		slot.busy = true
		return nil
	}); err != nil {
		return nil, err
	}
	waited := false
	return func() error {
		if waited {
			return fmt.Errorf("cuda: %s: wait called twice", op)
		}
		waited = true
		return b.callSpin(func() error {
			if noSlot != nil {
				return noSlot
			}
			if slot == nil { // the copy failed to queue: its error is deferred
				err := b.deferred
				b.deferred = nil
				if err == nil {
					err = fmt.Errorf("cuda: %s: the copy was not queued", op)
				}
				return err
			}
			slot.busy = false
			d := b.d
			if err := d.check("cuEventSynchronize", d.call(d.cuEventSynchronize, slot.ev)); err != nil {
				return err
			}
			copy(dst, slot.mem.b[:len(dst)])
			if err := hostBytes(ct, dst); err != nil { // AWQ4: back to the format
				return err
			}
			err := b.deviceCheck()
			if err == nil {
				err = b.deferred
			}
			b.deferred = nil
			return err
		})
	}, nil
}
