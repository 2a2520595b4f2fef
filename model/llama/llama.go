// Package llama is the forward pass of the Llama family: Llama 2/3/3.x,
// Mistral, Qwen2/2.5 and Qwen3, which differ only in the switches of
// model.Config.Llama (attention biases, Q/K norms) and in common Config
// fields (sliding window, tied embeddings, RoPE scaling). model/arch
// constructs it for those architectures.
//
// The whole model is this file. Every step is one fused backend op, so the
// same code drives the CPU oracle and the GPU, and per-step work allocates
// nothing on the device: activations live in scratch buffers sized once for
// model.Options.MaxTokens.
package llama

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/model"
)

// Model is a loaded Llama-family model on one backend: a model.Model. It
// is not safe for concurrent use: Forward reuses its scratch buffers.
type Model struct {
	b     backend.Backend
	cfg   model.Config
	opts  model.Options
	scale float32 // attention softmax scale, 1/sqrt(headDim)
	// sh is the part of the model this rank holds (the whole model when
	// sh.Whole()); comm meets the other ranks' parts at the collectives.
	sh   model.Shard
	comm backend.Communicator
	// embedShard says embed holds only the rank's vocabulary rows (the
	// backend is a backend.ShardEmbedder); otherwise every rank holds the
	// whole table.
	embedShard bool

	embed     backend.Tensor // [vocab, hidden] (embedShard: [sh.VocabRows, hidden]), checkpoint dtype
	finalNorm backend.Tensor // [hidden] F32
	lmHead    backend.Tensor // [sh.VocabRows, hidden]; embed's rows when tied
	invFreq   backend.Tensor // [headDim/2] F32, scaling applied
	layers    []layer

	// Scratch activations, act = backend.ActDType(); each Forward uses the
	// first NumTokens (NumLogits) rows through views.
	resid    backend.Tensor // [MaxTokens, hidden] act: the residual stream
	normed   backend.Tensor // [MaxTokens, hidden] act: normed input of the next projection
	delta    backend.Tensor // [MaxTokens, hidden] act: a sublayer's output, added to resid
	qkv      backend.Tensor // [MaxTokens, (nH+2*nKV)*headDim] act
	q        backend.Tensor // [MaxTokens, nH*headDim] act: rotated queries
	attnOut  backend.Tensor // [MaxTokens, nH*headDim] act
	gateUp   backend.Tensor // [MaxTokens, 2*inter] act
	mlpAct   backend.Tensor // [MaxTokens, inter] act
	gathered backend.Tensor // [MaxLogits, hidden] act: final-normed rows whose logits are wanted
	logits   backend.Tensor // [MaxLogits, vocab] F32
	// logitsPart is the rank's vocabulary columns of the logits, gathered
	// into logits ([MaxLogits, sh.VocabRows] F32; nil for the whole model).
	logitsPart backend.Tensor

	// prog is the step's program, rebuilt by every Forward in place.
	prog backend.Program

	owned []backend.Tensor // everything Close frees
}

var _ model.Model = (*Model)(nil)

// layer is one decoder block's weights. nH, nKV and inter are the
// rank's share (model.Shard): the whole model's on one rank.
type layer struct {
	inputNorm backend.Tensor // [hidden] F32
	qkv       backend.Tensor // [(nH+2*nKV)*headDim, hidden]: q_proj, k_proj, v_proj rows
	qkvBias   backend.Tensor // [(nH+2*nKV)*headDim] F32, or nil
	qNorm     backend.Tensor // [headDim] F32, or nil (Qwen3)
	kNorm     backend.Tensor // [headDim] F32, or nil (Qwen3)
	o         backend.Tensor // [hidden, nH*headDim]
	oBias     backend.Tensor // [hidden] F32, or nil (and nil on every rank but 0)
	postNorm  backend.Tensor // [hidden] F32
	gateUp    backend.Tensor // [2*inter, hidden]: gate_proj rows, then up_proj rows
	down      backend.Tensor // [hidden, inter]
}

