package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/kvcache"
	"github.com/trigon-llm/trigon/model"
	"github.com/trigon-llm/trigon/model/arch"
	"github.com/trigon-llm/trigon/runner"
)

// The overlap benchmark answers one scheduling question: while a batch of
// sequences is decoding, a new prompt arrives; is it better to
//
//   - mixed: put a chunk of the prompt into every decode step (one forward
//     over the decode rows and the chunk, one stream: what the engine does),
//   - serial: run each decode step (from its graph), then a prefill chunk,
//     on one stream, or
//   - overlap: keep decoding on one stream while the prompt is prefilled
//     on a second stream, concurrently?
//
//	 mixed    |decode+chunk|decode+chunk|decode+chunk|
//	 serial   |dec|chunk      |dec|chunk      |dec|chunk      |
//	 overlap  |dec|dec|dec|dec|dec|dec|dec|dec|   (stream 1)
//	          |chunk      |chunk      |chunk      | (stream 2)
//
// Each strategy reports the arriving prompt's prefill time (its TTFT), the
// decode steps made meanwhile and their durations, and the decode tokens
// per second over that window. Overlap wins only if it gives both a
// shorter prefill and at least the decode rate of mixed.
//
// The second stream is a second backend on the same device (the CUDA
// backend runs one stream per instance, on the device's primary context),
// holding its own copy of the weights: the HBM traffic is the same as two
// streams sharing one copy, since a decode step streams every weight
// either way.

// OverlapOptions configure RunOverlap.
type OverlapOptions struct {
	// Backend runs the decode batch (and, in mixed and serial, the
	// prompt); Second, on the same device, runs the prompt in overlap. A
	// nil Second skips the overlap strategy.
	Backend, Second backend.Backend
	Config          model.Config
	Weights         model.Weights
	Arch            string
	WeightsSource   string

	Batch     int // sequences decoding when the prompt arrives
	Context   int // their context (prompt tokens) at that point
	PromptLen int // tokens of the arriving prompt
	Chunk     int // most prompt tokens per prefill step
	Warmup    int // untimed repetitions of each strategy first
	Iters     int // timed repetitions (>= 1)
	Seed      uint64
	// CUDAGraphs replays pure decode steps (serial, overlap) from the
	// runner's captured graph.
	CUDAGraphs bool
}

// OverlapRow is one strategy's result. Durations are in milliseconds.
type OverlapRow struct {
	Strategy string `json:"strategy"` // mixed, serial or overlap
	// PrefillMS is the arriving prompt's prefill, from its first chunk to
	// its first token sampled: its TTFT.
	PrefillMS Summary `json:"prefill_ms"`
	// DecodeSteps is the mean number of decode steps made during the
	// prefill (mixed and serial: one per chunk; overlap: as many as ran).
	DecodeSteps float64 `json:"decode_steps"`
	// StepMS are those decode steps' durations (mixed: the whole mixed
	// step), the inter-token latency the decoding sequences see.
	StepMS Summary `json:"step_ms"`
	// DecodeTokensPerS is decode tokens made during the prefill over the
	// prefill time.
	DecodeTokensPerS float64 `json:"decode_tokens_per_s"`
	// TokensAgree says whether the greedy tokens (the decode rows' and the
	// prompt's first) match the serial strategy's on their common prefix.
	TokensAgree bool `json:"tokens_agree"`

	// Tokens are the last repetition's greedy decode tokens,
	// [batch][steps], and First the prompt's first token.
	Tokens [][]int32 `json:"-"`
	First  int32     `json:"-"`
}

// OverlapResult is what `trigon bench overlap` reports.
type OverlapResult struct {
	Benchmark  string       `json:"benchmark"` // "overlap"
	Arch       string       `json:"arch"`
	Weights    string       `json:"weights"`
	Backend    string       `json:"backend"`
	Device     string       `json:"device,omitempty"`
	Batch      int          `json:"batch"`
	Context    int          `json:"context"`
	PromptLen  int          `json:"prompt_len"`
	Chunk      int          `json:"chunk"`
	Warmup     int          `json:"warmup"`
	Iters      int          `json:"iters"`
	CUDAGraphs string       `json:"cuda_graphs"`
	Rows       []OverlapRow `json:"rows"`
	Notes      []string     `json:"notes"`

	// Contexts are the decode rows' random contexts and Prompt the
	// arriving prompt, for checking Rows' tokens.
	Contexts [][]int32 `json:"-"`
	Prompt   []int32   `json:"-"`
}

