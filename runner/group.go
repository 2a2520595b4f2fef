package runner

import (
	"errors"
	"fmt"
	"sync"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/model"
)

// Aborter is the part of a communicator group a runner group needs when a
// rank fails: Abort releases the ranks that wait at a collective for the
// failed one (their collectives then fail), Reset makes the group usable
// again once every rank has returned. backend/collective's Group is one.
type Aborter interface {
	Abort(err error)
	Reset()
}

// NewGroup makes the runners of a tensor-parallel group, rank r's model
// and KV pools on its own backend, act as one: the returned runner (rank
// 0) executes every step, block copy and graph precapture on every rank
// at once, each rank running the same plan over its own pools (the same
// block ids: one KV manager plans for all). Every rank's model computes
// the whole logits (its program gathers them), so sampling needs only
// rank 0; Output.SampleNext samples on every rank, so that each finds
// the fed tokens on its own device.
//
// abort, when non-nil, is told when a rank fails, so that the others are
// not left waiting at a collective; without it a rank must not fail
// alone (its backend reports errors at a later Sync, as the CUDA
// backend's queued ops do). Closing the group's runner closes every rank's.
func NewGroup(ranks []*Runner, abort Aborter) (*Runner, error) {
	if len(ranks) == 0 {
		return nil, errors.New("runner: a group needs at least one rank")
	}
	lead := ranks[0]
	for i, r := range ranks {
		if r == nil || r.peers != nil {
			return nil, fmt.Errorf("runner: group rank %d is nil or a group", i)
		}
		o, l := r.opts, lead.opts
		if o.NumBlocks != l.NumBlocks || o.BlockSize != l.BlockSize || o.MaxTokens != l.MaxTokens ||
			o.MaxSeqs != l.MaxSeqs || o.MaxSeqLen != l.MaxSeqLen || o.NumLayers != l.NumLayers || (r.graphs == nil) != (lead.graphs == nil) {
			return nil, fmt.Errorf("runner: group rank %d's options differ from rank 0's: every rank runs the same plans", i)
		}
	}
	if len(ranks) > 1 {
		lead.peers, lead.abort = ranks[1:], abort
		for _, r := range ranks {
			r.grouped = true
		}
	}
	return lead, nil
}

// Ranks is the number of ranks the runner executes on (1 unless a
// group).
func (r *Runner) Ranks() int { return 1 + len(r.peers) }

// eachRank runs fn on every rank at once (rank 0 on the caller's
// goroutine) and returns the first error in rank order. A failure aborts
// the group's collectives, so the other ranks return too, and resets them
// once all have.
func (r *Runner) eachRank(fn func(rank int, q *Runner) error) error {
	errs := make([]error, len(r.peers)+1)
	var once sync.Once
	fail := func(err error) {
		if r.abort != nil {
			once.Do(func() { r.abort.Abort(err) })
		}
	}
	var wg sync.WaitGroup
	for i, p := range r.peers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if errs[i+1] = fn(i+1, p); errs[i+1] != nil {
				fail(fmt.Errorf("rank %d: %w", i+1, errs[i+1]))
			}
		}()
	}
	if errs[0] = fn(0, r); errs[0] != nil {
		fail(fmt.Errorf("rank 0: %w", errs[0]))
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			if r.abort != nil {
				r.abort.Reset()
			}
			if i == 0 {
				return err
			}
			return fmt.Errorf("runner: rank %d: %w", i, err)
		}
	}
	return nil
}

// executeGroup runs step on every rank; the output is rank 0's, holding
// the others' for SampleNext.
func (r *Runner) executeGroup(step *Step) (*Output, error) {
	outs := make([]*Output, len(r.peers)+1)
	err := r.eachRank(func(i int, q *Runner) error {
		var err error
		outs[i], err = q.execute(step)
		return err
	})
	if err != nil {
		return nil, err
	}
	lead := outs[0]
	for _, o := range outs[1:] {
		if o.Rows != lead.Rows || o.vocab != lead.vocab {
			return nil, fmt.Errorf("runner: group ranks returned %d x %d and %d x %d logits", o.Rows, o.vocab, lead.Rows, lead.vocab)
		}
	}
	lead.peers = outs[1:]
	return lead, nil
}