// New uploads w's tensors to b and allocates the scratch buffers. Q, K and
// V are fused into one projection and gate and up into another (row
// concatenation is byte concatenation in every dtype, quantized included);
// norm weights and biases are widened to F32. Backends may alias w's
// memory (the CPU backend does), so w must stay open while the Model lives.
func New(b backend.Backend, cfg model.Config, w model.Weights, opts model.Options) (*Model, error) {
	if err := model.ValidateWeights(cfg, w); err != nil {
		return nil, fmt.Errorf("llama: %w", err)
	}
	if opts.MaxTokens <= 0 {
		return nil, fmt.Errorf("llama: MaxTokens %d must be positive", opts.MaxTokens)
	}
	if opts.MaxLogits == 0 {
		opts.MaxLogits = min(opts.MaxTokens, 256)
	}
	if opts.MaxLogits < 0 {
		return nil, fmt.Errorf("llama: MaxLogits %d is negative", opts.MaxLogits)
	}
	m := &Model{b: b, cfg: cfg, opts: opts, scale: float32(1 / math.Sqrt(float64(cfg.HeadDim)))}
	if err := m.setShard(w); err != nil {
		return nil, fmt.Errorf("llama: %w", err)
	}
	if err := m.load(w); err != nil {
		m.Close()
		return nil, fmt.Errorf("llama: load weights: %w", err)
	}
	if err := m.allocScratch(); err != nil {
		m.Close()
		return nil, fmt.Errorf("llama: allocate activations for %d tokens: %w", opts.MaxTokens, err)
	}
	return m, nil
}

// Config is the model's architecture.
func (m *Model) Config() model.Config { return m.cfg }

// Close frees the model's device memory.
func (m *Model) Close() {
	for _, t := range m.owned {
		m.b.Free(t)
	}
	m.owned = nil
}

func (m *Model) load(w model.Weights) error {
	c := m.cfg
	var err error
	get := func(name string) model.Weight {
		t, _ := w.Tensor(name) // presence checked by ValidateWeights
		return t
	}
	sh, whole := m.sh, m.sh.Whole()
	vocab := span{sh.Vocab, sh.VocabRows}
	if m.embedShard {
		m.embed, err = m.matrix(w, part{name: model.NameEmbed, rows: vocab})
	} else {
		m.embed, err = m.matrix(w, part{name: model.NameEmbed})
	}
	if err != nil {
		return err
	}
	m.lmHead = m.embed
	switch {
	case !c.TieEmbeddings:
		if m.lmHead, err = m.matrix(w, part{name: model.NameLMHead, rows: vocab}); err != nil {
			return err
		}
	case !whole && !m.embedShard:
		// The whole table is here: the LM head is a view of its rows.
		if m.lmHead, err = m.b.View(m.embed, sh.Vocab, sh.VocabRows); err != nil {
			return fmt.Errorf("lm head rows of %s: %w", model.NameEmbed, err)
		}
	}
	if m.finalNorm, err = m.uploadF32(get(model.NameFinalNorm)); err != nil {
		return err
	}
	inv := c.InvFreq()
	if m.invFreq, err = m.uploadRaw(backend.F32, []int{len(inv)}, f32Bytes(inv)); err != nil {
		return fmt.Errorf("inv freq: %w", err)
	}
	m.layers = make([]layer, c.NumLayers)
	for l := range m.layers {
		ly := &m.layers[l]
		lw := func(suffix string) model.Weight { return get(model.LayerName(l, suffix)) }
		if ly.inputNorm, err = m.uploadF32(lw(model.SuffixInputNorm)); err != nil {
			return err
		}
		if ly.postNorm, err = m.uploadF32(lw(model.SuffixPostNorm)); err != nil {
			return err
		}
		ln := func(suffix string) string { return model.LayerName(l, suffix) }
		// Column-parallel Q, K, V (the rank's heads' rows) and gate/up
		// (its intermediate rows); row-parallel O and down (the same
		// ranges of their input columns), summed over the ranks after.
		hd := c.HeadDim
		q, kv := span{sh.QHead * hd, sh.NumHeads * hd}, span{sh.KVHead * hd, sh.NumKVHeads * hd}
		inter := span{sh.Inter, sh.Intermed}
		if whole {
			// The whole model loads whole weights (Filler's device path).
			q, kv, inter = span{}, span{}, span{}
		}
		if ly.qkv, err = m.matrix(w, part{name: ln(model.SuffixQ), rows: q},
			part{name: ln(model.SuffixK), rows: kv}, part{name: ln(model.SuffixV), rows: kv}); err != nil {
			return err
		}
		if c.Llama.AttentionBias {
			if ly.qkvBias, err = m.uploadF32Parts(vecPart{lw(model.SuffixQBias), q},
				vecPart{lw(model.SuffixKBias), kv}, vecPart{lw(model.SuffixVBias), kv}); err != nil {
				return err
			}
		}
		if c.Llama.QKNorm {
			if ly.qNorm, err = m.uploadF32(lw(model.SuffixQNorm)); err != nil {
				return err
			}
			if ly.kNorm, err = m.uploadF32(lw(model.SuffixKNorm)); err != nil {
				return err
			}
		}
		if ly.o, err = m.matrix(w, part{name: ln(model.SuffixO), cols: q}); err != nil {
			return err
		}
		// The bias of a row-parallel product is added once, by rank 0,
		// before the sum.
		if c.Llama.AttnOutputBias && sh.Rank == 0 {
			if ly.oBias, err = m.uploadF32(lw(model.SuffixOBias)); err != nil {
				return err
			}
		}
		if ly.gateUp, err = m.matrix(w, part{name: ln(model.SuffixGate), rows: inter}, part{name: ln(model.SuffixUp), rows: inter}); err != nil {
			return err
		}
		if ly.down, err = m.matrix(w, part{name: ln(model.SuffixDown), cols: inter}); err != nil {
			return err
		}
	}
	return nil
}

