package gguf

import (
	"encoding/binary"
	"fmt"
	"io/fs"
	"math"
	"math/bits"
	"slices"
	"strings"

	"github.com/trigon-llm/trigon/format/internal/mmap"
)

// Magic is the first four bytes of every GGUF file.
const Magic = "GGUF"

// DefaultAlignment is the data alignment of a file without general.alignment.
const DefaultAlignment = 32

// AlignmentKey names the metadata entry that overrides DefaultAlignment. It
// must be a uint32 (llama.cpp reads it as one), a non-zero power of two.
const AlignmentKey = "general.alignment"

// MaxDims is the most dimensions a GGUF tensor may have (GGML_MAX_DIMS).
const MaxDims = 4

// maxArrayDepth bounds the nesting of arrays. Real files nest at most once;
// the bound keeps a hostile file from recursing the parser to death (each
// level costs only 12 bytes of input).
const maxArrayDepth = 8

// Encoded lower bounds, used to check a count against the bytes left before
// allocating anything for it.
const (
	minKVSize     = 8 + 4 + 1         // empty key, type, one-byte value
	minTensorSize = 8 + 4 + 8 + 4 + 8 // empty name, n_dims, one dim, type, offset
)

// KV is one metadata entry.
type KV struct {
	Key   string
	Value Value
}

// TensorInfo describes one tensor and holds its bytes.
type TensorInfo struct {
	Name string
	Type GGMLType
	// Dims are in GGUF order, innermost first: Dims[0] is the row length,
	// the reverse of the [outer, ..., inner] order used elsewhere in trigon.
	Dims []uint64
	// Offset is the tensor's position relative to File.DataOffset.
	Offset uint64
	// Data is the tensor's encoded bytes, a slice of the file's mapping:
	// valid until File.Close and never to be written to.
	Data []byte
}

// File is a parsed GGUF file. Its fields are filled by Parse or Open and
// must not be modified: the lookup methods index them.
type File struct {
	Version uint32
	// KVs are the metadata entries in file order.
	KVs []KV
	// Tensors are the tensor infos in file order.
	Tensors []TensorInfo
	// Alignment is the data alignment: general.alignment or 32.
	Alignment uint64
	// DataOffset is the file offset where the data section starts (the end
	// of the tensor infos rounded up to Alignment).
	DataOffset uint64

	kvIndex     map[string]int
	tensorIndex map[string]int
	mapping     *mmap.Mapping
}

// FormatError reports a malformed file: where parsing stopped and why.
type FormatError struct {
	Offset int64 // byte offset in the file
	Msg    string
}

func (e *FormatError) Error() string {
	return fmt.Sprintf("gguf: invalid file at byte %d: %s", e.Offset, e.Msg)
}

