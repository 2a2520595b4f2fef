package cuda

import (
	"encoding/binary"
	"fmt"

	"github.com/trigon-llm/trigon/backend"
)

// The device layout of AWQ4 weights (kernels/wquant.cu's header comment
// draws it): each row of k inputs keeps its byte count, k/2 + 4*(k/g), but
// its nibbles come first, each 128-input chunk's sixteen words in the order
// the decode kernel's lane quads read them as 16-byte loads, and the
// groups' headers after them. Rows stay self-contained, so row views,
// stacked uploads and row shards keep working; the host side
// (backend/wquant.go's blocks) stays the format, which Write translates
// from and Read back to. F8E4M3Row needs no translation: its rows are
// 16-byte aligned as stored.

// isAWQ reports whether dt is stored in the AWQ4 device layout.
func isAWQ(dt backend.DType) bool { return backend.AWQGroup(dt) != 0 }

// awqWordOffset is the byte offset, in a device row of k inputs, of word
// w (inputs 8w..8w+7): word i = tq + 4q of chunk c = w/16 at 64c +
// 4*(tq*Q + q), Q the chunk's 32-input quads (4, or fewer in a last,
// short chunk). kernels/wquant.cu's awq_wofs is the same map.
func awqWordOffset(w, k int) int {
	c, i := w/16, w%16
	q := min(4, k/32-4*c)
	return 64*c + 4*((i%4)*q+i/4)
}

// awqRepack translates whole rows of k inputs of an AWQ4 tensor of dtype
// dt between the format (backend/wquant.go) and the device layout: to the
// device when toDevice, else back. dst and src are distinct and of equal
// length, a whole number of rows.
func awqRepack(dt backend.DType, dst, src []byte, k int, toDevice bool) error {
	g := backend.AWQGroup(dt)
	rb, err := dt.RowBytes(k)
	if err != nil {
		return err
	}
	if g == 0 || k%32 != 0 || len(dst) != len(src) || rb == 0 || len(src)%rb != 0 {
		return fmt.Errorf("cuda: awq repack: %d bytes of %v rows of %d inputs: %w", len(src), dt, k, backend.ErrShape)
	}
	// The row's word moves, format offset to device offset, computed once.
	bb, wpb, words, half := 4+g/2, g/8, k/8, k/2
	fmtOff, devOff := make([]int, 0, words+k/g), make([]int, 0, words+k/g)
	for j := range k / g { // headers: the format's block starts, the device's header plane
		fmtOff, devOff = append(fmtOff, j*bb), append(devOff, half+4*j)
	}
	for w := range words {
		fmtOff, devOff = append(fmtOff, (w/wpb)*bb+4+4*(w%wpb)), append(devOff, awqWordOffset(w, k))
	}
	from, to := fmtOff, devOff
	if !toDevice {
		from, to = devOff, fmtOff
	}
	le := binary.LittleEndian
	for r := 0; r < len(src); r += rb {
		s, d := src[r:r+rb], dst[r:r+rb]
		for i, f := range from {
			le.PutUint32(d[to[i]:], le.Uint32(s[f:]))
		}
	}
	return nil
}

// deviceBytes returns data as tensor t stores it on the device: data
// itself unless t's dtype has a device layout, else a translated copy.
func deviceBytes(t *tensor, data []byte) ([]byte, error) {
	if !isAWQ(t.dt) {
		return data, nil
	}
	out := make([]byte, len(data))
	return out, awqRepack(t.dt, out, data, t.shape[len(t.shape)-1], true)
}

// hostBytes translates dst, read from tensor t's device bytes, back to
// the format in place.
func hostBytes(t *tensor, dst []byte) error {
	if !isAWQ(t.dt) {
		return nil
	}
	dev := append([]byte(nil), dst...)
	return awqRepack(t.dt, dst, dev, t.shape[len(t.shape)-1], false)
}
