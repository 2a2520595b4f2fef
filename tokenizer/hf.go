package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// Limits on what a tokenizer file may ask for, so that a broken or hostile
// file gives an error instead of exhausting memory.
const (
	maxVocab      = 1 << 22 // ids
	maxPieceBytes = 1 << 12
)

// FromHFDir loads tokenizer.json and, if present, tokenizer_config.json
// (special tokens, chat template) from a Hugging Face model directory.
func FromHFDir(dir string) (*Tokenizer, error) {
	tj, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, fmt.Errorf("load tokenizer from %s: %w", dir, err)
	}
	cfgPath := filepath.Join(dir, "tokenizer_config.json")
	cfg, err := os.ReadFile(cfgPath)
	if errors.Is(err, os.ErrNotExist) {
		cfg = nil
	} else if err != nil {
		return nil, fmt.Errorf("load tokenizer from %s: %w", dir, err)
	}
	t, err := FromHFJSON(tj, cfg)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer from %s: %w", dir, err)
	}
	return t, nil
}

// hfFile is the part of tokenizer.json this package reads. Polymorphic
// parts stay raw until their "type" is known.
type hfFile struct {
	AddedTokens   []hfAddedToken  `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Model         hfModel         `json:"model"`
}

type hfAddedToken struct {
	ID         int64  `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized *bool  `json:"normalized"`
	Special    bool   `json:"special"`
}

type hfModel struct {
	Type                    string           `json:"type"`
	Vocab                   map[string]int64 `json:"vocab"`
	Merges                  json.RawMessage  `json:"merges"`
	UnkToken                *string          `json:"unk_token"`
	ContinuingSubwordPrefix *string          `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string          `json:"end_of_word_suffix"`
	FuseUnk                 bool             `json:"fuse_unk"`
	ByteFallback            bool             `json:"byte_fallback"`
	IgnoreMerges            bool             `json:"ignore_merges"`
	Dropout                 *float64         `json:"dropout"`
}

// hfNode is any typed component (normalizer, pre-tokenizer, ...). Only the
// fields of the types this package supports are listed.
type hfNode struct {
	Type string `json:"type"`

	// Sequences.
	Normalizers   []json.RawMessage `json:"normalizers"`
	Pretokenizers []json.RawMessage `json:"pretokenizers"`
	Processors    []json.RawMessage `json:"processors"`
	Decoders      []json.RawMessage `json:"decoders"`

	// Prepend, Replace, Split, Strip.
	Prepend    string     `json:"prepend"`
	Pattern    *hfPattern `json:"pattern"`
	Content    *string    `json:"content"`
	Behavior   string     `json:"behavior"`
	Invert     bool       `json:"invert"`
	StripLeft  *bool      `json:"strip_left"`
	StripRight *bool      `json:"strip_right"`
	Start      int        `json:"start"`
	Stop       int        `json:"stop"`

	// ByteLevel, Metaspace.
	AddPrefixSpace *bool  `json:"add_prefix_space"`
	UseRegex       *bool  `json:"use_regex"`
	Replacement    string `json:"replacement"`
	PrependScheme  string `json:"prepend_scheme"`
	Split          *bool  `json:"split"`

	// TemplateProcessing, RobertaProcessing, BertProcessing.
	Single        []map[string]hfTemplatePiece `json:"single"`
	SpecialTokens map[string]struct {
		IDs []int64 `json:"ids"`
	} `json:"special_tokens"`
	Sep []json.RawMessage `json:"sep"`
	Cls []json.RawMessage `json:"cls"`
}

type hfPattern struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

type hfTemplatePiece struct {
	ID string `json:"id"`
}

// hfConfig is the part of tokenizer_config.json this package reads.
type hfConfig struct {
	BOS          json.RawMessage `json:"bos_token"`
	EOS          json.RawMessage `json:"eos_token"`
	UNK          json.RawMessage `json:"unk_token"`
	PAD          json.RawMessage `json:"pad_token"`
	ChatTemplate json.RawMessage `json:"chat_template"`
}

func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || bytes.Equal(raw, []byte("null"))
}

// tokenContent reads a special-token entry: a string, or an AddedToken
// object with "content".
func tokenContent(raw json.RawMessage) (string, bool, error) {
	if isNull(raw) {
		return "", false, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, true, nil
	}
	var obj struct {
		Content *string `json:"content"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil || obj.Content == nil {
		return "", false, fmt.Errorf("special token %s: want a string or an object with content", raw)
	}
	return *obj.Content, true, nil
}

