package model

import "github.com/trigon-llm/trigon/backend"

// Model is a loaded model on one backend, whatever its family: what the
// runner, the engine, eval and bench hold. model/arch constructs one for a
// Config; model/llama implements it for the Llama family. A Model is not
// safe for concurrent use: Forward reuses its scratch buffers.
type Model interface {
	// Forward runs one step: every token row of in through every layer,
	// its K and V written into kv (one entry per layer), and returns the
	// logits ([in.NumLogits, vocab] F32) of the rows in.LogitsRows, nil
	// when the step wants none. The logits are the model's memory, valid
	// until the next Forward.
	Forward(in *DeviceBatch, kv []LayerKV) (backend.Tensor, error)
	// Config is the architecture the model was loaded with.
	Config() Config
	// Close frees the model's device memory.
	Close()
}

// Options size a Model's scratch memory; every family takes them.
type Options struct {
	// MaxTokens is the most token rows one Forward may carry (prefill
	// chunks plus decodes).
	MaxTokens int
	// MaxLogits is the most logits rows one Forward may ask for; 0 means
	// min(MaxTokens, 256). The logits buffer is MaxLogits x vocab F32, so
	// runners set it to their largest batch of sequences.
	MaxLogits int
	// Shard is the part of the model to load (PlanShards), Comm the
	// rank's communicator with the ranks holding the other parts; the
	// zero Shard is the whole model, and Comm is then unused.
	Shard Shard
	Comm  backend.Communicator
}
