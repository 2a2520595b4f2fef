// Package convert writes a checkpoint as a GGUF file in llama.cpp's layout:
// architecture metadata, the tokenizer, and every tensor under its GGUF name,
// converted to the requested type.
//
// The tokenizer's pre-tokenizer is written under llama.cpp's name for it
// where llama.cpp has one; a split llama.cpp does not know keeps trigon's
// name, and the Report says llama.cpp will not load the file. Options.Pre
// writes another name instead, and the Report says whether its split is
// the tokenizer's.
//
// Norm weights and biases (1-D tensors) stay F32 as llama.cpp keeps them;
// matrices are written in the target type. Quantized targets need inner
// dimensions that are whole blocks (32 values for Q8_0 and Q4_0, 256 for
// the K-quants); a matrix that is not is written in a fallback type (see
// kquant.go for the K-quants; F16 otherwise, F32 for F32 targets) and
// reported. The q4_k_m and q5_k_m targets mix types per tensor as
// llama.cpp's Q4_K_M and Q5_K_M do (Options.KMix).
package convert

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/format/gguf"
	"github.com/trigon-llm/trigon/model"
	"github.com/trigon-llm/trigon/tokenizer"
)

// ParseType maps a user-facing type name to a dtype.
func ParseType(s string) (backend.DType, error) {
	switch strings.ToLower(s) {
	case "f32":
		return backend.F32, nil
	case "f16":
		return backend.F16, nil
	case "bf16":
		return backend.BF16, nil
	case "q8_0":
		return backend.Q8_0, nil
	case "q4_0":
		return backend.Q4_0, nil
	case "q4_k":
		return backend.Q4_K, nil
	case "q5_k":
		return backend.Q5_K, nil
	case "q6_k":
		return backend.Q6_K, nil
	}
	return 0, fmt.Errorf("unknown type %q: want f32, f16, bf16, q8_0, q4_0, q4_k, q5_k or q6_k", s)
}

// Options of a conversion.
type Options struct {
	Type backend.DType // target type of matrices
	// KMix raises some matrices of a Q4_K or Q5_K target to Q6_K by
	// llama.cpp's rule for its _M files (tensorType).
	KMix bool
	Name string // general.name; default: the source's base name
	// Pre, when set, is written as tokenizer.ggml.pre instead of the
	// tokenizer's own name: a byte-level BPE name trigon reads
	// (tokenizer.PreNames), for readers that refuse the tokenizer's own
	// (llama.cpp and "trigon-go"). The file's readers tokenize by Pre's
	// split; Report.PreDiffers says when that is not the tokenizer's.
	Pre string
}

// Report says what a conversion wrote.
type Report struct {
	Tensors  int
	Bytes    int64
	Fallback []string // matrices written in a fallback type: their rows are not whole blocks
	// NotLlamaCpp says why llama.cpp will refuse the file (a tokenizer it
	// has no name for), "" when it should load it. trigon reads the file
	// either way.
	NotLlamaCpp string
	// PreDiffers, with Options.Pre, says how the split Pre names differs
	// from the tokenizer's own; "" when they are the same split.
	PreDiffers string
}

// TensorCount is the number of tensors Write puts in a GGUF file of
// (cfg, w): every weight, plus rope_freqs.weight when cfg has Llama 3.1
// scaling, which a GGUF file stores as a tensor and an HF checkpoint as
// config.
func TensorCount(cfg model.Config, w model.Weights) (int, error) {
	n := 0
	if _, ok, err := cfg.RopeFreqsTensor(); err != nil {
		return 0, err
	} else if ok {
		n++
	}
	for _, name := range w.Names() {
		if _, ok := w.Tensor(name); ok && !model.IsKVScale(name) {
			n++
		}
	}
	return n, nil
}

