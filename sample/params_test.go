package sample

import (
	"math"
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	nan := float32(math.NaN())
	base := Neutral()
	for _, c := range []struct {
		name    string
		mutate  func(p *Params)
		wantErr string // "" for valid
	}{
		{"defaults", func(p *Params) {}, ""},
		{"greedy", func(p *Params) { p.Temperature = 0 }, ""},
		{"max temperature", func(p *Params) { p.Temperature = MaxTemperature }, ""},
		{"temperature too high", func(p *Params) { p.Temperature = 2.01 }, "temperature"},
		{"negative temperature", func(p *Params) { p.Temperature = -0.1 }, "temperature"},
		{"NaN temperature", func(p *Params) { p.Temperature = nan }, "temperature"},
		{"top_p 1", func(p *Params) { p.TopP = 1 }, ""},
		{"top_p small", func(p *Params) { p.TopP = 0.01 }, ""},
		{"top_p 0", func(p *Params) { p.TopP = 0 }, "top_p"},
		{"top_p above 1", func(p *Params) { p.TopP = 1.5 }, "top_p"},
		{"min_p 1", func(p *Params) { p.MinP = 1 }, ""},
		{"min_p negative", func(p *Params) { p.MinP = -0.1 }, "min_p"},
		{"min_p NaN", func(p *Params) { p.MinP = nan }, "min_p"},
		{"top_k -1", func(p *Params) { p.TopK = -1 }, ""},
		{"top_k 40", func(p *Params) { p.TopK = 40 }, ""},
		{"top_k -2", func(p *Params) { p.TopK = -2 }, "top_k"},
		{"repetition 0", func(p *Params) { p.RepetitionPenalty = 0 }, "repetition_penalty"},
		{"repetition 1.3", func(p *Params) { p.RepetitionPenalty = 1.3 }, ""},
		{"presence 2", func(p *Params) { p.PresencePenalty = 2 }, ""},
		{"presence 2.5", func(p *Params) { p.PresencePenalty = 2.5 }, "presence_penalty"},
		{"frequency -2", func(p *Params) { p.FrequencyPenalty = -2 }, ""},
		{"frequency -3", func(p *Params) { p.FrequencyPenalty = -3 }, "frequency_penalty"},
		{"min without max", func(p *Params) { p.MinTokens = 6 }, ""},
		{"logprobs 20", func(p *Params) { p.Logprobs = 20 }, ""},
		{"logprobs 21", func(p *Params) { p.Logprobs = 21 }, "logprobs"},
		{"empty stop", func(p *Params) { p.Stop = []string{"a", ""} }, "stop[1]"},
		{"long stop", func(p *Params) { p.Stop = []string{strings.Repeat("x", MaxStopLen+1)} }, "stop[0]"},
		{"too many stops", func(p *Params) { p.Stop = make([]string, MaxStopStrings+1) }, "stop strings"},
		{"negative stop id", func(p *Params) { p.StopTokenIDs = []int32{3, -1} }, "stop_token_ids[1]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := base
			c.mutate(&p)
			err := p.Validate()
			switch {
			case c.wantErr == "" && err != nil:
				t.Errorf("unexpected error %v", err)
			case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
				t.Errorf("error %v, want one about %q", err, c.wantErr)
			}
		})
	}
}
