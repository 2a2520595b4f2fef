// Package collective is an in-process backend.Communicator: the ranks of a
// tensor-parallel group as goroutines of one process, each over its own
// backend, meeting at barriers to sum or gather through host memory. It
// serves the CPU mode of tensor parallelism and, over GPU backends, the
// oracle that NCCL's results are compared with.
//
// Sums are computed in f32 in rank order (rank 0's value, plus rank 1's,
// ...), whatever rank computes them and however the elements are split, so
// every rank gets the same bits and a run is reproducible.
//
//	comms, err := collective.New([]backend.Backend{b0, b1})
//	// rank r, on its own goroutine:
//	err = comms[r].AllReduce(t)
package collective

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/trigon-llm/trigon/backend"
)

// ErrAborted is wrapped by the errors of collectives cut short by Abort.
var ErrAborted = errors.New("collective aborted")

// Group is the shared state of one group's ranks.
type Group struct {
	n     int
	comms []*Comm

	mu      sync.Mutex
	cond    *sync.Cond
	arrived int
	gen     uint64
	aborted error

	// Per collective: what each rank posted, and the reduced values.
	posted []post
	sum    []float32
}

// post is one rank's contribution to a collective.
type post struct {
	shape []int
	dt    backend.DType
	vals  []float32
	err   error
}

// Comm is one rank's end of a Group. It is used from one goroutine at a
// time (its rank's).
type Comm struct {
	g    *Group
	rank int
	b    backend.Backend
	raw  []byte
	vals []float32 // posted: read by every rank until the collective ends
	full []float32 // AllGather's result
}

var _ backend.Communicator = (*Comm)(nil)

// New makes a group of len(bs) ranks, rank r over bs[r].
func New(bs []backend.Backend) ([]*Comm, error) {
	if len(bs) == 0 {
		return nil, errors.New("collective: a group needs at least one rank")
	}
	g := &Group{n: len(bs), posted: make([]post, len(bs))}
	g.cond = sync.NewCond(&g.mu)
	for r, b := range bs {
		if b == nil {
			return nil, fmt.Errorf("collective: rank %d has no backend", r)
		}
		g.comms = append(g.comms, &Comm{g: g, rank: r, b: b})
	}
	return g.comms, nil
}

// Group returns the group c belongs to.
func (c *Comm) Group() *Group { return c.g }

// Rank implements backend.Communicator.
func (c *Comm) Rank() int { return c.rank }

// Size implements backend.Communicator.
func (c *Comm) Size() int { return c.g.n }

// Abort makes every collective waiting now or called later fail with err
// (wrapped with ErrAborted): a rank that failed before reaching a
// collective would otherwise leave the others waiting for it forever.
func (g *Group) Abort(err error) {
	g.mu.Lock()
	if g.aborted == nil {
		g.aborted = fmt.Errorf("%w: %w", ErrAborted, err)
	}
	g.cond.Broadcast()
	g.mu.Unlock()
}

// Reset clears an Abort, once every rank has returned from its
// collectives (none may be waiting): the group is then as new.
func (g *Group) Reset() {
	g.mu.Lock()
	g.aborted, g.arrived = nil, 0
	g.mu.Unlock()
}

// wait is the group's barrier: it returns once every rank has called it
// (the same number of times), or with the abort error.
func (g *Group) wait() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.aborted != nil {
		return g.aborted
	}
	gen := g.gen
	g.arrived++
	if g.arrived == g.n {
		g.arrived = 0
		g.gen++
		g.cond.Broadcast()
		return nil
	}
	for gen == g.gen && g.aborted == nil {
		g.cond.Wait()
	}
	if gen == g.gen {
		return g.aborted
	}
	return nil
}

// exchange posts p as this rank's contribution and waits for every rank's,
// then checks that they agree (shape, dtype, no error), so that every rank
// fails alike when one of them cannot take part.
func (c *Comm) exchange(op string, p post) error {
	g := c.g
	g.posted[c.rank] = p
	if err := g.wait(); err != nil {
		return fmt.Errorf("collective: %s: %w", op, err)
	}
	var bad error
	for r, q := range g.posted {
		if q.err != nil {
			bad = fmt.Errorf("collective: %s: rank %d: %w", op, r, q.err)
			break
		}
		if !slices.Equal(q.shape, g.posted[0].shape) || q.dt != g.posted[0].dt {
			bad = fmt.Errorf("collective: %s: rank %d has %v %v, rank 0 %v %v: %w", op, r, q.dt, q.shape, g.posted[0].dt, g.posted[0].shape, backend.ErrShape)
			break
		}
	}
	if bad != nil {
		// Every rank sees the same posts and fails alike; one more
		// barrier keeps the posts from being overwritten by a rank's next
		// collective while another still reads them.
		if err := g.wait(); err != nil {
			return fmt.Errorf("collective: %s: %w", op, err)
		}
	}
	return bad
}

