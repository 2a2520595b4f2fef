package tokenizer

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Decoding runs token strings through a chain of stages that mirror HF's
// decoders (ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace). Each
// stage is written in streaming form: it passes on only what no later token
// can change, and holds the rest (an incomplete UTF-8 sequence, a run of
// byte tokens, trailing characters a Strip may remove) until more tokens or
// the end. Decode is the streaming Decoder fed all ids at once, so the two
// agree by construction, and both agree with HF (golden tests).
//
// HF's decoders map a list of tokens to a list of tokens; after Fuse or
// ByteLevel the list has one element. Stages after those run "fused": the
// chunks they receive are consecutive parts of that single token.

// decodeStep describes one stage; newStage makes its per-stream state.
type decodeStep struct {
	kind        decodeKind
	old, new    string // replace
	content     rune   // strip
	start, stop int    // strip
	scheme      prependScheme
	replacement rune // metaspace
}

type decodeKind int

const (
	decByteLevel decodeKind = iota
	decReplace
	decByteFallback
	decFuse
	decStrip
	decMetaspace
	decJoinSpace // no decoder at all: HF joins tokens with spaces
)

// stage is one step's state within one stream.
type stage interface {
	push(tok string, next func(string))
	flush(next func(string))
}

func (s decodeStep) newStage(fused bool) stage {
	switch s.kind {
	case decByteLevel:
		return &byteLevelStage{fused: fused}
	case decReplace:
		return &replaceStage{old: s.old, new: s.new, fused: fused}
	case decByteFallback:
		return &byteFallbackStage{fused: fused}
	case decFuse:
		return passStage{}
	case decStrip:
		return &stripStage{content: s.content, start: s.start, stop: s.stop, fused: fused}
	case decMetaspace:
		return &metaspaceStage{repl: s.replacement, scheme: s.scheme, fused: fused}
	case decJoinSpace:
		return &joinSpaceStage{}
	}
	return passStage{}
}

// fusesOutput says whether a stage's output is a single token.
func (s decodeStep) fusesOutput() bool { return s.kind == decByteLevel || s.kind == decFuse }

type passStage struct{}

func (passStage) push(tok string, next func(string)) { next(tok) }
func (passStage) flush(func(string))                 {}

// byteLevelStage maps byte-level pieces back to bytes and emits the UTF-8
// text they complete. A piece with a rune outside the byte alphabet (an
// added token such as "<|im_start|>" is inside it, one with a space is not)
// contributes its own UTF-8 bytes, as HF's ByteLevel decoder does.
//
// Fused (after a Fuse, which no real tokenizer has), the whole stream is
// one token and one rune outside the alphabet changes how all of it
// decodes, so everything is held until the end.
type byteLevelStage struct {
	pending []byte
	fused   bool
	whole   strings.Builder
}

func (b *byteLevelStage) push(tok string, next func(string)) {
	if b.fused {
		b.whole.WriteString(tok)
		return
	}
	b.decodeToken(tok, next)
}

func (b *byteLevelStage) decodeToken(tok string, next func(string)) {
	raw, ok := byteLevelDecode(tok)
	if !ok {
		raw = []byte(tok)
	}
	b.pending = append(b.pending, raw...)
	out, held := appendLossy(nil, b.pending, false)
	b.pending = append(b.pending[:0], b.pending[len(b.pending)-held:]...)
	if len(out) > 0 {
		next(string(out))
	}
}

func (b *byteLevelStage) flush(next func(string)) {
	if b.fused {
		b.decodeToken(b.whole.String(), next)
		b.whole.Reset()
	}
	if len(b.pending) == 0 {
		return
	}
	out, _ := appendLossy(nil, b.pending, true)
	b.pending = b.pending[:0]
	next(string(out))
}

// replaceStage replaces a literal string. Fused, a match may span chunks,
// so a suffix that could start a match is held back.
type replaceStage struct {
	old, new string
	fused    bool
	buf      string
}