// lane is one model and runner (one stream) and the sequences it holds.
type lane struct {
	b backend.Backend
	m model.Model
	r *runner.Runner
}

func (l *lane) close() {
	if l.r != nil {
		l.r.Close()
	}
	if l.m != nil {
		l.m.Close()
	}
}

// overlapRun is the state of one RunOverlap.
type overlapRun struct {
	o        OverlapOptions
	main     lane // decode batch; mixed and serial prompt
	second   lane // overlap prompt
	maxSteps int  // decode steps a repetition may take (block capacity)
	chunks   int  // prefill steps of the prompt

	decTables [][]int32 // [batch][blocks]
	promptTab []int32   // the prompt's blocks on main
	prompt    []int32
	contexts  [][]int32 // [batch][Context]
	start     []int32   // each decode row's token at position Context
	greedy    []backend.SampleRow
}

// RunOverlap measures the three strategies (overlap only when
// opts.Second is set) and returns their rows in the order mixed, serial,
// overlap.
func RunOverlap(ctx context.Context, opts OverlapOptions) (*OverlapResult, error) {
	if err := checkOverlapOptions(&opts); err != nil {
		return nil, err
	}
	run := &overlapRun{o: opts}
	defer run.main.close()
	defer run.second.close()
	if err := run.setup(); err != nil {
		return nil, err
	}
	res := &OverlapResult{
		Benchmark: "overlap", Arch: opts.Arch, Weights: opts.WeightsSource, Backend: opts.Backend.Name(),
		Batch: opts.Batch, Context: opts.Context, PromptLen: opts.PromptLen, Chunk: opts.Chunk,
		Warmup: opts.Warmup, Iters: opts.Iters, CUDAGraphs: "off", Notes: []string{},
	}
	if d, ok := opts.Backend.(interface{ Device() string }); ok {
		res.Device = d.Device()
	}
	if opts.CUDAGraphs {
		res.CUDAGraphs = "on"
	}
	if opts.Second == nil {
		res.Notes = append(res.Notes, "no second stream: overlap not measured")
	} else {
		res.Notes = append(res.Notes, "overlap runs the prompt on a second backend of the same device with its own copy of the weights")
	}

	type strategy struct {
		name string
		fn   func() (rep, error)
	}
	strategies := []strategy{{"mixed", run.mixed}, {"serial", run.serial}}
	if opts.Second != nil {
		strategies = append(strategies, strategy{"overlap", run.overlap})
	}
	var ref rep // serial's tokens
	var rows []OverlapRow
	var reps [][]rep
	for _, st := range strategies {
		var rs []rep
		for it := range opts.Warmup + opts.Iters {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			r, err := st.fn()
			if err != nil {
				return nil, fmt.Errorf("bench overlap: %s: %w", st.name, err)
			}
			if it >= opts.Warmup {
				rs = append(rs, r)
			}
		}
		if st.name == "serial" {
			ref = rs[len(rs)-1]
		}
		reps = append(reps, rs)
	}
	for i, st := range strategies {
		rows = append(rows, summarizeReps(st.name, reps[i], ref, opts.Batch))
	}
	res.Rows = rows
	res.Contexts, res.Prompt = run.contexts, run.prompt
	return res, nil
}

func checkOverlapOptions(o *OverlapOptions) error {
	if err := checkModelRun("bench overlap", o.Backend, o.Weights, o.Config, o.Batch); err != nil {
		return err
	}
	if o.Chunk == 0 {
		o.Chunk = 512
	}
	switch {
	case o.Context < 1 || o.PromptLen < 1 || o.Chunk < 1:
		return fmt.Errorf("bench overlap: context %d, prompt length %d and chunk %d must be >= 1", o.Context, o.PromptLen, o.Chunk)
	case o.Context >= o.Config.MaxPositions || o.PromptLen > o.Config.MaxPositions:
		return fmt.Errorf("bench overlap: context %d and prompt %d must fit the model's %d positions (with room to decode)",
			o.Context, o.PromptLen, o.Config.MaxPositions)
	case o.Warmup < 0 || o.Iters < 1:
		return fmt.Errorf("bench overlap: warmup %d must be >= 0 and iters %d >= 1", o.Warmup, o.Iters)
	}
	if _, err := checkedMul(o.Batch, o.Context+o.PromptLen); err != nil {
		return fmt.Errorf("bench overlap: %w", err)
	}
	// Only the decode steps replay graphs; the second stream prefills.
	if _, can := o.Backend.(backend.GraphCapturer); o.CUDAGraphs && !can {
		return fmt.Errorf("bench overlap: --cuda-graphs on: the %s backend cannot capture graphs", o.Backend.Name())
	}
	return nil
}

