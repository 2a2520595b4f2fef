package tokenizer

import (
	"fmt"
	"slices"
	"strings"
)

// bytePre is a byte-level BPE pre-tokenizer that has a GGUF name
// (tokenizer.ggml.pre): the split regex and what else the name implies.
// The names are llama.cpp's wherever llama.cpp has one that means the same
// regex and merge rule, since a GGUF file is only loadable there under a
// name it knows.
type bytePre struct {
	name string // what Spec.Pre says and convert writes
	// aliases are llama.cpp's other names for the same pre-tokenizer.
	aliases []string
	// readOnly are names trigon also reads as this one that llama.cpp
	// does not know or reads as another split: "gpt2" is unknown to it,
	// and its "default" (or no key) is a split of its own, not GPT-2's.
	readOnly []string
	pattern  string
	// ignoreMerges: a word that is itself in the vocabulary is one token,
	// before any merge (HF's ignore_merges, llama.cpp's per-name flag).
	ignoreMerges bool
	// nfc: NFC normalization first, as HF's Qwen2 tokenizer does. llama.cpp
	// does not normalize; it still names this split "qwen2", so the two
	// agree on NFC text only.
	nfc bool
	// llamaCpp says llama.cpp knows name; false for trigon's own.
	llamaCpp bool
}

// bytePres returns every byte-level pre-tokenizer a GGUF file can name.
// The first entry is the plain GPT-2 byte-level regex, the reading of an
// absent key.
func bytePres() []bytePre {
	return []bytePre{
		{name: "gpt-2", readOnly: []string{"gpt2", "default", ""}, pattern: gpt2Pattern, llamaCpp: true},
		// llama.cpp's LLAMA3 type: the Llama 3 regex with ignore_merges.
		{name: "llama-bpe", aliases: []string{"llama3", "llama-v3"}, pattern: llama3Pattern, ignoreMerges: true, llamaCpp: true},
		// The same regex without ignore_merges is llama.cpp's SMAUG (and
		// DBRX) type.
		{name: "smaug-bpe", aliases: []string{"dbrx"}, pattern: llama3Pattern, llamaCpp: true},
		{name: "qwen2", pattern: qwen2Pattern, nfc: true, llamaCpp: true},
		// The embedded default model's split. llama.cpp has no type with
		// the Llama 3 regex minus its contractions (a piece-initial
		// "'string" is "'string" here, "'s" "tring" under llama-bpe), so the name stays trigon's.
		{name: "trigon-go", pattern: trigonGoPattern},
	}
}

// lookupBytePre finds the pre-tokenizer a tokenizer.ggml.pre value names.
func lookupBytePre(name string) (bytePre, bool) {
	for _, p := range bytePres() {
		if p.name == name {
			return p, true
		}
		if slices.Contains(p.aliases, name) || slices.Contains(p.readOnly, name) {
			return p, true
		}
	}
	return bytePre{}, false
}

// SamePreSplit reports whether the tokenizer.ggml.pre values a and b of a
// byte-level BPE ("gpt2") tokenizer select the same pre-tokenizer: one
// split regex, whole-word lookup and normalization, as a name and its
// aliases (and trigon's readings of "gpt2", "default" and no key as
// "gpt-2") do. A value trigon does not read is an error naming it.
func SamePreSplit(a, b string) (bool, error) {
	pa, ok := lookupBytePre(a)
	if !ok {
		return false, fmt.Errorf("pre-tokenizer %q is not one trigon knows (known: %s)", a, strings.Join(PreNames(), ", "))
	}
	pb, ok := lookupBytePre(b)
	if !ok {
		return false, fmt.Errorf("pre-tokenizer %q is not one trigon knows (known: %s)", b, strings.Join(PreNames(), ", "))
	}
	// Each entry of bytePres is a distinct split.
	return pa.name == pb.name, nil
}

// PreNames lists the tokenizer.ggml.pre names of byte-level BPE that trigon
// reads, each entry's own name first, then its aliases.
func PreNames() []string {
	var names []string
	for _, p := range bytePres() {
		names = append(names, p.name)
		names = append(names, p.aliases...)
	}
	return names
}

// LlamaCppLoads reports whether llama.cpp accepts s's tokenizer.ggml.model
// and tokenizer.ggml.pre, with an error saying why not. llama.cpp reads the
// pre-tokenizer name of byte-level BPE ("gpt2") only and refuses a name it
// does not know.
func (s Spec) LlamaCppLoads() error {
	switch s.Model {
	case "llama":
		return nil
	case "gpt2":
		p, ok := lookupBytePre(s.Pre)
		if !ok {
			return fmt.Errorf("pre-tokenizer %q is not one trigon or llama.cpp knows", s.Pre)
		}
		if !p.llamaCpp {
			return fmt.Errorf("llama.cpp has no pre-tokenizer that splits like trigon's %q and refuses a tokenizer.ggml.pre it does not know", s.Pre)
		}
		if slices.Contains(p.readOnly, s.Pre) {
			return fmt.Errorf("llama.cpp does not read the pre-tokenizer name %q as trigon does (its name for this split is %q)", s.Pre, p.name)
		}
		return nil
	}
	return fmt.Errorf("tokenizer model %q is not one llama.cpp loads", s.Model)
}