func (r *replaceStage) push(tok string, next func(string)) {
	if !r.fused {
		next(strings.ReplaceAll(tok, r.old, r.new))
		return
	}
	s := r.buf + tok
	var out strings.Builder
	i := 0
	for {
		j := strings.Index(s[i:], r.old)
		if j < 0 {
			break
		}
		out.WriteString(s[i : i+j])
		out.WriteString(r.new)
		i += j + len(r.old)
	}
	rest := s[i:]
	hold := 0
	for k := min(len(r.old)-1, len(rest)); k > 0; k-- {
		if strings.HasSuffix(rest, r.old[:k]) {
			hold = k
			break
		}
	}
	out.WriteString(rest[:len(rest)-hold])
	r.buf = rest[len(rest)-hold:]
	if out.Len() > 0 {
		next(out.String())
	}
}

func (r *replaceStage) flush(next func(string)) {
	if r.buf != "" {
		next(r.buf)
		r.buf = ""
	}
}

// byteFallbackStage turns runs of <0xAB> tokens into the text they spell,
// or one U+FFFD per byte token if the run is not valid UTF-8, which is why a
// whole run is held until a non-byte token (or the end) closes it.
//
// Fused (after a Fuse), the stream is one token, which is a byte token only
// if it is exactly "<0xAB>"; it is held until the end to find out.
type byteFallbackStage struct {
	pending []byte
	fused   bool
	whole   strings.Builder
}

// parseByteToken reads "<0xAB>".
func parseByteToken(tok string) (byte, bool) {
	if len(tok) != 6 || tok[0] != '<' || tok[1] != '0' || tok[2] != 'x' || tok[5] != '>' {
		return 0, false
	}
	hi, ok1 := hexDigit(tok[3])
	lo, ok2 := hexDigit(tok[4])
	return hi<<4 | lo, ok1 && ok2
}