// setup builds the lanes and prefills the decode batch's contexts
// (untimed): each decode row then has its token for position Context.
func (run *overlapRun) setup() error {
	o, c := run.o, run.o.Config
	bs := kvcache.DefaultBlockSize
	run.chunks = (o.PromptLen + o.Chunk - 1) / o.Chunk
	// Overlap decodes until the prompt is done: room for many steps per
	// chunk, within the model's positions.
	run.maxSteps = min(16*run.chunks+64, c.MaxPositions-o.Context)
	perSeq := (o.Context + run.maxSteps + bs - 1) / bs
	promptBlocks := (o.PromptLen + bs - 1) / bs
	decBlocks, err := checkedMul(perSeq, o.Batch)
	if err != nil {
		return fmt.Errorf("bench overlap: %w", err)
	}
	maxSeqLen := max(o.Context+run.maxSteps, o.PromptLen)
	maxTokens := max(o.Chunk+o.Batch, o.Context)
	if run.main, err = newLane(o.Backend, c, o.Weights, maxTokens, o.Batch+1, decBlocks+promptBlocks+1, o.Batch+1, maxSeqLen, o.CUDAGraphs, o.Batch); err != nil {
		return err
	}
	if o.Second != nil {
		if run.second, err = newLane(o.Second, c, o.Weights, o.Chunk, 1, promptBlocks+1, 1, o.PromptLen, false, 0); err != nil {
			return err
		}
	}
	for s := range o.Batch {
		t := make([]int32, perSeq)
		for i := range t {
			t[i] = int32(1 + s*perSeq + i)
		}
		run.decTables = append(run.decTables, t)
	}
	run.promptTab = make([]int32, promptBlocks)
	for i := range run.promptTab {
		run.promptTab[i] = int32(1 + decBlocks + i)
	}
	rng := rand.New(rand.NewPCG(o.Seed, 0x6f76_6572_6c61_70))
	randTokens := func(n int) []int32 {
		t := make([]int32, n)
		for i := range t {
			t[i] = int32(rng.IntN(c.VocabSize))
		}
		return t
	}
	run.prompt = randTokens(o.PromptLen)
	run.greedy = make([]backend.SampleRow, o.Batch+1)
	// The decode rows' contexts: one sequence per step, so the steps fit
	// MaxTokens = Context.
	run.start = make([]int32, o.Batch)
	for s := range o.Batch {
		run.contexts = append(run.contexts, randTokens(o.Context))
		step := runner.Step{Seqs: []runner.Seq{{Tokens: run.contexts[s], BlockTable: run.decTables[s], WantLogits: true}}}
		out, err := run.main.r.Execute(&step)
		if err != nil {
			return fmt.Errorf("bench overlap: prefill decode row %d: %w", s, err)
		}
		ids, err := out.Sample(run.greedy[:1])
		if err != nil {
			return fmt.Errorf("bench overlap: prefill decode row %d: %w", s, err)
		}
		run.start[s] = ids[0]
	}
	return nil
}

func newLane(b backend.Backend, c model.Config, w model.Weights, maxTokens, maxLogits, blocks, maxSeqs, maxSeqLen int, graphs bool, bucket int) (lane, error) {
	m, err := arch.New(b, c, w, model.Options{MaxTokens: maxTokens, MaxLogits: maxLogits})
	if err != nil {
		return lane{}, fmt.Errorf("bench overlap: %w", err)
	}
	gopts := runner.GraphOptions{Enabled: graphs}
	if graphs {
		gopts.Buckets = []int{bucket}
	}
	r, err := runner.New(b, m, runner.Options{
		NumBlocks: blocks, BlockSize: kvcache.DefaultBlockSize, MaxTokens: maxTokens, MaxSeqs: maxSeqs, MaxSeqLen: maxSeqLen,
		NumLayers: c.NumLayers, NumKVHeads: c.NumKVHeads, HeadDim: c.HeadDim, Graphs: gopts,
	})
	if err != nil {
		m.Close()
		return lane{}, fmt.Errorf("bench overlap: %w", err)
	}
	return lane{b: b, m: m, r: r}, nil
}