// File converts the model at src (HF directory or GGUF) with tokenizer tok
// into a GGUF file at dst, written atomically. dst is checked first
// (checkOutput), before any tensor is read.
func File(src, dst string, tok *tokenizer.Tokenizer, opts Options) (Report, error) {
	if err := checkOutput(src, dst); err != nil {
		return Report{}, err
	}
	cfg, _, w, err := model.OpenWeights(src)
	if err != nil {
		return Report{}, err
	}
	defer w.Close()
	if opts.Name == "" {
		opts.Name = filepath.Base(filepath.Clean(src))
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".convert-*.gguf")
	if err != nil {
		return Report{}, fmt.Errorf("convert: %w", err)
	}
	defer os.Remove(tmp.Name())
	rep, err := Write(tmp, cfg, w, tok, opts)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return rep, fmt.Errorf("convert %s: %w", src, err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return rep, fmt.Errorf("convert: %w", err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return rep, fmt.Errorf("convert: %w", err)
	}
	return rep, nil
}

// checkOutput refuses a dst the conversion cannot or must not write: a
// directory, a path in a directory that does not exist, or an existing
// file of the HF directory src other than a GGUF file (its weights,
// config or tokenizer, which the rename of the finished file would
// replace while they are the conversion's input). A GGUF src converted
// onto itself is allowed: the new file replaces it only once written.
func checkOutput(src, dst string) error {
	if st, err := os.Stat(dst); err == nil && st.IsDir() {
		return fmt.Errorf("convert: output %s is a directory; want a file path such as %s", dst, filepath.Join(dst, "model.gguf"))
	}
	dir := filepath.Dir(dst)
	dirSt, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("convert: output %s: directory %s does not exist", dst, dir)
	case err != nil:
		return fmt.Errorf("convert: output %s: %w", dst, err)
	case !dirSt.IsDir():
		return fmt.Errorf("convert: output %s: %s is not a directory", dst, dir)
	}
	srcSt, err := os.Stat(src)
	if err != nil || !srcSt.IsDir() {
		return nil // OpenWeights reports a missing src
	}
	if _, err := os.Lstat(dst); err == nil && os.SameFile(dirSt, srcSt) && !strings.HasSuffix(strings.ToLower(dst), ".gguf") {
		return fmt.Errorf("convert: output %s would replace a file of the source directory %s; write the GGUF file elsewhere", dst, src)
	}
	return nil
}

// Write streams the GGUF form of (cfg, w, tok) to out.
func Write(out io.Writer, cfg model.Config, w model.Weights, tok *tokenizer.Tokenizer, opts Options) (Report, error) {
	ft, err := fileType(opts.Type, opts.KMix)
	if err != nil {
		return Report{}, err
	}
	meta, err := cfg.GGUFMetadata()
	if err != nil {
		return Report{}, err
	}
	gw := gguf.NewWriter()
	for _, kv := range meta {
		gw.AddKV(kv.Key, kv.Value)
	}
	gw.AddKV("general.name", gguf.StringValue(opts.Name))
	gw.AddKV("general.file_type", gguf.Uint32Value(ft))
	gw.AddKV("general.quantization_version", gguf.Uint32Value(2))
	spec := tok.Spec()
	if spec.Model == "gpt2" && spec.Pre == "" {
		return Report{}, fmt.Errorf("convert: the tokenizer's pre-tokenizer has no GGUF name (tokenizer.ggml.pre), so a GGUF file would tokenize differently")
	}
	var rep Report
	if opts.Pre != "" {
		if spec.Model != "gpt2" {
			return Report{}, fmt.Errorf("convert: pre-tokenizer %q: a %q tokenizer has no pre-tokenizer name to replace (only byte-level BPE, \"gpt2\", has one)", opts.Pre, spec.Model)
		}
		same, err := tokenizer.SamePreSplit(opts.Pre, spec.Pre)
		if err != nil {
			return Report{}, fmt.Errorf("convert: %w", err)
		}
		if !same {
			rep.PreDiffers = fmt.Sprintf("pre-tokenizer %q does not split text as the tokenizer's own %q does: readers of the file (trigon too) split by %q, so some texts get other tokens than the model was trained on", opts.Pre, spec.Pre, opts.Pre)
		}
		spec.Pre = opts.Pre
	}
	for _, kv := range spec.GGUFMetadata() {
		gw.AddKV(kv.Key, kv.Value)
	}
	if err := spec.LlamaCppLoads(); err != nil {
		rep.NotLlamaCpp = err.Error()
	}
	if rf, ok, err := cfg.RopeFreqsTensor(); err != nil {
		return rep, err
	} else if ok {
		if err := gw.AddTensor(rf.Name, rf.Type, rf.Dims, rf.Data); err != nil {
			return rep, err
		}
		rep.Tensors++
	}
	for _, name := range w.Names() {
		src, ok := w.Tensor(name)
		if !ok || model.IsKVScale(name) { // GGUF has no name for FP8 KV scales
			continue
		}
		target, err := tensorType(cfg, name, opts)
		if err != nil {
			return rep, err
		}
		if len(src.Shape) == 1 {
			target = backend.F32
		} else if inner := src.Shape[len(src.Shape)-1]; target.Quantized() && inner%target.BlockSize() != 0 {
			target = fallbackType(target, inner)
			rep.Fallback = append(rep.Fallback, name)
		}
		conv, err := recode(src, target)
		if err != nil {
			return rep, fmt.Errorf("tensor %s: %w", name, err)
		}
		gt, err := model.ToGGUFTensor(cfg, conv)
		if err != nil {
			return rep, err
		}
		if err := gw.AddTensor(gt.Name, gt.Type, gt.Dims, gt.Data); err != nil {
			return rep, fmt.Errorf("tensor %s: %w", name, err)
		}
		rep.Tensors++
		rep.Bytes += int64(len(gt.Data))
	}
	if _, err := gw.WriteTo(out); err != nil {
		return rep, err
	}
	return rep, nil
}