// Open maps the file at path and parses it. Tensor data stays in the
// mapping until Close. A file that does not parse is an *fs.PathError
// naming path, as os.Open's errors are, so that a caller that names the
// file itself can take the path off.
func Open(path string) (*File, error) {
	m, err := mmap.Open(path)
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	f, err := Parse(m.Bytes())
	if err != nil {
		m.Close()
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	f.mapping = m
	return f, nil
}

// Close unmaps a file made by Open; after it the tensors' Data must not be
// touched. For a file made by Parse it does nothing.
func (f *File) Close() error {
	if f.mapping == nil {
		return nil
	}
	err := f.mapping.Close()
	f.mapping = nil
	return err
}

// Parse parses a whole GGUF file held in data. The tensors' Data slices
// alias data, so data must stay unchanged while they are used.
//
// Every count, length and offset is checked against the bytes that are
// actually there before anything is allocated for it, so a hostile file
// costs memory in proportion to its size only.
func Parse(data []byte) (*File, error) {
	d := &decoder{buf: data}
	f := &File{Alignment: DefaultAlignment}

	if len(data) < 4 || string(data[:4]) != Magic {
		return nil, d.errorf("bad magic %q, want %q", data[:min(4, len(data))], Magic)
	}
	d.off = 4
	version, err := d.u32("version")
	if err != nil {
		return nil, err
	}
	switch {
	case version == 2 || version == 3:
		f.Version = version
	case version == 1:
		return nil, d.errorf("GGUF version 1 is not supported (it used 32-bit counts); convert the file to v3")
	case version&0xffff == 0 && bits.ReverseBytes32(version)-1 < 3: // 1, 2 or 3 byte-swapped
		return nil, d.errorf("GGUF version %#08x looks big-endian; only little-endian files are supported", version)
	default:
		return nil, d.errorf("unsupported GGUF version %d (want 2 or 3)", version)
	}
	tensorCount, err := d.u64("tensor count")
	if err != nil {
		return nil, err
	}
	kvCount, err := d.u64("kv count")
	if err != nil {
		return nil, err
	}

	nKV, err := d.count(kvCount, minKVSize, "kv count")
	if err != nil {
		return nil, err
	}
	f.KVs = make([]KV, 0, nKV)
	f.kvIndex = make(map[string]int, nKV)
	for i := range nKV {
		d.ctx = fmt.Sprintf("kv %d", i)
		key, err := d.str("key")
		if err != nil {
			return nil, err
		}
		d.ctx = fmt.Sprintf("kv %d (%q)", i, key)
		if _, dup := f.kvIndex[key]; dup {
			return nil, d.errorf("duplicate key")
		}
		t, err := d.u32("value type")
		if err != nil {
			return nil, err
		}
		v, err := d.value(ValueType(t), 0)
		if err != nil {
			return nil, err
		}
		f.kvIndex[key] = len(f.KVs)
		f.KVs = append(f.KVs, KV{Key: key, Value: v})
	}
	d.ctx = ""
	if i, ok := f.kvIndex[AlignmentKey]; ok {
		v := f.KVs[i].Value
		if v.Type() != TypeUint32 {
			return nil, d.errorf("%s has type %v, want uint32", AlignmentKey, v.Type())
		}
		if v.bits == 0 || v.bits&(v.bits-1) != 0 {
			return nil, d.errorf("%s = %d is not a non-zero power of two", AlignmentKey, v.bits)
		}
		f.Alignment = v.bits
	}

	nTensors, err := d.count(tensorCount, minTensorSize, "tensor count")
	if err != nil {
		return nil, err
	}
	f.Tensors = make([]TensorInfo, 0, nTensors)
	f.tensorIndex = make(map[string]int, nTensors)
	sizes := make([]uint64, 0, nTensors)
	for i := range nTensors {
		d.ctx = fmt.Sprintf("tensor %d", i)
		t, size, err := d.tensorInfo(f.Alignment)
		if err != nil {
			return nil, err
		}
		if _, dup := f.tensorIndex[t.Name]; dup {
			return nil, d.errorf("duplicate tensor name %q", t.Name)
		}
		f.tensorIndex[t.Name] = len(f.Tensors)
		f.Tensors = append(f.Tensors, t)
		sizes = append(sizes, size)
	}
	d.ctx = ""

	start, ok := alignUp(uint64(d.off), f.Alignment)
	if !ok {
		return nil, d.errorf("data section offset overflows")
	}
	f.DataOffset = start
	if len(f.Tensors) > 0 && start > uint64(len(data)) {
		return nil, d.errorf("data section starts at %d, past the end of the file (%d bytes)", start, len(data))
	}
	for i := range f.Tensors {
		t := &f.Tensors[i]
		end, carry := bits.Add64(t.Offset, sizes[i], 0)
		if carry != 0 || end > uint64(len(data))-start {
			return nil, &FormatError{Offset: int64(d.off), Msg: fmt.Sprintf(
				"tensor %q: data [%d, %d+%d) runs past the end of the data section (%d bytes)",
				t.Name, t.Offset, t.Offset, sizes[i], uint64(len(data))-start)}
		}
		lo, hi := int(start+t.Offset), int(start+end)
		t.Data = data[lo:hi:hi]
	}
	if err := checkOverlap(f.Tensors, sizes); err != nil {
		return nil, &FormatError{Offset: int64(d.off), Msg: err.Error()}
	}
	return f, nil
}

// checkOverlap rejects tensors whose bytes share storage: a writer bug that
// would make one tensor silently alias another.
func checkOverlap(ts []TensorInfo, sizes []uint64) error {
	order := make([]int, len(ts))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		switch {
		case ts[a].Offset < ts[b].Offset:
			return -1
		case ts[a].Offset > ts[b].Offset:
			return 1
		}
		return 0
	})
	for k := 1; k < len(order); k++ {
		prev, cur := order[k-1], order[k]
		if ts[cur].Offset < ts[prev].Offset+sizes[prev] {
			return fmt.Errorf("tensor %q at [%d, %d) overlaps tensor %q at [%d, %d)",
				ts[cur].Name, ts[cur].Offset, ts[cur].Offset+sizes[cur],
				ts[prev].Name, ts[prev].Offset, ts[prev].Offset+sizes[prev])
		}
	}
	return nil
}

