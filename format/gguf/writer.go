package gguf

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
)

// Writer builds a GGUF v3 file: metadata and tensors are added in the order
// they will appear, then WriteTo streams the file out.
//
// Tensor data is not copied: AddTensor keeps the caller's slice until
// WriteTo, so converting a model from mmapped weights costs no extra memory.
// Errors from AddKV are sticky and reported by WriteTo.
type Writer struct {
	kvs      []KV
	keys     map[string]bool
	tensors  []TensorInfo
	names    map[string]bool
	firstErr error
}

// NewWriter returns an empty Writer.
func NewWriter() *Writer {
	return &Writer{keys: map[string]bool{}, names: map[string]bool{}}
}

// AddKV appends a metadata entry. A key added twice makes WriteTo fail: a
// GGUF file may not hold duplicate keys.
func (w *Writer) AddKV(key string, v Value) {
	if w.keys[key] {
		w.setErr(fmt.Errorf("gguf writer: duplicate key %q", key))
		return
	}
	if err := checkValue(v, 0); err != nil {
		w.setErr(fmt.Errorf("gguf writer: key %q: %w", key, err))
		return
	}
	w.keys[key] = true
	w.kvs = append(w.kvs, KV{Key: key, Value: v})
}

func (w *Writer) setErr(err error) {
	if w.firstErr == nil {
		w.firstErr = err
	}
}

// checkValue rejects values the reader would refuse: bad type tags and
// arrays nested too deep or holding non-arrays where arrays are declared.
func checkValue(v Value, depth int) error {
	if !v.typ.valid() {
		return fmt.Errorf("unknown value type %d", uint32(v.typ))
	}
	if v.typ != TypeArray {
		return nil
	}
	if depth >= maxArrayDepth {
		return fmt.Errorf("arrays nested deeper than %d", maxArrayDepth)
	}
	if v.elem == TypeArray {
		inner, _ := v.arr.([]Value)
		for i, e := range inner {
			if e.typ != TypeArray {
				return fmt.Errorf("element %d of an array of arrays is a %v", i, e.typ)
			}
			if err := checkValue(e, depth+1); err != nil {
				return fmt.Errorf("element %d: %w", i, err)
			}
		}
	}
	return nil
}

// AddTensor appends a tensor. dims are in GGUF order (innermost first) and
// data must be exactly the encoded size of such a tensor. The Writer keeps
// data, unchanged, until WriteTo.
func (w *Writer) AddTensor(name string, typ GGMLType, dims []uint64, data []byte) error {
	if name == "" {
		return errors.New("gguf writer: empty tensor name")
	}
	if w.names[name] {
		return fmt.Errorf("gguf writer: duplicate tensor %q", name)
	}
	size, err := typ.Bytes(dims)
	if err != nil {
		return fmt.Errorf("gguf writer: tensor %q: %w", name, err)
	}
	if uint64(len(data)) != size {
		return fmt.Errorf("gguf writer: tensor %q: %v %v needs %d bytes, got %d", name, typ, dims, size, len(data))
	}
	w.names[name] = true
	w.tensors = append(w.tensors, TensorInfo{Name: name, Type: typ, Dims: append([]uint64(nil), dims...), Data: data})
	return nil
}

// alignment is general.alignment if it was added, else the default.
func (w *Writer) alignment() (uint64, error) {
	for _, kv := range w.kvs {
		if kv.Key != AlignmentKey {
			continue
		}
		if kv.Value.Type() != TypeUint32 {
			return 0, fmt.Errorf("%s has type %v, want uint32", AlignmentKey, kv.Value.Type())
		}
		a := kv.Value.bits
		if a == 0 || a&(a-1) != 0 {
			return 0, fmt.Errorf("%s = %d is not a non-zero power of two", AlignmentKey, a)
		}
		return a, nil
	}
	return DefaultAlignment, nil
}

