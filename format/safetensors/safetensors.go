package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"strings"

	"github.com/trigon-llm/trigon/format/internal/mmap"
)

// MaxHeaderSize caps the JSON header. Real headers are a few megabytes at
// most; a larger length is a corrupt or hostile file, and refusing it early
// bounds what the JSON parser may allocate.
const MaxHeaderSize = 100 << 20

// metadataKey is the header entry that holds free-form string metadata
// instead of a tensor.
const metadataKey = "__metadata__"

// dtypeSizes are the element sizes of the dtypes this reader accepts. Which
// of them a model may use is the loader's business; the reader only needs
// the size to validate the byte ranges.
var dtypeSizes = map[string]int{
	"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
	"U16": 2, "I16": 2, "F16": 2, "BF16": 2,
	"U32": 4, "I32": 4, "F32": 4,
	"U64": 8, "I64": 8, "F64": 8,
}

// ElementSize returns the byte size of one element of dtype (as spelled in
// files: "F32", "BF16", ...), and whether the dtype is known.
func ElementSize(dtype string) (int, bool) {
	n, ok := dtypeSizes[dtype]
	return n, ok
}

// TensorInfo describes one tensor and holds its bytes.
type TensorInfo struct {
	Name string
	// DType is the dtype as written in the file: "F32", "F16", "BF16", ...
	DType string
	// Shape is outermost first, as in PyTorch; empty for a scalar.
	Shape []int
	// Data is the tensor's little-endian bytes, a slice of the file's
	// mapping: valid until Close and never to be written to.
	Data []byte
}

// File is an open safetensors file.
type File struct {
	tensors  []TensorInfo // sorted by name
	index    map[string]int
	metadata map[string]string
	mapping  *mmap.Mapping
}

// FormatError reports a malformed file.
type FormatError struct {
	Msg string
}

func (e *FormatError) Error() string { return "safetensors: invalid file: " + e.Msg }

func formatErr(format string, args ...any) error {
	return &FormatError{Msg: fmt.Sprintf(format, args...)}
}

