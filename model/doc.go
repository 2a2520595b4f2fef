// Package model describes the models trigon runs, independent of any device:
// the architecture Config (from a Hugging Face config.json or GGUF metadata),
// the generation defaults a checkpoint ships, the weights behind one Weights
// interface with Hugging Face tensor names, and the DeviceBatch of one engine
// step.
//
// Checkpoint quirks are fixed here, at load time, so that forward passes
// (model/llama) never see them: GGUF tensor names are mapped to HF names,
// GGUF dims are reversed to outermost-first, llama.cpp's Q/K row permutation
// is undone, and every weight's name, dtype and shape is checked against the
// Config before a byte of it is used.
//
// Typical use:
//
//	cfg, gen, w, err := model.OpenWeights("/models/Llama-3.2-1B") // or a .gguf file
//	if err != nil { ... }
//	defer w.Close()
//	m, err := arch.New(b, cfg, w, model.Options{MaxTokens: 8192})
//
// Nothing in this package runs code from a model directory: configs that
// need custom modelling code (auto_map) are refused.
package model