// setShard resolves opts.Shard (the whole model when zero) and checks it
// against the config and the communicator.
func (m *Model) setShard(w model.Weights) error {
	sh, c := m.opts.Shard, m.cfg
	if sh.Size == 0 {
		whole, err := model.PlanShards(c, w, 1)
		if err != nil {
			return err
		}
		sh = whole[0]
	}
	if !sh.Whole() {
		if m.opts.Comm == nil || m.opts.Comm.Size() != sh.Size || m.opts.Comm.Rank() != sh.Rank {
			return fmt.Errorf("shard %d of %d needs a communicator of that rank and size", sh.Rank, sh.Size)
		}
		if len(sh.VocabWidths) != sh.Size {
			return fmt.Errorf("shard %d of %d has %d vocabulary widths", sh.Rank, sh.Size, len(sh.VocabWidths))
		}
		_, m.embedShard = m.b.(backend.ShardEmbedder)
	}
	if sh.NumHeads <= 0 || sh.NumKVHeads <= 0 || sh.NumHeads%sh.NumKVHeads != 0 || sh.Intermed <= 0 || sh.VocabRows <= 0 {
		return fmt.Errorf("shard %d of %d: %d query heads over %d KV heads, %d intermediate columns, %d vocabulary rows",
			sh.Rank, sh.Size, sh.NumHeads, sh.NumKVHeads, sh.Intermed, sh.VocabRows)
	}
	m.sh, m.comm = sh, m.opts.Comm
	return nil
}

func (m *Model) uploadRaw(dt backend.DType, shape []int, data []byte) (backend.Tensor, error) {
	t, err := m.b.Upload(dt, shape, data)
	if err != nil {
		return nil, err
	}
	m.owned = append(m.owned, t)
	return t, nil
}

// span is a range [start, start+n) of a weight's rows or columns; the
// zero span is all of them.
type span struct{ start, n int }

func (s span) all() bool { return s.n == 0 }

// part is the piece of a 2-D weight a rank loads: its rows, its columns.
type part struct {
	name       string
	rows, cols span
}

// matrix loads one projection, or stacks several of one dtype and row
// width into a single [sum of rows, width] tensor so one MatMul computes
// all of them; each piece is the rank's rows or columns of a weight (a
// row range shares the file's bytes, a column range is copied). Weights
// that are a model.Filler make their values on the device where they
// can; otherwise the host bytes are uploaded.
func (m *Model) matrix(w model.Weights, parts ...part) (backend.Tensor, error) {
	names := make([]string, len(parts))
	whole := true
	for i, p := range parts {
		names[i] = p.name
		whole = whole && p.rows.all() && p.cols.all()
	}
	if f, ok := w.(model.Filler); ok && whole {
		t, filled, err := m.fill(f, names)
		if err != nil || filled {
			return t, err
		}
	}
	if sf, ok := w.(model.ShardFiller); ok && !whole {
		fl, _ := w.(model.Filler)
		t, filled, err := m.fillShards(fl, sf, parts)
		if err != nil || filled {
			return t, err
		}
	}
	var ws []model.Weight
	for _, p := range parts {
		t, _ := w.Tensor(p.name) // presence checked by ValidateWeights
		var err error
		if !p.rows.all() {
			t, err = model.SliceRows(t, p.rows.start, p.rows.n)
		}
		if err == nil && !p.cols.all() {
			t, err = model.SliceCols(t, p.cols.start, p.cols.n)
		}
		if err != nil {
			return nil, err
		}
		ws = append(ws, t)
	}
	if len(ws) == 1 {
		return m.upload(ws[0])
	}
	return m.uploadRows(ws...)
}

