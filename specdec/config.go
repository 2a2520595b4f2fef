package specdec

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Methods of Config.Method.
const (
	MethodNGram      = "ngram"
	MethodDraftModel = "draft_model"
)

// MaxSpeculativeTokens bounds num_speculative_tokens: a verify step carries
// 1+K rows per sequence, and acceptance falls geometrically with K, so
// more than this only costs.
const MaxSpeculativeTokens = 16

// Config is --speculative-config, with vLLM's keys. A zero Config (Method
// "") means speculation is off.
type Config struct {
	// Method is "ngram" (prompt lookup) or "draft_model". vLLM's spellings
	// are accepted by ParseConfig: "[ngram]", and a draft given by Model
	// alone.
	Method string `json:"method"`
	// NumSpeculativeTokens is K, the most tokens proposed per sequence
	// and step.
	NumSpeculativeTokens int `json:"num_speculative_tokens"`
	// PromptLookupMin and PromptLookupMax bound the n-gram that prompt
	// lookup matches (ngram only). vLLM's defaults: both 5 when neither is
	// given, else the one given for the other.
	PromptLookupMin int `json:"prompt_lookup_min"`
	PromptLookupMax int `json:"prompt_lookup_max"`
	// Model is the draft model (draft_model only): an HF directory or a
	// .gguf file whose vocabulary is the target's.
	Model string `json:"model"`
}

// Enabled reports whether the config turns speculation on.
func (c Config) Enabled() bool { return c.Method != "" }

// String is the config as JSON, for logs.
func (c Config) String() string {
	b, _ := json.Marshal(c)
	return string(b)
}

// ParseConfig reads --speculative-config. Empty text is speculation off.
// Unknown keys (vLLM keys trigon has no use for included), a wrong type or
// an invalid combination are errors that name the key.
func ParseConfig(text string) (Config, error) {
	var c Config
	if strings.TrimSpace(text) == "" {
		return c, nil
	}
	// Pointers tell an absent key from a zero one.
	var raw struct {
		Method               *string `json:"method"`
		NumSpeculativeTokens *int    `json:"num_speculative_tokens"`
		PromptLookupMin      *int    `json:"prompt_lookup_min"`
		PromptLookupMax      *int    `json:"prompt_lookup_max"`
		Model                *string `json:"model"`
	}
	dec := json.NewDecoder(bytes.NewReader([]byte(text)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return c, fmt.Errorf("--speculative-config: %w (keys: method, num_speculative_tokens, prompt_lookup_min, prompt_lookup_max, model)", err)
	}
	if dec.More() {
		return c, errors.New("--speculative-config: text after the JSON object")
	}
	if raw.Method != nil {
		c.Method = *raw.Method
	}
	if raw.Model != nil {
		c.Model = *raw.Model
	}
	switch {
	case c.Method == "[ngram]" || c.Method == "" && c.Model == "[ngram]":
		c.Method, c.Model = MethodNGram, ""
	case c.Method == "" && c.Model != "":
		c.Method = MethodDraftModel // vLLM infers a draft model from "model" alone
	case c.Method == "":
		return c, errors.New(`--speculative-config: "method" is required: "ngram" or "draft_model" (or "model" naming a draft)`)
	}
	if raw.NumSpeculativeTokens == nil {
		return c, errors.New(`--speculative-config: "num_speculative_tokens" is required`)
	}
	c.NumSpeculativeTokens = *raw.NumSpeculativeTokens
	if raw.PromptLookupMin != nil {
		c.PromptLookupMin = *raw.PromptLookupMin
	}
	if raw.PromptLookupMax != nil {
		c.PromptLookupMax = *raw.PromptLookupMax
	}
	switch c.Method {
	case MethodNGram:
		if c.Model != "" {
			return c, fmt.Errorf(`--speculative-config: "model" %q with method "ngram": prompt lookup has no draft model`, c.Model)
		}
		switch {
		case raw.PromptLookupMin == nil && raw.PromptLookupMax == nil:
			c.PromptLookupMin, c.PromptLookupMax = 5, 5
		case raw.PromptLookupMin == nil:
			c.PromptLookupMin = c.PromptLookupMax
		case raw.PromptLookupMax == nil:
			c.PromptLookupMax = c.PromptLookupMin
		}
	case MethodDraftModel:
		if c.Model == "" {
			return c, errors.New(`--speculative-config: method "draft_model" needs "model", the draft's path`)
		}
		if raw.PromptLookupMin != nil || raw.PromptLookupMax != nil {
			return c, errors.New(`--speculative-config: "prompt_lookup_min"/"prompt_lookup_max" are for method "ngram"`)
		}
	default:
		return c, fmt.Errorf(`--speculative-config: method %q: trigon has "ngram" and "draft_model"`, c.Method)
	}
	if err := c.Validate(); err != nil {
		return c, err
	}
	return c, nil
}

// Validate checks a config made in code (ParseConfig's are valid).
func (c Config) Validate() error {
	if !c.Enabled() {
		return nil
	}
	if c.NumSpeculativeTokens < 1 || c.NumSpeculativeTokens > MaxSpeculativeTokens {
		return fmt.Errorf("--speculative-config: num_speculative_tokens %d: want 1 to %d", c.NumSpeculativeTokens, MaxSpeculativeTokens)
	}
	switch c.Method {
	case MethodNGram:
		if c.PromptLookupMin < 1 || c.PromptLookupMax < c.PromptLookupMin {
			return fmt.Errorf("--speculative-config: prompt_lookup_min %d, prompt_lookup_max %d: want 1 <= min <= max", c.PromptLookupMin, c.PromptLookupMax)
		}
	case MethodDraftModel:
		if c.Model == "" {
			return errors.New("--speculative-config: draft_model without a model")
		}
	default:
		return fmt.Errorf("--speculative-config: method %q", c.Method)
	}
	return nil
}
