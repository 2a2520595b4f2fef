package runner

import (
	"fmt"
	"slices"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/model"
)

// GraphOptions turn on replaying decode steps (and, with VerifyTokens,
// speculative decoding's verify steps) from captured graphs.
//
// A step qualifies when every sequence feeds one token and wants its
// logits (pure decode). It is padded to the next bucket with padding rows
// (slot -1, so no KV write; a one-token context in the null block; their
// logits are dropped) and run with MaxSeqLen fixed at what its block
// tables can hold (their width, a power of two of blocks: Runner.tableWidth),
// so one graph per (bucket, width) serves every step of that size: the
// kernels read lengths and block tables from the step's device buffers,
// which keep their addresses. A graph's first step runs eagerly (loading
// kernels, warming the memory pool), its second is captured and replayed,
// later ones replay.
type GraphOptions struct {
	Enabled bool
	// Buckets are the padded batch sizes, ascending (default 1, 2, 4, 8,
	// 16, 24, 32, 48, 64, then every 32 up to MaxSeqs).
	Buckets []int
	// MaxGraphs bounds the graph cache; the least recently used graph is
	// dropped beyond it. 0: room for the shapes of steady traffic at two
	// table widths (contexts that grow across a power of two) in every
	// bucket: its decode graph and, with VerifyTokens k, both forms of a
	// verify step of each draft length 1..k (verify.go). A bound below
	// the shapes in use recaptures a graph on most steps.
	MaxGraphs int
	// MemoryBudget bounds the device bytes the cached graphs hold beyond
	// the runner's tensors (their temporaries, for backends whose graphs
	// report them with a Bytes() int64 method); 0: no bound.
	MemoryBudget int64
	// VerifyTokens > 0 also replays speculative decoding's verify steps
	// with up to that many draft tokens: steps in which every sequence
	// feeds the same number 1+k of tokens and wants every row's logits,
	// padded like decode steps with padding sequences of 1+k rows, one
	// graph per (bucket, 1+k, width). The model must take bucket*(1+k)
	// logits rows for every bucket whose step fits MaxTokens (a bucket
	// whose padded step would not runs eagerly).
	VerifyTokens int
}

// GraphKey identifies a captured graph: a graph replays fixed weights,
// adapters and KV layout, so a change of any of them must not reuse it.
type GraphKey struct {
	WeightsVersion uint64 // bumped when weights are replaced in place
	AdapterVersion uint64 // the loaded adapter set (0: none)
	KV             backend.KVSpec
	Bucket         int
	Width          int // block-table width: blocks per sequence
	Query          int // tokens per sequence: 1 for decode, 1+k for a verify step
	// StepKeys is the step's model.DeviceBatch.StepKeys, which the
	// attention kernels take as an argument: 1+k for a verify step run as
	// decode rows (verify.go), else 0.
	StepKeys int
}

// DefaultBuckets are the decode batch sizes graphs are captured for, up to
// maxSeqs.
func DefaultBuckets(maxSeqs int) []int {
	var b []int
	for _, n := range []int{1, 2, 4, 8, 16, 24, 32, 48, 64} {
		if n < maxSeqs {
			b = append(b, n)
		}
	}
	for n := 96; n < maxSeqs; n += 32 {
		b = append(b, n)
	}
	return append(b, maxSeqs)
}

// graphCache holds the captured decode graphs by bucket, in LRU order, and
// the histogram of decode batch sizes seen.
type graphCache struct {
	capture backend.GraphCapturer
	buckets []int
	verify  int // most draft tokens of a replayed verify step (0: none)
	max     int
	budget  int64
	bytes   int64 // held by cached graphs
	key     GraphKey
	graphs  map[GraphKey]*graphEntry
	warm    map[graphShape]bool // shapes whose step ran eagerly once (kernels loaded)
	// uncapturable are shapes whose capture failed: they run eagerly.
	uncapturable map[graphShape]bool
	// width is the table width of each bucket's latest step: what
	// Precapture captures it at.
	width map[int]int
	clock uint64
	hist  map[int]uint64 // decode steps per bucket
	// verifyChoice is each verify shape's form (verify.go).
	verifyChoice map[verifyKey]verifyChoice
	steps        uint64
	stats        GraphStats
}

