package main

import (
	"fmt"
	"math"
)

// intFlag is a numeric flag's value with the least value it takes.
type intFlag struct {
	name  string // without the dashes
	value int64
	min   int64
	want  string // what the flag takes, for the error
}

// checkInts returns an error naming the first flag below its least
// value, before any model is read.
func checkInts(flags ...intFlag) error {
	for _, f := range flags {
		if f.value < f.min {
			return fmt.Errorf("--%s %d: want %s", f.name, f.value, f.want)
		}
	}
	return nil
}

// check refuses --threads and --gpu values no backend takes.
func (f *deviceFlags) check() error {
	return checkInts(
		intFlag{"threads", int64(f.threads), 0, "a thread count, or 0 for all cores"},
		intFlag{"gpu", int64(f.gpu), 0, "a CUDA device ordinal, 0 or more"},
	)
}

// check refuses model flags out of range, before anything is read: the
// engine takes a zero or negative size as "its default", which a flag
// given explicitly never means, and a GPU share outside (0, 1] as 0.9.
func (f *modelFlags) check() error {
	if err := f.deviceFlags.check(); err != nil {
		return err
	}
	if err := checkInts(
		intFlag{"tensor-parallel-size", int64(f.tp), 1, "at least 1"},
		intFlag{"max-model-len", int64(f.maxContext), 0, "a token count, or 0 for the model's context"},
		intFlag{"max-seqs", int64(f.maxSeqs), 1, "at least 1"},
		intFlag{"max-num-batched-tokens", int64(f.maxTokens), 0, "a token count, or 0 to measure one at load"},
		intFlag{"kv-blocks", int64(f.kvBlocks), 0, "a block count, or 0 to size the cache from --kv-memory"},
		intFlag{"kv-memory", f.kvMemory, 1, "a positive byte count"},
		intFlag{"cuda-graph-memory", f.graphMem, 0, "a byte count, or 0 for no bound"},
	); err != nil {
		return err
	}
	if f.kvBlocks == 1 {
		// Block 0 is the KV manager's null block: one holds no token.
		return fmt.Errorf("--kv-blocks 1: want 0 (sized from --kv-memory) or at least 2 (one block is reserved)")
	}
	if u := f.memUtil; !(u > 0 && u <= 1) || math.IsNaN(u) {
		return fmt.Errorf("--gpu-memory-utilization %g: want a share in (0, 1]", u)
	}
	return nil
}
