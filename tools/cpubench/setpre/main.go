// Command setpre copies a GGUF file with its tokenizer.ggml.pre value
// replaced by another of the same length, for peers that refuse a
// pre-tokenizer name they do not know (llama.cpp and trigon's "trigon-go"):
// the measurement in docs/benchmarks.md ("CPU backend: vector kernels")
// gives llama.cpp a copy whose value is "llama-bpe". Equal lengths keep
// every offset of the file, so the tensor data is copied unchanged.
package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
)

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: setpre IN.gguf OUT.gguf NEW-PRE")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2], os.Args[3]); err != nil {
		fmt.Fprintln(os.Stderr, "setpre:", err)
		os.Exit(1)
	}
}

func run(in, out, pre string) error {
	data, err := os.ReadFile(in)
	if err != nil {
		return err
	}
	key := []byte("tokenizer.ggml.pre")
	i := bytes.Index(data, key)
	if i < 0 {
		return fmt.Errorf("%s: no tokenizer.ggml.pre key", in)
	}
	// key, then u32 value type 8 (string), u64 length, the bytes.
	at := i + len(key)
	if at+12 > len(data) || binary.LittleEndian.Uint32(data[at:]) != 8 {
		return fmt.Errorf("%s: tokenizer.ggml.pre is not a string", in)
	}
	n := int(binary.LittleEndian.Uint64(data[at+4:]))
	if n != len(pre) || at+12+n > len(data) {
		return fmt.Errorf("%s: tokenizer.ggml.pre has %d bytes, %q has %d: only equal lengths keep the offsets", in, n, pre, len(pre))
	}
	fmt.Printf("%s: tokenizer.ggml.pre %q -> %q\n", out, data[at+12:at+12+n], pre)
	copy(data[at+12:], pre)
	return os.WriteFile(out, data, 0o644)
}