// fill allocates the stacked tensor of names and has f fill each part's
// rows. filled is false, with nothing left allocated, where f cannot.
func (m *Model) fill(f model.Filler, names []string) (t backend.Tensor, filled bool, err error) {
	var dt backend.DType
	var shapes [][]int
	rows := 0
	for i, name := range names {
		d, shape, ok := f.Spec(name)
		if !ok || len(shape) != 2 || (i > 0 && (d != dt || shape[1] != shapes[0][1])) {
			return nil, false, nil // the host path reports what is wrong
		}
		dt = d
		shapes = append(shapes, shape)
		rows += shape[0]
	}
	full, err := m.b.Alloc(dt, rows, shapes[0][1])
	if err != nil {
		return nil, false, fmt.Errorf("%s: %w", names[0], err)
	}
	start := 0
	for i, name := range names {
		part, err := m.b.View(full, start, shapes[i][0])
		if err == nil {
			filled, err = f.Fill(m.b, name, part)
		}
		if err != nil || !filled {
			m.b.Free(full)
			if err != nil {
				err = fmt.Errorf("%s: %w", name, err)
			}
			return nil, false, err
		}
		start += shapes[i][0]
	}
	m.owned = append(m.owned, full)
	return full, true, nil
}

// fillShards is fill for a rank's pieces of the weights (their rows or
// columns), made by sf where it can.
func (m *Model) fillShards(f model.Filler, sf model.ShardFiller, parts []part) (t backend.Tensor, filled bool, err error) {
	if f == nil {
		return nil, false, nil
	}
	var dt backend.DType
	shapes := make([][]int, len(parts))
	rows := 0
	for i, p := range parts {
		d, shape, ok := f.Spec(p.name)
		if !ok || len(shape) != 2 || (i > 0 && d != dt) {
			return nil, false, nil // the host path reports what is wrong
		}
		dt = d
		r, c := shape[0], shape[1]
		if !p.rows.all() {
			r = p.rows.n
		}
		if !p.cols.all() {
			c = p.cols.n
		}
		if i > 0 && c != shapes[0][1] {
			return nil, false, nil
		}
		shapes[i] = []int{r, c}
		rows += r
	}
	full, err := m.b.Alloc(dt, rows, shapes[0][1])
	if err != nil {
		return nil, false, fmt.Errorf("%s: %w", parts[0].name, err)
	}
	start := 0
	for i, p := range parts {
		piece, err := m.b.View(full, start, shapes[i][0])
		if err == nil {
			filled, err = sf.FillShard(m.b, p.name, piece, p.rows.start, p.cols.start)
		}
		if err != nil || !filled {
			m.b.Free(full)
			if err != nil {
				err = fmt.Errorf("%s: %w", p.name, err)
			}
			return nil, false, err
		}
		start += shapes[i][0]
	}
	m.owned = append(m.owned, full)
	return full, true, nil
}

// upload passes one weight through unchanged.
func (m *Model) upload(w model.Weight) (backend.Tensor, error) {
	t, err := m.uploadRaw(w.DType, w.Shape, w.Data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", w.Name, err)
	}
	return t, nil
}

// uploadRows stacks 2-D weights of one row width into a single [sum of
// rows, width] tensor, so one MatMul computes all of them. Parts of
// different dtypes (GGUF mixes such as Q4_K_M store some V projections in
// Q6_K beside Q4_K Q and K) are first re-encoded in the dtype of the part
// that takes the most bytes per value (sameDType).
func (m *Model) uploadRows(ws ...model.Weight) (backend.Tensor, error) {
	ws, err := sameDType(ws)
	if err != nil {
		return nil, err
	}
	rows, size := 0, 0
	for _, w := range ws {
		if w.DType != ws[0].DType || w.Shape[1] != ws[0].Shape[1] {
			return nil, fmt.Errorf("cannot fuse %s (%v %v) with %s (%v %v): dtypes or widths differ",
				w.Name, w.DType, w.Shape, ws[0].Name, ws[0].DType, ws[0].Shape)
		}
		rows += w.Shape[0]
		size += len(w.Data)
	}
	data := make([]byte, 0, size)
	for _, w := range ws {
		data = append(data, w.Data...)
	}
	t, err := m.uploadRaw(ws[0].DType, []int{rows, ws[0].Shape[1]}, data)
	if err != nil {
		return nil, fmt.Errorf("fused %s..: %w", ws[0].Name, err)
	}
	return t, nil
}