// alignUp rounds x up to a multiple of the power of two a.
func alignUp(x, a uint64) (uint64, bool) {
	sum, carry := bits.Add64(x, a-1, 0)
	if carry != 0 {
		return 0, false
	}
	return sum &^ (a - 1), true
}

// decoder reads little-endian fields with bounds checks; errors carry the
// offset and ctx (which entry is being read).
type decoder struct {
	buf []byte
	off int
	ctx string
}

func (d *decoder) errorf(format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if d.ctx != "" {
		msg = d.ctx + ": " + msg
	}
	return &FormatError{Offset: int64(d.off), Msg: msg}
}

func (d *decoder) left() int { return len(d.buf) - d.off }

// take returns the next n bytes.
func (d *decoder) take(n int, what string) ([]byte, error) {
	if n > d.left() {
		return nil, d.errorf("%s: need %d bytes, %d left in the file", what, n, d.left())
	}
	b := d.buf[d.off : d.off+n]
	d.off += n
	return b, nil
}

func (d *decoder) u8(what string) (uint8, error) {
	b, err := d.take(1, what)
	if err != nil {
		return 0, err
	}
	return b[0], nil
}

func (d *decoder) u16(what string) (uint16, error) {
	b, err := d.take(2, what)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint16(b), nil
}

func (d *decoder) u32(what string) (uint32, error) {
	b, err := d.take(4, what)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(b), nil
}

func (d *decoder) u64(what string) (uint64, error) {
	b, err := d.take(8, what)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b), nil
}

// count checks that n items of at least minSize bytes each fit in what is
// left of the file, and returns n as an int to allocate with.
func (d *decoder) count(n uint64, minSize int, what string) (int, error) {
	if n > uint64(d.left()/minSize) {
		return 0, d.errorf("%s %d needs at least %d bytes each, only %d bytes left", what, n, minSize, d.left())
	}
	return int(n), nil
}

// str reads a GGUF string: a uint64 byte length, then the bytes. The bytes
// are copied so that metadata outlives the mapping.
func (d *decoder) str(what string) (string, error) {
	n, err := d.strLen(what)
	if err != nil {
		return "", err
	}
	s := string(d.buf[d.off : d.off+n])
	d.off += n
	return s, nil
}

// strLen reads a string's length and checks that its bytes are there.
func (d *decoder) strLen(what string) (int, error) {
	if d.left() < 8 {
		return 0, d.errorf("%s length: need 8 bytes, %d left in the file", what, d.left())
	}
	n := binary.LittleEndian.Uint64(d.buf[d.off:])
	d.off += 8
	if n > uint64(d.left()) {
		return 0, d.errorf("%s of %d bytes, only %d bytes left", what, n, d.left())
	}
	return int(n), nil
}

// strs reads n strings. Vocabularies hold hundreds of thousands of short
// strings, so they are copied into one allocation and sliced from it,
// rather than allocated one by one.
func (d *decoder) strs(n int) ([]string, error) {
	start := d.off
	total := 0
	for range n {
		k, err := d.strLen("string")
		if err != nil {
			return nil, err
		}
		d.off += k
		total += k
	}
	end := d.off
	var b strings.Builder
	b.Grow(total)
	d.off = start
	for range n {
		k := int(binary.LittleEndian.Uint64(d.buf[d.off:]))
		b.Write(d.buf[d.off+8 : d.off+8+k])
		d.off += 8 + k
	}
	all := b.String()
	out := make([]string, n)
	d.off, total = start, 0
	for i := range out {
		k := int(binary.LittleEndian.Uint64(d.buf[d.off:]))
		out[i] = all[total : total+k]
		d.off += 8 + k
		total += k
	}
	d.off = end
	return out, nil
}

