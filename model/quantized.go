package model

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"

	"github.com/trigon-llm/trigon/backend"
)

// Pre-quantized Hugging Face checkpoints. A config.json quantization_config
// names how the projections are stored; the loader repacks them at open
// time into the dtypes every backend reads (backend/wquant.go), under the
// plain X.weight name, so nothing past this file knows the checkpoint's
// layout. Embeddings, the LM head, norms and biases stay as they are.
//
// Accepted:
//
//   - AutoAWQ "GEMM" (quant_method "awq", bits 4, group_size 32, 64 or
//     128, zero_point true, version "gemm"): X.qweight I32 [in, out/8],
//     X.qzeros I32 [in/group, out/8], X.scales F16 [in/group, out]. Eight
//     4-bit values per int32, nibble i (bits 4i..4i+3) of word c holding
//     output feature 8c + awqOrder[i]; weight[out][in] =
//     (q - zero) * scale of the input's group. Repacked to AWQ4_G*.
//   - FP8 W8A8 with dynamic per-token activations: quant_method "fp8"
//     (activation_scheme "dynamic", no weight_block_size), "fbgemm_fp8", or
//     "compressed-tensors" whose groups have 8-bit float weights (strategy
//     "tensor" or "channel") and dynamic 8-bit float per-token input
//     activations: X.weight F8_E4M3 [out, in] and X.weight_scale (one
//     value, or one per output feature: [out] or [out, 1]; F32, F16 or
//     BF16), weight = e4m3 * scale. Repacked to F8_E4M3_ROW. FBGEMM's
//     X.input_scale_ub (an upper bound on activation scales) is dropped:
//     activation scales are never clamped.
//
// Anything else (other bit widths, GPTQ, block-wise FP8, static activation
// scales, AWQ without zero points or in the GEMV/Marlin layouts) is refused
// at load with an error that names what was found.

// Quantization is a checkpoint's parsed quantization_config.
type Quantization struct {
	// Method is "awq" or "fp8" (every accepted FP8 spelling); "" for an
	// unquantized checkpoint.
	Method string
	// Group is AWQ's group size.
	Group int
}

// awqOrder[i] is the output feature (within its 8) that nibble i of an
// AutoAWQ GEMM word holds.
var awqOrder = [8]int{0, 2, 4, 6, 1, 3, 5, 7}

// quantConfig is the quantization_config fields read, of every accepted
// method.
type quantConfig struct {
	QuantMethod      string          `json:"quant_method"`
	Bits             *int            `json:"bits"`
	WBit             *int            `json:"w_bit"`
	GroupSize        *int            `json:"group_size"`
	QGroupSize       *int            `json:"q_group_size"`
	ZeroPoint        *bool           `json:"zero_point"`
	Version          string          `json:"version"`
	ActivationScheme string          `json:"activation_scheme"`
	WeightBlockSize  json.RawMessage `json:"weight_block_size"`
	Format           string          `json:"format"`
	ConfigGroups     map[string]struct {
		Weights          *ctQuantArgs `json:"weights"`
		InputActivations *ctQuantArgs `json:"input_activations"`
	} `json:"config_groups"`
}

// ctQuantArgs is compressed-tensors' QuantizationArgs.
type ctQuantArgs struct {
	NumBits   int             `json:"num_bits"`
	Type      string          `json:"type"`
	Strategy  string          `json:"strategy"`
	Dynamic   json.RawMessage `json:"dynamic"`
	Symmetric *bool           `json:"symmetric"`
	GroupSize *int            `json:"group_size"`
}