// graphShape is what a graph's kernels are specialised on: its padded
// batch, its block-table width, its tokens per sequence and its
// StepKeys (whatever the weights version).
type graphShape struct{ bucket, width, query, stepKeys int }

type graphEntry struct {
	g       backend.Graph
	logits  backend.Tensor // what the captured Forward returned
	bytes   int64
	lastUse uint64
}

// GraphStats count what the graph path did.
type GraphStats struct {
	Captures, Replays, Evictions, EagerDecodes, CaptureFailures uint64
	// FlatVerifies counts verify steps run as decode rows (verify.go),
	// VerifyTimings the verify shapes whose two forms were timed,
	// PaddedVerifies the uneven verify steps padded to a graph's shape.
	FlatVerifies, VerifyTimings, PaddedVerifies uint64
	Cached                                      int
	Bytes                                       int64 // device bytes the cached graphs hold
	// MaxCached and Budget are the cache's bounds: graphs, and device
	// bytes (0: none).
	MaxCached int
	Budget    int64
}

func newGraphCache(b backend.Backend, o GraphOptions, maxSeqs int) (*graphCache, error) {
	if !o.Enabled {
		return nil, nil
	}
	cp, ok := b.(backend.GraphCapturer)
	if !ok {
		return nil, fmt.Errorf("runner: the %s backend cannot capture graphs", b.Name())
	}
	buckets := o.Buckets
	if len(buckets) == 0 {
		buckets = DefaultBuckets(maxSeqs)
	}
	if !slices.IsSorted(buckets) || buckets[0] < 1 || buckets[len(buckets)-1] > maxSeqs {
		return nil, fmt.Errorf("runner: graph buckets %v must ascend within [1, %d]", buckets, maxSeqs)
	}
	if o.VerifyTokens < 0 {
		return nil, fmt.Errorf("runner: graph verify tokens %d < 0", o.VerifyTokens)
	}
	max := o.MaxGraphs
	if max <= 0 {
		max = 2 * len(buckets) * (1 + 2*o.VerifyTokens)
	}
	return &graphCache{capture: cp, buckets: buckets, verify: o.VerifyTokens, max: max, budget: o.MemoryBudget,
		graphs: map[GraphKey]*graphEntry{}, warm: map[graphShape]bool{}, uncapturable: map[graphShape]bool{}, width: map[int]int{}, hist: map[int]uint64{},
		verifyChoice: map[verifyKey]verifyChoice{}}, nil
}

// bucket is the smallest bucket holding n sequences, or 0.
func (c *graphCache) bucket(n int) int {
	i, _ := slices.BinarySearch(c.buckets, n)
	if i == len(c.buckets) {
		return 0
	}
	return c.buckets[i]
}

// graphQuery is the tokens per sequence of a step the graph path takes,
// or 0: 1 for a pure decode step (every sequence feeds one token and
// wants its logits), 1+k for a verify step (every sequence wants all its
// logits, or feeds one token and wants its logits, and the longest feeds
// 1+k tokens, k at most the cache's verify bound). even says every
// sequence of a verify step feeds 1+k; otherwise the runner pads the
// shorter ones (padVerifyRows).
func (c *graphCache) graphQuery(step *Step) (q int, even bool) {
	q, decode := 0, true
	for _, s := range step.Seqs {
		n := len(s.Tokens)
		switch {
		case n == 1 && s.WantLogits && !s.AllLogits:
		case s.AllLogits && c.verify > 0:
			decode = false
		default:
			return 0, false
		}
		q = max(q, n)
	}
	if decode {
		return 1, true
	}
	if q < 2 || q-1 > c.verify {
		return 0, false
	}
	even = true
	for _, s := range step.Seqs {
		even = even && len(s.Tokens) == q
	}
	return q, even
}

