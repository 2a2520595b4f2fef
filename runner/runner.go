// Package runner turns one scheduled step into device work: it packs the
// step's sequences into the model's batch tensors (token ids, positions,
// slot mapping, query offsets, sequence lengths, block tables), owns the
// paged KV pools on the device, runs the model forward and hands back the
// logits rows that the step wants sampled.
//
// The runner makes no policy: which sequences run, how many tokens each and
// which KV blocks they use all arrive as data (Step) from the scheduler.
//
//	step := runner.Step{Seqs: []runner.Seq{
//		{Tokens: prompt, Start: 0, BlockTable: blocks, WantLogits: true},
//	}}
//	out, err := r.Execute(&step)
//	ids, err := out.Sample(rows) // on the device where the backend can
package runner

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/model"
)

// Model is the part of a model.Model the runner drives: its forward pass.
type Model interface {
	// Forward runs one step. logits: [in.NumLogits, vocab] F32.
	Forward(in *model.DeviceBatch, kv []model.LayerKV) (backend.Tensor, error)
}

// Options size the runner's device state.
type Options struct {
	NumBlocks int           // KV blocks per layer pool, block 0 (the null block) included
	BlockSize int           // tokens per KV block
	MaxTokens int           // most tokens one step may carry
	MaxSeqs   int           // most sequences one step may carry
	MaxSeqLen int           // longest context a sequence may reach (the model's context)
	KVDType   backend.DType // 0: the backend's activation dtype (a plain cache; see KV)
	// KV is the cache's format; its zero value is a plain cache of
	// KVDType. Its BlockSize, when set, must be BlockSize.
	KV backend.KVSpec
	// KVScales are an FP8 cache's checkpoint scales, per layer (nil:
	// computed from the first tokens written; see backend.KVSpec).
	KVScales   []model.KVScales
	NumLayers  int
	NumKVHeads int
	HeadDim    int
	Graphs     GraphOptions // replay decode steps from captured graphs
}

// Seq is one sequence's share of a step: compute Tokens, which sit at
// positions Start, Start+1, ..., reading and writing KV through BlockTable.
type Seq struct {
	Tokens     []int32 // [n] token ids to compute this step
	Start      int     // position of Tokens[0]: tokens already in the KV cache
	BlockTable []int32 // block ids covering positions [0, Start+len(Tokens))
	WantLogits bool    // logits of the last token are wanted (sampling)
	AllLogits  bool    // logits of every token are wanted (scoring, perplexity)
}

// Step is the runner's input for one engine step.
type Step struct {
	Seqs []Seq
	// FedTokens says the first n sequences each compute one token that is
	// already on the device, n being the rows of the previous step's
	// Output.SampleNext (at most len(Seqs)): it picked them (row i for
	// sequence i, so those sequences must come first, in the order of its
	// rows), and their Tokens[0] is not read. The host then need not wait
	// for the previous step's ids before queuing this one. Sequences after
	// the first n take their tokens from Tokens as usual.
	FedTokens bool
}

