package arch

import (
	"fmt"
	"sync"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/model"
)

// NewSharded loads cfg split over the ranks of a tensor-parallel group
// (model.PlanShards): rank r's shard on bs[r], meeting the others through
// comms[r]; the ranks load concurrently. One backend loads the whole
// model (comms unused). opts' Shard and Comm are set per rank. On error
// nothing stays loaded.
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
	// The ranks load at once, each on its own backend: the weights are
	// read-only, and a rank's upload does not wait for another's.
	ms := make([]model.Model, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r, s := range shards {
		o := opts
		if n > 1 {
			o.Shard, o.Comm = s, comms[r]
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ms[r], errs[r] = New(bs[r], cfg, w, o)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err == nil {
			continue
		}
		for _, m := range ms {
			if m != nil {
				m.Close()
			}
		}
		if n > 1 {
			err = fmt.Errorf("rank %d: %w", r, err)
		}
		return nil, nil, err
	}
	return ms, shards, nil
}
