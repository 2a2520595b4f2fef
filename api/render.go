package api

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Response shapes of OpenAI's API. Field order follows OpenAI's so that raw
// output reads the same; nullable fields are pointers without omitempty.

type usageJSON struct {
	PromptTokens        int                 `json:"prompt_tokens"`
	CompletionTokens    int                 `json:"completion_tokens"`
	TotalTokens         int                 `json:"total_tokens"`
	PromptTokensDetails *promptTokenDetails `json:"prompt_tokens_details,omitempty"`
}

type promptTokenDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// Completions (legacy) shapes.

type completionResponse struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"` // "text_completion"
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []completionChoice `json:"choices"`
	// Usage is the usage object, "null" on intermediate chunks when the
	// client asked for stream_options.include_usage, absent otherwise.
	Usage json.RawMessage `json:"usage,omitempty"`
}

type completionChoice struct {
	Index        int             `json:"index"`
	Text         string          `json:"text"`
	Logprobs     *legacyLogprobs `json:"logprobs"`
	FinishReason *string         `json:"finish_reason"`
}

// legacyLogprobs is the completions logprobs object: parallel arrays, with
// top_logprobs as one {token: logprob} object per position.
type legacyLogprobs struct {
	Tokens        []string       `json:"tokens"`
	TokenLogprobs []logprobValue `json:"token_logprobs"`
	TopLogprobs   []orderedTop   `json:"top_logprobs"`
	TextOffset    []int          `json:"text_offset"`
}

// orderedTop is a {token: logprob} object written most likely first
// (a Go map would sort keys alphabetically). A key that repeats keeps its
// first, most likely entry, as JSON object keys must be unique. Keys are
// compared as the client reads them: distinct tokens holding parts of a
// UTF-8 sequence all read as U+FFFD.
type orderedTop []topEntry

type topEntry struct {
	token string
	lp    logprobValue
}

func (o orderedTop) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	seen := make(map[string]bool, len(o))
	for _, e := range o {
		key := validUTF8(e.token)
		if seen[key] {
			continue
		}
		if len(seen) > 0 {
			b.WriteByte(',')
		}
		seen[key] = true
		k, err := marshal(key)
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		v, _ := e.lp.MarshalJSON()
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// validUTF8 returns s with each byte that is not part of a valid UTF-8
// sequence replaced by U+FFFD, as encoding/json writes such a string.
func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b.WriteRune(utf8.RuneError)
		} else {
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// logprobValue prints a float32 log-probability in its shortest form.
// JSON has no -Inf, so an impossible token is written as -9999 (vLLM's
// convention), which clients treat as "never".
type logprobValue float32

func (v logprobValue) MarshalJSON() ([]byte, error) {
	f := float64(v)
	if math.IsInf(f, 0) || math.IsNaN(f) || f < -9999 {
		f = -9999
	}
	return strconv.AppendFloat(nil, f, 'g', -1, 32), nil
}

// Chat shapes.

type chatResponse struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"` // "chat.completion"
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []chatChoice `json:"choices"`
	Usage   usageJSON    `json:"usage"`
}

type chatChoice struct {
	Index        int            `json:"index"`
	Message      chatMessageOut `json:"message"`
	Logprobs     *chatLogprobs  `json:"logprobs"`
	FinishReason string         `json:"finish_reason"`
}

type chatMessageOut struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type chatChunk struct {
	ID      string            `json:"id"`
	Object  string            `json:"object"` // "chat.completion.chunk"
	Created int64             `json:"created"`
	Model   string            `json:"model"`
	Choices []chatChunkChoice `json:"choices"`
	Usage   json.RawMessage   `json:"usage,omitempty"`
}

type chatChunkChoice struct {
	Index        int           `json:"index"`
	Delta        chatDelta     `json:"delta"`
	Logprobs     *chatLogprobs `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"`
}

type chatDelta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

type chatLogprobs struct {
	Content []chatTokenLogprob `json:"content"`
}

