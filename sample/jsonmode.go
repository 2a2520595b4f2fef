package sample

import "math"

var negInf = float32(math.Inf(-1))

// JSON mode (response_format json_object): the output must be one JSON
// object. JSONState is an incremental syntax checker over output bytes; a
// JSONConstraint masks every token whose text would leave the output no
// longer a prefix of valid JSON, and allows EOS only once the object is
// complete. After it is complete, only EOS may follow.

// jsonCtx is what the checker expects next.
type jsonCtx uint8

const (
	ctxValue      jsonCtx = iota // a value (after ':' or ',' in an array, or the top)
	ctxValueOrEnd                // a value or ']' (right after '[')
	ctxKeyOrEnd                  // a key string or '}' (right after '{')
	ctxKey                       // a key string (after ',' in an object)
	ctxColon                     // ':' after a key
	ctxCommaOrEnd                // ',' or the closing bracket after a value
	ctxDone                      // the top-level value is complete
)

// JSONState is a position in a JSON text. The zero value expects the
// top-level value; TopObject restricts it to an object. It is a value:
// copying it forks the state (Stack is copied on write).
type JSONState struct {
	TopObject bool
	stack     []byte // open containers, '{' or '['
	ctx       jsonCtx
	inString  bool
	isKey     bool   // the string being read is an object key
	escape    int8   // 0 none; 1 after '\'; 2..5 hex digits of \u left+1
	literal   string // rest of true/false/null being matched
	number    uint8  // number state, 0: not in a number
}

// Number states.
const (
	numNone      = iota
	numMinus     // after '-'
	numZero      // a leading 0
	numInt       // digits
	numDot       // after '.'
	numFrac      // fraction digits
	numExp       // after 'e'
	numExpSign   // after 'e+' or 'e-'
	numExpDigits // exponent digits
)

// numberCanEnd reports whether a number may end in state n.
func numberCanEnd(n uint8) bool {
	return n == numZero || n == numInt || n == numFrac || n == numExpDigits
}

// Complete reports whether the top-level value is complete. (A top-level
// bare number is complete only once a byte after it ends it.)
func (s *JSONState) Complete() bool { return s.ctx == ctxDone }