// padDecode appends padding sequences of q rows each up to bucket
// sequences after pack filled the step's real ones: positions 0..q-1 of
// a context in the null block, slot -1 (no KV write), every row's logits
// wanted (and dropped), so the step's layout and shapes are those of
// every step of its graph.
func (r *Runner) padDecode(bucket, q int) {
	for i := len(r.hSeqLens); i < bucket; i++ {
		for p := range q {
			r.hTokens = append(r.hTokens, 0)
			r.hPositions = append(r.hPositions, int32(p))
			r.hSlots = append(r.hSlots, -1)
			r.hLogitsRows = append(r.hLogitsRows, int32(len(r.hTokens)-1))
		}
		r.hQueryStart = append(r.hQueryStart, int32(len(r.hTokens)))
		r.hSeqLens = append(r.hSeqLens, int32(q))
		row := len(r.hTables)
		r.hTables = r.hTables[:row+r.width]
		clear(r.hTables[row:]) // the null block
	}
}

// forwardGraph runs a padded step of bucket sequences of q tokens each
// from its graph, capturing it on the shape's second use. Decode steps
// (q 1) count towards Precapture's histogram; verify steps, of either
// form, do not.
func (r *Runner) forwardGraph(in *model.DeviceBatch, bucket, q int) (backend.Tensor, error) {
	c := r.graphs
	c.clock++
	if q == 1 && in.StepKeys == 0 {
		c.steps++
		c.hist[bucket]++
		c.width[bucket] = r.width
	}
	key := c.keyFor(bucket, r.width, q, in.StepKeys)
	if e := c.graphs[key]; e != nil {
		e.lastUse = c.clock
		c.stats.Replays++
		if err := e.g.Launch(); err != nil {
			return nil, fmt.Errorf("replay graph of bucket %d: %w", bucket, err)
		}
		return e.logits, nil
	}
	sh := graphShape{bucket, r.width, q, in.StepKeys}
	if !c.warm[sh] {
		c.warm[sh] = true
		c.stats.EagerDecodes++
		return r.m.Forward(in, r.kv)
	}
	if c.uncapturable[sh] {
		c.stats.EagerDecodes++
		return r.m.Forward(in, r.kv)
	}
	e, err := r.captureBucket(in, bucket, q)
	if err != nil {
		// A capture that fails (the device short of memory for the
		// graph's temporaries, say) queued nothing: the step runs eagerly,
		// and so do later steps of this shape, rather than fail requests.
		c.uncapturable[sh] = true
		c.stats.CaptureFailures++
		c.stats.EagerDecodes++
		return r.m.Forward(in, r.kv)
	}
	c.stats.Replays++
	if err := e.g.Launch(); err != nil {
		return nil, fmt.Errorf("replay graph of bucket %d: %w", bucket, err)
	}
	return e.logits, nil
}