// Runner owns the KV pools and the step's device buffers, and does the
// device work on them (Execute, CopyBlocks). Not safe for concurrent use.
type Runner struct {
	b    backend.Backend
	m    Model
	opts Options
	// spec is the KV cache's format: the runner allocates the pools from
	// it and hands it with them to the model.
	spec backend.KVSpec
	kv   []model.LayerKV
	// win assigns a KIVI cache's window blocks (nil for other formats);
	// winMap is its device image, shared by every layer's KVAux.
	win    *windowPool
	winMap backend.Tensor

	maxBlocksPerSeq int
	// width is the current step's block-table width (tableWidth of the
	// most blocks any of its sequences needs): the tables the host packs
	// and copies grow with the contexts in the step, not with the model's
	// context.
	width int

	// Device step inputs: one I32 buffer, allocated once at its largest,
	// that each step fills with a single copy (stepLayout places the
	// step's tensors in it); tokens views its start, where
	// Output.SampleNext leaves the ids it feeds to the next step.
	stepIn backend.Tensor // [stepInLen] I32
	tokens backend.Tensor // [MaxTokens] I32, a view of stepIn

	graphs *graphCache // nil: graphs off

	// CopyBlocks' ids [2] I32 and one-block scratch [1, blockElems],
	// allocated on its first copy.
	copyIDs, copyScratch backend.Tensor

	// fed is how many token ids the last Output.SampleNext left in tokens
	// for the next step (0: none); every Execute clears it.
	fed int
	// gather says the step's uploads take their logits rows by index
	// (DeviceBatch.LogitsAll false) whatever their order: a verify step's
	// graph serves even steps and padded ones, whose logits rows are not
	// in token order.
	gather bool

	// peers are the other ranks of a tensor-parallel group led by this
	// runner (NewGroup), nil for one rank; abort releases them.
	peers []*Runner
	abort Aborter
	// grouped: a rank of a group (lead or not), whose steps every rank
	// must run alike.
	grouped bool

	// Host staging, reused every step; hIn is stepIn's image.
	hTokens, hPositions, hSlots, hQueryStart, hSeqLens, hTables, hLogitsRows []int32
	hIn                                                                      []int32
	buf                                                                      []byte
}

// stepAlign is the alignment of each tensor in the step input buffer, in
// I32 elements (64 bytes).
const stepAlign = 16

// stepLayout is where a step's input tensors sit in the step input
// buffer (offsets in I32 elements), a function of the step's token,
// sequence and logits-row counts only: every step of a graph bucket has
// the same layout, so the addresses its graph captured hold the inputs
// of every replay. Tokens come first, at offset 0.
//
//	| tokens | positions | slots | queryStart | seqLens | logitsRows | blockTables |
//	  nt       nt          nt      ns+1         ns        nl           ns*maxBlocksPerSeq
//
// each starting on a stepAlign boundary.
type stepLayout struct {
	positions, slots, queryStart, seqLens, logitsRows, tables, end int
}

func layoutStep(nt, ns, nl, maxBlocksPerSeq int) stepLayout {
	up := func(n int) int { return (n + stepAlign - 1) / stepAlign * stepAlign }
	var l stepLayout
	l.positions = up(nt)
	l.slots = l.positions + up(nt)
	l.queryStart = l.slots + up(nt)
	l.seqLens = l.queryStart + up(ns+1)
	l.logitsRows = l.seqLens + up(ns)
	l.tables = l.logitsRows + up(nl)
	l.end = l.tables + ns*maxBlocksPerSeq
	return l
}