// FromHFJSON builds a tokenizer from the bytes of tokenizer.json and
// tokenizer_config.json (config may be nil: no chat template, BOS from the
// post-processor, no EOS).
func FromHFJSON(tokenizerJSON, tokenizerConfigJSON []byte) (*Tokenizer, error) {
	var f hfFile
	if err := json.Unmarshal(tokenizerJSON, &f); err != nil {
		return nil, fmt.Errorf("parse tokenizer.json: %w", err)
	}
	b := &builder{}
	if err := b.model(&f.Model); err != nil {
		return nil, fmt.Errorf("tokenizer.json model: %w", err)
	}
	for _, a := range f.AddedTokens {
		if a.ID < 0 || a.ID >= maxVocab {
			return nil, fmt.Errorf("tokenizer.json: added token %q has id %d out of range", a.Content, a.ID)
		}
		normalized := !a.Special
		if a.Normalized != nil {
			normalized = *a.Normalized
		}
		b.added = append(b.added, addedToken{id: TokenID(a.ID), content: a.Content, special: a.Special,
			lstrip: a.LStrip, rstrip: a.RStrip, singleWord: a.SingleWord, normalized: normalized})
	}
	var err error
	if b.normalizer, err = b.parseNormalizer(f.Normalizer); err != nil {
		return nil, fmt.Errorf("tokenizer.json normalizer: %w", err)
	}
	if b.pre, err = b.parsePreTokenizer(f.PreTokenizer); err != nil {
		return nil, fmt.Errorf("tokenizer.json pre_tokenizer: %w", err)
	}
	b.m.byteLevel = b.sawByteLevel
	if b.decoder, err = parseDecoder(f.Decoder); err != nil {
		return nil, fmt.Errorf("tokenizer.json decoder: %w", err)
	}
	t, err := b.finish()
	if err != nil {
		return nil, err
	}
	if err := t.parsePostProcessor(f.PostProcessor); err != nil {
		return nil, fmt.Errorf("tokenizer.json post_processor: %w", err)
	}
	if len(t.prefix) == 1 {
		t.bos = t.prefix[0]
	}
	if tokenizerConfigJSON != nil {
		if err := t.applyConfig(tokenizerConfigJSON); err != nil {
			return nil, fmt.Errorf("tokenizer_config.json: %w", err)
		}
	}
	t.specPre, t.specPrefix = describeForSpec(b)
	return t, nil
}

// builder collects the parts of a tokenizer from either source.
type builder struct {
	m          bpeModel
	pieces     []string
	known      []bool
	added      []addedToken
	normalizer normalizer
	pre        preTokenizer
	decoder    []decodeStep

	sawByteLevel  bool
	byteLevelLast bool // ByteLevel was the last pre-tokenizer stage
}

func (b *builder) setPiece(id TokenID, piece string) {
	for int(id) >= len(b.pieces) {
		b.pieces = append(b.pieces, "")
		b.known = append(b.known, false)
	}
	b.pieces[id] = piece
	b.known[id] = true
}