type chatTokenLogprob struct {
	Token       string           `json:"token"`
	Logprob     logprobValue     `json:"logprob"`
	Bytes       []int            `json:"bytes"`
	TopLogprobs []chatTopLogprob `json:"top_logprobs"`
}

type chatTopLogprob struct {
	Token   string       `json:"token"`
	Logprob logprobValue `json:"logprob"`
	Bytes   []int        `json:"bytes"`
}

// tokenText renders a token for logprobs. The string may hold a partial
// UTF-8 sequence; JSON encoding shows those bytes as U+FFFD while "bytes"
// keeps them exact, which is what the bytes field is for.
func (s *Server) tokenText(id int32) (string, []int) {
	t, _ := s.opts.Tokenizer.TokenString(id)
	b := make([]int, len(t))
	for i := 0; i < len(t); i++ {
		b[i] = int(t[i])
	}
	return t, b
}

// chatLogprobsFor renders the chat logprobs of a run of tokens.
func (s *Server) chatLogprobsFor(lps []TokenLogprob, topN int) *chatLogprobs {
	out := &chatLogprobs{Content: make([]chatTokenLogprob, len(lps))}
	for i, lp := range lps {
		tok, b := s.tokenText(lp.ID)
		e := chatTokenLogprob{Token: tok, Logprob: logprobValue(lp.Logprob), Bytes: b,
			TopLogprobs: make([]chatTopLogprob, 0, min(topN, len(lp.Top)))}
		for _, t := range lp.Top[:min(topN, len(lp.Top))] {
			tt, tb := s.tokenText(t.ID)
			e.TopLogprobs = append(e.TopLogprobs, chatTopLogprob{Token: tt, Logprob: logprobValue(t.Logprob), Bytes: tb})
		}
		out.Content[i] = e
	}
	return out
}

// legacyLogprobsFor renders completions logprobs of a run of tokens whose
// text starts at character offset *offset of the choice's text; it advances
// *offset. Offsets count Unicode code points (Python's len, as OpenAI's and
// vLLM's do), summed over token texts.
//
// As in vLLM, each top_logprobs object holds the topN alternatives plus the
// sampled token, so it may have topN+1 entries.
func (s *Server) legacyLogprobsFor(lps []TokenLogprob, topN int, offset *int) *legacyLogprobs {
	out := &legacyLogprobs{
		Tokens:        make([]string, len(lps)),
		TokenLogprobs: make([]logprobValue, len(lps)),
		TopLogprobs:   make([]orderedTop, len(lps)),
		TextOffset:    make([]int, len(lps)),
	}
	for i, lp := range lps {
		tok, _ := s.tokenText(lp.ID)
		out.Tokens[i] = tok
		out.TokenLogprobs[i] = logprobValue(lp.Logprob)
		out.TextOffset[i] = *offset
		*offset += utf8.RuneCountInString(tok)
		top := make(orderedTop, 0, topN+1)
		chosenIn := false
		for _, t := range lp.Top[:min(topN, len(lp.Top))] {
			tt, _ := s.tokenText(t.ID)
			top = append(top, topEntry{tt, logprobValue(t.Logprob)})
			chosenIn = chosenIn || t.ID == lp.ID
		}
		if !chosenIn {
			// Insert the sampled token where its logprob ranks it.
			at := len(top)
			for j, t := range top {
				if lp.Logprob > float32(t.lp) {
					at = j
					break
				}
			}
			top = append(top, topEntry{})
			copy(top[at+1:], top[at:])
			top[at] = topEntry{tok, logprobValue(lp.Logprob)}
		}
		out.TopLogprobs[i] = top
	}
	return out
}

// appendLegacy extends a (non-streamed) legacy logprobs object.
func (l *legacyLogprobs) appendLegacy(m *legacyLogprobs) {
	l.Tokens = append(l.Tokens, m.Tokens...)
	l.TokenLogprobs = append(l.TokenLogprobs, m.TokenLogprobs...)
	l.TopLogprobs = append(l.TopLogprobs, m.TopLogprobs...)
	l.TextOffset = append(l.TextOffset, m.TextOffset...)
}

func strPtr(s string) *string { return &s }