// rep is one repetition of a strategy.
type rep struct {
	prefill float64   // seconds, the prompt's first chunk to its first token
	steps   []float64 // seconds per decode step during the prefill
	tokens  [][]int32 // [step][batch] greedy decode tokens
	first   int32     // the prompt's first token
}

// decodeStep runs decode step k (position Context+k) of every row on l.
func (run *overlapRun) decodeStep(l *lane, cur []int32, k int) ([]int32, error) {
	o := run.o
	step := runner.Step{Seqs: make([]runner.Seq, o.Batch)}
	for s := range step.Seqs {
		step.Seqs[s] = runner.Seq{Tokens: cur[s : s+1], Start: o.Context + k, BlockTable: run.decTables[s], WantLogits: true}
	}
	out, err := l.r.Execute(&step)
	if err != nil {
		return nil, fmt.Errorf("decode step %d: %w", k, err)
	}
	return out.Sample(run.greedy[:o.Batch])
}

// promptChunk runs prefill chunk i of the prompt on l, with blocks table;
// it returns the first token after the last chunk (else -1).
func (run *overlapRun) promptChunk(l *lane, table []int32, i int) (int32, error) {
	o := run.o
	lo := i * o.Chunk
	hi := min(o.PromptLen, lo+o.Chunk)
	step := runner.Step{Seqs: []runner.Seq{{Tokens: run.prompt[lo:hi], Start: lo, BlockTable: table, WantLogits: hi == o.PromptLen}}}
	out, err := l.r.Execute(&step)
	if err != nil {
		return 0, fmt.Errorf("prompt chunk %d: %w", i, err)
	}
	if out.Rows == 0 {
		// The runner's work is queued; wait so step times are the GPU's.
		return -1, l.b.Sync()
	}
	ids, err := out.Sample(run.greedy[:1])
	if err != nil {
		return 0, err
	}
	return ids[0], nil
}

// mixed runs one step per chunk carrying every decode row and the chunk.
func (run *overlapRun) mixed() (rep, error) {
	o := run.o
	if err := run.main.b.Sync(); err != nil {
		return rep{}, err
	}
	r := rep{first: -1}
	cur := slices.Clone(run.start)
	t0 := time.Now()
	for i := range run.chunks {
		ts := time.Now()
		lo := i * o.Chunk
		hi := min(o.PromptLen, lo+o.Chunk)
		step := runner.Step{Seqs: make([]runner.Seq, 0, o.Batch+1)}
		for s := range o.Batch {
			step.Seqs = append(step.Seqs, runner.Seq{Tokens: cur[s : s+1], Start: o.Context + i, BlockTable: run.decTables[s], WantLogits: true})
		}
		step.Seqs = append(step.Seqs, runner.Seq{Tokens: run.prompt[lo:hi], Start: lo, BlockTable: run.promptTab, WantLogits: hi == o.PromptLen})
		out, err := run.main.r.Execute(&step)
		if err != nil {
			return rep{}, fmt.Errorf("mixed step %d: %w", i, err)
		}
		ids, err := out.Sample(run.greedy[:out.Rows])
		if err != nil {
			return rep{}, err
		}
		for row, id := range ids {
			if q := out.Seq[row]; q < o.Batch {
				cur[q] = id
			} else {
				r.first = id
			}
		}
		r.steps = append(r.steps, time.Since(ts).Seconds())
		r.tokens = append(r.tokens, slices.Clone(cur))
	}
	r.prefill = time.Since(t0).Seconds()
	return r, nil
}

// serial runs, per chunk, a decode step and then the chunk, on one stream.
func (run *overlapRun) serial() (rep, error) {
	if err := run.main.b.Sync(); err != nil {
		return rep{}, err
	}
	r := rep{first: -1}
	cur := slices.Clone(run.start)
	t0 := time.Now()
	for i := range run.chunks {
		ts := time.Now()
		var err error
		if cur, err = run.decodeStep(&run.main, cur, i); err != nil {
			return rep{}, err
		}
		r.steps = append(r.steps, time.Since(ts).Seconds())
		r.tokens = append(r.tokens, slices.Clone(cur))
		id, err := run.promptChunk(&run.main, run.promptTab, i)
		if err != nil {
			return rep{}, err
		}
		if id >= 0 {
			r.first = id
		}
	}
	r.prefill = time.Since(t0).Seconds()
	return r, nil
}