func (b *builder) model(m *hfModel) error {
	switch m.Type {
	case "BPE", "":
	default:
		return fmt.Errorf("model type %q is not supported (only BPE)", m.Type)
	}
	if m.Dropout != nil && *m.Dropout > 0 {
		return fmt.Errorf("BPE dropout %v is not supported", *m.Dropout)
	}
	if m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "" {
		return fmt.Errorf("continuing_subword_prefix %q is not supported", *m.ContinuingSubwordPrefix)
	}
	if m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "" {
		return fmt.Errorf("end_of_word_suffix %q is not supported", *m.EndOfWordSuffix)
	}
	if len(m.Vocab) == 0 {
		return errors.New("empty vocab")
	}
	b.m.vocab = make(map[string]TokenID, len(m.Vocab))
	for piece, id := range m.Vocab {
		if id < 0 || id >= maxVocab {
			return fmt.Errorf("vocab piece %q has id %d out of range", piece, id)
		}
		b.m.vocab[piece] = TokenID(id)
		b.setPiece(TokenID(id), piece)
	}
	var pairs [][2]string
	if !isNull(m.Merges) {
		var flat []string
		if err := json.Unmarshal(m.Merges, &flat); err == nil {
			pairs = make([][2]string, len(flat))
			for i, s := range flat {
				a, c, ok := strings.Cut(s, " ")
				if !ok {
					return fmt.Errorf("merge %d %q: want two pieces separated by a space", i, s)
				}
				pairs[i] = [2]string{a, c}
			}
		} else if err := json.Unmarshal(m.Merges, &pairs); err != nil {
			return fmt.Errorf("merges: want [\"a b\", ...] or [[\"a\", \"b\"], ...]: %w", err)
		}
	}
	if err := b.setMerges(pairs); err != nil {
		return err
	}
	b.m.unk = -1
	if m.UnkToken != nil {
		id, ok := b.m.vocab[*m.UnkToken]
		if !ok {
			return fmt.Errorf("unk_token %q is not in the vocab", *m.UnkToken)
		}
		b.m.unk = id
	}
	b.m.fuseUnk = m.FuseUnk
	b.m.byteFallback = m.ByteFallback
	b.m.ignoreMerges = m.IgnoreMerges
	return nil
}

func (b *builder) setMerges(pairs [][2]string) error {
	b.m.merges = make(map[uint64]merge, len(pairs))
	for i, p := range pairs {
		a, ok1 := b.m.vocab[p[0]]
		c, ok2 := b.m.vocab[p[1]]
		r, ok3 := b.m.vocab[p[0]+p[1]]
		if !ok1 || !ok2 || !ok3 {
			return fmt.Errorf("merge %d (%q, %q): piece not in the vocab", i, p[0], p[1])
		}
		k := mergeKey(a, c)
		if _, dup := b.m.merges[k]; !dup { // the first (lowest) rank wins, as in HF
			b.m.merges[k] = merge{rank: int32(i), id: r}
		}
	}
	return nil
}

func (b *builder) parseNormalizer(raw json.RawMessage) (normalizer, error) {
	if isNull(raw) {
		return nil, nil
	}
	var n hfNode
	if err := json.Unmarshal(raw, &n); err != nil {
		return nil, err
	}
	switch n.Type {
	case "Sequence":
		var seq normSequence
		for _, r := range n.Normalizers {
			c, err := b.parseNormalizer(r)
			if err != nil {
				return nil, err
			}
			if c != nil {
				seq = append(seq, c)
			}
		}
		return seq, nil
	case "NFC":
		return normUnicode{norm.NFC}, nil
	case "NFD":
		return normUnicode{norm.NFD}, nil
	case "NFKC":
		return normUnicode{norm.NFKC}, nil
	case "NFKD":
		return normUnicode{norm.NFKD}, nil
	case "Prepend":
		return normPrepend{n.Prepend}, nil
	case "Replace":
		if n.Pattern == nil || n.Pattern.String == nil || n.Content == nil {
			return nil, errors.New("Replace: only string patterns are supported")
		}
		if *n.Pattern.String == "" {
			return nil, errors.New("Replace: empty pattern")
		}
		return normReplace{*n.Pattern.String, *n.Content}, nil
	case "Lowercase":
		return normLowercase{}, nil
	case "Strip":
		return normStrip{left: n.StripLeft == nil || *n.StripLeft, right: n.StripRight == nil || *n.StripRight}, nil
	}
	return nil, fmt.Errorf("normalizer type %q is not supported", n.Type)
}