// WriteTo writes the file: header, metadata, tensor infos, padding, then
// each tensor's data padded to the alignment.
func (w *Writer) WriteTo(out io.Writer) (int64, error) {
	if w.firstErr != nil {
		return 0, w.firstErr
	}
	align, err := w.alignment()
	if err != nil {
		return 0, fmt.Errorf("gguf writer: %w", err)
	}
	// Lay the tensors out first so the infos can carry their offsets.
	offsets := make([]uint64, len(w.tensors))
	var pos uint64
	for i, t := range w.tensors {
		offsets[i] = pos
		end, carry := bits.Add64(pos, uint64(len(t.Data)), 0)
		end, ok := alignUp(end, align)
		if !ok || carry != 0 {
			return 0, errors.New("gguf writer: data section size overflows")
		}
		pos = end
	}

	cw := &countingWriter{w: out}
	bw := bufio.NewWriterSize(cw, 1<<16)
	e := encoder{w: bw}
	e.bytes([]byte(Magic))
	e.u32(3)
	e.u64(uint64(len(w.tensors)))
	e.u64(uint64(len(w.kvs)))
	for _, kv := range w.kvs {
		e.str(kv.Key)
		e.u32(uint32(kv.Value.typ))
		e.value(kv.Value)
	}
	for i, t := range w.tensors {
		e.str(t.Name)
		e.u32(uint32(len(t.Dims)))
		for _, d := range t.Dims {
			e.u64(d)
		}
		e.u32(uint32(t.Type))
		e.u64(offsets[i])
	}
	if e.err != nil {
		return cw.n, fmt.Errorf("gguf writer: %w", e.err)
	}
	if err := bw.Flush(); err != nil {
		return cw.n, fmt.Errorf("gguf writer: %w", err)
	}
	if err := pad(cw, align); err != nil {
		return cw.n, fmt.Errorf("gguf writer: %w", err)
	}
	for _, t := range w.tensors {
		if _, err := cw.Write(t.Data); err != nil {
			return cw.n, fmt.Errorf("gguf writer: tensor %q: %w", t.Name, err)
		}
		if err := pad(cw, align); err != nil {
			return cw.n, fmt.Errorf("gguf writer: %w", err)
		}
	}
	return cw.n, nil
}

// pad writes zeros up to the next multiple of align.
func pad(cw *countingWriter, align uint64) error {
	n := (align - uint64(cw.n)%align) % align
	var zeros [256]byte
	for n > 0 {
		k := min(n, uint64(len(zeros)))
		if _, err := cw.Write(zeros[:k]); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// encoder writes little-endian fields, keeping the first error.
type encoder struct {
	w   *bufio.Writer
	err error
	buf [8]byte
}

func (e *encoder) bytes(b []byte) {
	if e.err == nil {
		_, e.err = e.w.Write(b)
	}
}

func (e *encoder) u8(x uint8) { e.bytes([]byte{x}) }

func (e *encoder) u16(x uint16) {
	binary.LittleEndian.PutUint16(e.buf[:2], x)
	e.bytes(e.buf[:2])
}

func (e *encoder) u32(x uint32) {
	binary.LittleEndian.PutUint32(e.buf[:4], x)
	e.bytes(e.buf[:4])
}

func (e *encoder) u64(x uint64) {
	binary.LittleEndian.PutUint64(e.buf[:8], x)
	e.bytes(e.buf[:8])
}

func (e *encoder) str(s string) {
	e.u64(uint64(len(s)))
	if e.err == nil {
		_, e.err = e.w.WriteString(s)
	}
}

// value writes v without its type tag.
func (e *encoder) value(v Value) {
	switch v.typ {
	case TypeUint8, TypeInt8, TypeBool:
		e.u8(uint8(v.bits))
	case TypeUint16, TypeInt16:
		e.u16(uint16(v.bits))
	case TypeUint32, TypeInt32, TypeFloat32:
		e.u32(uint32(v.bits))
	case TypeUint64, TypeInt64, TypeFloat64:
		e.u64(v.bits)
	case TypeString:
		e.str(v.str)
	case TypeArray:
		e.u32(uint32(v.elem))
		e.u64(uint64(v.Len()))
		e.array(v)
	}
}

func (e *encoder) array(v Value) {
	switch a := v.arr.(type) {
	case []uint8:
		e.bytes(a)
	case []int8:
		for _, x := range a {
			e.u8(uint8(x))
		}
	case []bool:
		for _, x := range a {
			if x {
				e.u8(1)
			} else {
				e.u8(0)
			}
		}
	case []uint16:
		for _, x := range a {
			e.u16(x)
		}
	case []int16:
		for _, x := range a {
			e.u16(uint16(x))
		}
	case []uint32:
		for _, x := range a {
			e.u32(x)
		}
	case []int32:
		for _, x := range a {
			e.u32(uint32(x))
		}
	case []float32:
		for _, x := range a {
			e.u32(math.Float32bits(x))
		}
	case []uint64:
		for _, x := range a {
			e.u64(x)
		}
	case []int64:
		for _, x := range a {
			e.u64(uint64(x))
		}
	case []float64:
		for _, x := range a {
			e.u64(math.Float64bits(x))
		}
	case []string:
		for _, x := range a {
			e.str(x)
		}
	case []Value:
		for _, x := range a {
			e.value(x) // an array body: element type, count, elements
		}
	}
}