// ParseQuantization reads quantization_config (raw JSON; null or empty: an
// unquantized checkpoint) and refuses what the loader cannot repack.
func ParseQuantization(raw json.RawMessage) (Quantization, error) {
	if isNull(raw) {
		return Quantization{}, nil
	}
	fail := func(format string, args ...any) (Quantization, error) {
		return Quantization{}, fmt.Errorf("quantization_config: "+format, args...)
	}
	var q quantConfig
	if err := json.Unmarshal(raw, &q); err != nil {
		return fail("%v", err)
	}
	switch strings.ToLower(q.QuantMethod) {
	case "awq":
		bits, group := q.Bits, q.GroupSize
		if bits == nil {
			bits = q.WBit
		}
		if group == nil {
			group = q.QGroupSize
		}
		if bits == nil || *bits != 4 {
			return fail("awq with bits %s: only 4-bit AWQ is supported", intOrAbsent(bits))
		}
		if group == nil || backend.AWQGroup(awqDType(*group)) == 0 {
			return fail("awq group_size %s: want 32, 64 or 128", intOrAbsent(group))
		}
		if q.ZeroPoint == nil || !*q.ZeroPoint {
			return fail("awq without zero_point is not supported")
		}
		if v := strings.ToLower(q.Version); v != "" && v != "gemm" {
			return fail("awq version %q: only the GEMM layout is supported", q.Version)
		}
		return Quantization{Method: "awq", Group: *group}, nil
	case "fp8":
		if s := strings.ToLower(q.ActivationScheme); s != "" && s != "dynamic" {
			return fail("fp8 activation_scheme %q: only dynamic (per-token) activation scales are supported", q.ActivationScheme)
		}
		if !isNull(q.WeightBlockSize) {
			return fail("fp8 weight_block_size %s: block-wise FP8 is not supported (per-tensor or per-channel scales only)", truncate(q.WeightBlockSize))
		}
		return Quantization{Method: "fp8"}, nil
	case "fbgemm_fp8":
		return Quantization{Method: "fp8"}, nil
	case "compressed-tensors":
		if len(q.ConfigGroups) == 0 {
			return fail("compressed-tensors without config_groups")
		}
		for name, g := range q.ConfigGroups {
			w, a := g.Weights, g.InputActivations
			if w == nil || w.NumBits != 8 || w.Type != "float" || (w.Strategy != "tensor" && w.Strategy != "channel") {
				return fail("compressed-tensors group %s: weights %s; only 8-bit float weights with a per-tensor or per-channel scale are supported", name, describeArgs(w))
			}
			if a == nil || a.NumBits != 8 || a.Type != "float" || a.Strategy != "token" || !isTrue(a.Dynamic) {
				return fail("compressed-tensors group %s: input_activations %s; only dynamic 8-bit float per-token activations are supported", name, describeArgs(a))
			}
		}
		return Quantization{Method: "fp8"}, nil
	case "":
		return fail("no quant_method")
	}
	return fail("quant_method %q is not supported (supported: awq, fp8, fbgemm_fp8, compressed-tensors fp8)", q.QuantMethod)
}

func awqDType(g int) backend.DType {
	dt, _ := backend.AWQDType(g)
	return dt
}

func intOrAbsent(p *int) string {
	if p == nil {
		return "absent"
	}
	return fmt.Sprint(*p)
}

func isTrue(raw json.RawMessage) bool { return strings.TrimSpace(string(raw)) == "true" }

func describeArgs(a *ctQuantArgs) string {
	if a == nil {
		return "absent"
	}
	return fmt.Sprintf("{num_bits %d, type %q, strategy %q, dynamic %s}", a.NumBits, a.Type, a.Strategy, strings.TrimSpace(string(a.Dynamic)))
}

// IsProjection reports a per-layer projection weight name (the tensors
// quantized checkpoints and --quantization fp8 quantize).
func IsProjection(name string) bool {
	_, suffix, ok := splitLayerName(name)
	if !ok {
		return false
	}
	switch suffix {
	case SuffixQ, SuffixK, SuffixV, SuffixO, SuffixGate, SuffixUp, SuffixDown:
		return true
	}
	return false
}

// repackQuantized repacks byName's quantized projections: each one's
// checkpoint tensors are replaced by one X.weight of the backend dtype.
// Projections the quantizer skipped (stored as floats) stay as they are.
func repackQuantized(q Quantization, byName map[string]Weight) error {
	var bases []string
	for name, w := range byName {
		switch q.Method {
		case "awq":
			if base, ok := strings.CutSuffix(name, ".qweight"); ok {
				bases = append(bases, base)
			}
		case "fp8":
			if w.DType != backend.F8E4M3 {
				continue
			}
			base, ok := strings.CutSuffix(name, ".weight")
			if !ok {
				return fmt.Errorf("fp8 tensor %s is not a .weight", name)
			}
			bases = append(bases, base)
		default:
			return fmt.Errorf("quantization method %q", q.Method)
		}
	}
	// The jobs only read byName; their results are applied after.
	out := make([]repacked, len(bases))
	err := parallelFor(len(bases), func(i int) error {
		var err error
		if q.Method == "awq" {
			out[i], err = repackAWQ(byName, bases[i], q.Group)
		} else {
			out[i], err = repackFP8(byName, bases[i])
		}
		return err
	})
	if err != nil {
		return err
	}
	for _, r := range out {
		for _, d := range r.drop {
			delete(byName, d)
		}
		byName[r.w.Name] = r.w
	}
	return nil
}