func (b *builder) parsePreTokenizer(raw json.RawMessage) (preTokenizer, error) {
	if isNull(raw) {
		return nil, nil
	}
	var n hfNode
	if err := json.Unmarshal(raw, &n); err != nil {
		return nil, err
	}
	if b.byteLevelLast {
		// The byte-level model sees raw bytes (see preByteLevel), so nothing
		// may look at the text after the ByteLevel stage.
		return nil, errors.New("a pre-tokenizer after ByteLevel is not supported")
	}
	switch n.Type {
	case "Sequence":
		var seq preSequence
		for _, r := range n.Pretokenizers {
			c, err := b.parsePreTokenizer(r)
			if err != nil {
				return nil, err
			}
			if c != nil {
				seq = append(seq, c)
			}
		}
		return seq, nil
	case "Split":
		if n.Pattern == nil {
			return nil, errors.New("Split: missing pattern")
		}
		var m matcher
		var err error
		switch {
		case n.Pattern.Regex != nil:
			m, err = newMatcher(*n.Pattern.Regex)
		case n.Pattern.String != nil && *n.Pattern.String != "":
			m, err = newRegexMatcher(regexp.QuoteMeta(*n.Pattern.String))
		default:
			err = errors.New("Split: empty pattern")
		}
		if err != nil {
			return nil, err
		}
		beh, err := parseBehavior(n.Behavior)
		if err != nil {
			return nil, err
		}
		return preSplit{m: m, behavior: beh, invert: n.Invert}, nil
	case "ByteLevel":
		p := preByteLevel{addPrefixSpace: n.AddPrefixSpace != nil && *n.AddPrefixSpace}
		if n.UseRegex == nil || *n.UseRegex {
			m, err := newMatcher(gpt2Pattern)
			if err != nil {
				return nil, err
			}
			p.re = m
		}
		b.sawByteLevel, b.byteLevelLast = true, true
		return p, nil
	case "Metaspace":
		p := preMetaspace{replacement: n.Replacement, splitWords: n.Split == nil || *n.Split}
		if p.replacement == "" {
			p.replacement = "▁"
		}
		var err error
		if p.scheme, err = parseScheme(n.PrependScheme, n.AddPrefixSpace); err != nil {
			return nil, err
		}
		return p, nil
	}
	return nil, fmt.Errorf("pre-tokenizer type %q is not supported", n.Type)
}

func parseBehavior(s string) (splitBehavior, error) {
	switch s {
	case "Isolated", "":
		return splitIsolated, nil
	case "Removed":
		return splitRemoved, nil
	case "MergedWithPrevious":
		return splitMergedWithPrevious, nil
	case "MergedWithNext":
		return splitMergedWithNext, nil
	case "Contiguous":
		return splitContiguous, nil
	}
	return 0, fmt.Errorf("split behavior %q is not supported", s)
}

// parseScheme reads Metaspace's prepend_scheme, or the older
// add_prefix_space flag it replaced.
func parseScheme(s string, addPrefixSpace *bool) (prependScheme, error) {
	switch s {
	case "always":
		return prependAlways, nil
	case "first":
		return prependFirst, nil
	case "never":
		return prependNever, nil
	case "":
		if addPrefixSpace != nil && !*addPrefixSpace {
			return prependNever, nil
		}
		return prependAlways, nil
	}
	return 0, fmt.Errorf("prepend_scheme %q is not supported", s)
}

func parseDecoder(raw json.RawMessage) ([]decodeStep, error) {
	if isNull(raw) {
		return []decodeStep{{kind: decJoinSpace}}, nil
	}
	var n hfNode
	if err := json.Unmarshal(raw, &n); err != nil {
		return nil, err
	}
	switch n.Type {
	case "Sequence":
		var steps []decodeStep
		for _, r := range n.Decoders {
			if isNull(r) {
				continue
			}
			s, err := parseDecoder(r)
			if err != nil {
				return nil, err
			}
			steps = append(steps, s...)
		}
		return steps, nil
	case "ByteLevel":
		return []decodeStep{{kind: decByteLevel}}, nil
	case "Replace":
		if n.Pattern == nil || n.Pattern.String == nil || n.Content == nil || *n.Pattern.String == "" {
			return nil, errors.New("Replace: only non-empty string patterns are supported")
		}
		return []decodeStep{{kind: decReplace, old: *n.Pattern.String, new: *n.Content}}, nil
	case "ByteFallback":
		return []decodeStep{{kind: decByteFallback}}, nil
	case "Fuse":
		return []decodeStep{{kind: decFuse}}, nil
	case "Strip":
		if n.Content == nil || utf8.RuneCountInString(*n.Content) != 1 {
			return nil, errors.New("Strip: content must be one character")
		}
		if n.Start < 0 || n.Stop < 0 {
			return nil, errors.New("Strip: negative start or stop")
		}
		r, _ := utf8.DecodeRuneInString(*n.Content)
		return []decodeStep{{kind: decStrip, content: r, start: n.Start, stop: n.Stop}}, nil
	case "Metaspace":
		repl := n.Replacement
		if repl == "" {
			repl = "▁"
		}
		if utf8.RuneCountInString(repl) != 1 {
			return nil, errors.New("Metaspace: replacement must be one character")
		}
		scheme, err := parseScheme(n.PrependScheme, n.AddPrefixSpace)
		if err != nil {
			return nil, err
		}
		r, _ := utf8.DecodeRuneInString(repl)
		return []decodeStep{{kind: decMetaspace, replacement: r, scheme: scheme}}, nil
	}
	return nil, fmt.Errorf("decoder type %q is not supported", n.Type)
}

