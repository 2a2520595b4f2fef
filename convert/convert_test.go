package convert_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/convert"
	"github.com/trigon-llm/trigon/engine"
	"github.com/trigon-llm/trigon/format/gguf"
	"github.com/trigon-llm/trigon/model"
	"github.com/trigon-llm/trigon/tokenizer"
)

const fixture = "../testdata/models/qwen3"

// TestConvertTypes converts a fixture to every target type and reads the
// file back: same config, 1-D tensors in F32, matrices in the target type
// (F16 where a quantized type's 32-element blocks do not divide the row),
// the tokenizer intact, and F32 weights byte-identical through an F32 file.
func TestConvertTypes(t *testing.T) {
	tok, err := engine.LoadTokenizer(fixture)
	if err != nil {
		t.Fatal(err)
	}
	srcCfg, _, src, err := model.OpenWeights(fixture)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	for _, name := range []string{"f32", "f16", "bf16", "q8_0", "q4_0"} {
		t.Run(name, func(t *testing.T) {
			dt, err := convert.ParseType(name)
			if err != nil {
				t.Fatal(err)
			}
			dst := filepath.Join(t.TempDir(), "m.gguf")
			rep, err := convert.File(fixture, dst, tok, convert.Options{Type: dt})
			if err != nil {
				t.Fatal(err)
			}
			if st, err := os.Stat(dst); err != nil || st.Mode().Perm() != 0o644 {
				t.Errorf("output file: %v, mode %v", err, st.Mode())
			}
			cfg, _, w, err := model.OpenWeights(dst)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			if cfg.Hidden != srcCfg.Hidden || cfg.NumLayers != srcCfg.NumLayers || cfg.Llama.QKNorm != srcCfg.Llama.QKNorm || cfg.HeadDim != srcCfg.HeadDim {
				t.Errorf("config changed: %+v vs %+v", cfg, srcCfg)
			}
			if rep.Tensors != len(w.Names()) {
				t.Errorf("report says %d tensors, file has %d", rep.Tensors, len(w.Names()))
			}
			fallback := map[string]bool{}
			for _, n := range rep.Fallback {
				fallback[n] = true
			}
			for _, n := range src.Names() {
				sw, _ := src.Tensor(n)
				gw, ok := w.Tensor(n)
				if !ok {
					t.Fatalf("%s missing after conversion", n)
				}
				want := dt
				switch {
				case len(sw.Shape) == 1:
					want = backend.F32
				case fallback[n]:
					want = backend.F16
				}
				if gw.DType != want {
					t.Errorf("%s: %v, want %v", n, gw.DType, want)
				}
				if dt == backend.F32 && sw.DType == backend.F32 && string(gw.Data) != string(sw.Data) {
					t.Errorf("%s: F32 bytes changed through an F32 file", n)
				}
			}
			gtok, err := engine.LoadTokenizer(dst)
			if err != nil {
				t.Fatal(err)
			}
			text := "Hello, world! 你好 <|im_start|>user\n12345"
			a, _ := tok.Encode(text, false)
			b, _ := gtok.Encode(text, false)
			if len(a) != len(b) {
				t.Errorf("tokenizer changed: %v vs %v", a, b)
			}
			for i := range a {
				if a[i] != b[i] {
					t.Errorf("tokenizer changed: %v vs %v", a, b)
					break
				}
			}
		})
	}
}