// sameDType returns ws with every part in the widest part's dtype: the
// narrower parts are decoded to f32 and encoded again, so their values
// gain the wider format's rounding (a Q4_K part re-encoded as Q6_K: that
// format's error on values already on Q4_K's coarser grid). Backends take
// one dtype per tensor, and a fused product beats three.
func sameDType(ws []model.Weight) ([]model.Weight, error) {
	widest := ws[0]
	mixed := false
	for _, w := range ws {
		mixed = mixed || w.DType != widest.DType
		if bytesPerValue(w.DType) > bytesPerValue(widest.DType) {
			widest = w
		}
	}
	if !mixed {
		return ws, nil
	}
	out := make([]model.Weight, len(ws))
	for i, w := range ws {
		out[i] = w
		if w.DType == widest.DType {
			continue
		}
		n, err := backend.NumElements(w.Shape)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", w.Name, err)
		}
		vals := make([]float32, n)
		if err := backend.DequantizeRow(w.DType, w.Data, vals); err != nil {
			return nil, fmt.Errorf("%s: %w", w.Name, err)
		}
		var data []byte
		switch dt := widest.DType; {
		case dt.Quantized():
			data, err = backend.Quantize(dt, vals)
		case dt == backend.F32:
			data = f32Bytes(vals)
		default:
			data = make([]byte, 2*n)
			for j, v := range vals {
				h := backend.F32ToBF16(v)
				if dt == backend.F16 {
					h = backend.F32ToF16(v)
				}
				binary.LittleEndian.PutUint16(data[2*j:], h)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("%s: re-encode as %v to fuse with %s: %w", w.Name, widest.DType, widest.Name, err)
		}
		out[i] = model.Weight{Name: w.Name, DType: widest.DType, Shape: w.Shape, Data: data}
	}
	return out, nil
}

// bytesPerValue is dt's storage per value (a block's bytes over its size).
func bytesPerValue(dt backend.DType) float64 {
	return float64(dt.BlockBytes()) / float64(dt.BlockSize())
}

// uploadF32 widens small float vectors (norm weights, biases) to F32 and
// concatenates them, so backends need only one dtype for them.
func (m *Model) uploadF32(ws ...model.Weight) (backend.Tensor, error) {
	var vals []float32
	for _, w := range ws {
		v, err := toF32(w)
		if err != nil {
			return nil, err
		}
		vals = append(vals, v...)
	}
	t, err := m.uploadRaw(backend.F32, []int{len(vals)}, f32Bytes(vals))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ws[0].Name, err)
	}
	return t, nil
}

// vecPart is the range of a vector weight (a bias) a rank loads.
type vecPart struct {
	w model.Weight
	s span
}

// uploadF32Parts is uploadF32 of the ranges of vectors that parts name.
func (m *Model) uploadF32Parts(parts ...vecPart) (backend.Tensor, error) {
	var vals []float32
	for _, p := range parts {
		v, err := toF32(p.w)
		if err != nil {
			return nil, err
		}
		if !p.s.all() {
			if p.s.start+p.s.n > len(v) {
				return nil, fmt.Errorf("%s: elements [%d, %d) of %d", p.w.Name, p.s.start, p.s.start+p.s.n, len(v))
			}
			v = v[p.s.start : p.s.start+p.s.n]
		}
		vals = append(vals, v...)
	}
	t, err := m.uploadRaw(backend.F32, []int{len(vals)}, f32Bytes(vals))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", parts[0].w.Name, err)
	}
	return t, nil
}

func toF32(w model.Weight) ([]float32, error) {
	n, err := backend.NumElements(w.Shape)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", w.Name, err)
	}
	out := make([]float32, n)
	le := binary.LittleEndian
	switch w.DType {
	case backend.F32:
		for i := range out {
			out[i] = math.Float32frombits(le.Uint32(w.Data[4*i:]))
		}
	case backend.BF16:
		for i := range out {
			out[i] = backend.BF16ToF32(le.Uint16(w.Data[2*i:]))
		}
	case backend.F16:
		for i := range out {
			out[i] = backend.F16ToF32(le.Uint16(w.Data[2*i:]))
		}
	default:
		return nil, fmt.Errorf("%s: dtype %v cannot be widened to F32", w.Name, w.DType)
	}
	return out, nil
}