func (t *Tokenizer) parsePostProcessor(raw json.RawMessage) error {
	if isNull(raw) {
		return nil
	}
	var n hfNode
	if err := json.Unmarshal(raw, &n); err != nil {
		return err
	}
	switch n.Type {
	case "Sequence":
		for _, r := range n.Processors {
			if err := t.parsePostProcessor(r); err != nil {
				return err
			}
		}
		return nil
	case "ByteLevel":
		return nil // only adjusts offsets
	case "TemplateProcessing":
		var prefix, suffix []TokenID
		seenSeq := false
		for _, item := range n.Single {
			if p, ok := item["Sequence"]; ok {
				if seenSeq || p.ID != "A" {
					return errors.New("TemplateProcessing: single template must hold $A once")
				}
				seenSeq = true
				continue
			}
			p, ok := item["SpecialToken"]
			if !ok {
				return fmt.Errorf("TemplateProcessing: unknown template item %v", item)
			}
			st, ok := n.SpecialTokens[p.ID]
			if !ok {
				return fmt.Errorf("TemplateProcessing: special token %q not defined", p.ID)
			}
			for _, id := range st.IDs {
				if id < 0 || id >= int64(len(t.pieces)) {
					return fmt.Errorf("TemplateProcessing: id %d out of range", id)
				}
				if seenSeq {
					suffix = append(suffix, TokenID(id))
				} else {
					prefix = append(prefix, TokenID(id))
				}
			}
		}
		if !seenSeq {
			return errors.New("TemplateProcessing: single template has no $A")
		}
		t.prefix, t.suffix = prefix, suffix
		return nil
	case "RobertaProcessing", "BertProcessing":
		cls, err := t.pairID(n.Cls)
		if err != nil {
			return fmt.Errorf("%s cls: %w", n.Type, err)
		}
		sep, err := t.pairID(n.Sep)
		if err != nil {
			return fmt.Errorf("%s sep: %w", n.Type, err)
		}
		t.prefix, t.suffix = []TokenID{cls}, []TokenID{sep}
		return nil
	}
	return fmt.Errorf("post-processor type %q is not supported", n.Type)
}

// pairID reads a ["token", id] pair.
func (t *Tokenizer) pairID(raw []json.RawMessage) (TokenID, error) {
	if len(raw) != 2 {
		return 0, errors.New("want [token, id]")
	}
	var id int64
	if err := json.Unmarshal(raw[1], &id); err != nil || id < 0 || id >= int64(len(t.pieces)) {
		return 0, fmt.Errorf("bad id %s", raw[1])
	}
	return TokenID(id), nil
}

func (t *Tokenizer) applyConfig(raw []byte) error {
	var c hfConfig
	if err := json.Unmarshal(raw, &c); err != nil {
		return err
	}
	lookup := func(what string, r json.RawMessage) (TokenID, error) {
		s, ok, err := tokenContent(r)
		if err != nil || !ok {
			return -1, err
		}
		id, found := t.ids[s]
		if !found {
			return -1, fmt.Errorf("%s %q is not in the vocabulary", what, s)
		}
		return id, nil
	}
	var err error
	if id, e := lookup("bos_token", c.BOS); e != nil {
		return e
	} else if id >= 0 {
		t.bos = id
	}
	// eos_token is one token, but some configs list several.
	var eosList []json.RawMessage
	if err := json.Unmarshal(c.EOS, &eosList); err != nil || isNull(c.EOS) {
		eosList = []json.RawMessage{c.EOS}
	}
	for _, raw := range eosList {
		id, e := lookup("eos_token", raw)
		if e != nil {
			return e
		}
		if id >= 0 && !slices.Contains(t.eos, id) {
			t.eos = append(t.eos, id)
		}
	}
	if t.unk, err = lookup("unk_token", c.UNK); err != nil {
		return err
	}
	if t.pad, err = lookup("pad_token", c.PAD); err != nil {
		return err
	}
	src, err := chatTemplateSource(c.ChatTemplate)
	if err != nil {
		return err
	}
	if src != "" {
		if t.chat, err = compileChatTemplate(src); err != nil {
			return err
		}
	}
	return nil
}