// New allocates the KV pools and step buffers on b.
func New(b backend.Backend, m Model, opts Options) (*Runner, error) {
	if opts.NumBlocks < 2 || opts.BlockSize <= 0 || opts.MaxTokens <= 0 || opts.MaxSeqs <= 0 || opts.MaxSeqLen <= 0 {
		return nil, fmt.Errorf("runner: invalid options %+v", opts)
	}
	if opts.NumLayers <= 0 || opts.NumKVHeads <= 0 || opts.HeadDim <= 0 {
		return nil, fmt.Errorf("runner: invalid model shape in options %+v", opts)
	}
	spec := opts.KV
	if spec.DType == 0 {
		if opts.KVDType == 0 {
			opts.KVDType = b.ActDType()
		}
		spec = backend.PlainKV(opts.KVDType, opts.BlockSize)
	}
	opts.KVDType, opts.KV = spec.DType, spec
	r := &Runner{b: b, m: m, opts: opts, spec: spec}
	if err := spec.Validate(); err != nil {
		return nil, fmt.Errorf("runner: %w", err)
	}
	if spec.BlockSize != opts.BlockSize {
		return nil, fmt.Errorf("runner: KV spec of %d-token blocks for blocks of %d", spec.BlockSize, opts.BlockSize)
	}
	if err := spec.CheckModel(opts.NumKVHeads, opts.HeadDim); err != nil {
		return nil, fmt.Errorf("runner: %w", err)
	}
	if c, ok := b.(backend.KVSpecChecker); ok {
		if err := c.CheckKVSpec(spec); err != nil {
			return nil, fmt.Errorf("runner: %w", err)
		}
	}
	if opts.KVScales != nil && (spec.Scales != backend.KVScalePerHead || len(opts.KVScales) != opts.NumLayers) {
		return nil, fmt.Errorf("runner: %d layers of KV scales for a %v cache of %d layers", len(opts.KVScales), spec, opts.NumLayers)
	}
	r.maxBlocksPerSeq = (opts.MaxSeqLen + opts.BlockSize - 1) / opts.BlockSize
	if err := r.allocKV(); err != nil {
		r.Close()
		return nil, err
	}
	// The largest layout: every count at its maximum (a step has at most
	// MaxTokens logits rows and min(MaxSeqs, MaxTokens) sequences).
	maxIn := layoutStep(opts.MaxTokens, opts.MaxSeqs, opts.MaxTokens, r.maxBlocksPerSeq).end
	var err error
	if r.stepIn, err = b.Alloc(backend.I32, maxIn); err == nil {
		r.tokens, err = b.View(r.stepIn, 0, opts.MaxTokens)
	}
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("runner: allocate step buffers: %w", err)
	}
	r.hIn = make([]int32, maxIn)
	if r.graphs, err = newGraphCache(b, opts.Graphs, opts.MaxSeqs); err != nil {
		r.Close()
		return nil, err
	}
	if r.graphs != nil {
		r.graphs.key.KV = r.spec
	}
	return r, nil
}

// KVBytes is the device memory the KV cache takes: pools, scales and
// window.
func (r *Runner) KVBytes() int64 {
	o := r.opts
	return r.spec.CacheBlockBytes(o.NumLayers, o.NumKVHeads, o.HeadDim)*int64(o.NumBlocks) +
		r.spec.FixedBytes(o.NumLayers, o.NumKVHeads, o.HeadDim, r.spec.WindowBlocks(o.MaxSeqs, o.MaxTokens))
}

// CapacityTokens is how many tokens the KV cache holds (the null block
// aside).
func (r *Runner) CapacityTokens() int { return (r.opts.NumBlocks - 1) * r.opts.BlockSize }

// Options returns the options the runner was made with (KVDType resolved).
func (r *Runner) Options() Options { return r.opts }

// Close frees the runner's device memory and graphs, and a group's
// other ranks'.
func (r *Runner) Close() {
	for _, p := range r.peers {
		p.Close()
	}
	r.peers = nil
	if r.graphs != nil {
		r.graphs.close()
	}
	for _, kv := range r.kv {
		for _, t := range []backend.Tensor{kv.K, kv.V, kv.Aux.KScale, kv.Aux.VScale, kv.Aux.KWindow, kv.Aux.VWindow} {
			if t != nil {
				r.b.Free(t)
			}
		}
	}
	r.kv = nil
	if r.winMap != nil {
		r.b.Free(r.winMap)
		r.winMap = nil
	}
	for _, t := range []backend.Tensor{r.copyIDs, r.copyScratch} {
		if t != nil {
			r.b.Free(t)
		}
	}
	r.copyIDs, r.copyScratch = nil, nil
	if r.stepIn != nil {
		r.b.Free(r.stepIn)
		r.stepIn, r.tokens = nil, nil
	}
}

// Output holds a step's logits in step order: one row per sequence that
// wanted them (WantLogits), or one per token (AllLogits).
type Output struct {
	b      backend.Backend
	r      *Runner
	logits backend.Tensor // [Rows, vocab] F32
	Rows   int
	// Seq[i] is the index in Step.Seqs of logits row i.
	Seq []int
	// Graph says the step ran by replaying a captured graph (not eagerly).
	Graph bool
	vocab int
	host  []float32
	// peers are the other ranks' outputs of the step (NewGroup): the same
	// logits, which SampleNext samples on every rank.
	peers []*Output
}

