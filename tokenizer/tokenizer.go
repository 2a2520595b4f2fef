package tokenizer

import (
	"hash/maphash"
	"strings"
	"sync"
)

// TokenID is a vocabulary index. It is an alias so that sched, model and
// api can pass []int32 without conversions.
type TokenID = int32

// Kinds reported by Tokenizer.Kind.
const (
	KindByteLevelBPE     = "byte-level BPE"
	KindSentencePieceBPE = "SentencePiece BPE"
)

// Tokenizer encodes text to ids and back. It is immutable after
// construction (apart from an internal cache) and safe for concurrent use.
type Tokenizer struct {
	kind  string
	model *bpeModel

	pieces  []string // id -> vocabulary piece or added-token content
	known   []bool   // id has a piece (vocabularies may have gaps)
	special []bool   // id is a special added token
	ids     map[string]TokenID
	added   []addedToken

	rawAdded  *addedMatcher // added tokens matched in the raw text
	normAdded *addedMatcher // added tokens matched after normalization

	normalizer normalizer   // nil: none
	pre        preTokenizer // nil: the whole segment is one word
	spmSep     string       // non-empty: cut words before this separator (see spaceChunks)

	prefix, suffix []TokenID // what the post-processor adds around the ids
	decoder        []decodeStep

	bos      TokenID // -1 if none
	eos      []TokenID
	unk, pad TokenID

	chat *chatTemplate

	// What Spec needs to describe the pipeline in GGUF terms.
	specPre    string // tokenizer.ggml.pre, "" if the pipeline has no GGUF name
	specPrefix string // Spec.SpacePrefix for SentencePiece layouts

	cache *wordCache
}

// Kind says which family the tokenizer belongs to: KindByteLevelBPE or
// KindSentencePieceBPE.
func (t *Tokenizer) Kind() string { return t.kind }

// VocabSize is the number of ids, added tokens included.
func (t *Tokenizer) VocabSize() int { return len(t.pieces) }

// TokenString returns the raw vocabulary piece of id (byte-level pieces in
// their GPT-2 alphabet, SentencePiece pieces with "▁"), or the content of
// an added token.
func (t *Tokenizer) TokenString(id TokenID) (string, bool) {
	if id < 0 || int(id) >= len(t.pieces) || !t.known[id] {
		return "", false
	}
	return t.pieces[id], true
}

// ID returns the id of a raw vocabulary piece or added token.
func (t *Tokenizer) ID(piece string) (TokenID, bool) {
	id, ok := t.ids[piece]
	return id, ok
}

// BOS returns the beginning-of-sequence id, if the tokenizer has one.
func (t *Tokenizer) BOS() (TokenID, bool) { return t.bos, t.bos >= 0 }

// EOS returns the end-of-sequence ids (a copy); generation stops at any.
func (t *Tokenizer) EOS() []TokenID { return append([]TokenID(nil), t.eos...) }

// IsSpecial reports whether id is a special added token (BOS, EOS, chat
// markers), the ones Decode(ids, true) leaves out.
func (t *Tokenizer) IsSpecial(id TokenID) bool {
	return id >= 0 && int(id) < len(t.special) && t.special[id]
}

// Encode turns text into ids. Added tokens written in the text (such as
// "<|im_start|>") become their ids, as in HF; addSpecial adds what the
// post-processor adds around a sequence (BOS for Llama and Mistral).
// Invalid UTF-8 is replaced with U+FFFD first. The error is non-nil only
// when a pre-tokenizer regex from the model file fails (times out).
func (t *Tokenizer) Encode(text string, addSpecial bool) ([]TokenID, error) {
	text = toValidUTF8(text)
	ids := make([]TokenID, 0, len(text)/3+len(t.prefix)+len(t.suffix)+1)
	if addSpecial {
		ids = append(ids, t.prefix...)
	}
	var err error
	t.rawAdded.split(text, func(seg segment) {
		if err != nil {
			return
		}
		if seg.id >= 0 {
			ids = append(ids, seg.id)
			return
		}
		s := seg.text
		if t.normalizer != nil {
			s = t.normalizer.normalize(s)
		}
		atStart := seg.offset == 0
		t.normAdded.split(s, func(sub segment) {
			if err != nil {
				return
			}
			if sub.id >= 0 {
				ids = append(ids, sub.id)
				return
			}
			ids, err = t.encodeSegment(sub.text, atStart && sub.offset == 0, ids)
		})
	})
	if err != nil {
		return nil, err
	}
	if addSpecial {
		ids = append(ids, t.suffix...)
	}
	return ids, nil
}

