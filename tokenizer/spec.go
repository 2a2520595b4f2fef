package tokenizer

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/text/unicode/norm"
)

// Token types as GGUF's tokenizer.ggml.token_type stores them.
const (
	TypeNormal      int32 = 1
	TypeUnknown     int32 = 2
	TypeControl     int32 = 3
	TypeUserDefined int32 = 4
	TypeUnused      int32 = 5
	TypeByte        int32 = 6
)

// Spec is a tokenizer in the terms GGUF metadata uses (tokenizer.ggml.*):
// what format/gguf reads and what convert writes.
type Spec struct {
	// Model is tokenizer.ggml.model: "gpt2" (byte-level BPE) or "llama"
	// (SentencePiece BPE).
	Model string
	// Pre is tokenizer.ggml.pre and selects the pre-tokenizer for "gpt2":
	// "gpt-2" (also "gpt2", "default" or ""), "llama-bpe" (Llama 3: its
	// regex and whole-word lookup before merging; also "llama3",
	// "llama-v3"), "smaug-bpe" (the Llama 3 regex alone; also "dbrx"),
	// "qwen2" (its regex and NFC) or trigon's own "trigon-go". All but
	// "trigon-go" are llama.cpp's names: see LlamaCppLoads.
	Pre string

	Tokens []string  // tokenizer.ggml.tokens, indexed by id
	Scores []float32 // tokenizer.ggml.scores; "llama" without Merges merges by them
	Types  []int32   // tokenizer.ggml.token_type (Type*); empty means all normal
	Merges []string  // tokenizer.ggml.merges, "a b"; required for "gpt2", optional for "llama"

	BOS, EOS, UNK, PAD int32 // -1 when absent
	AddBOS, AddEOS     bool
	ChatTemplate       string

	// SpacePrefix says where "llama" puts the "▁" standing for a leading
	// space: "" at the start of every text span between added tokens (as
	// SentencePiece, llama.cpp and HF's legacy Llama layout do), "always"
	// the same unless the span already starts with a space, "first" only at
	// the start of the input (HF's Metaspace prepend_scheme "first"), or
	// "none" (GGUF tokenizer.ggml.add_space_prefix = false). Only "none"
	// has a GGUF key; the others are the HF layouts a GGUF can't tell apart.
	SpacePrefix string
}

// Spec describes t in GGUF terms. FromSpec(t.Spec()) encodes like t,
// except that lstrip/rstrip/single_word flags of added tokens have no GGUF
// form and are lost. Pre is "" when the pipeline matches no GGUF name, and
// FromSpec then refuses it.
func (t *Tokenizer) Spec() Spec {
	s := Spec{
		Pre:         t.specPre,
		Tokens:      make([]string, len(t.pieces)),
		Types:       make([]int32, len(t.pieces)),
		BOS:         t.bos,
		EOS:         -1,
		UNK:         t.unk,
		PAD:         t.pad,
		SpacePrefix: t.specPrefix,
	}
	if len(t.eos) > 0 {
		s.EOS = t.eos[0]
	}
	if t.unk < 0 {
		s.UNK = t.model.unk
	}
	s.AddBOS = len(t.prefix) == 1 && t.prefix[0] == t.bos && t.bos >= 0
	s.AddEOS = len(t.suffix) == 1 && s.EOS >= 0 && t.suffix[0] == s.EOS
	if t.chat != nil {
		s.ChatTemplate = t.chat.source
	}
	if t.kind == KindByteLevelBPE {
		s.Model = "gpt2"
	} else {
		s.Model = "llama"
	}
	for id := range t.pieces {
		s.Tokens[id] = t.pieces[id]
		switch {
		case !t.known[id]:
			s.Tokens[id] = fmt.Sprintf("[UNUSED_%d]", id)
			s.Types[id] = TypeUnused
		case TokenID(id) == t.model.unk:
			s.Types[id] = TypeUnknown
		default:
			s.Types[id] = TypeNormal
			if t.kind == KindSentencePieceBPE {
				if _, ok := parseByteToken(t.pieces[id]); ok {
					s.Types[id] = TypeByte
				}
			}
		}
	}
	for _, a := range t.added {
		if a.special {
			s.Types[a.id] = TypeControl
		} else {
			s.Types[a.id] = TypeUserDefined
		}
	}
	// Merges in rank order, and scores that rank merged pieces the same way.
	maxRank := int32(-1)
	for _, mg := range t.model.merges {
		maxRank = max(maxRank, mg.rank)
	}
	byRank := make([]string, maxRank+1)
	best := make(map[TokenID]int32, len(t.model.merges))
	for k, mg := range t.model.merges {
		a, b := TokenID(k>>32), TokenID(uint32(k))
		byRank[mg.rank] = t.pieces[a] + " " + t.pieces[b]
		if r, ok := best[mg.id]; !ok || mg.rank < r {
			best[mg.id] = mg.rank
		}
	}
	for _, m := range byRank {
		if m != "" { // ranks of duplicate merges leave holes
			s.Merges = append(s.Merges, m)
		}
	}
	if t.kind == KindSentencePieceBPE {
		if t.model.scores != nil {
			s.Scores = append([]float32(nil), t.model.scores...)
			return s
		}
		s.Scores = make([]float32, len(t.pieces))
		n := maxRank + 1
		for id := range s.Scores {
			if r, ok := best[TokenID(id)]; ok {
				s.Scores[id] = -float32(r)
			} else if s.Types[id] == TypeNormal {
				s.Scores[id] = -float32(n + int32(id))
			}
		}
	}
	return s
}