// repacked is one projection in its backend dtype and the checkpoint
// tensors it replaces.
type repacked struct {
	w    Weight
	drop []string
}

// parallelFor runs f(0..n-1) on up to GOMAXPROCS goroutines and returns
// the first error.
func parallelFor(n int, f func(i int) error) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		next  int
	)
	for range min(n, runtime.GOMAXPROCS(0)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				i := next
				next++
				stop := i >= n || first != nil
				mu.Unlock()
				if stop {
					return
				}
				if err := f(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// lookup returns byName[name] checked against a dtype and a rank.
func lookup(byName map[string]Weight, name string, dt backend.DType, rank int) (Weight, error) {
	w, ok := byName[name]
	if !ok {
		return Weight{}, fmt.Errorf("tensor %s is missing", name)
	}
	if w.DType != dt || len(w.Shape) != rank {
		return Weight{}, fmt.Errorf("tensor %s is %v %v, want %v of rank %d", name, w.DType, w.Shape, dt, rank)
	}
	return w, nil
}

// repackAWQ turns base.qweight, .qzeros and .scales (AutoAWQ GEMM, group
// g) into base.weight in AWQ4_G<g>, one output feature per row.
func repackAWQ(byName map[string]Weight, base string, g int) (repacked, error) {
	fail := func(err error) (repacked, error) { return repacked{}, fmt.Errorf("awq %s: %w", base, err) }
	qw, err := lookup(byName, base+".qweight", backend.I32, 2)
	if err != nil {
		return fail(err)
	}
	qz, err := lookup(byName, base+".qzeros", backend.I32, 2)
	if err != nil {
		return fail(err)
	}
	sc, err := lookup(byName, base+".scales", backend.F16, 2)
	if err != nil {
		return fail(err)
	}
	in, out := qw.Shape[0], qw.Shape[1]*8
	if in%g != 0 {
		return fail(fmt.Errorf("%d input features are not whole groups of %d", in, g))
	}
	groups := in / g
	if qz.Shape[0] != groups || qz.Shape[1] != out/8 || sc.Shape[0] != groups || sc.Shape[1] != out {
		return fail(fmt.Errorf("qweight %v, qzeros %v, scales %v do not agree for groups of %d (want qzeros [%d %d], scales [%d %d])",
			qw.Shape, qz.Shape, sc.Shape, g, groups, out/8, groups, out))
	}
	dt := awqDType(g)
	rb, err := dt.RowBytes(in)
	if err != nil {
		return fail(err)
	}
	data := make([]byte, out*rb)
	q := make([]uint8, in)
	scales := make([]uint16, groups)
	zeros := make([]uint8, groups)
	word := func(t Weight, row, col int) uint32 {
		return binary.LittleEndian.Uint32(t.Data[4*(row*(out/8)+col):])
	}
	for o := range out {
		c, j := o/8, awqNibble[o%8]
		for k := range in {
			q[k] = uint8(word(qw, k, c) >> (4 * j) & 15)
		}
		for b := range groups {
			zeros[b] = uint8(word(qz, b, c) >> (4 * j) & 15)
			scales[b] = binary.LittleEndian.Uint16(sc.Data[2*(b*out+o):])
		}
		if err := backend.PackAWQ4(data[o*rb:(o+1)*rb], q, scales, zeros, g); err != nil {
			return fail(err)
		}
	}
	w := Weight{Name: base + ".weight", DType: dt, Shape: []int{out, in}, Data: data}
	return repacked{w: w, drop: []string{qw.Name, qz.Name, sc.Name}}, nil
}

// awqNibble[j] is the nibble of an AutoAWQ word that holds output feature
// 8c + j: awqOrder's inverse.
var awqNibble = func() (inv [8]int) {
	for i, j := range awqOrder {
		inv[j] = i
	}
	return inv
}()

// repackFP8 turns base.weight (F8_E4M3 [out, in]) and base.weight_scale
// into base.weight in F8_E4M3_ROW.
func repackFP8(byName map[string]Weight, base string) (repacked, error) {
	fail := func(err error) (repacked, error) { return repacked{}, fmt.Errorf("fp8 %s: %w", base, err) }
	w, err := lookup(byName, base+".weight", backend.F8E4M3, 2)
	if err != nil {
		return fail(err)
	}
	if _, ok := byName[base+".input_scale"]; ok {
		return fail(fmt.Errorf("a static input_scale: only dynamic activation scales are supported"))
	}
	st, ok := byName[base+".weight_scale"]
	if !ok {
		return fail(fmt.Errorf("weight_scale is missing"))
	}
	out, in := w.Shape[0], w.Shape[1]
	n, err := backend.NumElements(st.Shape)
	if err != nil || (n != 1 && n != out) || (len(st.Shape) == 2 && st.Shape[1] != 1) || len(st.Shape) > 2 {
		return fail(fmt.Errorf("weight_scale shape %v: want one value or one per output feature ([%d] or [%d 1])", st.Shape, out, out))
	}
	scales := make([]float32, n)
	if err := backend.DequantizeRow(st.DType, st.Data, scales); err != nil {
		return fail(fmt.Errorf("weight_scale: %w", err))
	}
	rb, err := backend.F8E4M3Row.RowBytes(in)
	if err != nil || in%16 != 0 {
		return fail(fmt.Errorf("%d input features: FP8 rows must be a multiple of 16", in))
	}
	data := make([]byte, out*rb)
	for o := range out {
		s := scales[min(o, n-1)]
		if !(s > 0) || math.IsInf(float64(s), 0) {
			return fail(fmt.Errorf("weight_scale %v of output %d is not a positive finite number", s, o))
		}
		if err := backend.PackF8E4M3Row(data[o*rb:(o+1)*rb], w.Data[o*in:(o+1)*in], s); err != nil {
			return fail(err)
		}
	}
	nw := Weight{Name: w.Name, DType: backend.F8E4M3Row, Shape: []int{out, in}, Data: data}
	drop := []string{st.Name}
	if _, ok := byName[base+".input_scale_ub"]; ok {
		// FBGEMM's bound on the activation scale, for outliers; the
		// per-token scales here are never clamped.
		drop = append(drop, base+".input_scale_ub")
	}
	return repacked{w: nw, drop: drop}, nil
}

// QuantizeWeights returns w with every per-layer projection of F32, F16
// or BF16 quantized at open time, round to nearest, into dt: F8E4M3Row (a
// scale per output feature, max|w|/448, as vLLM's --quantization fp8 does
// for an unquantized checkpoint) or an AWQ4 dtype (backend.QuantizeAWQ4:
// the format without AWQ's activation-aware scaling, for benchmarks and
// tests). Embeddings, the LM head, norms and biases stay. Projections
// already quantized are refused. The result owns its repacked bytes and
// closes w.
func QuantizeWeights(w Weights, dt backend.DType) (Weights, error) {
	g := backend.AWQGroup(dt)
	if g == 0 && dt != backend.F8E4M3Row {
		return nil, fmt.Errorf("quantize weights: %v is not a weight-quantized dtype", dt)
	}
	byName := map[string]Weight{}
	var names []string
	for _, name := range w.Names() {
		t, ok := w.Tensor(name)
		if !ok {
			return nil, fmt.Errorf("quantize %v: tensor %s listed but not readable", dt, name)
		}
		byName[name] = t
		if IsProjection(name) {
			names = append(names, name)
		}
	}
	results := make([]Weight, len(names))
	err := parallelFor(len(names), func(i int) error {
		t := byName[names[i]]
		fail := func(format string, args ...any) error {
			return fmt.Errorf("quantize %v: %s: %s", dt, t.Name, fmt.Sprintf(format, args...))
		}
		switch t.DType {
		case backend.F32, backend.F16, backend.BF16:
		default:
			return fail("already %v", t.DType)
		}
		if len(t.Shape) != 2 || t.Shape[1]%dt.BlockSize() != 0 {
			return fail("shape %v: rows must be whole %d-value blocks", t.Shape, dt.BlockSize())
		}
		out, in := t.Shape[0], t.Shape[1]
		srb, err := t.DType.RowBytes(in)
		if err != nil {
			return fail("%v", err)
		}
		rb, err := dt.RowBytes(in)
		if err != nil {
			return fail("%v", err)
		}
		data := make([]byte, out*rb)
		row := make([]float32, in)
		for o := range out {
			if err := backend.DequantizeRow(t.DType, t.Data[o*srb:(o+1)*srb], row); err != nil {
				return fail("%v", err)
			}
			var enc []byte
			if g != 0 {
				enc, err = backend.EncodeAWQ4(row, g)
			} else {
				enc, err = backend.EncodeF8E4M3Row(row, 0)
			}
			if err != nil {
				return fail("row %d: %v", o, err)
			}
			copy(data[o*rb:], enc)
		}
		results[i] = Weight{Name: t.Name, DType: dt, Shape: []int{out, in}, Data: data}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, r := range results {
		byName[r.Name] = r
	}
	return newMapWeights(byName, w), nil
}