// encodeSegment pre-tokenizes normalized text that holds no added tokens and
// appends the ids of its words.
func (t *Tokenizer) encodeSegment(s string, atStart bool, ids []TokenID) ([]TokenID, error) {
	if s == "" {
		return ids, nil
	}
	if t.pre == nil {
		return t.encodeWord(s, ids), nil
	}
	err := t.pre.split(s, atStart, func(w string, _ bool) { ids = t.encodeWord(w, ids) })
	return ids, err
}

func (t *Tokenizer) encodeWord(w string, ids []TokenID) []TokenID {
	if t.spmSep == "" {
		return t.cachedWord(w, ids)
	}
	spaceChunks(w, t.spmSep, func(c string) { ids = t.cachedWord(c, ids) })
	return ids
}

// maxCachedWord bounds the words the cache keeps: long words are rare and
// would let one request fill the cache with large keys.
const maxCachedWord = 128

func (t *Tokenizer) cachedWord(w string, ids []TokenID) []TokenID {
	if len(w) > maxCachedWord {
		return t.model.encodeWord(w, ids)
	}
	if v, ok := t.cache.get(w); ok {
		return append(ids, v...)
	}
	start := len(ids)
	ids = t.model.encodeWord(w, ids)
	t.cache.put(w, ids[start:])
	return ids
}

// wordCache maps a word to its ids. It is sharded to keep lock contention
// low under concurrent encoding, and each shard is simply emptied when full:
// a bounded size matters more than the hit rate of an eviction policy, since
// a miss only costs one BPE run.
type wordCache struct {
	seed   maphash.Seed
	shards [cacheShards]cacheShard
}

const (
	cacheShards   = 16
	cacheShardCap = 4096
)

type cacheShard struct {
	mu sync.RWMutex
	m  map[string][]TokenID
}

func newWordCache() *wordCache {
	c := &wordCache{seed: maphash.MakeSeed()}
	for i := range c.shards {
		c.shards[i].m = make(map[string][]TokenID)
	}
	return c
}

func (c *wordCache) shard(w string) *cacheShard {
	return &c.shards[maphash.String(c.seed, w)%cacheShards]
}

func (c *wordCache) get(w string) ([]TokenID, bool) {
	s := c.shard(w)
	s.mu.RLock()
	v, ok := s.m[w]
	s.mu.RUnlock()
	return v, ok
}

func (c *wordCache) put(w string, ids []TokenID) {
	s := c.shard(w)
	// Copies: w may be a slice of a large input, ids a slice of the result.
	key := strings.Clone(w)
	val := append([]TokenID(nil), ids...)
	s.mu.Lock()
	if len(s.m) >= cacheShardCap {
		s.m = make(map[string][]TokenID)
	}
	s.m[key] = val
	s.mu.Unlock()
}

// TokenBytes returns the bytes one token contributes to decoded text, as
// OpenAI's logprobs "bytes" want them: byte-level pieces mapped back to
// their bytes, SentencePiece "▁" as a space and <0xAB> byte tokens as that
// byte, added tokens as their content. The result may be an incomplete
// UTF-8 sequence. ok is false for ids outside the vocabulary.
func (t *Tokenizer) TokenBytes(id TokenID) (b []byte, ok bool) {
	if id < 0 || int(id) >= len(t.pieces) || !t.known[id] {
		return nil, false
	}
	piece := t.pieces[id]
	if t.isAddedID(id) {
		return []byte(piece), true
	}
	if t.kind == KindByteLevelBPE {
		if raw, ok := byteLevelDecode(piece); ok {
			return raw, true
		}
		return []byte(piece), true
	}
	if c, ok := parseByteToken(piece); ok {
		return []byte{c}, true
	}
	return []byte(strings.ReplaceAll(piece, "▁", " ")), true
}

// isAddedID reports whether id is an added token (special or not).
func (t *Tokenizer) isAddedID(id TokenID) bool {
	for _, a := range t.added {
		if a.id == id {
			return true
		}
	}
	return false
}