// TestConvertRefusesUnnamedPreTokenizer: a byte-level tokenizer whose split
// pattern has no GGUF name cannot be written, since the file would
// tokenize differently.
func TestConvertRefusesUnnamedPreTokenizer(t *testing.T) {
	// The default model's tokenizer has a Split pre-tokenizer ("trigon-go").
	raw, err := os.ReadFile("../models/default/hf/tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	named, err := tokenizer.FromHFJSON(raw, nil)
	if err != nil || named.Spec().Pre != "trigon-go" {
		t.Fatalf("unchanged tokenizer: pre %q, %v", named.Spec().Pre, err)
	}
	// Swap its split pattern for one llama.cpp has no name for.
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	split := doc["pre_tokenizer"].(map[string]any)["pretokenizers"].([]any)[0].(map[string]any)
	split["pattern"] = map[string]any{"Regex": `\p{L}+|\s+|[^\s\p{L}]+`}
	edited, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.FromHFJSON(edited, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg, _, w, err := model.OpenWeights(fixture)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	var sink strings.Builder
	if _, err := convert.Write(&sink, cfg, w, tok, convert.Options{Type: backend.F16}); err == nil || !strings.Contains(err.Error(), "pre-tokenizer") {
		t.Errorf("unnamed pre-tokenizer: %v, want a refusal", err)
	}
}

// TestConvertTensorCountAndLlamaCpp: TensorCount agrees with what Write
// reports and with the tensors in the file (rope_freqs.weight included for
// Llama 3.1 scaling, also when the source is itself a GGUF file), and the
// report says whether llama.cpp will load the file.
func TestConvertTensorCountAndLlamaCpp(t *testing.T) {
	dir := t.TempDir()
	fromGGUF := filepath.Join(dir, "llama3.gguf")
	cases := []struct {
		name, src, dst string
		ropeFreqs      bool
		notLlamaCpp    bool
	}{
		{"llama3 scaling", "../testdata/models/llama3", fromGGUF, true, false},
		{"llama3 scaling from GGUF", fromGGUF, filepath.Join(dir, "again.gguf"), true, false}, // needs the case above
		{"plain rope", "../testdata/models/qwen2", filepath.Join(dir, "qwen2.gguf"), false, false},
		{"default model", "../models/default/hf", filepath.Join(dir, "default.gguf"), false, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tok, err := engine.LoadTokenizer(c.src)
			if err != nil {
				t.Fatal(err)
			}
			cfg, _, src, err := model.OpenWeights(c.src)
			if err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			want, err := convert.TensorCount(cfg, src)
			if err != nil {
				t.Fatal(err)
			}
			rep, err := convert.File(c.src, c.dst, tok, convert.Options{Type: backend.F16})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Tensors != want {
				t.Errorf("Write reports %d tensors, TensorCount %d", rep.Tensors, want)
			}
			f, err := gguf.Open(c.dst)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if len(f.Tensors) != want {
				t.Errorf("file has %d tensors, TensorCount %d", len(f.Tensors), want)
			}
			if _, ok := f.Tensor("rope_freqs.weight"); ok != c.ropeFreqs {
				t.Errorf("rope_freqs.weight present %v, want %v", ok, c.ropeFreqs)
			}
			if (rep.NotLlamaCpp != "") != c.notLlamaCpp {
				t.Errorf("NotLlamaCpp = %q, want set %v", rep.NotLlamaCpp, c.notLlamaCpp)
			}
		})
	}
}

// TestConvertOutputPath: an OUT that is a directory, lies in a directory
// that does not exist, or is a file of the HF source directory (its
// weights, config or tokenizer, which the rename would replace) is
// refused before any tensor is written, with an error naming OUT; the
// source is left as it was and no temporary file stays behind.
func TestConvertOutputPath(t *testing.T) {
	src := t.TempDir()
	for _, name := range []string{"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"} {
		data, err := os.ReadFile(filepath.Join(fixture, name))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tok, err := engine.LoadTokenizer(src)
	if err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(filepath.Join(src, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	outDir := t.TempDir()
	for _, c := range []struct {
		name, dst, msg string
	}{
		{"a directory", outDir, "is a directory"},
		{"a missing directory", filepath.Join(outDir, "no", "m.gguf"), "does not exist"},
		{"the source's weights", filepath.Join(src, "model.safetensors"), "would replace a file of the source"},
		{"the source's config", filepath.Join(src, "config.json"), "would replace a file of the source"},
		{"the source directory itself", src, "is a directory"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := convert.File(src, c.dst, tok, convert.Options{Type: backend.F16})
			if err == nil || !strings.Contains(err.Error(), c.msg) || !strings.Contains(err.Error(), c.dst) {
				t.Fatalf("convert to %s: %v, want an error naming it and saying %q", c.dst, err, c.msg)
			}
		})
	}
	after, err := os.ReadFile(filepath.Join(src, "model.safetensors"))
	if err != nil || !bytes.Equal(before, after) {
		t.Errorf("the source's weights changed (%v)", err)
	}
	for _, dir := range []string{src, outDir} {
		left, _ := filepath.Glob(filepath.Join(dir, ".convert-*"))
		if len(left) > 0 {
			t.Errorf("temporary files left behind: %v", left)
		}
	}
	// A new GGUF file inside the source directory is fine.
	if _, err := convert.File(src, filepath.Join(src, "m.gguf"), tok, convert.Options{Type: backend.F16}); err != nil {
		t.Errorf("convert into the source directory: %v", err)
	}
}

// TestConvertPreTokenizer: Options.Pre is written as tokenizer.ggml.pre and
// reads back as that name's split; the report says when the split is not
// the tokenizer's own (the default model's trigon-go read as llama-bpe)
// and whether llama.cpp loads the result; a name trigon does not read, or
// a name for a tokenizer that has none, is refused before any tensor is
// written.
func TestConvertPreTokenizer(t *testing.T) {
	defaultTok, err := engine.LoadTokenizer("../models/default/hf")
	if err != nil {
		t.Fatal(err)
	}
	fixtureTok, err := engine.LoadTokenizer(fixture) // gpt-2's split
	if err != nil {
		t.Fatal(err)
	}
	// The fixture's weights carry every tokenizer here: the test reads
	// the file's tokenizer only.
	cfg, _, w, err := model.OpenWeights(fixture)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for _, c := range []struct {
		name     string
		tok      *tokenizer.Tokenizer
		pre      string
		written  string // tokenizer.ggml.pre in the file
		readAs   string // the split trigon reads it as
		differs  bool
		llamaCpp bool
		err      string
	}{
		{"own name", defaultTok, "", "trigon-go", "trigon-go", false, false, ""},
		{"own name given", defaultTok, "trigon-go", "trigon-go", "trigon-go", false, false, ""},
		{"llama-bpe for llama.cpp", defaultTok, "llama-bpe", "llama-bpe", "llama-bpe", true, true, ""},
		{"an alias", defaultTok, "llama3", "llama3", "llama-bpe", true, true, ""},
		{"same split, another name", fixtureTok, "gpt2", "gpt2", "gpt-2", false, false, ""},
		{"another split", fixtureTok, "qwen2", "qwen2", "qwen2", true, true, ""},
		{"unknown", defaultTok, "llama-bpe2", "", "", false, false, `"llama-bpe2" is not one trigon knows`},
	} {
		t.Run(c.name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "out.gguf")
			f, err := os.Create(dst)
			if err != nil {
				t.Fatal(err)
			}
			rep, err := convert.Write(f, cfg, w, c.tok, convert.Options{Type: backend.F16, Pre: c.pre})
			f.Close()
			if c.err != "" {
				st, _ := os.Stat(dst)
				if err == nil || !strings.Contains(err.Error(), c.err) || st.Size() != 0 {
					t.Fatalf("%v (%d bytes written), want an error containing %q before any byte", err, st.Size(), c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (rep.PreDiffers != "") != c.differs || (rep.NotLlamaCpp == "") != c.llamaCpp {
				t.Errorf("PreDiffers %q, NotLlamaCpp %q; want differs %v, llama.cpp loads %v", rep.PreDiffers, rep.NotLlamaCpp, c.differs, c.llamaCpp)
			}
			g, err := gguf.Open(dst)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			if got, _ := g.String("tokenizer.ggml.pre"); got != c.written {
				t.Errorf("tokenizer.ggml.pre %q, want %q", got, c.written)
			}
			back, err := engine.LoadTokenizer(dst)
			if err != nil {
				t.Fatal(err)
			}
			if got := back.Spec().Pre; got != c.readAs {
				t.Errorf("reads back as %q, want %q", got, c.readAs)
			}
		})
	}
	// A SentencePiece ("llama") tokenizer has no pre-tokenizer name.
	sp, err := tokenizer.FromSpec(tokenizer.Spec{Model: "llama", Tokens: []string{"<unk>", "▁a", "b"}, Scores: []float32{0, -1, -2},
		BOS: -1, EOS: -1, UNK: 0, PAD: -1})
	if err != nil {
		t.Fatal(err)
	}
	var sink bytes.Buffer
	if _, err := convert.Write(&sink, cfg, w, sp, convert.Options{Type: backend.F16, Pre: "llama-bpe"}); err == nil || !strings.Contains(err.Error(), "no pre-tokenizer name") || sink.Len() != 0 {
		t.Errorf("SentencePiece with a pre-tokenizer name: %v (%d bytes), want a refusal", err, sink.Len())
	}
}
