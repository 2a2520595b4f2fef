package kvcache_test

import (
	"errors"
	"fmt"

	"github.com/trigon-llm/trigon/kvcache"
)

// A second request with the same system prompt reuses its cached blocks.
func Example() {
	pool, err := kvcache.NewPool(kvcache.Options{NumBlocks: 9, BlockSize: 4, EnablePrefixCache: true})
	if err != nil {
		panic(err)
	}
	system := []int32{101, 102, 103, 104, 105, 106, 107, 108}

	first := kvcache.NewBlockTable("")
	prompt := append(system, 1, 2)
	m := pool.MatchPrefix(first, prompt)
	if err := pool.AllocatePrefix(first, m, len(prompt)); err != nil {
		panic(err)
	}
	// ... the runner computes the prompt's KV into first.Blocks() ...
	if err := pool.CommitFull(first, prompt); err != nil {
		panic(err)
	}
	pool.Free(first) // finished: its full blocks stay cached

	second := kvcache.NewBlockTable("")
	prompt2 := append(system, 7, 8, 9)
	m = pool.MatchPrefix(second, prompt2)
	fmt.Println("cached tokens:", m.NumTokens, "blocks:", m.Blocks)
	if err := pool.AllocatePrefix(second, m, len(prompt2)); err != nil {
		panic(err)
	}
	fmt.Println("table:", second.Blocks())

	big := kvcache.NewBlockTable("")
	err = pool.Allocate(big, 100)
	fmt.Println("out of blocks:", errors.Is(err, kvcache.ErrNoBlocks))
	// Output:
	// cached tokens: 8 blocks: [1 2]
	// table: [1 2 3]
	// out of blocks: true
}