// sampleNextGroup is SampleNext on every rank of a group: each leaves the
// same ids (the same logits, the same rule) where its next step reads
// them; the wait returns rank 0's once every rank's are read.
func (o *Output) sampleNextGroup(rows []backend.SampleRow) (func() ([]int32, error), error) {
	outs := append([]*Output{o}, o.peers...)
	waits := make([]func() ([]int32, error), len(outs))
	for i, q := range outs {
		single := *q
		single.peers = nil
		w, err := single.SampleNext(rows)
		if err != nil {
			for _, w := range waits[:i] {
				w() // every queued read is waited for once
			}
			return nil, fmt.Errorf("runner: rank %d: %w", i, err)
		}
		waits[i] = w
	}
	return func() ([]int32, error) {
		var ids []int32
		var first error
		for i, w := range waits {
			got, err := w()
			if err != nil && first == nil {
				first = fmt.Errorf("runner: rank %d: %w", i, err)
			}
			if i == 0 {
				ids = got
			}
		}
		return ids, first
	}, nil
}

// NewSharded makes the runners of a tensor-parallel group, rank r's over
// models[r] on bs[r] with the pools of its shard's KV heads (and its
// heads' FP8 scales), and groups them (NewGroup). opts are the whole
// model's; one rank is runner.New.
func NewSharded(bs []backend.Backend, models []Model, shards []model.Shard, opts Options, abort Aborter) (*Runner, error) {
	if len(bs) != len(models) || len(bs) != len(shards) || len(bs) == 0 {
		return nil, fmt.Errorf("runner: %d backends, %d models and %d shards", len(bs), len(models), len(shards))
	}
	if len(bs) == 1 {
		return New(bs[0], models[0], opts)
	}
	var rs []*Runner
	closeAll := func() {
		for _, r := range rs {
			r.Close()
		}
	}
	for i, s := range shards {
		o := opts
		o.NumKVHeads = s.NumKVHeads
		if opts.KVScales != nil {
			o.KVScales = make([]model.KVScales, len(opts.KVScales))
			for l, sc := range opts.KVScales {
				k, errK := perHeadScales("k_scale", sc.K, opts.NumKVHeads)
				v, errV := perHeadScales("v_scale", sc.V, opts.NumKVHeads)
				if err := errors.Join(errK, errV); err != nil {
					closeAll()
					return nil, fmt.Errorf("runner: layer %d: %w", l, err)
				}
				end := s.KVHead + s.NumKVHeads
				if s.KVHead < 0 || end > opts.NumKVHeads {
					closeAll()
					return nil, fmt.Errorf("runner: rank %d holds KV heads [%d, %d) of %d", i, s.KVHead, end, opts.NumKVHeads)
				}
				o.KVScales[l] = model.KVScales{K: k[s.KVHead:end], V: v[s.KVHead:end]}
			}
		}
		r, err := New(bs[i], models[i], o)
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("runner: rank %d: %w", i, err)
		}
		rs = append(rs, r)
	}
	g, err := NewGroup(rs, abort)
	if err != nil {
		closeAll()
		return nil, err
	}
	return g, nil
}

// perHeadScales is a checkpoint's FP8 scales of one layer (model.KVScales:
// one for the layer, as compressed-tensors stores them, or one per KV
// head) as one per each of numKVHeads heads, so that a rank can take its
// heads' part.
func perHeadScales(name string, s []float32, numKVHeads int) ([]float32, error) {
	switch len(s) {
	case numKVHeads:
		return s, nil
	case 1:
		out := make([]float32, numKVHeads)
		for h := range out {
			out[h] = s[0]
		}
		return out, nil
	}
	return nil, fmt.Errorf("%d %s values for %d KV heads, want 1 or %d", len(s), name, numKVHeads, numKVHeads)
}