// chatTemplateSource reads chat_template: a string, or a list of named
// templates of which "default" is the one for plain chat.
func chatTemplateSource(raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var list []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return "", fmt.Errorf("chat_template: want a string or a list of {name, template}: %w", err)
	}
	for _, e := range list {
		if e.Name == "default" {
			return e.Template, nil
		}
	}
	return "", errors.New("chat_template: list has no template named \"default\"")
}

// finish checks the collected parts and builds the Tokenizer.
func (b *builder) finish() (*Tokenizer, error) {
	for _, a := range b.added {
		if a.content == "" {
			return nil, fmt.Errorf("added token %d has empty content", a.id)
		}
		b.setPiece(a.id, a.content)
	}
	if len(b.pieces) > maxVocab {
		return nil, fmt.Errorf("vocabulary of %d ids is too large", len(b.pieces))
	}
	t := &Tokenizer{
		model:      &b.m,
		pieces:     b.pieces,
		known:      b.known,
		special:    make([]bool, len(b.pieces)),
		ids:        make(map[string]TokenID, len(b.pieces)),
		added:      b.added,
		normalizer: b.normalizer,
		pre:        b.pre,
		decoder:    b.decoder,
		bos:        -1,
		unk:        -1,
		pad:        -1,
		cache:      newWordCache(),
	}
	for piece, id := range b.m.vocab {
		if len(piece) > maxPieceBytes {
			return nil, fmt.Errorf("vocab piece %d is %d bytes long", id, len(piece))
		}
		t.ids[piece] = id
	}
	var raw, normd []addedToken
	for _, a := range b.added {
		t.ids[a.content] = a.id
		t.special[a.id] = t.special[a.id] || a.special
		if a.normalized && b.normalizer != nil {
			normd = append(normd, a)
		} else {
			raw = append(raw, a)
		}
	}
	t.rawAdded, t.normAdded = newAddedMatcher(raw), newAddedMatcher(normd)

	m := &b.m
	for i := range m.byteTokens {
		m.byteTokens[i] = -1
		if id, ok := m.vocab[fmt.Sprintf("<0x%02X>", i)]; ok {
			m.byteTokens[i] = id
		}
	}
	if m.byteLevel {
		t.kind = KindByteLevelBPE
		for i := range m.byteIDs {
			m.byteIDs[i] = -1
			if id, ok := m.vocab[string(byteToRune[i])]; ok {
				m.byteIDs[i] = id
			}
		}
		if m.ignoreMerges {
			m.rawVocab = make(map[string]TokenID, len(m.vocab))
			for piece, id := range m.vocab {
				if raw, ok := byteLevelDecode(piece); ok {
					m.rawVocab[string(raw)] = id
				}
			}
		}
	} else {
		t.kind = KindSentencePieceBPE
		if m.ignoreMerges && m.merges == nil {
			return nil, errors.New("ignore_merges needs merges")
		}
		if sep := "▁"; spaceCutsSafe(m.vocab, sep) {
			t.spmSep = sep
		}
	}
	return t, nil
}

// spaceCutsSafe reports whether no piece has sep after another rune, which
// makes cutting words before such seps exact (see spaceChunks).
func spaceCutsSafe(vocab map[string]TokenID, sep string) bool {
	for piece := range vocab {
		if i := strings.Index(piece, sep); i >= 0 {
			rest := strings.TrimLeft(piece, sep)
			if strings.Contains(rest, sep) || (i > 0) {
				return false
			}
		}
	}
	return true
}

// checkedScore turns a GGUF score into a finite float.
func checkedScore(f float32) (float32, error) {
	if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
		return 0, fmt.Errorf("score %v is not finite", f)
	}
	return f, nil
}