// Sample picks one token per logits row by the rule of each row (see
// backend.SampleRow), on the backend's device.
func (o *Output) Sample(rows []backend.SampleRow) ([]int32, error) {
	if len(rows) != o.Rows {
		return nil, fmt.Errorf("runner: %d sampling rows for %d logits rows", len(rows), o.Rows)
	}
	return o.b.Sample(backend.SampleArgs{Logits: o.logits, Rows: rows})
}

// SampleNext samples like Sample, on the device, but leaves the picks
// where the next step reads its tokens (Step.FedTokens) and returns at
// once; wait gives the ids on the host when the device has them. Queue
// the next step before calling wait, and the host's work for it overlaps
// this step's. The backend must implement backend.DeviceSampler (see
// CanFeed), and no other step may run between this one and the fed one.
func (o *Output) SampleNext(rows []backend.SampleRow) (wait func() ([]int32, error), err error) {
	if o.peers != nil {
		return o.sampleNextGroup(rows)
	}
	ds, ok := o.b.(backend.DeviceSampler)
	if !ok {
		return nil, fmt.Errorf("runner: %s cannot sample into the next step's inputs", o.b.Name())
	}
	if len(rows) != o.Rows || o.Rows == 0 {
		return nil, fmt.Errorf("runner: %d sampling rows for %d logits rows", len(rows), o.Rows)
	}
	if o.Rows*4 > backend.MaxAsyncRead {
		return nil, fmt.Errorf("runner: %d rows are too many to feed back", o.Rows)
	}
	ids, err := o.b.View(o.r.tokens, 0, o.Rows)
	if err != nil {
		return nil, err
	}
	if err := ds.SampleTo(ids, backend.SampleArgs{Logits: o.logits, Rows: rows}); err != nil {
		return nil, err
	}
	raw := make([]byte, 4*o.Rows)
	done, err := ds.ReadAsync(ids, raw)
	if err != nil {
		return nil, err
	}
	o.r.fed = o.Rows
	return func() ([]int32, error) {
		if err := done(); err != nil {
			return nil, fmt.Errorf("runner: sampled ids: %w", err)
		}
		out := make([]int32, len(raw)/4)
		for i := range out {
			out[i] = int32(binary.LittleEndian.Uint32(raw[4*i:]))
		}
		return out, nil
	}, nil
}

// CanFeed reports whether the runner's backend can feed sampled tokens to
// the next step on the device (Output.SampleNext, Step.FedTokens).
func (r *Runner) CanFeed() bool {
	_, ok := r.b.(backend.DeviceSampler)
	for _, p := range r.peers {
		ok = ok && p.CanFeed()
	}
	return ok
}

// Logits returns row i's logits on the host, read from the device once for
// all rows on first use. The slice is valid until the next Execute.
func (o *Output) Logits(i int) ([]float32, error) {
	if i < 0 || i >= o.Rows {
		return nil, fmt.Errorf("runner: logits row %d of %d", i, o.Rows)
	}
	if o.host == nil {
		raw := make([]byte, o.Rows*o.vocab*4)
		if err := o.b.Read(o.logits, raw); err != nil {
			return nil, fmt.Errorf("runner: read logits: %w", err)
		}
		o.host = make([]float32, o.Rows*o.vocab)
		for j := range o.host {
			o.host[j] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*j:]))
		}
	}
	return o.host[i*o.vocab : (i+1)*o.vocab], nil
}

// Execute runs one step (on every rank of a group: NewGroup).
func (r *Runner) Execute(step *Step) (*Output, error) {
	if r.peers != nil {
		return r.executeGroup(step)
	}
	return r.execute(step)
}