func f32Bytes(v []float32) []byte {
	out := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(x))
	}
	return out
}

func (m *Model) allocScratch() error {
	c, n, act, sh := m.cfg, m.opts.MaxTokens, m.b.ActDType(), m.sh
	var err error
	alloc := func(dt backend.DType, shape ...int) backend.Tensor {
		if err != nil {
			return nil
		}
		var t backend.Tensor
		if t, err = m.b.Alloc(dt, shape...); err == nil {
			m.owned = append(m.owned, t)
		}
		return t
	}
	m.resid = alloc(act, n, c.Hidden)
	m.normed = alloc(act, n, c.Hidden)
	m.delta = alloc(act, n, c.Hidden)
	m.qkv = alloc(act, n, (sh.NumHeads+2*sh.NumKVHeads)*c.HeadDim)
	m.q = alloc(act, n, sh.NumHeads*c.HeadDim)
	m.attnOut = alloc(act, n, sh.NumHeads*c.HeadDim)
	m.gateUp = alloc(act, n, 2*sh.Intermed)
	m.mlpAct = alloc(act, n, sh.Intermed)
	m.gathered = alloc(act, m.opts.MaxLogits, c.Hidden)
	m.logits = alloc(backend.F32, m.opts.MaxLogits, c.VocabSize)
	if !sh.Whole() {
		m.logitsPart = alloc(backend.F32, m.opts.MaxLogits, sh.VocabRows)
	}
	return err
}

// Forward runs one step: every token row of in through every layer, its K
// and V written into kv (one entry per layer), and returns the logits
// ([in.NumLogits, vocab] F32) of the rows in.LogitsRows. The returned
// tensor is a view of the model's scratch, valid until the next Forward.
// A step that wants no logits (NumLogits 0, LogitsRows nil: prefill chunks
// that do not end their prompt) only fills the KV cache and returns nil.
func (m *Model) Forward(in *model.DeviceBatch, kv []model.LayerKV) (backend.Tensor, error) {
	if err := m.checkInput(in, kv); err != nil {
		return nil, fmt.Errorf("llama: forward: %w", err)
	}
	logits, err := m.forward(in, kv)
	if err != nil {
		return nil, fmt.Errorf("llama: forward: %w", err)
	}
	return logits, nil
}

func (m *Model) forward(in *model.DeviceBatch, kv []model.LayerKV) (backend.Tensor, error) {
	b := m.b
	var logits backend.Tensor
	if err := m.program(&m.prog, in, kv, &logits); err != nil {
		return nil, err
	}
	if err := backend.Run(b, &m.prog); err != nil {
		return nil, err
	}
	return logits, nil
}

