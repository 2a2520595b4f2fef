package sample

import (
	"math"
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	nan := float32(math.NaN())
	base := Defaults(GenerationConfig{})
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
		{"negative max_tokens", func(p *Params) { p.MaxTokens = -1 }, "max_tokens"},
		{"min above max", func(p *Params) { p.MaxTokens, p.MinTokens = 5, 6 }, "min_tokens"},
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

func TestGenerationConfig(t *testing.T) {
	for _, c := range []struct {
		name    string
		json    string
		want    Params
		wantErr bool
	}{
		{
			name: "Qwen3 style",
			json: `{"bos_token_id": 151643, "do_sample": true, "eos_token_id": [151645, 151643],
				"pad_token_id": 151643, "temperature": 0.6, "top_k": 20, "top_p": 0.95, "transformers_version": "4.51.0"}`,
			want: Params{Temperature: 0.6, TopP: 0.95, TopK: 20, RepetitionPenalty: 1},
		},
		{
			name: "penalty, min_p and max_new_tokens",
			json: `{"repetition_penalty": 1.05, "min_p": 0.1, "max_new_tokens": 512}`,
			want: Params{Temperature: 1, TopP: 1, MinP: 0.1, RepetitionPenalty: 1.05, MaxTokens: 512},
		},
		{
			name: "greedy model ignores do_sample",
			json: `{"do_sample": false, "temperature": 0.7}`,
			want: Params{Temperature: 0.7, TopP: 1, RepetitionPenalty: 1},
		},
		{name: "nothing", json: `{}`, want: Params{Temperature: 1, TopP: 1, RepetitionPenalty: 1}},
		{name: "top_p out of range", json: `{"top_p": 0}`, wantErr: true},
		{name: "negative max_new_tokens", json: `{"max_new_tokens": -5}`, wantErr: true},
		{name: "not JSON", json: `{"temperature": }`, wantErr: true},
		{name: "wrong type", json: `{"top_k": "20"}`, wantErr: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			gc, err := ParseGenerationConfig([]byte(c.json))
			if c.wantErr {
				if err == nil {
					t.Fatal("no error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := Defaults(gc)
			if got.Temperature != c.want.Temperature || got.TopP != c.want.TopP || got.TopK != c.want.TopK ||
				got.MinP != c.want.MinP || got.RepetitionPenalty != c.want.RepetitionPenalty || got.MaxTokens != c.want.MaxTokens {
				t.Errorf("Defaults = %+v, want %+v", got, c.want)
			}
			if err := got.Validate(); err != nil {
				t.Errorf("defaults do not validate: %v", err)
			}
		})
	}
}
