package engine_test

import (
	"testing"

	"github.com/trigon-llm/trigon/engine"
	"github.com/trigon-llm/trigon/model"
	"github.com/trigon-llm/trigon/sample"
)

func TestDefaultParams(t *testing.T) {
	for _, c := range []struct {
		name    string
		json    string
		want    sample.Params
		invalid bool
	}{
		{
			name: "Qwen3 style",
			json: `{"bos_token_id": 151643, "do_sample": true, "eos_token_id": [151645, 151643],
				"pad_token_id": 151643, "temperature": 0.6, "top_k": 20, "top_p": 0.95}`,
			want: sample.Params{Temperature: 0.6, TopP: 0.95, TopK: 20, RepetitionPenalty: 1},
		},
		{
			name: "penalty and min_p",
			json: `{"repetition_penalty": 1.05, "min_p": 0.1}`,
			want: sample.Params{Temperature: 1, TopP: 1, MinP: 0.1, RepetitionPenalty: 1.05},
		},
		{
			name: "do_sample false is greedy (HF semantics)",
			json: `{"do_sample": false, "temperature": 0.7}`,
			want: sample.Params{Temperature: 0, TopP: 1, RepetitionPenalty: 1},
		},
		{name: "nothing", json: `{}`, want: sample.Neutral()},
		{name: "top_p out of range", json: `{"top_p": 0}`, invalid: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			gc, err := model.ParseGenerationConfig([]byte(c.json))
			if err != nil {
				if c.invalid {
					return // refused by the parser: fine too
				}
				t.Fatal(err)
			}
			got := engine.DefaultParams(gc)
			if c.invalid {
				if got.Validate() == nil {
					t.Fatalf("params %+v from %s validate", got, c.json)
				}
				return
			}
			if got.Temperature != c.want.Temperature || got.TopP != c.want.TopP || got.TopK != c.want.TopK ||
				got.MinP != c.want.MinP || got.RepetitionPenalty != c.want.RepetitionPenalty {
				t.Errorf("DefaultParams = %+v, want %+v", got, c.want)
			}
		})
	}
}