func (r *Runner) execute(step *Step) (*Output, error) {
	fed := r.fed
	r.fed = 0
	if step.FedTokens {
		if fed == 0 || fed > len(step.Seqs) {
			return nil, fmt.Errorf("runner: step of %d sequences fed %d sampled tokens", len(step.Seqs), fed)
		}
		for i, s := range step.Seqs[:fed] {
			if len(s.Tokens) != 1 {
				return nil, fmt.Errorf("runner: fed step: seq %d computes %d tokens, not 1", i, len(s.Tokens))
			}
		}
	} else {
		fed = 0
	}
	if err := r.pack(step); err != nil {
		return nil, err
	}
	if r.win != nil {
		if err := r.win.prepare(step.Seqs); err != nil {
			return nil, err
		}
		if err := r.syncWindowMap(); err != nil {
			return nil, err
		}
	}
	real := len(r.hLogitsRows)
	bucket, q := 0, 0
	r.gather = false
	if r.graphs != nil {
		var even bool
		if q, even = r.graphs.graphQuery(step); q > 0 {
			bucket = r.graphs.bucket(len(step.Seqs))
			if bucket*q > r.opts.MaxTokens {
				bucket = 0 // a verify step whose padded bucket would not fit the step buffers
			}
			if bucket > 0 && !even {
				if r.padVerifyRows(q) {
					r.graphs.stats.PaddedVerifies++
				} else {
					bucket = 0
				}
			}
			// A verify graph gathers its logits rows, even or padded
			// (whose step's rows come first, the padding rows after).
			r.gather = bucket > 0 && q > 1
		}
	}
	var replays uint64
	if r.graphs != nil {
		replays = r.graphs.stats.Replays
	}
	var logits backend.Tensor
	var err error
	if bucket > 0 && q > 1 && fed == 0 {
		if flat := r.flatBucket(len(step.Seqs), q); flat > 0 {
			if logits, err = r.forwardVerify(step, bucket, q, flat); err != nil {
				return nil, fmt.Errorf("runner: forward: %w", err)
			}
			return r.output(step, real, replays, logits)
		}
	}
	if bucket > 0 {
		r.padDecode(bucket, q)
	}
	in, err := r.upload(fed)
	if err != nil {
		return nil, err
	}
	if bucket > 0 {
		// One MaxSeqLen for every step of a graph: kernels that size
		// their grids by it (split-KV decode) must see the captured value.
		in.MaxSeqLen = r.graphSeqLen()
		logits, err = r.forwardGraph(in, bucket, q)
	} else {
		logits, err = r.m.Forward(in, r.kv)
	}
	if err != nil {
		return nil, fmt.Errorf("runner: forward: %w", err)
	}
	return r.output(step, real, replays, logits)
}

// output wraps a forward's logits (the step's real rows first, then any
// padding rows) as the step's Output; replays is the graph replay count
// before the step.
func (r *Runner) output(step *Step, real int, replays uint64, logits backend.Tensor) (*Output, error) {
	out := &Output{b: r.b, r: r, Rows: real, Graph: r.graphs != nil && r.graphs.stats.Replays > replays}
	if real > 0 {
		numLogits := len(r.hLogitsRows)
		if logits == nil || len(logits.Shape()) != 2 || logits.Shape()[0] != numLogits {
			return nil, fmt.Errorf("runner: forward returned no [%d, vocab] logits", numLogits)
		}
		var err error
		if numLogits > real { // padding rows of a graph bucket
			if logits, err = r.b.View(logits, 0, real); err != nil {
				return nil, err
			}
		}
		out.logits = logits
		out.vocab = logits.Shape()[1]
		for i, s := range step.Seqs {
			switch {
			case s.AllLogits:
				for range s.Tokens {
					out.Seq = append(out.Seq, i)
				}
			case s.WantLogits:
				out.Seq = append(out.Seq, i)
			}
		}
	}
	return out, nil
}