// Feed advances the state over text; false means text makes the output
// invalid JSON (the state is then unspecified).
func (s *JSONState) Feed(text string) bool {
	for i := 0; i < len(text); i++ {
		if !s.byte(text[i]) {
			return false
		}
	}
	return true
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func (s *JSONState) byte(c byte) bool {
	if s.inString {
		return s.stringByte(c)
	}
	if s.literal != "" {
		if c != s.literal[0] {
			return false
		}
		s.literal = s.literal[1:]
		if s.literal == "" {
			s.valueDone()
		}
		return true
	}
	if s.number != numNone {
		if s.numberByte(c) {
			return true
		}
		if !numberCanEnd(s.number) {
			return false
		}
		s.number = numNone
		s.valueDone()
		// c ends the number; read it as the next token.
	}
	if isSpace(c) {
		return true
	}
	switch s.ctx {
	case ctxDone:
		return false
	case ctxColon:
		if c != ':' {
			return false
		}
		s.ctx = ctxValue
		return true
	case ctxCommaOrEnd:
		top := s.stack[len(s.stack)-1]
		switch {
		case c == ',' && top == '{':
			s.ctx = ctxKey
		case c == ',' && top == '[':
			s.ctx = ctxValue
		case c == '}' && top == '{', c == ']' && top == '[':
			s.stack = s.stack[:len(s.stack)-1]
			s.valueDone()
		default:
			return false
		}
		return true
	case ctxKeyOrEnd, ctxKey:
		switch {
		case c == '"':
			s.inString, s.isKey = true, true
		case c == '}' && s.ctx == ctxKeyOrEnd:
			s.stack = s.stack[:len(s.stack)-1]
			s.valueDone()
		default:
			return false
		}
		return true
	}
	// ctxValue or ctxValueOrEnd: a value starts here.
	if c == ']' && s.ctx == ctxValueOrEnd {
		s.stack = s.stack[:len(s.stack)-1]
		s.valueDone()
		return true
	}
	if s.TopObject && len(s.stack) == 0 && c != '{' {
		return false
	}
	switch {
	case c == '{':
		s.push('{')
		s.ctx = ctxKeyOrEnd
	case c == '[':
		s.push('[')
		s.ctx = ctxValueOrEnd
	case c == '"':
		s.inString, s.isKey = true, false
	case c == 't':
		s.literal = "rue"
	case c == 'f':
		s.literal = "alse"
	case c == 'n':
		s.literal = "ull"
	case c == '-':
		s.number = numMinus
	case c == '0':
		s.number = numZero
	case c >= '1' && c <= '9':
		s.number = numInt
	default:
		return false
	}
	return true
}

// push opens a container; the stack is copied so forks do not share it.
func (s *JSONState) push(c byte) {
	st := make([]byte, len(s.stack), len(s.stack)+1)
	copy(st, s.stack)
	s.stack = append(st, c)
}

// valueDone moves past a completed value.
func (s *JSONState) valueDone() {
	if len(s.stack) == 0 {
		s.ctx = ctxDone
		return
	}
	s.ctx = ctxCommaOrEnd
}

func (s *JSONState) stringByte(c byte) bool {
	switch {
	case s.escape == 1:
		switch c {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			s.escape = 0
		case 'u':
			s.escape = 5
		default:
			return false
		}
		return true
	case s.escape > 1:
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
		s.escape--
		if s.escape == 1 {
			s.escape = 0
		}
		return true
	case c == '\\':
		s.escape = 1
		return true
	case c == '"':
		s.inString = false
		if s.isKey {
			s.ctx = ctxColon
		} else {
			s.valueDone()
		}
		return true
	case c < 0x20:
		return false // control characters must be escaped
	}
	return true
}

func (s *JSONState) numberByte(c byte) bool {
	digit := c >= '0' && c <= '9'
	switch s.number {
	case numMinus:
		switch {
		case c == '0':
			s.number = numZero
		case digit:
			s.number = numInt
		default:
			return false
		}
	case numZero, numInt:
		switch {
		case digit && s.number == numInt:
		case c == '.':
			s.number = numDot
		case c == 'e' || c == 'E':
			s.number = numExp
		default:
			return false
		}
	case numDot:
		if !digit {
			return false
		}
		s.number = numFrac
	case numFrac:
		switch {
		case digit:
		case c == 'e' || c == 'E':
			s.number = numExp
		default:
			return false
		}
	case numExp:
		switch {
		case c == '+' || c == '-':
			s.number = numExpSign
		case digit:
			s.number = numExpDigits
		default:
			return false
		}
	case numExpSign:
		if !digit {
			return false
		}
		s.number = numExpDigits
	case numExpDigits:
		if !digit {
			return false
		}
	}
	return true
}

// JSONConstraint keeps a request's output one JSON object (OpenAI's
// json_object response format).
type JSONConstraint struct {
	state JSONState
	texts []string // token id -> bytes it adds to the output; "" for special tokens
	eos   map[int32]bool
}

// NewJSONConstraint builds a constraint over a vocabulary: texts[id] is the
// bytes token id adds to the output, "" for special tokens, which are never
// allowed except as EOS. texts is shared, not copied.
func NewJSONConstraint(texts []string, eos []int32) *JSONConstraint {
	c := &JSONConstraint{state: JSONState{TopObject: true}, texts: texts, eos: map[int32]bool{}}
	for _, id := range eos {
		c.eos[id] = true
	}
	return c
}

// Mask sets to -Inf the logits of tokens that would break the JSON, and of
// EOS until the object is complete.
func (c *JSONConstraint) Mask(logits []float32) {
	complete := c.state.Complete()
	for id := range logits {
		if c.eos[int32(id)] {
			if !complete {
				logits[id] = negInf
			}
			continue
		}
		if complete || id >= len(c.texts) || c.texts[id] == "" {
			logits[id] = negInf
			continue
		}
		s := c.state
		if !s.Feed(c.texts[id]) {
			logits[id] = negInf
		}
	}
}

// Accept advances the constraint over a sampled token.
func (c *JSONConstraint) Accept(id int32) {
	if c.eos[id] || int(id) >= len(c.texts) {
		return
	}
	c.state.Feed(c.texts[id])
}

// Complete reports whether the output is a whole JSON object.
func (c *JSONConstraint) Complete() bool { return c.state.Complete() }