// describeForSpec names the pipeline in GGUF terms (Spec.Pre and
// Spec.SpacePrefix), or gives "" for Pre if it has no GGUF name.
func describeForSpec(b *builder) (pre, prefix string) {
	if b.m.byteLevel {
		if len(b.decoder) != 1 || b.decoder[0].kind != decByteLevel {
			return "", ""
		}
		split, bl, ok := splitThenByteLevel(b.pre)
		switch {
		case ok && split == nil && bl.re != nil && !bl.addPrefixSpace && b.normalizer == nil && !b.m.ignoreMerges:
			return "gpt-2", ""
		case ok && split != nil && bl.re == nil && !bl.addPrefixSpace:
			pat := patternOf(split)
			u, isNFC := b.normalizer.(normUnicode)
			isNFC = isNFC && u.form == norm.NFC
			for _, p := range bytePres()[1:] {
				if pat == p.pattern && b.m.ignoreMerges == p.ignoreMerges &&
					((p.nfc && isNFC) || (!p.nfc && b.normalizer == nil)) {
					return p.name, ""
				}
			}
		}
		return "", ""
	}
	if b.m.ignoreMerges {
		return "", ""
	}
	legacyDecoder := len(b.decoder) == 4 && b.decoder[0].kind == decReplace && b.decoder[0].old == "▁" &&
		b.decoder[0].new == " " && b.decoder[1].kind == decByteFallback && b.decoder[2].kind == decFuse &&
		b.decoder[3].kind == decStrip && b.decoder[3].content == ' ' && b.decoder[3].start == 1 && b.decoder[3].stop == 0
	metaDecoder := len(b.decoder) >= 1 && b.decoder[0].kind == decMetaspace && b.decoder[0].replacement == '▁'
	if !legacyDecoder && !metaDecoder {
		return "", ""
	}
	if seq, ok := b.normalizer.(normSequence); ok && b.pre == nil {
		if len(seq) == 2 && seq[0] == normalizer(normPrepend{"▁"}) && seq[1] == normalizer(normReplace{" ", "▁"}) {
			return "default", ""
		}
		if len(seq) == 1 && seq[0] == normalizer(normReplace{" ", "▁"}) {
			return "default", "none"
		}
	}
	if ms, ok := b.pre.(preMetaspace); ok && b.normalizer == nil && ms.replacement == "▁" && !ms.splitWords {
		switch ms.scheme {
		case prependAlways:
			return "default", "always"
		case prependFirst:
			return "default", "first"
		case prependNever:
			return "default", "none"
		}
	}
	return "", ""
}

func nfc() normUnicode { return normUnicode{form: norm.NFC} }