// upload writes the packed host rows into the step input buffer, in one
// copy, and returns the batch viewing them. The first fed token ids are on
// the device already (Step.FedTokens) and are not written.
func (r *Runner) upload(fed int) (*model.DeviceBatch, error) {
	nt, ns, nl := len(r.hTokens), len(r.hSeqLens), len(r.hLogitsRows)
	in := &model.DeviceBatch{NumTokens: nt, NumSeqs: ns, NumLogits: nl}
	l := layoutStep(nt, ns, nl, r.width)
	if l.end > len(r.hIn) {
		return nil, fmt.Errorf("runner: a step of %d tokens, %d sequences and %d logits rows exceeds the step buffers (MaxTokens %d, MaxSeqs %d)",
			nt, ns, nl, r.opts.MaxTokens, r.opts.MaxSeqs)
	}
	h := r.hIn[:l.end]
	// Each tensor at its offset, the alignment gap after it zeroed (the
	// tables end the buffer: they fill it to l.end).
	for _, part := range []struct {
		at, next int
		v        []int32
	}{{0, l.positions, r.hTokens}, {l.positions, l.slots, r.hPositions}, {l.slots, l.queryStart, r.hSlots},
		{l.queryStart, l.seqLens, r.hQueryStart}, {l.seqLens, l.logitsRows, r.hSeqLens},
		{l.logitsRows, l.tables, r.hLogitsRows}, {l.tables, l.end, r.hTables}} {
		n := copy(h[part.at:part.next], part.v)
		clear(h[part.at+n : part.next])
	}
	var err error
	view := func(off, n int) backend.Tensor {
		if err != nil {
			return nil
		}
		var v backend.Tensor
		v, err = r.b.View(r.stepIn, off, n)
		return v
	}
	// Everything after the fed ids, in one copy.
	if rest := view(fed, l.end-fed); err == nil {
		err = r.b.Write(rest, r.bytes(h[fed:]))
	}
	in.Tokens = view(0, nt)
	in.Positions = view(l.positions, nt)
	in.SlotMapping = view(l.slots, nt)
	in.QueryStart = view(l.queryStart, ns+1)
	in.SeqLens = view(l.seqLens, ns)
	if tables := view(l.tables, ns*r.width); err == nil {
		in.BlockTables, err = r.b.Reshape(tables, ns, r.width)
	}
	if nl > 0 {
		in.LogitsRows = view(l.logitsRows, nl)
		in.LogitsAll = nl == nt && !r.gather
		for i, row := range r.hLogitsRows {
			in.LogitsAll = in.LogitsAll && int(row) == i
		}
	}
	if err != nil {
		return nil, fmt.Errorf("runner: upload step inputs: %w", err)
	}
	for _, sl := range r.hSeqLens {
		in.MaxSeqLen = max(in.MaxSeqLen, int(sl))
	}
	for s := range ns {
		in.MaxQueryLen = max(in.MaxQueryLen, int(r.hQueryStart[s+1]-r.hQueryStart[s]))
	}
	return in, nil
}

// graphSeqLen is the MaxSeqLen a decode graph of the current table width
// runs with: every context its tables can hold.
func (r *Runner) graphSeqLen() int { return min(r.width*r.opts.BlockSize, r.opts.MaxSeqLen) }

// minTableWidth is the narrowest block table a step packs (256 tokens at
// blocks of 16).
const minTableWidth = 16

// tableWidth is the block-table width of a step whose sequences need at
// most need blocks: the next power of two from minTableWidth, at most
// maxBlocksPerSeq. Powers of two keep the decode graphs, one per (bucket,
// width), few as contexts grow.
func (r *Runner) tableWidth(need int) int {
	w := minTableWidth
	for w < need {
		w *= 2
	}
	return min(w, r.maxBlocksPerSeq)
}

// TableWidths lists the block-table widths steps pack, narrowest first
// (tableWidth's values): the widths a graph shape's key can take.
func (r *Runner) TableWidths() []int {
	var ws []int
	for w := minTableWidth; ; w *= 2 {
		ws = append(ws, min(w, r.maxBlocksPerSeq))
		if w >= r.maxBlocksPerSeq {
			return ws
		}
	}
}

// resetHost empties the host staging rows.
func (r *Runner) resetHost() {
	r.hTokens, r.hPositions, r.hSlots = r.hTokens[:0], r.hPositions[:0], r.hSlots[:0]
	r.hQueryStart, r.hSeqLens, r.hLogitsRows = append(r.hQueryStart[:0], 0), r.hSeqLens[:0], r.hLogitsRows[:0]
	if need := r.opts.MaxSeqs * r.maxBlocksPerSeq; cap(r.hTables) < need {
		r.hTables = make([]int32, 0, need)
	}
	r.hTables = r.hTables[:0]
}