// Open maps the file at path and parses it. Tensor data stays in the
// mapping until Close.
func Open(path string) (*File, error) {
	m, err := mmap.Open(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	f, err := Parse(m.Bytes())
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("open %s: %w", path, err)
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

// Parse parses a whole safetensors file held in data: an 8-byte
// little-endian header length, the JSON header, then the data section. The
// tensors' Data slices alias data.
func Parse(data []byte) (*File, error) {
	if len(data) < 8 {
		return nil, formatErr("%d bytes is shorter than the 8-byte header length", len(data))
	}
	n := binary.LittleEndian.Uint64(data)
	if n > MaxHeaderSize {
		return nil, formatErr("header length %d exceeds the cap of %d bytes", n, MaxHeaderSize)
	}
	if n > uint64(len(data)-8) {
		return nil, formatErr("header length %d runs past the end of the file (%d bytes follow the length)", n, len(data)-8)
	}
	start := 8 + int(n)
	h, err := parseHeader(data[8:start], uint64(len(data)-start))
	if err != nil {
		return nil, err
	}
	f := &File{
		tensors:  make([]TensorInfo, len(h.entries)),
		index:    make(map[string]int, len(h.entries)),
		metadata: h.metadata,
	}
	for i, e := range h.entries {
		lo, hi := start+int(e.begin), start+int(e.end)
		e.info.Data = data[lo:hi:hi]
		f.tensors[i] = e.info
		f.index[e.info.Name] = i
	}
	return f, nil
}

// Tensors returns every tensor, sorted by name. The slice is the caller's;
// the Shape and Data inside it are shared and must not be modified.
func (f *File) Tensors() []TensorInfo { return slices.Clone(f.tensors) }

// Tensor returns the tensor called name.
func (f *File) Tensor(name string) (TensorInfo, bool) {
	i, ok := f.index[name]
	if !ok {
		return TensorInfo{}, false
	}
	return f.tensors[i], true
}

// Metadata returns a copy of the __metadata__ entry (empty if absent).
func (f *File) Metadata() map[string]string {
	m := maps.Clone(f.metadata)
	if m == nil {
		m = map[string]string{}
	}
	return m
}

// entry is a validated tensor header entry: its byte range is
// [begin, end) of the data section.
type entry struct {
	info       TensorInfo
	begin, end uint64
}

type header struct {
	entries  []entry // sorted by name
	metadata map[string]string
}

// parseHeader parses and validates the JSON header of a file whose data
// section is dataLen bytes long.
//
// It reads the JSON as a token stream rather than unmarshalling into a map,
// because a map would silently keep only the last of two entries with the
// same name, and a file that names a tensor twice is ambiguous.
func parseHeader(hdr []byte, dataLen uint64) (*header, error) {
	r := newJSONReader(hdr)
	h := &header{}
	err := r.object("header", func(key string) error {
		if key == metadataKey {
			m, err := r.stringMap(metadataKey)
			h.metadata = m
			return err
		}
		e, err := r.tensorEntry(key, dataLen)
		if err != nil {
			return err
		}
		h.entries = append(h.entries, e)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if err := r.end(); err != nil {
		return nil, err
	}
	if err := checkOverlap(h.entries); err != nil {
		return nil, err
	}
	slices.SortFunc(h.entries, func(a, b entry) int { return strings.Compare(a.info.Name, b.info.Name) })
	return h, nil
}

// checkOverlap rejects tensors that share bytes. Empty tensors occupy
// nothing and overlap nothing. Gaps between tensors are allowed.
func checkOverlap(es []entry) error {
	order := make([]int, 0, len(es))
	for i, e := range es {
		if e.begin < e.end {
			order = append(order, i)
		}
	}
	slices.SortFunc(order, func(a, b int) int {
		switch {
		case es[a].begin < es[b].begin:
			return -1
		case es[a].begin > es[b].begin:
			return 1
		}
		return 0
	})
	for k := 1; k < len(order); k++ {
		p, c := &es[order[k-1]], &es[order[k]]
		if c.begin < p.end {
			return formatErr("tensor %q at [%d, %d) overlaps tensor %q at [%d, %d)",
				c.info.Name, c.begin, c.end, p.info.Name, p.begin, p.end)
		}
	}
	return nil
}

// jsonReader walks a JSON document token by token.
type jsonReader struct {
	dec *json.Decoder
}

func newJSONReader(b []byte) *jsonReader {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	return &jsonReader{dec: dec}
}

func (r *jsonReader) token(what string) (json.Token, error) {
	tok, err := r.dec.Token()
	if err != nil {
		return nil, jsonErr(what, err)
	}
	return tok, nil
}

// jsonErr reports a decoding error of the value what.
func jsonErr(what string, err error) error {
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return formatErr("%s: unexpected end of JSON", what)
	}
	return formatErr("%s: invalid JSON: %v", what, err)
}

// end checks that only whitespace follows the top-level value (writers pad
// the header with spaces for alignment).
func (r *jsonReader) end() error {
	tok, err := r.dec.Token()
	if err == io.EOF {
		return nil
	}
	if err != nil {
		return formatErr("after the header object: invalid JSON: %v", err)
	}
	return formatErr("unexpected %v after the header object", describe(tok))
}

// object reads a JSON object, calling field for each key with the decoder
// positioned at its value; field must consume the value. Duplicate keys
// are an error.
func (r *jsonReader) object(what string, field func(key string) error) error {
	tok, err := r.token(what)
	if err != nil {
		return err
	}
	if tok != json.Delim('{') {
		return formatErr("%s: want a JSON object, got %v", what, describe(tok))
	}
	seen := map[string]bool{}
	for r.dec.More() {
		tok, err := r.token(what)
		if err != nil {
			return err
		}
		key, ok := tok.(string)
		if !ok {
			return formatErr("%s: want a key, got %v", what, describe(tok))
		}
		if seen[key] {
			return formatErr("%s: duplicate key %q", what, key)
		}
		seen[key] = true
		if err := field(key); err != nil {
			return err
		}
	}
	_, err = r.token(what) // the closing brace; Token checks the syntax
	return err
}

func (r *jsonReader) str(what string) (string, error) {
	tok, err := r.token(what)
	if err != nil {
		return "", err
	}
	s, ok := tok.(string)
	if !ok {
		return "", formatErr("%s: want a string, got %v", what, describe(tok))
	}
	return s, nil
}

// skip consumes one value of any kind.
func (r *jsonReader) skip(what string) error {
	var raw json.RawMessage
	if err := r.dec.Decode(&raw); err != nil {
		return jsonErr(what, err)
	}
	return nil
}

// stringMap reads an object of string values, or null (as nil).
func (r *jsonReader) stringMap(what string) (map[string]string, error) {
	// The value is taken whole first: the token stream cannot peek at null.
	var raw json.RawMessage
	if err := r.dec.Decode(&raw); err != nil {
		return nil, jsonErr(what, err)
	}
	if string(bytes.TrimSpace(raw)) == "null" {
		return nil, nil
	}
	sub := newJSONReader(raw)
	m := map[string]string{}
	err := sub.object(what, func(key string) error {
		v, err := sub.str(fmt.Sprintf("%s[%q]", what, key))
		m[key] = v
		return err
	})
	return m, err
}

// uints reads an array of non-negative integers, each at most limit.
func (r *jsonReader) uints(what string, limit uint64) ([]uint64, error) {
	tok, err := r.token(what)
	if err != nil {
		return nil, err
	}
	if tok != json.Delim('[') {
		return nil, formatErr("%s: want an array, got %v", what, describe(tok))
	}
	var out []uint64
	for r.dec.More() {
		tok, err := r.token(what)
		if err != nil {
			return nil, err
		}
		num, ok := tok.(json.Number)
		if !ok {
			return nil, formatErr("%s: want a number, got %v", what, describe(tok))
		}
		s := num.String()
		if strings.HasPrefix(s, "-") {
			return nil, formatErr("%s: negative value %s", what, s)
		}
		x, err := strconv.ParseUint(s, 10, 64)
		if errors.Is(err, strconv.ErrRange) || (err == nil && x > limit) {
			return nil, formatErr("%s: value %s overflows", what, s)
		}
		if err != nil {
			return nil, formatErr("%s: %s is not an integer", what, s)
		}
		out = append(out, x)
	}
	_, err = r.token(what) // ']'
	return out, err
}

// tensorEntry reads and validates {"dtype", "shape", "data_offsets"}.
// Unknown fields are skipped, as the reference implementation does.
func (r *jsonReader) tensorEntry(name string, dataLen uint64) (entry, error) {
	what := fmt.Sprintf("tensor %q", name)
	var (
		e                         = entry{info: TensorInfo{Name: name}}
		dims, offsets             []uint64
		haveDType, haveShape, hav bool
	)
	err := r.object(what, func(key string) error {
		var err error
		switch key {
		case "dtype":
			e.info.DType, err = r.str(what + " dtype")
			haveDType = true
		case "shape":
			dims, err = r.uints(what+" shape", math.MaxInt)
			haveShape = true
		case "data_offsets":
			offsets, err = r.uints(what+" data_offsets", math.MaxInt64)
			hav = true
		default:
			err = r.skip(what + " " + key)
		}
		return err
	})
	if err != nil {
		return e, err
	}
	if !haveDType || !haveShape || !hav {
		return e, formatErr("%s: want dtype, shape and data_offsets", what)
	}
	size, ok := dtypeSizes[e.info.DType]
	if !ok {
		return e, formatErr("%s: unknown dtype %q", what, e.info.DType)
	}
	if len(offsets) != 2 || offsets[0] > offsets[1] {
		return e, formatErr("%s: data_offsets %v is not [begin, end] with begin <= end", what, offsets)
	}
	e.begin, e.end = offsets[0], offsets[1]
	if e.end > dataLen {
		return e, formatErr("%s: data_offsets end %d is past the end of the data section (%d bytes)", what, e.end, dataLen)
	}
	e.info.Shape = make([]int, len(dims))
	var n uint64 = 1
	for i, d := range dims {
		e.info.Shape[i] = int(d)
		hi, lo := bits.Mul64(n, d)
		if hi != 0 || lo > math.MaxInt64 {
			return e, formatErr("%s: element count of shape %v overflows", what, dims)
		}
		n = lo
	}
	hi, want := bits.Mul64(n, uint64(size))
	if hi != 0 {
		return e, formatErr("%s: byte size of %s %v overflows", what, e.info.DType, dims)
	}
	if want != e.end-e.begin {
		return e, formatErr("%s: %s %v needs %d*%d bytes, data_offsets [%d, %d] hold %d",
			what, e.info.DType, dims, n, size, e.begin, e.end, e.end-e.begin)
	}
	return e, nil
}

// describe names a JSON token for error messages.
func describe(tok json.Token) string {
	switch t := tok.(type) {
	case nil:
		return "null"
	case json.Delim:
		return strconv.Quote(t.String())
	case string:
		return "string " + strconv.Quote(t)
	case json.Number:
		return "number " + t.String()
	case bool:
		return strconv.FormatBool(t)
	}
	return fmt.Sprint(tok)
}
