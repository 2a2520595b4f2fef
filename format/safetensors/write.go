package safetensors

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
)

// Write writes tensors, in order, and metadata (may be nil) as one
// safetensors file at path: the 8-byte little-endian header size, the
// JSON header padded with spaces to 8 bytes, then the data. Each tensor's
// Data must hold exactly its shape's bytes in its DType; names must be
// unique. It is for tools and tests that make checkpoints.
func Write(path string, tensors []TensorInfo, metadata map[string]string) error {
	type entry struct {
		DType   string    `json:"dtype"`
		Shape   []int     `json:"shape"`
		Offsets [2]uint64 `json:"data_offsets"`
	}
	hdr := map[string]any{}
	if metadata != nil {
		hdr[metadataKey] = metadata
	}
	var off uint64
	for _, t := range tensors {
		if _, dup := hdr[t.Name]; dup || t.Name == metadataKey {
			return fmt.Errorf("safetensors: write %s: duplicate or reserved tensor name %q", path, t.Name)
		}
		size, ok := ElementSize(t.DType)
		if !ok {
			return fmt.Errorf("safetensors: write %s: tensor %s has unknown dtype %q", path, t.Name, t.DType)
		}
		n := 1
		for _, d := range t.Shape {
			if d < 0 {
				return fmt.Errorf("safetensors: write %s: tensor %s has shape %v", path, t.Name, t.Shape)
			}
			n *= d
		}
		if n*size != len(t.Data) {
			return fmt.Errorf("safetensors: write %s: tensor %s %s %v holds %d bytes, want %d", path, t.Name, t.DType, t.Shape, len(t.Data), n*size)
		}
		shape := t.Shape
		if shape == nil {
			shape = []int{}
		}
		hdr[t.Name] = entry{t.DType, shape, [2]uint64{off, off + uint64(len(t.Data))}}
		off += uint64(len(t.Data))
	}
	h, err := json.Marshal(hdr)
	if err != nil {
		return fmt.Errorf("safetensors: write %s: %w", path, err)
	}
	for len(h)%8 != 0 {
		h = append(h, ' ')
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("safetensors: write: %w", err)
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	var size [8]byte
	binary.LittleEndian.PutUint64(size[:], uint64(len(h)))
	bw.Write(size[:])
	bw.Write(h)
	for _, t := range tensors {
		bw.Write(t.Data)
	}
	if err := bw.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("safetensors: write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("safetensors: write %s: %w", path, err)
	}
	return nil
}
