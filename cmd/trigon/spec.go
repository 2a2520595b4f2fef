package main

import (
	"github.com/spf13/cobra"

	"github.com/trigon-llm/trigon/specdec"
)

// specFlag is --speculative-config: vLLM's JSON, parsed as the flag is
// set, so that a bad config stops the command before anything loads.
type specFlag struct {
	text string
	cfg  specdec.Config
}

func (f *specFlag) String() string { return f.text }
func (f *specFlag) Type() string   { return "json" }

func (f *specFlag) Set(text string) error {
	cfg, err := specdec.ParseConfig(text)
	if err != nil {
		return err
	}
	f.text, f.cfg = text, cfg
	return nil
}

// registerSpecFlag adds --speculative-config with usage for what the
// command does with it.
func registerSpecFlag(cmd *cobra.Command, f *specFlag, what string) {
	cmd.Flags().Var(f, "speculative-config", `speculative decoding, vLLM's JSON: {"method": "ngram", "num_speculative_tokens": 4, `+
		`"prompt_lookup_min": 2, "prompt_lookup_max": 4} (prompt lookup) or {"method": "draft_model", "model": PATH, `+
		`"num_speculative_tokens": 4} (a draft model with the same vocabulary); `+what+"; see docs/speculative.md")
}