// program writes one step's forward pass into p as unfused ops over the
// scratch buffers' row views, and sets *logits to the view the LM head
// writes (nil when the step wants no logits).
//
// Per layer, with resid the residual stream:
//
//	normed = rmsnorm(resid) * input_norm      (the first layer: the embedding's rows)
//	qkv = normed . Wqkv^T (+ bias);  Q, KV cache <- rope(qkv)
//	attnOut = attention(Q, KV cache)
//	delta = attnOut . Wo^T (+ bias)
//	resid += delta;  normed = rmsnorm(resid) * post_norm
//	gateUp = normed . Wgateup^T;  mlpAct = silu(gate) * up
//	delta = mlpAct . Wdown^T
//	resid += delta;  normed = rmsnorm(resid) * (next layer's input_norm, or the final norm)
//
// Each "resid += delta" is the residual add of the AddRMSNorm that
// follows it, so every norm but the first adds the previous sublayer's
// output.
func (m *Model) program(p *backend.Program, in *model.DeviceBatch, kv []model.LayerKV, logits *backend.Tensor) error {
	c, b, n, sh := m.cfg, m.b, in.NumTokens, m.sh
	var vs views
	resid := vs.rows(b, m.resid, n)     // [n, hidden]
	normed := vs.rows(b, m.normed, n)   // [n, hidden]
	delta := vs.rows(b, m.delta, n)     // [n, hidden]
	qkv := vs.rows(b, m.qkv, n)         // [n, (nH+2nKV)*hd]
	q := vs.rows(b, m.q, n)             // [n, nH*hd]
	attnOut := vs.rows(b, m.attnOut, n) // [n, nH*hd]
	gateUp := vs.rows(b, m.gateUp, n)   // [n, 2*inter]
	mlpAct := vs.rows(b, m.mlpAct, n)   // [n, inter]
	var gathered, out, outPart backend.Tensor
	if in.NumLogits > 0 {
		gathered = vs.rows(b, m.gathered, in.NumLogits) // [NumLogits, hidden]
		out = vs.rows(b, m.logits, in.NumLogits)        // [NumLogits, vocab]
		outPart = out
		if !sh.Whole() {
			outPart = vs.rows(b, m.logitsPart, in.NumLogits) // [NumLogits, sh.VocabRows]
		}
	}
	if vs.err != nil {
		return vs.err
	}

	p.Reset()
	// sum adds the ranks' partial sums of t (row-parallel products, the
	// vocabulary shards' embeddings); the whole model has no collective.
	sum := func(layer int, name string, t backend.Tensor) {
		if !sh.Whole() {
			p.Add(backend.Op{Kind: backend.OpAllReduce, Layer: layer, Name: name, X: t, Comm: m.comm})
		}
	}
	if m.embedShard {
		p.Add(backend.Op{Kind: backend.OpEmbedShard, Layer: -1, Name: "embed", Out: resid, X: m.embed, IDs: in.Tokens, Base: sh.Vocab})
		sum(-1, "embed_sum", resid)
	} else {
		p.Add(backend.Op{Kind: backend.OpEmbed, Layer: -1, Name: "embed", Out: resid, X: m.embed, IDs: in.Tokens})
	}
	// norm normalises resid into normed, first adding delta (the previous
	// sublayer's output) unless this is the first norm.
	first := true
	norm := func(layer int, name string, w backend.Tensor) {
		op := backend.Op{Kind: backend.OpAddRMSNorm, Layer: layer, Name: name, Out: normed, X: resid, W: w, Eps: c.RMSNormEps}
		if !first {
			op.X, op.Residual = delta, resid
		}
		first = false
		p.Add(op)
	}
	matmul := func(layer int, name string, out, x, w, bias backend.Tensor) {
		p.Add(backend.Op{Kind: backend.OpMatMul, Layer: layer, Name: name, Out: out, X: x, W: w, Bias: bias})
	}
	for l, ly := range m.layers {
		norm(l, "input_norm", ly.inputNorm)
		matmul(l, "qkv", qkv, normed, ly.qkv, ly.qkvBias)
		p.Add(backend.Op{Kind: backend.OpRoPEStoreKV, Layer: l, Name: "rope", RoPE: backend.RoPEArgs{
			Q: q, QKV: qkv, Positions: in.Positions, SlotMapping: in.SlotMapping,
			KCache: kv[l].K, VCache: kv[l].V, KV: kv[l].Spec, KVAux: kv[l].Aux, InvFreq: m.invFreq,
			QNorm: ly.qNorm, KNorm: ly.kNorm, NormEps: c.RMSNormEps,
			NumHeads: sh.NumHeads, NumKVHeads: sh.NumKVHeads, HeadDim: c.HeadDim,
		}})
		p.Add(backend.Op{Kind: backend.OpAttention, Layer: l, Name: "attention", Attn: backend.AttentionArgs{
			Out: attnOut, Q: q, KCache: kv[l].K, VCache: kv[l].V, KV: kv[l].Spec, KVAux: kv[l].Aux,
			BlockTables: in.BlockTables, SeqLens: in.SeqLens, QueryStart: in.QueryStart,
			NumSeqs: in.NumSeqs, MaxSeqLen: in.MaxSeqLen, MaxQueryLen: in.MaxQueryLen, StepKeys: in.StepKeys,
			NumHeads: sh.NumHeads, NumKVHeads: sh.NumKVHeads, HeadDim: c.HeadDim,
			Scale: m.scale, SlidingWindow: c.SlidingWindow,
		}})
		matmul(l, "o_proj", delta, attnOut, ly.o, ly.oBias)
		sum(l, "o_proj_sum", delta)
		norm(l, "post_norm", ly.postNorm)
		matmul(l, "gate_up", gateUp, normed, ly.gateUp, nil)
		p.Add(backend.Op{Kind: backend.OpSiLUMul, Layer: l, Name: "silu_mul", Out: mlpAct, X: gateUp})
		matmul(l, "down_proj", delta, mlpAct, ly.down, nil)
		if l < len(m.layers)-1 || in.NumLogits > 0 {
			sum(l, "down_proj_sum", delta)
		}
	}
	if in.NumLogits == 0 {
		// A prefill chunk that does not end its prompt only fills the KV
		// cache: the last down projection's sum is never wanted (nor
		// reduced over the ranks).
		*logits = nil
		return nil
	}
	norm(-1, "final_norm", m.finalNorm)
	// Only the wanted rows go through the LM head: the normed activations
	// serve as an embedding table for a gather, unless every row is
	// wanted in order (decode), when they go as they are.
	if in.LogitsAll && in.NumLogits == n {
		gathered = normed
	} else {
		p.Add(backend.Op{Kind: backend.OpEmbed, Layer: -1, Name: "gather_logits_rows", Out: gathered, X: normed, IDs: in.LogitsRows})
	}
	matmul(-1, "lm_head", outPart, gathered, m.lmHead, nil)
	if !sh.Whole() {
		p.Add(backend.Op{Kind: backend.OpAllGather, Layer: -1, Name: "logits_gather", Out: out, X: outPart, Widths: sh.VocabWidths, Comm: m.comm})
	}
	*logits = out
	return nil
}