// pack validates the step and fills the host staging slices.
func (r *Runner) pack(step *Step) error {
	o := r.opts
	if len(step.Seqs) == 0 {
		return fmt.Errorf("runner: empty step")
	}
	if len(step.Seqs) > o.MaxSeqs {
		return fmt.Errorf("runner: %d sequences in a step, at most %d", len(step.Seqs), o.MaxSeqs)
	}
	r.resetHost()
	need := 1
	for _, s := range step.Seqs {
		need = max(need, (s.Start+len(s.Tokens)+o.BlockSize-1)/o.BlockSize)
	}
	r.width = r.tableWidth(need)
	for i, s := range step.Seqs {
		n := len(s.Tokens)
		end := s.Start + n
		if n == 0 || s.Start < 0 {
			return fmt.Errorf("runner: seq %d: %d tokens at start %d", i, n, s.Start)
		}
		if end > o.MaxSeqLen {
			return fmt.Errorf("runner: seq %d reaches %d tokens, past the context of %d", i, end, o.MaxSeqLen)
		}
		if need := (end + o.BlockSize - 1) / o.BlockSize; len(s.BlockTable) < need {
			return fmt.Errorf("runner: seq %d: block table of %d blocks for %d tokens (needs %d)", i, len(s.BlockTable), end, need)
		}
		if len(r.hTokens)+n > o.MaxTokens {
			return fmt.Errorf("runner: step carries more than %d tokens", o.MaxTokens)
		}
		for j, tok := range s.Tokens {
			p := s.Start + j
			blk := s.BlockTable[p/o.BlockSize]
			if blk <= 0 || int(blk) >= o.NumBlocks {
				return fmt.Errorf("runner: seq %d: block id %d out of range [1, %d)", i, blk, o.NumBlocks)
			}
			r.hTokens = append(r.hTokens, tok)
			r.hPositions = append(r.hPositions, int32(p))
			r.hSlots = append(r.hSlots, blk*int32(o.BlockSize)+int32(p%o.BlockSize))
		}
		r.hQueryStart = append(r.hQueryStart, int32(len(r.hTokens)))
		r.hSeqLens = append(r.hSeqLens, int32(end))
		switch {
		case s.AllLogits:
			for j := len(r.hTokens) - n; j < len(r.hTokens); j++ {
				r.hLogitsRows = append(r.hLogitsRows, int32(j))
			}
		case s.WantLogits:
			r.hLogitsRows = append(r.hLogitsRows, int32(len(r.hTokens)-1))
		}
		row := len(r.hTables)
		r.hTables = r.hTables[:row+r.width] // capacity reserved by resetHost
		clear(r.hTables[row:])
		nb := min(len(s.BlockTable), r.width)
		for j := 0; j < nb; j++ {
			b := s.BlockTable[j]
			if b < 0 || int(b) >= o.NumBlocks {
				return fmt.Errorf("runner: seq %d: block id %d out of range", i, b)
			}
			r.hTables[row+j] = b
		}
	}
	return nil
}

// bytes encodes v little-endian into the reused staging buffer.
func (r *Runner) bytes(v []int32) []byte {
	n := 4 * len(v)
	if cap(r.buf) < n {
		r.buf = make([]byte, n)
	}
	b := r.buf[:n]
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(x))
	}
	return b
}

// Backend is the backend the runner drives.
func (r *Runner) Backend() backend.Backend { return r.b }

// KV returns the per-layer KV pools, [numBlocks, numKVHeads, blockSize,
// headDim] each. The runner keeps ownership.
func (r *Runner) KV() []model.LayerKV { return r.kv }

// KVSpec is the format of the runner's KV cache.
func (r *Runner) KVSpec() backend.KVSpec { return r.spec }
