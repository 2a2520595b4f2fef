package engine

import (
	"errors"
	"fmt"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/model"
	"github.com/trigon-llm/trigon/model/arch"
	"github.com/trigon-llm/trigon/runner"
)

// TensorParallel splits a model over the ranks of a group (Megatron-style,
// model.PlanShards): rank r holds its shard on Backends[r] and meets the
// other ranks through Comms[r]. One scheduler and one KV manager plan every
// step; every rank executes the plan over its own KV pools.
type TensorParallel struct {
	// Backends are the ranks' backends, Backends[0] being
	// LoadOptions.Backend.
	Backends []backend.Backend
	Comms    []backend.Communicator
	// Abort, when set, releases the ranks that wait for a failed one
	// (runner.NewGroup).
	Abort runner.Aborter
}

// ranks is the number of ranks of tp (1 without tensor parallelism).
func (tp *TensorParallel) ranks() int {
	if tp == nil {
		return 1
	}
	return len(tp.Backends)
}

func (tp *TensorParallel) check(b backend.Backend) error {
	if tp == nil {
		return nil
	}
	n := len(tp.Backends)
	if n == 0 || len(tp.Comms) != n || tp.Backends[0] != b {
		return fmt.Errorf("tensor parallelism over %d backends and %d communicators: want one of each per rank, rank 0's backend the load's", n, len(tp.Comms))
	}
	for r, c := range tp.Comms {
		if c == nil || c.Rank() != r || c.Size() != n {
			return fmt.Errorf("tensor parallelism: rank %d's communicator is not rank %d of %d", r, r, n)
		}
	}
	return nil
}

// backendOf is rank r's backend.
func (tp *TensorParallel) backendOf(b backend.Backend, r int) backend.Backend {
	if tp == nil {
		return b
	}
	return tp.Backends[r]
}

// rankModels holds every rank's model; rank 0's first.
type rankModels []model.Model

// Close frees every rank's model.
func (ms rankModels) Close() {
	for _, m := range ms {
		m.Close()
	}
}

// planShards cuts cfg for opts' ranks, and asks each rank's backend
// whether it runs its shard's attention shape.
func planShards(opts LoadOptions, cfg model.Config, w model.Weights) ([]model.Shard, error) {
	if err := opts.TensorParallel.check(opts.Backend); err != nil {
		return nil, err
	}
	shards, err := model.PlanShards(cfg, w, opts.TensorParallel.ranks())
	if err != nil {
		return nil, err
	}
	for r, s := range shards {
		b := opts.TensorParallel.backendOf(opts.Backend, r)
		if c, ok := b.(AttentionChecker); ok {
			if err := c.CheckAttention(s.NumHeads, s.NumKVHeads, cfg.HeadDim); err != nil {
				return nil, fmt.Errorf("on %s: %w: %w", b.Name(), ErrUnsupportedModel, err)
			}
		}
	}
	return shards, nil
}

// maxKVHeads is the most KV heads any rank's pools hold.
func maxKVHeads(shards []model.Shard) int {
	n := 0
	for _, s := range shards {
		n = max(n, s.NumKVHeads)
	}
	return n
}

// loadRanks loads every rank's shard of the model (the whole model on one
// rank).
func loadRanks(opts LoadOptions, cfg model.Config, w model.Weights, shards []model.Shard, mo model.Options) (rankModels, error) {
	var ms rankModels
	for r, s := range shards {
		o := mo
		if len(shards) > 1 {
			o.Shard, o.Comm = s, opts.TensorParallel.Comms[r]
		}
		m, err := arch.New(opts.TensorParallel.backendOf(opts.Backend, r), cfg, w, o)
		if err != nil {
			ms.Close()
			if len(shards) > 1 {
				err = fmt.Errorf("rank %d: %w", r, err)
			}
			return nil, err
		}
		ms = append(ms, m)
	}
	return ms, nil
}

// newRankRunners makes every rank's runner over its pools (ro, with the
// rank's KV heads and FP8 scales) and groups them.
func newRankRunners(opts LoadOptions, ms rankModels, shards []model.Shard, ro runner.Options) (*runner.Runner, error) {
	if len(ms) == 1 {
		return runner.New(opts.Backend, ms[0], ro)
	}
	var rs []*runner.Runner
	closeAll := func() {
		for _, r := range rs {
			r.Close()
		}
	}
	for i, s := range shards {
		o := ro
		o.NumKVHeads = s.NumKVHeads
		if ro.KVScales != nil {
			o.KVScales = make([]model.KVScales, len(ro.KVScales))
			for l, sc := range ro.KVScales {
				if len(sc.K) < s.KVHead+s.NumKVHeads || len(sc.V) < s.KVHead+s.NumKVHeads {
					closeAll()
					return nil, errors.New("KV scales fewer than the KV heads")
				}
				o.KVScales[l] = model.KVScales{K: sc.K[s.KVHead : s.KVHead+s.NumKVHeads], V: sc.V[s.KVHead : s.KVHead+s.NumKVHeads]}
			}
		}
		r, err := runner.New(opts.TensorParallel.Backends[i], ms[i], o)
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("rank %d: %w", i, err)
		}
		rs = append(rs, r)
	}
	g, err := runner.NewGroup(rs, opts.TensorParallel.Abort)
	if err != nil {
		closeAll()
		return nil, err
	}
	return g, nil
}