// fileType is llama.cpp's general.file_type (llama_ftype) for a target.
func fileType(dt backend.DType, kmix bool) (uint32, error) {
	if kmix {
		switch dt {
		case backend.Q4_K:
			return 15, nil // MOSTLY_Q4_K_M
		case backend.Q5_K:
			return 17, nil // MOSTLY_Q5_K_M
		}
		return 0, fmt.Errorf("convert: the _M mix is for Q4_K and Q5_K targets, not %v", dt)
	}
	switch dt {
	case backend.Q4_K:
		return 14, nil // MOSTLY_Q4_K_S, the nearest llama.cpp name for all-Q4_K
	case backend.Q5_K:
		return 16, nil // MOSTLY_Q5_K_S
	case backend.Q6_K:
		return 18, nil
	case backend.F32:
		return 0, nil
	case backend.F16:
		return 1, nil
	case backend.Q4_0:
		return 2, nil
	case backend.Q8_0:
		return 7, nil
	case backend.BF16:
		return 32, nil
	}
	return 0, fmt.Errorf("convert: unsupported target type %v", dt)
}

// recode converts a weight to dtype dt, row by row through f32.
func recode(w model.Weight, dt backend.DType) (model.Weight, error) {
	if w.DType == dt {
		return w, nil
	}
	inner := w.Shape[len(w.Shape)-1]
	rows := 1
	for _, d := range w.Shape[:len(w.Shape)-1] {
		rows *= d
	}
	srcRow, err := w.DType.RowBytes(inner)
	if err != nil {
		return w, err
	}
	dstRow, err := dt.RowBytes(inner)
	if err != nil {
		return w, err
	}
	out := make([]byte, 0, rows*dstRow)
	f := make([]float32, inner)
	for r := 0; r < rows; r++ {
		if err := backend.DequantizeRow(w.DType, w.Data[r*srcRow:(r+1)*srcRow], f); err != nil {
			return w, err
		}
		enc, err := encodeRow(f, dt)
		if err != nil {
			return w, err
		}
		out = append(out, enc...)
	}
	return model.Weight{Name: w.Name, DType: dt, Shape: w.Shape, Data: out}, nil
}

func encodeRow(f []float32, dt backend.DType) ([]byte, error) {
	if dt.Quantized() {
		return backend.Quantize(dt, f)
	}
	size := dt.BlockBytes()
	b := make([]byte, len(f)*size)
	for i, v := range f {
		switch dt {
		case backend.F32:
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
		case backend.F16:
			binary.LittleEndian.PutUint16(b[2*i:], backend.F32ToF16(v))
		case backend.BF16:
			binary.LittleEndian.PutUint16(b[2*i:], backend.F32ToBF16(v))
		default:
			return nil, fmt.Errorf("convert: cannot encode %v", dt)
		}
	}
	return b, nil
}