// splitThenByteLevel matches a ByteLevel pre-tokenizer, alone or after one
// Split.
func splitThenByteLevel(p preTokenizer) (*preSplit, preByteLevel, bool) {
	switch v := p.(type) {
	case preByteLevel:
		return nil, v, true
	case preSequence:
		if len(v) == 1 {
			return splitThenByteLevel(v[0])
		}
		if len(v) == 2 {
			s, ok1 := v[0].(preSplit)
			bl, ok2 := v[1].(preByteLevel)
			if ok1 && ok2 && s.behavior == splitIsolated && !s.invert {
				return &s, bl, true
			}
		}
	}
	return nil, preByteLevel{}, false
}

// patternOf returns the known pattern a Split runs, or "".
func patternOf(s *preSplit) string {
	if s.m == nil {
		return ""
	}
	if rm, ok := s.m.(*regexMatcher); ok {
		if rm.re.String() == trigonGoPattern {
			return trigonGoPattern
		}
		return ""
	}
	probe := "Hello  world's 12345\n\n x"
	for _, pat := range []string{llama3Pattern, qwen2Pattern, gpt2Pattern} {
		want, _ := newMatcher(pat)
		if sameScanner(s.m, want, probe) {
			return pat
		}
	}
	return ""
}

// sameScanner tells the fast scanners apart by what they do on a probe
// (they are closures, so they can't be compared directly).
func sameScanner(a, b matcher, probe string) bool {
	_, ok1 := a.(scanMatcher)
	_, ok2 := b.(scanMatcher)
	if !ok1 || !ok2 {
		return false
	}
	var x, y []int
	_ = a.matches(probe, func(s, e int) { x = append(x, s, e) })
	_ = b.matches(probe, func(s, e int) { y = append(y, s, e) })
	if len(x) != len(y) {
		return false
	}
	for i := range x {
		if x[i] != y[i] {
			return false
		}
	}
	return true
}