// value reads one value of type t; depth counts enclosing arrays.
func (d *decoder) value(t ValueType, depth int) (Value, error) {
	v := Value{typ: t}
	switch t {
	case TypeUint8, TypeBool:
		x, err := d.u8(t.String())
		if err != nil {
			return Value{}, err
		}
		if t == TypeBool && x > 1 {
			return Value{}, d.errorf("bool byte %d, want 0 or 1", x)
		}
		v.bits = uint64(x)
	case TypeInt8:
		x, err := d.u8(t.String())
		if err != nil {
			return Value{}, err
		}
		v.bits = uint64(int64(int8(x)))
	case TypeUint16, TypeInt16:
		x, err := d.u16(t.String())
		if err != nil {
			return Value{}, err
		}
		v.bits = uint64(x)
		if t == TypeInt16 {
			v.bits = uint64(int64(int16(x)))
		}
	case TypeUint32, TypeInt32, TypeFloat32:
		x, err := d.u32(t.String())
		if err != nil {
			return Value{}, err
		}
		v.bits = uint64(x)
		if t == TypeInt32 {
			v.bits = uint64(int64(int32(x)))
		}
	case TypeUint64, TypeInt64, TypeFloat64:
		x, err := d.u64(t.String())
		if err != nil {
			return Value{}, err
		}
		v.bits = x
	case TypeString:
		s, err := d.str("string")
		if err != nil {
			return Value{}, err
		}
		v.str = s
	case TypeArray:
		return d.array(depth)
	default:
		return Value{}, d.errorf("unknown value type %d", uint32(t))
	}
	return v, nil
}

// array reads an array body: element type, count, elements.
func (d *decoder) array(depth int) (Value, error) {
	if depth >= maxArrayDepth {
		return Value{}, d.errorf("arrays nested deeper than %d", maxArrayDepth)
	}
	et, err := d.u32("array element type")
	if err != nil {
		return Value{}, err
	}
	elem := ValueType(et)
	if !elem.valid() {
		return Value{}, d.errorf("unknown array element type %d", et)
	}
	n64, err := d.u64("array length")
	if err != nil {
		return Value{}, err
	}
	n, err := d.count(n64, elem.minSize(), "array of "+elem.String()+" length")
	if err != nil {
		return Value{}, err
	}
	v := Value{typ: TypeArray, elem: elem}
	if size := elem.fixedSize(); size > 0 {
		// The count check above already proved n*size bytes are there.
		raw, _ := d.take(n*size, "array")
		a, err := decodeFixed(elem, raw, n)
		if err != nil {
			return Value{}, d.errorf("%v", err)
		}
		v.arr = a
		return v, nil
	}
	switch elem {
	case TypeString:
		if v.arr, err = d.strs(n); err != nil {
			return Value{}, err
		}
	case TypeArray:
		a := make([]Value, n)
		for i := range a {
			if a[i], err = d.array(depth + 1); err != nil {
				return Value{}, err
			}
		}
		v.arr = a
	}
	return v, nil
}

// decodeFixed decodes n little-endian scalars of type t from raw.
func decodeFixed(t ValueType, raw []byte, n int) (any, error) {
	le := binary.LittleEndian
	switch t {
	case TypeUint8:
		return append([]uint8(nil), raw...), nil
	case TypeInt8:
		a := make([]int8, n)
		for i := range a {
			a[i] = int8(raw[i])
		}
		return a, nil
	case TypeBool:
		a := make([]bool, n)
		for i := range a {
			if raw[i] > 1 {
				return nil, fmt.Errorf("bool array element %d is %d, want 0 or 1", i, raw[i])
			}
			a[i] = raw[i] == 1
		}
		return a, nil
	case TypeUint16:
		a := make([]uint16, n)
		for i := range a {
			a[i] = le.Uint16(raw[2*i:])
		}
		return a, nil
	case TypeInt16:
		a := make([]int16, n)
		for i := range a {
			a[i] = int16(le.Uint16(raw[2*i:]))
		}
		return a, nil
	case TypeUint32:
		a := make([]uint32, n)
		for i := range a {
			a[i] = le.Uint32(raw[4*i:])
		}
		return a, nil
	case TypeInt32:
		a := make([]int32, n)
		for i := range a {
			a[i] = int32(le.Uint32(raw[4*i:]))
		}
		return a, nil
	case TypeFloat32:
		a := make([]float32, n)
		for i := range a {
			a[i] = math.Float32frombits(le.Uint32(raw[4*i:]))
		}
		return a, nil
	case TypeUint64:
		a := make([]uint64, n)
		for i := range a {
			a[i] = le.Uint64(raw[8*i:])
		}
		return a, nil
	case TypeInt64:
		a := make([]int64, n)
		for i := range a {
			a[i] = int64(le.Uint64(raw[8*i:]))
		}
		return a, nil
	case TypeFloat64:
		a := make([]float64, n)
		for i := range a {
			a[i] = math.Float64frombits(le.Uint64(raw[8*i:]))
		}
		return a, nil
	}
	return nil, fmt.Errorf("no fixed-size decoding for %v", t)
}