func hexDigit(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

func (b *byteFallbackStage) push(tok string, next func(string)) {
	if b.fused {
		b.whole.WriteString(tok)
		return
	}
	if c, ok := parseByteToken(tok); ok {
		b.pending = append(b.pending, c)
		return
	}
	b.flush(next)
	next(tok)
}

func (b *byteFallbackStage) flush(next func(string)) {
	if b.fused {
		whole := b.whole.String()
		b.whole.Reset()
		if c, ok := parseByteToken(whole); ok {
			b.pending = append(b.pending, c)
		} else if whole != "" {
			next(whole)
		}
	}
	if len(b.pending) == 0 {
		return
	}
	if utf8.Valid(b.pending) {
		next(string(b.pending))
	} else {
		for range b.pending {
			next("\uFFFD")
		}
	}
	b.pending = b.pending[:0]
}

// stripStage removes up to start leading and stop trailing content runes
// from each token (fused: from the whole stream).
type stripStage struct {
	content     rune
	start, stop int
	fused       bool

	stripped int    // fused: leading runes removed so far
	leadDone bool   // fused: a rune other than content has been seen
	tail     []rune // fused: trailing content runes held back
}

func (s *stripStage) push(tok string, next func(string)) {
	if !s.fused {
		next(stripRunes(tok, s.content, s.start, s.stop))
		return
	}
	var out []rune
	for _, r := range tok {
		if !s.leadDone {
			if r == s.content && s.stripped < s.start {
				s.stripped++
				continue
			}
			s.leadDone = true
		}
		if s.stop > 0 && r == s.content {
			s.tail = append(s.tail, r)
			continue
		}
		out = append(out, s.tail...)
		s.tail = s.tail[:0]
		out = append(out, r)
	}
	if len(out) > 0 {
		next(string(out))
	}
}

func (s *stripStage) flush(next func(string)) {
	if n := len(s.tail) - s.stop; n > 0 {
		next(string(s.tail[:n]))
	}
	s.tail = s.tail[:0]
}

func stripRunes(tok string, content rune, start, stop int) string {
	rs := []rune(tok)
	a := 0
	for a < len(rs) && a < start && rs[a] == content {
		a++
	}
	b := len(rs)
	for k := 0; k < stop && b > 0 && rs[b-1] == content; k++ {
		b--
	}
	if a >= b {
		return ""
	}
	return string(rs[a:b])
}

// metaspaceStage turns the replacement rune back into spaces, dropping
// every one in the first token unless the scheme is "never" (HF drops them
// all there, not just a leading one).
type metaspaceStage struct {
	repl   rune
	scheme prependScheme
	fused  bool
	index  int
}

func (m *metaspaceStage) push(tok string, next func(string)) {
	first := m.index == 0 && m.scheme != prependNever
	if !m.fused {
		m.index++
	}
	var b strings.Builder
	b.Grow(len(tok))
	for _, r := range tok {
		switch {
		case r != m.repl:
			b.WriteRune(r)
		case !first:
			b.WriteByte(' ')
		}
	}
	next(b.String())
}

func (m *metaspaceStage) flush(func(string)) {}

type joinSpaceStage struct{ started bool }

func (j *joinSpaceStage) push(tok string, next func(string)) {
	if j.started {
		next(" ")
	}
	j.started = true
	next(tok)
}

func (j *joinSpaceStage) flush(func(string)) {}

// Decoder turns generated ids into text incrementally. Add returns only
// text that no later id can change: never part of a UTF-8 sequence, never a
// byte-token run that is still open, never a space a Strip could still
// remove. The concatenation of everything Add and Flush return equals
// Decode of all the ids. A Decoder is not safe for concurrent use.
type Decoder struct {
	t           *Tokenizer
	skipSpecial bool
	stages      []stage
	nexts       []func(string) // nexts[k] feeds stage k
	out         strings.Builder
}

// NewDecoder returns a streaming decoder for t.
func NewDecoder(t *Tokenizer, skipSpecial bool) *Decoder {
	d := &Decoder{t: t, skipSpecial: skipSpecial}
	d.reset()
	return d
}

// reset gives the decoder fresh stage states.
func (d *Decoder) reset() {
	d.stages = d.stages[:0]
	fused := false
	for _, st := range d.t.decoder {
		d.stages = append(d.stages, st.newStage(fused))
		fused = fused || st.fusesOutput()
	}
	d.nexts = make([]func(string), len(d.stages)+1)
	d.nexts[len(d.stages)] = func(s string) { d.out.WriteString(s) }
	for k := len(d.stages) - 1; k >= 0; k-- {
		st, next := d.stages[k], d.nexts[k+1]
		d.nexts[k] = func(s string) { st.push(s, next) }
	}
}

// Add feeds one id and returns the text it completes (often "").
func (d *Decoder) Add(id TokenID) (string, error) {
	if id < 0 || int(id) >= len(d.t.pieces) || !d.t.known[id] {
		return "", fmt.Errorf("decode: token id %d out of range [0, %d)", id, len(d.t.pieces))
	}
	if d.skipSpecial && d.t.special[id] {
		return "", nil
	}
	d.nexts[0](d.t.pieces[id])
	return d.take(), nil
}

// Flush ends the stream and returns the text still held back. The Decoder
// can be reused for a new stream afterwards.
func (d *Decoder) Flush() string {
	for k, st := range d.stages {
		st.flush(d.nexts[k+1])
	}
	s := d.take()
	d.reset()
	return s
}

func (d *Decoder) take() string {
	s := d.out.String()
	d.out.Reset()
	return s
}

// Decode turns ids into text. With skipSpecial, special added tokens (BOS,
// EOS, <|im_end|>, ...) are left out; other added tokens stay. Ids outside
// the vocabulary are an error.
func (t *Tokenizer) Decode(ids []TokenID, skipSpecial bool) (string, error) {
	d := NewDecoder(t, skipSpecial)
	var b strings.Builder
	for _, id := range ids {
		s, err := d.Add(id)
		if err != nil {
			return "", err
		}
		b.WriteString(s)
	}
	b.WriteString(d.Flush())
	return b.String(), nil
}
