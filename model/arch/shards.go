package arch

import (
	"fmt"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/model"
)

// NewSharded loads cfg split over the ranks of a tensor-parallel group
// (model.PlanShards): rank r's shard on bs[r], meeting the others through
// comms[r]. One backend loads the whole model (comms unused). opts'
// Shard and Comm are set per rank. On error nothing stays loaded.
func NewSharded(bs []backend.Backend, comms []backend.Communicator, cfg model.Config, w model.Weights, opts model.Options) ([]model.Model, []model.Shard, error) {
	n := len(bs)
	if n == 0 || n > 1 && len(comms) != n {
		return nil, nil, fmt.Errorf("tensor parallelism over %d backends and %d communicators: want one of each per rank", n, len(comms))
	}
	for r, c := range comms {
		if n > 1 && (c == nil || c.Rank() != r || c.Size() != n) {
			return nil, nil, fmt.Errorf("tensor parallelism: rank %d's communicator is not rank %d of %d", r, r, n)
		}
	}
	shards, err := model.PlanShards(cfg, w, n)
	if err != nil {
		return nil, nil, err
	}
	var ms []model.Model
	for r, s := range shards {
		o := opts
		if n > 1 {
			o.Shard, o.Comm = s, comms[r]
		}
		m, err := New(bs[r], cfg, w, o)
		if err != nil {
			for _, m := range ms {
				m.Close()
			}
			if n > 1 {
				err = fmt.Errorf("rank %d: %w", r, err)
			}
			return nil, nil, err
		}
		ms = append(ms, m)
	}
	return ms, shards, nil
}