// tensorInfo reads one tensor info and validates it on its own; bounds
// against the data section are checked once all infos are read.
func (d *decoder) tensorInfo(alignment uint64) (TensorInfo, uint64, error) {
	var t TensorInfo
	name, err := d.str("tensor name")
	if err != nil {
		return t, 0, err
	}
	d.ctx += fmt.Sprintf(" (%q)", name)
	if name == "" {
		return t, 0, d.errorf("empty tensor name")
	}
	t.Name = name
	nd, err := d.u32("n_dims")
	if err != nil {
		return t, 0, err
	}
	if nd == 0 || nd > MaxDims {
		return t, 0, d.errorf("n_dims %d, want 1 to %d", nd, MaxDims)
	}
	t.Dims = make([]uint64, nd)
	for i := range t.Dims {
		if t.Dims[i], err = d.u64("dim"); err != nil {
			return t, 0, err
		}
	}
	typ, err := d.u32("tensor type")
	if err != nil {
		return t, 0, err
	}
	t.Type = GGMLType(typ)
	if t.Offset, err = d.u64("tensor offset"); err != nil {
		return t, 0, err
	}
	size, err := t.Type.Bytes(t.Dims)
	if err != nil {
		return t, 0, d.errorf("%v", err)
	}
	if t.Offset%alignment != 0 {
		return t, 0, d.errorf("offset %d is not a multiple of the alignment %d", t.Offset, alignment)
	}
	return t, size, nil
}

// Value returns the metadata value under key.
func (f *File) Value(key string) (Value, bool) {
	i, ok := f.kvIndex[key]
	if !ok {
		return Value{}, false
	}
	return f.KVs[i].Value, true
}

// Has reports whether key is present.
func (f *File) Has(key string) bool {
	_, ok := f.kvIndex[key]
	return ok
}

// String returns a string value.
func (f *File) String(key string) (string, bool) {
	v, ok := f.Value(key)
	if !ok {
		return "", false
	}
	return v.AsString()
}

// Uint returns a non-negative integer value of any integer type.
func (f *File) Uint(key string) (uint64, bool) {
	v, ok := f.Value(key)
	if !ok {
		return 0, false
	}
	return v.AsUint()
}

// Int returns an integer value of any integer type that fits in an int64.
func (f *File) Int(key string) (int64, bool) {
	v, ok := f.Value(key)
	if !ok {
		return 0, false
	}
	return v.AsInt()
}

// Float returns a float value (or an integer one, converted).
func (f *File) Float(key string) (float64, bool) {
	v, ok := f.Value(key)
	if !ok {
		return 0, false
	}
	return v.AsFloat()
}

// Bool returns a bool value.
func (f *File) Bool(key string) (bool, bool) {
	v, ok := f.Value(key)
	if !ok {
		return false, false
	}
	return v.AsBool()
}

// Strings returns a copy of a string array.
func (f *File) Strings(key string) ([]string, bool) {
	v, ok := f.Value(key)
	if !ok {
		return nil, false
	}
	return v.AsStrings()
}

// Floats returns a copy of a float32 array.
func (f *File) Floats(key string) ([]float32, bool) {
	v, ok := f.Value(key)
	if !ok {
		return nil, false
	}
	return v.AsFloat32s()
}

// Ints returns an integer array whose elements all fit in an int32.
func (f *File) Ints(key string) ([]int32, bool) {
	v, ok := f.Value(key)
	if !ok {
		return nil, false
	}
	return v.AsInt32s()
}

// Tensor returns the tensor called name.
func (f *File) Tensor(name string) (TensorInfo, bool) {
	i, ok := f.tensorIndex[name]
	if !ok {
		return TensorInfo{}, false
	}
	return f.Tensors[i], true
}
