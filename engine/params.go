package engine

import (
	"github.com/trigon-llm/trigon/model"
	"github.com/trigon-llm/trigon/sample"
)

// DefaultParams are the sampling parameters a request starts from: neutral
// sampling (temperature 1, no filters or penalties) with the checkpoint's
// generation_config.json laid over it. do_sample=false there means greedy.
func DefaultParams(g model.GenerationConfig) sample.Params {
	p := sample.Neutral()
	if g.Temperature != nil {
		p.Temperature = *g.Temperature
	}
	if g.TopP != nil {
		p.TopP = *g.TopP
	}
	if g.TopK != nil {
		p.TopK = *g.TopK
	}
	if g.MinP != nil {
		p.MinP = *g.MinP
	}
	if g.RepetitionPenalty != nil {
		p.RepetitionPenalty = *g.RepetitionPenalty
	}
	if g.DoSample != nil && !*g.DoSample {
		p.Temperature = 0
	}
	return p
}