func (r *Runner) captureBucket(in *model.DeviceBatch, bucket, q int) (*graphEntry, error) {
	c := r.graphs
	e := &graphEntry{lastUse: c.clock}
	g, err := c.capture.CaptureGraph(func() error {
		var err error
		e.logits, err = r.m.Forward(in, r.kv)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("capture graph of bucket %d: %w", bucket, err)
	}
	e.g = g
	if sz, ok := g.(interface{ Bytes() int64 }); ok {
		e.bytes = sz.Bytes()
	}
	c.stats.Captures++
	for len(c.graphs) > 0 && (len(c.graphs) >= c.max || c.budget > 0 && c.bytes+e.bytes > c.budget) {
		c.evictLRU()
	}
	c.graphs[c.keyFor(bucket, r.width, q, in.StepKeys)] = e
	c.bytes += e.bytes
	return e, nil
}

// keyFor is the cache key of a (bucket, table width, tokens per
// sequence, step keys) graph under the current versions.
func (c *graphCache) keyFor(bucket, width, q, stepKeys int) GraphKey {
	k := c.key
	k.Bucket, k.Width, k.Query, k.StepKeys = bucket, width, q, stepKeys
	return k
}

func (c *graphCache) evictLRU() {
	var victim GraphKey
	oldest := ^uint64(0)
	for k, e := range c.graphs {
		if e.lastUse < oldest {
			victim, oldest = k, e.lastUse
		}
	}
	c.drop(victim)
	c.stats.Evictions++
}

func (c *graphCache) drop(k GraphKey) {
	if e := c.graphs[k]; e != nil {
		e.g.Close()
		c.bytes -= e.bytes
		delete(c.graphs, k)
	}
}

func (c *graphCache) close() {
	for k := range c.graphs {
		c.drop(k)
	}
}

// SetGraphVersions records new weights or adapter versions: graphs
// captured under other versions are dropped and recaptured on use.
func (r *Runner) SetGraphVersions(weights, adapters uint64) {
	for _, p := range r.peers {
		p.SetGraphVersions(weights, adapters)
	}
	c := r.graphs
	if c == nil || c.key.WeightsVersion == weights && c.key.AdapterVersion == adapters {
		return
	}
	c.key.WeightsVersion, c.key.AdapterVersion = weights, adapters
	for k := range c.graphs {
		if k.WeightsVersion != weights || k.AdapterVersion != adapters {
			c.drop(k)
		}
	}
}

// GraphBuckets are the batch sizes decode steps are padded to for their
// graphs, ascending; nil when graphs are off.
func (r *Runner) GraphBuckets() []int {
	if r.graphs == nil {
		return nil
	}
	return slices.Clone(r.graphs.buckets)
}

// GraphStats reports the graph path's counters (zero when graphs are off).
func (r *Runner) GraphStats() GraphStats {
	if r.graphs == nil {
		return GraphStats{}
	}
	s := r.graphs.stats
	s.Cached, s.Bytes = len(r.graphs.graphs), r.graphs.bytes
	s.MaxCached, s.Budget = r.graphs.max, r.graphs.budget
	return s
}

// Precapture captures, ahead of use, the graphs of the buckets that the
// recent decode batch sizes show are in steady use (at least a tenth of
// the decode steps since the last call), so a burst at that size does not
// pay for capture. The engine calls it while idle. It runs a padding-only
// decode step per bucket (no KV writes) to load kernels where needed.
// It overwrites tokens fed by Output.SampleNext: call it between steps
// that do not feed.
func (r *Runner) Precapture() error {
	if r.peers != nil {
		return r.eachRank(func(_ int, q *Runner) error { return q.precapture() })
	}
	return r.precapture()
}

func (r *Runner) precapture() error {
	c := r.graphs
	if c == nil || c.steps < 20 {
		return nil
	}
	defer func() { clear(c.hist); c.steps = 0 }()
	for _, b := range c.buckets {
		w, seen := c.width[b]
		if !seen {
			w = r.tableWidth(1)
		}
		key := c.keyFor(b, w, 1, 0)
		if c.hist[b]*10 < c.steps || c.graphs[key] != nil {
			continue
		}
		r.resetHost()
		r.width = w
		r.gather = false // a decode graph: its rows in token order
		r.padDecode(b, 1)
		r.fed = 0 // the padding tokens overwrite any fed ones
		in, err := r.upload(0)
		if err != nil {
			return err
		}
		in.MaxSeqLen = r.graphSeqLen()
		if sh := (graphShape{b, w, 1, 0}); !c.warm[sh] {
			c.warm[sh] = true
			if _, err := r.m.Forward(in, r.kv); err != nil {
				return fmt.Errorf("runner: precapture bucket %d: %w", b, err)
			}
		}
		if _, err := r.captureBucket(in, b, 1); err != nil {
			return fmt.Errorf("runner: precapture: %w", err)
		}
	}
	return nil
}