// FromSpec builds a tokenizer from GGUF-style metadata.
func FromSpec(s Spec) (*Tokenizer, error) {
	n := len(s.Tokens)
	if n == 0 {
		return nil, errors.New("tokenizer spec: no tokens")
	}
	if n > maxVocab {
		return nil, fmt.Errorf("tokenizer spec: %d tokens is too many", n)
	}
	if len(s.Types) != 0 && len(s.Types) != n {
		return nil, fmt.Errorf("tokenizer spec: %d token types for %d tokens", len(s.Types), n)
	}
	if len(s.Scores) != 0 && len(s.Scores) != n {
		return nil, fmt.Errorf("tokenizer spec: %d scores for %d tokens", len(s.Scores), n)
	}
	for what, id := range map[string]int32{"BOS": s.BOS, "EOS": s.EOS, "UNK": s.UNK, "PAD": s.PAD} {
		if id < -1 || id >= int32(n) {
			return nil, fmt.Errorf("tokenizer spec: %s id %d out of range", what, id)
		}
	}
	typeOf := func(id int) int32 {
		if len(s.Types) == 0 {
			return TypeNormal
		}
		return s.Types[id]
	}
	b := &builder{}
	b.m.vocab = make(map[string]TokenID, n)
	for id, piece := range s.Tokens {
		if piece == "" {
			return nil, fmt.Errorf("tokenizer spec: token %d is empty", id)
		}
		if len(piece) > maxPieceBytes {
			return nil, fmt.Errorf("tokenizer spec: token %d is %d bytes long", id, len(piece))
		}
		switch ty := typeOf(id); ty {
		case TypeControl, TypeUserDefined:
			b.added = append(b.added, addedToken{id: TokenID(id), content: piece, special: ty == TypeControl})
		case TypeNormal, TypeUnknown, TypeUnused, TypeByte, 0:
			if _, dup := b.m.vocab[piece]; !dup {
				b.m.vocab[piece] = TokenID(id)
			}
		default:
			return nil, fmt.Errorf("tokenizer spec: token %d has unknown type %d", id, ty)
		}
		b.setPiece(TokenID(id), piece)
	}
	pairs := make([][2]string, len(s.Merges))
	for i, m := range s.Merges {
		a, c, ok := strings.Cut(m, " ")
		if !ok {
			return nil, fmt.Errorf("tokenizer spec: merge %d %q: want two pieces separated by a space", i, m)
		}
		pairs[i] = [2]string{a, c}
	}
	b.m.unk = -1
	if s.UNK >= 0 {
		b.m.unk = s.UNK
	}
	var specPre, specPrefix string
	switch s.Model {
	case "gpt2":
		if len(pairs) == 0 {
			return nil, errors.New("tokenizer spec: model gpt2 needs merges")
		}
		if err := b.setMerges(pairs); err != nil {
			return nil, fmt.Errorf("tokenizer spec: %w", err)
		}
		p, ok := lookupBytePre(s.Pre)
		if !ok {
			return nil, fmt.Errorf("tokenizer spec: pre-tokenizer %q is not supported", s.Pre)
		}
		specPre = p.name
		b.m.ignoreMerges = p.ignoreMerges
		if p.nfc {
			b.normalizer = nfc()
		}
		pattern := p.pattern
		m, err := newMatcher(pattern)
		if err != nil {
			return nil, err
		}
		if specPre == "gpt-2" {
			b.pre = preByteLevel{re: m}
		} else {
			b.pre = preSequence{preSplit{m: m}, preByteLevel{}}
		}
		b.m.byteLevel = true
		b.decoder = []decodeStep{{kind: decByteLevel}}
	case "llama":
		specPre = "default"
		if len(pairs) > 0 {
			if err := b.setMerges(pairs); err != nil {
				return nil, fmt.Errorf("tokenizer spec: %w", err)
			}
		} else {
			if len(s.Scores) != n {
				return nil, errors.New("tokenizer spec: model llama needs scores or merges")
			}
			b.m.scores = make([]float32, n)
			b.m.mergeable = make([]bool, n)
			for id, sc := range s.Scores {
				v, err := checkedScore(sc)
				if err != nil {
					return nil, fmt.Errorf("tokenizer spec: token %d: %w", id, err)
				}
				b.m.scores[id] = v
				ty := typeOf(id)
				b.m.mergeable[id] = ty == TypeNormal || ty == 0
			}
		}
		b.m.byteFallback = true
		b.m.fuseUnk = true
		replace := normReplace{" ", "▁"}
		switch s.SpacePrefix {
		case "":
			b.normalizer = normSequence{normPrepend{"▁"}, replace}
		case "none":
			b.normalizer = normSequence{replace}
		case "always":
			b.pre = preMetaspace{replacement: "▁", scheme: prependAlways}
		case "first":
			b.pre = preMetaspace{replacement: "▁", scheme: prependFirst}
		default:
			return nil, fmt.Errorf("tokenizer spec: space prefix %q is not supported", s.SpacePrefix)
		}
		specPrefix = s.SpacePrefix
		b.decoder = []decodeStep{{kind: decReplace, old: "▁", new: " "}, {kind: decByteFallback}, {kind: decFuse}}
		if s.SpacePrefix != "none" {
			b.decoder = append(b.decoder, decodeStep{kind: decStrip, content: ' ', start: 1})
		}
	default:
		return nil, fmt.Errorf("tokenizer spec: model %q is not supported", s.Model)
	}
	t, err := b.finish()
	if err != nil {
		return nil, fmt.Errorf("tokenizer spec: %w", err)
	}
	t.specPre, t.specPrefix = specPre, specPrefix
	t.bos, t.unk, t.pad = s.BOS, s.UNK, s.PAD
	if s.EOS >= 0 {
		t.eos = []TokenID{s.EOS}
	}
	if s.AddBOS {
		if s.BOS < 0 {
			return nil, errors.New("tokenizer spec: AddBOS without a BOS id")
		}
		t.prefix = []TokenID{s.BOS}
	}
	if s.AddEOS {
		if s.EOS < 0 {
			return nil, errors.New("tokenizer spec: AddEOS without an EOS id")
		}
		t.suffix = []TokenID{s.EOS}
	}
	if s.ChatTemplate != "" {
		if t.chat, err = compileChatTemplate(s.ChatTemplate); err != nil {
			return nil, fmt.Errorf("tokenizer spec: %w", err)
		}
	}
	return t, nil
}