// overlap decodes on the main lane until the prompt, prefilled on the
// second lane at the same time, has its first token.
func (run *overlapRun) overlap() (rep, error) {
	for _, l := range []*lane{&run.main, &run.second} {
		if err := l.b.Sync(); err != nil {
			return rep{}, err
		}
	}
	r := rep{first: -1}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		done     bool
		pErr     error
		prefill  float64
		firstTok int32 = -1
	)
	secondTable := make([]int32, len(run.promptTab))
	for i := range secondTable {
		secondTable[i] = int32(1 + i)
	}
	t0 := time.Now()
	wg.Go(func() {
		var err error
		defer func() {
			mu.Lock()
			done, pErr, prefill = true, err, time.Since(t0).Seconds()
			mu.Unlock()
		}()
		for i := range run.chunks {
			var id int32
			if id, err = run.promptChunk(&run.second, secondTable, i); err != nil {
				return
			}
			if id >= 0 {
				firstTok = id
			}
		}
	})
	cur := slices.Clone(run.start)
	var dErr error
	// At least one step: the batch was decoding when the prompt arrived.
	for k := 0; k < run.maxSteps; k++ {
		mu.Lock()
		finished := done
		mu.Unlock()
		if finished && k > 0 {
			break
		}
		ts := time.Now()
		if cur, dErr = run.decodeStep(&run.main, cur, k); dErr != nil {
			break
		}
		r.steps = append(r.steps, time.Since(ts).Seconds())
		r.tokens = append(r.tokens, slices.Clone(cur))
	}
	wg.Wait()
	if err := errors.Join(dErr, pErr); err != nil {
		return rep{}, err
	}
	r.prefill, r.first = prefill, firstTok
	return r, nil
}

// summarizeReps folds one strategy's repetitions into a row.
func summarizeReps(name string, reps []rep, ref rep, batch int) OverlapRow {
	row := OverlapRow{Strategy: name, TokensAgree: true}
	var prefill, steps []float64
	var nsteps, rate float64
	for _, r := range reps {
		prefill = append(prefill, r.prefill)
		steps = append(steps, r.steps...)
		nsteps += float64(len(r.steps))
		if r.prefill > 0 {
			rate += float64(len(r.steps)*batch) / r.prefill
		}
		if r.first != ref.first {
			row.TokensAgree = false
		}
		for k := range min(len(r.tokens), len(ref.tokens)) {
			if !slices.Equal(r.tokens[k], ref.tokens[k]) {
				row.TokensAgree = false
			}
		}
	}
	last := reps[len(reps)-1]
	row.First = last.first
	row.Tokens = make([][]int32, batch)
	for _, toks := range last.tokens {
		for s := range batch {
			row.Tokens[s] = append(row.Tokens[s], toks[s])
		}
	}
	n := float64(len(reps))
	row.PrefillMS = Summarize(prefill).scaled(1e3)
	row.StepMS = Summarize(steps).scaled(1e3)
	row.DecodeSteps = nsteps / n
	row.DecodeTokensPerS = rate / n
	return row
}

// WriteText prints the result as a table.
func (res *OverlapResult) WriteText(w io.Writer) error {
	var err error
	p := func(format string, args ...any) {
		if err == nil {
			_, err = fmt.Fprintf(w, format, args...)
		}
	}
	on := res.Backend
	if res.Device != "" {
		on += " (" + res.Device + ")"
	}
	p("overlap  %s on %s, %s weights, cuda graphs %s\n", res.Arch, on, res.Weights, res.CUDAGraphs)
	p("         %d sequences decoding at context %d; a %d-token prompt arrives, %d tokens per chunk\n",
		res.Batch, res.Context, res.PromptLen, res.Chunk)
	p("%-8s %14s %12s %22s %14s %7s\n", "strategy", "prompt TTFT", "decode steps", "step p50 / p99 (ms)", "decode tok/s", "agree")
	for _, r := range res.Rows {
		p("%-8s %11.2f ms %12.1f %10.2f / %-10.2f %14.1f %7v\n", r.Strategy, r.PrefillMS.P50, r.DecodeSteps,
			r.StepMS.P50, r.StepMS.P99, r.DecodeTokensPerS, r.TokensAgree)
	}
	for _, n := range res.Notes {
		p("note: %s\n", n)
	}
	return err
}
