package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"

	"github.com/trigon-llm/trigon/sample"
)

// Limits fixed by the OpenAI API rather than by the deployment.
const (
	maxTopLogprobs = 20 // OpenAI's top_logprobs bound; vLLM's default max_logprobs
	// defaultCompletionMaxTokens is the legacy completions default (OpenAI
	// and vLLM both use 16 when max_tokens is omitted).
	defaultCompletionMaxTokens = 16
)

// commonFields are the request fields shared by both generation endpoints.
// Pointers distinguish "absent or null" from zero, so defaults apply only to
// what the client left out. Unknown fields (user, metadata, store, ...) are
// ignored by encoding/json; known fields with a wrong type fail decoding.
type commonFields struct {
	Model            string             `json:"model"`
	Stream           bool               `json:"stream"`
	StreamOptions    *streamOptions     `json:"stream_options"`
	N                *jsonInt           `json:"n"`
	Temperature      *float64           `json:"temperature"`
	TopP             *float64           `json:"top_p"`
	PresencePenalty  *float64           `json:"presence_penalty"`
	FrequencyPenalty *float64           `json:"frequency_penalty"`
	Seed             *jsonInt           `json:"seed"`
	Stop             json.RawMessage    `json:"stop"`
	MaxTokens        *jsonInt           `json:"max_tokens"`
	LogitBias        map[string]float64 `json:"logit_bias"`
	ResponseFormat   *responseFormat    `json:"response_format"`

	// vLLM extensions, widely used by clients of open-model servers.
	TopK              *jsonInt  `json:"top_k"`
	MinP              *float64  `json:"min_p"`
	RepetitionPenalty *float64  `json:"repetition_penalty"`
	MinTokens         *jsonInt  `json:"min_tokens"`
	IgnoreEOS         bool      `json:"ignore_eos"`
	StopTokenIDs      []jsonInt `json:"stop_token_ids"`
	SkipSpecialTokens *bool     `json:"skip_special_tokens"`
	AddSpecialTokens  *bool     `json:"add_special_tokens"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type responseFormat struct {
	Type string `json:"type"`
}

// completionRequest is the body of POST /v1/completions.
type completionRequest struct {
	commonFields
	Prompt   json.RawMessage `json:"prompt"`
	Logprobs *jsonInt        `json:"logprobs"`
	Echo     bool            `json:"echo"`
	Suffix   *string         `json:"suffix"`
	BestOf   *jsonInt        `json:"best_of"`
}

// chatRequest is the body of POST /v1/chat/completions.
type chatRequest struct {
	commonFields
	Messages            []chatMessageIn `json:"messages"`
	MaxCompletionTokens *jsonInt        `json:"max_completion_tokens"`
	Logprobs            *bool           `json:"logprobs"`
	TopLogprobs         *jsonInt        `json:"top_logprobs"`
	Tools               json.RawMessage `json:"tools"`
	ToolChoice          json.RawMessage `json:"tool_choice"`
	AddGenerationPrompt *bool           `json:"add_generation_prompt"`
}

type chatMessageIn struct {
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	ToolCalls json.RawMessage `json:"tool_calls"`
}

type contentPart struct {
	Type string  `json:"type"`
	Text *string `json:"text"`
}

// jsonInt is an integer request field. It takes a JSON number with no
// fractional part, 16 as well as 16.0 or 1.6e1, as vLLM's pydantic models
// do in lax mode; a number with one (16.5), one past int64, and any other
// JSON value are refused with the *json.UnmarshalTypeError encoding/json
// gives for an int64 field, so that decodeJSON names the field as before.
// null leaves the field as it is (a pointer field nil).
type jsonInt int64

func (n *jsonInt) UnmarshalJSON(b []byte) error {
	s := string(bytes.TrimSpace(b))
	if s == "null" {
		return nil
	}
	refuse := func(value string) error {
		return &json.UnmarshalTypeError{Value: value, Type: reflect.TypeFor[jsonInt]()}
	}
	if s == "" || (s[0] != '-' && (s[0] < '0' || s[0] > '9')) {
		// Not a number: encoding/json's names of the JSON kinds.
		switch rawKind(b) {
		case 's':
			return refuse("string")
		case 'a':
			return refuse("array")
		case 'o':
			return refuse("object")
		case 'b':
			return refuse("bool")
		}
		return refuse(s)
	}
	if v, err := strconv.ParseInt(s, 10, 64); err == nil {
		*n = jsonInt(v)
		return nil
	}
	// Every float64 in [-2^63, 2^63) with no fraction is an int64.
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f != math.Trunc(f) || f < -(1<<63) || f >= 1<<63 {
		return refuse("number " + s)
	}
	*n = jsonInt(f)
	return nil
}

// intPtr is an optional integer field as an *int, nil for absent.
func (n *jsonInt) intPtr() *int {
	if n == nil {
		return nil
	}
	v := int(*n)
	return &v
}

// decodeJSON unmarshals a request body, turning decoder errors into 400s
// that name the field and the expected type.
func decodeJSON(body []byte, v any) *Error {
	if len(bytes.TrimSpace(body)) == 0 {
		return badRequest("", "the request body is empty; expected a JSON object")
	}
	err := json.Unmarshal(body, v)
	if err == nil {
		return nil
	}
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te):
		if te.Field == "" {
			return badRequest("", "the request body must be a JSON object, got JSON %s", te.Value)
		}
		// encoding/json names fields of an embedded struct through the Go
		// type ("commonFields.temperature"); clients know only the JSON name.
		field := strings.TrimPrefix(te.Field, "commonFields.")
		return badRequest(field, "invalid type for '%s': expected %s, got JSON %s",
			field, jsonTypeName(te.Type), te.Value)
	case errors.As(err, &se):
		return badRequest("", "the request body is not valid JSON (at byte %d): %s", se.Offset, se.Error())
	}
	return badRequest("", "the request body is not valid JSON: %s", err.Error())
}

// jsonTypeName names a Go type the way a JSON client thinks of it.
func jsonTypeName(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct:
		return "an object"
	}
	return t.String()
}

// isNull reports whether a raw field is absent or JSON null.
func isNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || bytes.Equal(t, []byte("null"))
}

// rawKind returns the JSON kind of a present, non-null raw value.
func rawKind(raw json.RawMessage) byte {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 {
		return 0
	}
	switch c := t[0]; {
	case c == '"':
		return 's'
	case c == '[':
		return 'a'
	case c == '{':
		return 'o'
	case c == 't' || c == 'f':
		return 'b'
	case c == 'n':
		return 'n'
	default:
		return '0'
	}
}

func rangeErr(param string, lo, hi, got float64) *Error {
	return badRequest(param, "'%s' must be between %g and %g, got %g", param, lo, hi, got)
}

// positiveFloat32 converts a positive value for the engine, which computes
// in float32. A value below float32's smallest positive number would round
// to 0, which is outside the range the client was held to (top_p and
// repetition_penalty must be above 0) and which the engine refuses; it
// becomes that smallest number instead, the nearest the engine can take.
func positiveFloat32(v float64) float32 {
	f := float32(v)
	if f == 0 && v > 0 {
		return math.SmallestNonzeroFloat32
	}
	return f
}

// sampling validates the shared fields into SamplingParams. maxTokens is
// resolved by the caller (the defaults differ per endpoint); n is returned.
func (s *Server) sampling(c *commonFields) (SamplingParams, int, *Error) {
	p := SamplingParams{
		Temperature:       1,
		TopP:              1,
		RepetitionPenalty: 1,
		SkipSpecialTokens: true,
		IgnoreEOS:         c.IgnoreEOS,
	}
	if c.Temperature != nil {
		if t := *c.Temperature; t < 0 || t > 2 {
			return p, 0, rangeErr("temperature", 0, 2, t)
		}
		p.Temperature = float32(*c.Temperature)
	}
	if c.TopP != nil {
		if t := *c.TopP; t <= 0 || t > 1 {
			return p, 0, badRequest("top_p", "'top_p' must be in (0, 1], got %g", t)
		}
		p.TopP = positiveFloat32(*c.TopP)
	}
	if c.TopK != nil {
		switch k := int(*c.TopK); {
		case k == -1 || k == 0:
			p.TopK = 0
		case k > 0:
			p.TopK = k
		default:
			return p, 0, badRequest("top_k", "'top_k' must be -1 or 0 (disabled) or a positive integer, got %d", k)
		}
	}
	if c.MinP != nil {
		if t := *c.MinP; t < 0 || t > 1 {
			return p, 0, rangeErr("min_p", 0, 1, t)
		}
		p.MinP = float32(*c.MinP)
	}
	if c.PresencePenalty != nil {
		if t := *c.PresencePenalty; t < -2 || t > 2 {
			return p, 0, rangeErr("presence_penalty", -2, 2, t)
		}
		p.PresencePenalty = float32(*c.PresencePenalty)
	}
	if c.FrequencyPenalty != nil {
		if t := *c.FrequencyPenalty; t < -2 || t > 2 {
			return p, 0, rangeErr("frequency_penalty", -2, 2, t)
		}
		p.FrequencyPenalty = float32(*c.FrequencyPenalty)
	}
	if c.RepetitionPenalty != nil {
		// vLLM only asks for > 0; 10 bounds it so float32 stays sane.
		if t := *c.RepetitionPenalty; t <= 0 || t > 10 {
			return p, 0, badRequest("repetition_penalty", "'repetition_penalty' must be in (0, 10], got %g", t)
		}
		p.RepetitionPenalty = positiveFloat32(*c.RepetitionPenalty)
	}
	if c.Seed != nil {
		// Any int64 is accepted (as in OpenAI and vLLM); negative seeds keep
		// their bit pattern.
		seed := uint64(*c.Seed)
		p.Seed = &seed
	}
	n := 1
	if c.N != nil {
		n = int(*c.N)
		if n < 1 || n > s.opts.MaxN {
			return p, 0, badRequest("n", "'n' must be between 1 and %d, got %d", s.opts.MaxN, n)
		}
	}
	if c.MinTokens != nil {
		if *c.MinTokens < 0 {
			return p, 0, badRequest("min_tokens", "'min_tokens' must be >= 0, got %d", *c.MinTokens)
		}
		p.MinTokens = int(*c.MinTokens)
	}
	if c.SkipSpecialTokens != nil {
		p.SkipSpecialTokens = *c.SkipSpecialTokens
	}
	stop, err := s.stopStrings(c.Stop)
	if err != nil {
		return p, 0, err
	}
	p.Stop = stop
	if len(c.StopTokenIDs) > s.opts.MaxStopTokenIDs {
		return p, 0, badRequest("stop_token_ids", "at most %d 'stop_token_ids' are allowed, got %d",
			s.opts.MaxStopTokenIDs, len(c.StopTokenIDs))
	}
	for i, id := range c.StopTokenIDs {
		tid, e := s.tokenID(int64(id), fmt.Sprintf("stop_token_ids[%d]", i))
		if e != nil {
			return p, 0, e
		}
		p.StopTokenIDs = append(p.StopTokenIDs, tid)
	}
	if len(c.LogitBias) > 0 {
		return p, 0, badRequest("logit_bias", "'logit_bias' is not supported by this server")
	}
	if rf := c.ResponseFormat; rf != nil {
		switch rf.Type {
		case "", "text":
		case "json_object":
			p.JSONObject = true
		case "json_schema":
			// Honest refusal: the engine constrains output to a JSON object,
			// not to a schema, and a client asking for one relies on it.
			return p, 0, badRequest("response_format.type",
				"response_format type 'json_schema' is not supported: the server can constrain output to a JSON object (json_object) but not to a schema")
		default:
			return p, 0, badRequest("response_format.type",
				"'response_format.type' must be one of text, json_object, json_schema, got '%s'", rf.Type)
		}
	}
	if c.StreamOptions != nil && !c.Stream {
		return p, 0, badRequest("stream_options", "'stream_options' is only allowed when 'stream' is true")
	}
	return p, n, nil
}

// stopStrings validates "stop": a string, an array of strings, or null.
func (s *Server) stopStrings(raw json.RawMessage) ([]string, *Error) {
	if isNull(raw) {
		return nil, nil
	}
	var list []string
	switch rawKind(raw) {
	case 's':
		var one string
		if err := json.Unmarshal(raw, &one); err != nil {
			return nil, badRequest("stop", "'stop' is not a valid JSON string")
		}
		list = []string{one}
	case 'a':
		if err := json.Unmarshal(raw, &list); err != nil {
			return nil, badRequest("stop", "'stop' must be a string or an array of strings")
		}
	default:
		return nil, badRequest("stop", "'stop' must be a string or an array of strings")
	}
	if len(list) > s.opts.MaxStopStrings {
		return nil, badRequest("stop", "at most %d stop strings are allowed, got %d", s.opts.MaxStopStrings, len(list))
	}
	for i, st := range list {
		if st == "" {
			return nil, badRequest(fmt.Sprintf("stop[%d]", i), "stop strings must not be empty")
		}
		if len(st) > s.opts.MaxStopStringBytes {
			return nil, badRequest(fmt.Sprintf("stop[%d]", i), "stop strings must be at most %d bytes, got %d",
				s.opts.MaxStopStringBytes, len(st))
		}
	}
	return list, nil
}

// tokenID checks that a client-supplied id is in the vocabulary.
func (s *Server) tokenID(id int64, param string) (int32, *Error) {
	if id < 0 || id > math.MaxInt32 {
		return 0, badRequest(param, "token id %d is out of range", id)
	}
	if _, ok := s.opts.Tokenizer.TokenString(int32(id)); !ok {
		return 0, badRequest(param, "token id %d is not in the vocabulary", id)
	}
	return int32(id), nil
}

// tokenIDs decodes and checks a JSON array of token ids.
func (s *Server) tokenIDs(raw json.RawMessage, param string) ([]int32, *Error) {
	var ids []jsonInt
	if err := json.Unmarshal(raw, &ids); err != nil {
		return nil, badRequest(param, "'%s' must be an array of integer token ids", param)
	}
	out := make([]int32, len(ids))
	for i, id := range ids {
		t, e := s.tokenID(int64(id), fmt.Sprintf("%s[%d]", param, i))
		if e != nil {
			return nil, e
		}
		out[i] = t
	}
	return out, nil
}

// checkModel accepts an omitted model or the served one, and answers 404
// for any other name, as vLLM and OpenAI do: a client that asks for a model
// this server does not have should learn so rather than get another one.
func (s *Server) checkModel(name string) *Error {
	if name == "" || name == s.opts.Model.ID {
		return nil
	}
	return &Error{Status: 404, Type: typeNotFound, Param: "model", Code: "model_not_found",
		Message: fmt.Sprintf("The model '%s' does not exist.", name)}
}

// resolveMaxTokens resolves max_tokens by sample.LengthRule (the one
// rule of the output length; the engine applies it again to what it is
// handed) with this endpoint's default and the server's cap, and words its
// refusals as vLLM does: an explicit value over the cap or the context is
// rejected, not clamped, so the client learns its request cannot be served
// as asked; a default shrinks to what fits. promptParam names what holds
// the prompt ("prompt" or "messages"): a context-length error says it,
// with the numbers.
func (s *Server) resolveMaxTokens(explicit *int, param string, def int, promptLen, minTokens int, promptParam string) (int, *Error) {
	rule := sample.LengthRule{Context: s.opts.Model.MaxContext, Default: def, Cap: s.opts.MaxTokensCap}
	mt, err := rule.MaxTokens(explicit, promptLen, minTokens)
	if err == nil {
		return mt, nil
	}
	var le *sample.LengthError
	if !errors.As(err, &le) {
		return 0, badRequest(param, "'%s': %v", param, err)
	}
	switch le.Problem {
	case sample.MaxTokensTooSmall:
		return 0, badRequest(param, "'%s' must be at least 1, got %d", param, le.MaxTokens)
	case sample.MaxTokensOverCap:
		return 0, badRequest(param, "'%s' must be at most %d, got %d", param, rule.Cap, le.MaxTokens)
	case sample.MinTokensOverMax:
		return 0, badRequest("min_tokens", "'min_tokens' (%d) must not exceed the maximum number of tokens (%d)", minTokens, le.MaxTokens)
	}
	// The context is exceeded: "your prompt has N tokens" / "your messages
	// have N tokens".
	has := fmt.Sprintf("your prompt has %d tokens", promptLen)
	if promptParam == "messages" {
		has = fmt.Sprintf("your messages have %d tokens", promptLen)
	}
	tooLong := &Error{Status: 400, Type: typeInvalidRequest, Param: promptParam, Code: "context_length_exceeded"}
	if room := rule.Context - promptLen; explicit != nil && room >= 1 {
		tooLong.Message = fmt.Sprintf("'%s' is too large: %d. This model's maximum context length is %d tokens and %s (%d > %d - %d). Please reduce the length of the %s or '%s'.",
			param, le.MaxTokens, rule.Context, has, le.MaxTokens, rule.Context, promptLen, promptParam, param)
		return 0, tooLong
	}
	// The prompt alone leaves no room for the least completion.
	tooLong.Message = fmt.Sprintf("This model's maximum context length is %d tokens. However, %s, which leaves %d for the completion (at least %d needed). Please reduce the length of the %s.",
		rule.Context, has, max(rule.Context-promptLen, 0), max(1, minTokens), promptParam)
	return 0, tooLong
}

// chatMessages validates messages and flattens their content to text.
func chatMessages(in []chatMessageIn) ([]ChatMessage, *Error) {
	if len(in) == 0 {
		return nil, badRequest("messages", "'messages' must be a non-empty array")
	}
	out := make([]ChatMessage, len(in))
	for i, m := range in {
		param := fmt.Sprintf("messages[%d]", i)
		role := m.Role
		switch role {
		case "system", "user", "assistant":
		case "developer":
			role = "system" // OpenAI's newer name for system instructions
		case "tool", "function":
			return nil, badRequest(param+".role", "role '%s' is not supported: this server does not support tool calls", role)
		case "":
			return nil, badRequest(param+".role", "'%s.role' is required", param)
		default:
			return nil, badRequest(param+".role", "'%s.role' must be one of system, developer, user, assistant, got '%s'", param, role)
		}
		if !isNull(m.ToolCalls) && !bytes.Equal(bytes.TrimSpace(m.ToolCalls), []byte("[]")) {
			return nil, badRequest(param+".tool_calls", "tool calls are not supported by this server")
		}
		text, err := messageContent(m.Content, param+".content", role)
		if err != nil {
			return nil, err
		}
		out[i] = ChatMessage{Role: role, Content: text}
	}
	return out, nil
}

// messageContent accepts a string, an array of text parts, or (for the
// assistant) null.
func messageContent(raw json.RawMessage, param, role string) (string, *Error) {
	switch rawKind(raw) {
	case 0, 'n':
		if role == "assistant" {
			return "", nil
		}
		return "", badRequest(param, "'%s' is required", param)
	case 's':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", badRequest(param, "'%s' is not a valid JSON string", param)
		}
		return s, nil
	case 'a':
		var parts []contentPart
		if err := json.Unmarshal(raw, &parts); err != nil {
			return "", badRequest(param, "'%s' must be a string or an array of content parts", param)
		}
		var b strings.Builder
		for j, p := range parts {
			if p.Type != "text" {
				return "", badRequest(fmt.Sprintf("%s[%d].type", param, j),
					"content part type '%s' is not supported: this server accepts text only", p.Type)
			}
			if p.Text == nil {
				return "", badRequest(fmt.Sprintf("%s[%d].text", param, j), "a text content part needs 'text'")
			}
			// Parts are joined with a newline, as vLLM does for text parts.
			if j > 0 {
				b.WriteByte('\n')
			}
			b.WriteString(*p.Text)
		}
		return b.String(), nil
	}
	return "", badRequest(param, "'%s' must be a string or an array of content parts", param)
}

// checkTools rejects tool use honestly: the server has no tool-call parser.
func checkTools(tools, choice json.RawMessage) *Error {
	if !isNull(tools) && !bytes.Equal(bytes.TrimSpace(tools), []byte("[]")) {
		return badRequest("tools", "'tools' are not supported by this server")
	}
	if isNull(choice) {
		return nil
	}
	var s string
	if json.Unmarshal(choice, &s) == nil && (s == "none" || s == "auto") {
		return nil
	}
	return badRequest("tool_choice", "'tool_choice' is not supported by this server")
}