// views makes row views of scratch buffers, keeping the first error.
type views struct{ err error }

func (v *views) rows(b backend.Backend, t backend.Tensor, n int) backend.Tensor {
	if v.err != nil {
		return nil
	}
	r, err := b.View(t, 0, n)
	if err != nil {
		v.err = err
	}
	return r
}

func (m *Model) checkInput(in *model.DeviceBatch, kv []model.LayerKV) error {
	if in == nil {
		return errors.New("nil batch")
	}
	if in.NumTokens <= 0 || in.NumTokens > m.opts.MaxTokens {
		return fmt.Errorf("%d tokens, want 1..%d (Options.MaxTokens)", in.NumTokens, m.opts.MaxTokens)
	}
	if in.NumLogits < 0 || in.NumLogits > m.opts.MaxLogits {
		return fmt.Errorf("%d logits rows, want 0..%d (Options.MaxLogits)", in.NumLogits, m.opts.MaxLogits)
	}
	if in.NumSeqs <= 0 || in.NumSeqs > in.NumTokens {
		return fmt.Errorf("%d sequences for %d tokens", in.NumSeqs, in.NumTokens)
	}
	if in.MaxSeqLen <= 0 {
		return fmt.Errorf("max sequence length %d must be positive", in.MaxSeqLen)
	}
	batchTensors := []struct {
		name  string
		t     backend.Tensor
		shape []int
	}{
		{"Tokens", in.Tokens, []int{in.NumTokens}},
		{"Positions", in.Positions, []int{in.NumTokens}},
		{"SlotMapping", in.SlotMapping, []int{in.NumTokens}},
		{"QueryStart", in.QueryStart, []int{in.NumSeqs + 1}},
		{"SeqLens", in.SeqLens, []int{in.NumSeqs}},
		{"BlockTables", in.BlockTables, nil},
	}
	if in.NumLogits > 0 {
		batchTensors = append(batchTensors, struct {
			name  string
			t     backend.Tensor
			shape []int
		}{"LogitsRows", in.LogitsRows, []int{in.NumLogits}})
	}
	for _, t := range batchTensors {
		if t.t == nil {
			return fmt.Errorf("batch tensor %s is nil", t.name)
		}
		if t.t.DType() != backend.I32 {
			return fmt.Errorf("batch tensor %s is %v, want I32", t.name, t.t.DType())
		}
		if s := t.t.Shape(); t.shape != nil && !equalShape(s, t.shape) {
			return fmt.Errorf("batch tensor %s has shape %v, want %v", t.name, s, t.shape)
		}
	}
	if s := in.BlockTables.Shape(); len(s) != 2 || s[0] != in.NumSeqs {
		return fmt.Errorf("batch tensor BlockTables has shape %v, want [%d, maxBlocksPerSeq]", s, in.NumSeqs)
	}
	if len(kv) != m.cfg.NumLayers {
		return fmt.Errorf("%d KV layers for a %d-layer model", len(kv), m.cfg.NumLayers)
	}
	for l, p := range kv {
		if _, err := p.Spec.CheckPools("forward", p.K, p.V, p.Aux, m.sh.NumKVHeads, m.cfg.HeadDim); err != nil {
			return fmt.Errorf("layer %d KV cache: %w", l, err)
		}
	}
	return nil
}

func equalShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