// AllReduce implements backend.Communicator: each rank sums its share of
// the elements over the ranks in rank order into the group's buffer, then
// every rank writes the whole sum into its t.
func (c *Comm) AllReduce(t backend.Tensor) error {
	g := c.g
	p := post{err: backend.CheckAllReduce(t)}
	if p.err == nil {
		p.shape, p.dt = t.Shape(), t.DType()
		p.vals, p.err = c.read(t)
	}
	if err := c.exchange("all_reduce", p); err != nil {
		return err
	}
	n := len(p.vals)
	if c.rank == 0 {
		g.sum = slices.Grow(g.sum[:0], n)[:n]
	}
	if err := g.wait(); err != nil {
		return fmt.Errorf("collective: all_reduce: %w", err)
	}
	per := (n + g.n - 1) / g.n
	lo, hi := min(c.rank*per, n), min((c.rank+1)*per, n)
	for i := lo; i < hi; i++ {
		s := g.posted[0].vals[i]
		for r := 1; r < g.n; r++ {
			s += g.posted[r].vals[i]
		}
		g.sum[i] = s
	}
	if err := g.wait(); err != nil {
		return fmt.Errorf("collective: all_reduce: %w", err)
	}
	werr := c.write(t, g.sum)
	// Nobody may overwrite the sum or the posts before every rank is done
	// with them.
	if err := g.wait(); err != nil {
		return fmt.Errorf("collective: all_reduce: %w", err)
	}
	if werr != nil {
		return fmt.Errorf("collective: all_reduce: %w", werr)
	}
	return nil
}

// AllGather implements backend.Communicator.
func (c *Comm) AllGather(out, x backend.Tensor, widths []int) error {
	g := c.g
	p := post{err: backend.CheckAllGather(out, x, widths, c.rank)}
	if p.err == nil && len(widths) != g.n {
		p.err = backend.ShapeError("all_gather", "widths", "%d widths for %d ranks", len(widths), g.n)
	}
	if p.err == nil {
		p.shape, p.dt = out.Shape(), out.DType()
		p.vals, p.err = c.read(x)
	}
	if err := c.exchange("all_gather", p); err != nil {
		return err
	}
	rows, total := p.shape[0], p.shape[1]
	c.full = slices.Grow(c.full[:0], rows*total)[:rows*total]
	full := c.full
	col := 0
	for r := range g.n {
		w, src := widths[r], g.posted[r].vals
		for i := range rows {
			copy(full[i*total+col:i*total+col+w], src[i*w:(i+1)*w])
		}
		col += w
	}
	if err := g.wait(); err != nil {
		return fmt.Errorf("collective: all_gather: %w", err)
	}
	if err := c.write(out, full); err != nil {
		return fmt.Errorf("collective: all_gather: %w", err)
	}
	return nil
}

// read returns t's values as f32 (c.vals, reused: each rank posts its own
// buffer, which no rank reads after the collective's last barrier).
func (c *Comm) read(t backend.Tensor) ([]float32, error) {
	size, err := t.DType().Bytes(t.Shape())
	if err != nil {
		return nil, err
	}
	c.raw = slices.Grow(c.raw[:0], size)[:size]
	if err := c.b.Read(t, c.raw); err != nil {
		return nil, err
	}
	le := binary.LittleEndian
	switch t.DType() {
	case backend.F32:
		n := size / 4
		c.vals = slices.Grow(c.vals[:0], n)[:n]
		for i := range c.vals {
			c.vals[i] = math.Float32frombits(le.Uint32(c.raw[4*i:]))
		}
	case backend.BF16:
		n := size / 2
		c.vals = slices.Grow(c.vals[:0], n)[:n]
		for i := range c.vals {
			c.vals[i] = backend.BF16ToF32(le.Uint16(c.raw[2*i:]))
		}
	default:
		return nil, fmt.Errorf("dtype %v", t.DType())
	}
	return c.vals, nil
}

// write stores vals into t in t's dtype.
func (c *Comm) write(t backend.Tensor, vals []float32) error {
	le := binary.LittleEndian
	var raw []byte
	switch t.DType() {
	case backend.F32:
		raw = slices.Grow(c.raw[:0], 4*len(vals))[:4*len(vals)]
		for i, v := range vals {
			le.PutUint32(raw[4*i:], math.Float32bits(v))
		}
	case backend.BF16:
		raw = slices.Grow(c.raw[:0], 2*len(vals))[:2*len(vals)]
		for i, v := range vals {
			le.PutUint16(raw[2*i:], backend.F32ToBF16(v))
		}
	default:
		return fmt.Errorf("dtype %v", t.DType())
	}
	c.raw = raw
	return c.b.Write(t, raw)
}
