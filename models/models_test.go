package models_test

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/cpu"
	"github.com/trigon-llm/trigon/convert"
	"github.com/trigon-llm/trigon/engine"
	"github.com/trigon-llm/trigon/eval"
	"github.com/trigon-llm/trigon/models"
	"github.com/trigon-llm/trigon/runner"
)

const hfDir = "default/hf"

func defaultGGUF(t *testing.T) string {
	t.Helper()
	p, err := models.DefaultPath()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// heldout returns the held-out text and the ids the training script's
// tokenizer (HF tokenizers) gave it.
func heldout(t *testing.T) (string, []int32) {
	t.Helper()
	text, err := os.ReadFile("default/heldout.go.txt")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile("default/heldout.ids.txt")
	if err != nil {
		t.Fatal(err)
	}
	var ids []int32
	for _, f := range strings.Fields(string(raw)) {
		v, err := strconv.Atoi(strings.Trim(f, "[],"))
		if err != nil {
			t.Fatalf("heldout.ids.txt: %v", err)
		}
		ids = append(ids, int32(v))
	}
	return string(text), ids
}

// TestTokenizerFormatsAgree: the HF directory's tokenizer and the one the
// embedded GGUF carries both give exactly the training script's ids.
func TestTokenizerFormatsAgree(t *testing.T) {
	text, want := heldout(t)
	for name, path := range map[string]string{"hf": hfDir, "gguf": defaultGGUF(t)} {
		tok, err := engine.LoadTokenizer(path)
		if err != nil {
			t.Fatal(err)
		}
		got, err := tok.Encode(text, false)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Errorf("%s: %d ids, training tokenizer %d", name, len(got), len(want))
			continue
		}
		for i := range got {
			if got[i] != want[i] {
				t.Errorf("%s: id %d is %d, training tokenizer %d", name, i, got[i], want[i])
				break
			}
		}
	}
}

// lastLogits runs ids through the model at path on the CPU.
func lastLogits(t *testing.T, path string, ids []int32) []float32 {
	t.Helper()
	b := cpu.New(cpu.Options{})
	l, err := engine.Load(engine.LoadOptions{Model: path, Backend: b, MaxSeqs: 1, KVBlocks: 80})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	out, err := engine.RunnerOf(l).Execute(&runner.Step{Seqs: []runner.Seq{{Tokens: ids, BlockTable: seqTable(len(ids)), WantLogits: true}}})
	if err != nil {
		t.Fatal(err)
	}
	lg, err := out.Logits(0)
	if err != nil {
		t.Fatal(err)
	}
	return append([]float32(nil), lg...)
}

func seqTable(n int) []int32 {
	t := make([]int32, (n+15)/16)
	for i := range t {
		t[i] = int32(i + 1)
	}
	return t
}

func relErr(got, want []float32) float64 {
	var d, m float64
	for i := range want {
		d = math.Max(d, math.Abs(float64(got[i]-want[i])))
		m = math.Max(m, math.Abs(float64(want[i])))
	}
	return d / m
}

// TestFormatsGiveSameLogits: the shipped HF directory and GGUF files of it
// give the same logits: exactly for a BF16 GGUF (same weights), within
// Q8_0 quantization error for the embedded Q8_0 file.
func TestFormatsGiveSameLogits(t *testing.T) {
	_, ids := heldout(t)
	ids = ids[:300]
	ref := lastLogits(t, hfDir, ids)

	tok, err := engine.LoadTokenizer(hfDir)
	if err != nil {
		t.Fatal(err)
	}
	bf16 := filepath.Join(t.TempDir(), "bf16.gguf")
	if _, err := convert.File(hfDir, bf16, tok, convert.Options{Type: backend.BF16}); err != nil {
		t.Fatal(err)
	}
	if e := relErr(lastLogits(t, bf16, ids), ref); e != 0 {
		t.Errorf("BF16 GGUF vs HF: relative error %.3g, want 0 (same weights, same arithmetic)", e)
	}
	q8 := lastLogits(t, defaultGGUF(t), ids)
	e := relErr(q8, ref)
	t.Logf("embedded Q8_0 GGUF vs HF bf16: relative logits error %.3g", e)
	if e > 3e-2 {
		t.Errorf("embedded Q8_0 GGUF vs HF: relative error %.3g > 3e-2", e)
	}
}

// TestPerplexityMatchesTraining: trigon's perplexity of the first held-out
// window matches the training script's figure for that window to 1%
// (models/default/perplexity.json; the whole file is `trigon eval
// perplexity`, too slow for every CI run).
func TestPerplexityMatchesTraining(t *testing.T) {
	raw, err := os.ReadFile("default/perplexity.json")
	if err != nil {
		t.Fatal(err)
	}
	var ref struct {
		Window    int       `json:"window"`
		WindowNLL []float64 `json:"window_nll"`
	}
	if err := json.Unmarshal(raw, &ref); err != nil {
		t.Fatal(err)
	}
	_, ids := heldout(t)
	res, err := eval.Perplexity(cpu.New(cpu.Options{}), hfDir, ids[:ref.Window], eval.Options{Window: ref.Window})
	if err != nil {
		t.Fatal(err)
	}
	want := math.Exp(ref.WindowNLL[0])
	t.Logf("first window: trigon ppl %.4f, training script %.4f", res.PPL, want)
	if math.Abs(res.PPL-want)/want > 0.01 {
		t.Errorf("first window perplexity %.4f, training script %.4f: more than 1%% apart", res.PPL, want)
	}
}
