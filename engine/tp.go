package engine

import (
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

// rankModels holds every rank's model; rank 0's first.
type rankModels []model.Model

// Close frees every rank's model.
func (ms rankModels) Close() {
	for _, m := range ms {
		m.Close()
	}
}

// backends is every rank's backend (b alone without tensor parallelism).
func (tp *TensorParallel) backends(b backend.Backend) []backend.Backend {
	if tp == nil {
		return []backend.Backend{b}
	}
	return tp.Backends
}

func (tp *TensorParallel) comms() []backend.Communicator {
	if tp == nil {
		return nil
	}
	return tp.Comms
}

func (tp *TensorParallel) aborter() runner.Aborter {
	if tp == nil {
		return nil
	}
	return tp.Abort
}

// planShards cuts cfg for opts' ranks, and asks each rank's backend
// whether it runs its shard's attention shape. Its errors are Load's.
func planShards(opts LoadOptions, cfg model.Config, w model.Weights) ([]model.Shard, error) {
	if err := opts.TensorParallel.check(opts.Backend); err != nil {
		return nil, fmt.Errorf("load %s: %w", opts.Model, err)
	}
	bs := opts.TensorParallel.backends(opts.Backend)
	shards, err := model.PlanShards(cfg, w, len(bs))
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", opts.Model, err)
	}
	for r, s := range shards {
		if c, ok := bs[r].(AttentionChecker); ok {
			if err := c.CheckAttention(s.NumHeads, s.NumKVHeads, cfg.HeadDim); err != nil {
				return nil, fmt.Errorf("load %s on %s: %w: %w", opts.Model, bs[r].Name(), ErrUnsupportedModel, err)
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
func loadRanks(opts LoadOptions, cfg model.Config, w model.Weights, mo model.Options) (rankModels, []model.Shard, error) {
	ms, shards, err := arch.NewSharded(opts.TensorParallel.backends(opts.Backend), opts.TensorParallel.comms(), cfg, w, mo)
	return ms, shards, err
}

// newRankRunners makes every rank's runner over its pools and groups them.
func newRankRunners(opts LoadOptions, ms rankModels, shards []model.Shard, ro runner.Options) (*runner.Runner, error) {
	rm := make([]runner.Model, len(ms))
	for i, m := range ms {
		rm[i] = m
	}
	return runner.NewSharded(opts.TensorParallel.backends(opts.Backend), rm, shards, ro, opts.TensorParallel.aborter())
}
