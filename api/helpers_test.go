package api

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
)

const (
	testModel  = "fake-model"
	testMaxCtx = 64
)

type env struct {
	srv *Server
	eng *fakeEngine
	tok *fakeTokenizer
}

// newEnv builds a server over the fake engine; mod adjusts options.
func newEnv(t testing.TB, mod func(*Options)) *env {
	t.Helper()
	tok := newFakeTokenizer()
	eng := newFakeEngine(tok)
	opts := Options{
		Engine:    eng,
		Tokenizer: tok,
		Model:     ModelInfo{ID: testModel, MaxContext: testMaxCtx, Created: 1700000000},
		MaxN:      4,
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if mod != nil {
		mod(&opts)
	}
	srv, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return &env{srv: srv, eng: eng, tok: tok}
}

func (e *env) do(t *testing.T, method, path, body string, hdr ...string) *httptest.ResponseRecorder {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, path, r)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	rec := httptest.NewRecorder()
	e.srv.Handler().ServeHTTP(rec, req)
	return rec
}

// mustJSON marshals v for a request body.
func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// apiErr is an error body decoded strictly: exactly {"error": {message,
// type, param, code}}.
type apiErr struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func decodeError(t *testing.T, rec *httptest.ResponseRecorder) apiErr {
	t.Helper()
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("error Content-Type %q", ct)
	}
	var outer map[string]json.RawMessage
	if err := json.Unmarshal(rec.Body.Bytes(), &outer); err != nil {
		t.Fatalf("error body not JSON: %v: %s", err, rec.Body)
	}
	if len(outer) != 1 || outer["error"] == nil {
		t.Fatalf("error body must be exactly {\"error\": ...}: %s", rec.Body)
	}
	var keys map[string]json.RawMessage
	json.Unmarshal(outer["error"], &keys)
	for _, k := range []string{"message", "type", "param", "code"} {
		if _, ok := keys[k]; !ok {
			t.Errorf("error body lacks %q: %s", k, rec.Body)
		}
	}
	var e apiErr
	dec := json.NewDecoder(bytes.NewReader(outer["error"]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		t.Fatalf("error object: %v: %s", err, rec.Body)
	}
	if e.Message == "" || e.Type == "" {
		t.Errorf("error without message or type: %s", rec.Body)
	}
	return e
}

// parseSSE checks the event-stream framing strictly: only "data: <json>"
// events separated by blank lines, the last one "data: [DONE]", nothing
// after it. It returns the JSON payloads.
func parseSSE(t *testing.T, body string) []json.RawMessage {
	t.Helper()
	if strings.Contains(body, "\r") {
		t.Fatalf("stream contains CR")
	}
	if !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Fatalf("stream does not end with data: [DONE]: %q", tail(body))
	}
	blocks := strings.Split(strings.TrimSuffix(body, "\n\n"), "\n\n")
	var out []json.RawMessage
	for i, b := range blocks {
		if !strings.HasPrefix(b, "data: ") || strings.Contains(b, "\n") {
			t.Fatalf("event %d is not a single data line: %q", i, b)
		}
		payload := strings.TrimPrefix(b, "data: ")
		if i == len(blocks)-1 {
			if payload != "[DONE]" {
				t.Fatalf("last event %q, want [DONE]", payload)
			}
			break
		}
		if payload == "[DONE]" {
			t.Fatalf("[DONE] before the end (event %d)", i)
		}
		if !json.Valid([]byte(payload)) || payload[0] != '{' {
			t.Fatalf("event %d is not a JSON object: %q", i, payload)
		}
		out = append(out, json.RawMessage(payload))
	}
	return out
}

func tail(s string) string {
	if len(s) > 200 {
		return s[len(s)-200:]
	}
	return s
}

// Test-side response types, decoded strictly so that stray fields fail.

type tUsage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

type tLegacyLP struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []float64            `json:"token_logprobs"`
	TopLogprobs   []map[string]float64 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

type tCompletion struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index        int        `json:"index"`
		Text         string     `json:"text"`
		Logprobs     *tLegacyLP `json:"logprobs"`
		FinishReason *string    `json:"finish_reason"`
	} `json:"choices"`
	Usage *tUsage `json:"usage"`
}

type tChatTop struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

type tChatLP struct {
	Content []struct {
		Token       string     `json:"token"`
		Logprob     float64    `json:"logprob"`
		Bytes       []int      `json:"bytes"`
		TopLogprobs []tChatTop `json:"top_logprobs"`
	} `json:"content"`
}

type tChat struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index   int `json:"index"`
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Delta *struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		Logprobs     *tChatLP `json:"logprobs"`
		FinishReason *string  `json:"finish_reason"`
	} `json:"choices"`
	Usage *tUsage `json:"usage"`
}

func strict(t *testing.T, b []byte, v any) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("decode %T: %v: %s", v, err, b)
	}
}

// result is one request's outcome, per choice, however it was delivered.
type result struct {
	text    []string
	finish  []string
	usage   *tUsage
	legacy  []*tLegacyLP // completions logprobs per choice (merged over chunks)
	chatLP  []*tChatLP   // chat logprobs per choice (merged over chunks)
	id      string
	created int64
}

func newResult(n int) *result {
	return &result{text: make([]string, n), finish: make([]string, n),
		legacy: make([]*tLegacyLP, n), chatLP: make([]*tChatLP, n)}
}

// generate posts body and returns the parsed result, streamed or not, with
// the framing and shape checked along the way.
func (e *env) generate(t *testing.T, path string, body map[string]any) *result {
	t.Helper()
	rec := e.do(t, "POST", path, mustJSON(t, body))
	if rec.Code != 200 {
		t.Fatalf("%s: status %d: %s", path, rec.Code, rec.Body)
	}
	n := 1
	if v, ok := body["n"].(int); ok {
		n = v
	}
	res := newResult(n)
	chat := path == "/v1/chat/completions"
	stream, _ := body["stream"].(bool)
	if !stream {
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
			t.Errorf("Content-Type %q", ct)
		}
		if chat {
			var r tChat
			strict(t, rec.Body.Bytes(), &r)
			if r.Object != "chat.completion" || !strings.HasPrefix(r.ID, "chatcmpl-") {
				t.Errorf("object %q id %q", r.Object, r.ID)
			}
			res.id, res.created, res.usage = r.ID, r.Created, r.Usage
			if len(r.Choices) != n {
				t.Fatalf("%d choices, want %d", len(r.Choices), n)
			}
			for i, c := range r.Choices {
				if c.Index != i || c.Message.Role != "assistant" || c.FinishReason == nil || c.Delta != nil {
					t.Errorf("choice %d malformed: %+v", i, c)
				}
				res.text[i] = c.Message.Content
				res.finish[i] = *c.FinishReason
				res.chatLP[i] = c.Logprobs
			}
		} else {
			var r tCompletion
			strict(t, rec.Body.Bytes(), &r)
			if r.Object != "text_completion" || !strings.HasPrefix(r.ID, "cmpl-") {
				t.Errorf("object %q id %q", r.Object, r.ID)
			}
			res.id, res.created, res.usage = r.ID, r.Created, r.Usage
			if len(r.Choices) != n {
				t.Fatalf("%d choices, want %d", len(r.Choices), n)
			}
			for i, c := range r.Choices {
				if c.Index != i || c.FinishReason == nil {
					t.Errorf("choice %d malformed", i)
				}
				res.text[i] = c.Text
				res.finish[i] = *c.FinishReason
				res.legacy[i] = c.Logprobs
			}
		}
		if res.usage == nil {
			t.Fatal("non-streamed reply without usage")
		}
		return res
	}

	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Errorf("stream Content-Type %q", ct)
	}
	includeUsage := false
	if so, ok := body["stream_options"].(map[string]any); ok {
		includeUsage, _ = so["include_usage"].(bool)
	}
	chunks := parseSSE(t, rec.Body.String())
	roleSeen := make([]bool, n)
	for ci, raw := range chunks {
		var keys map[string]json.RawMessage
		json.Unmarshal(raw, &keys)
		usageRaw, hasUsage := keys["usage"]
		if includeUsage != hasUsage {
			t.Fatalf("chunk %d: usage key present=%v, include_usage=%v", ci, hasUsage, includeUsage)
		}
		last := ci == len(chunks)-1
		if includeUsage && !last && string(usageRaw) != "null" {
			t.Fatalf("chunk %d: usage %s, want null before the last chunk", ci, usageRaw)
		}
		var id, object string
		var created int64
		var choices int
		var usage *tUsage
		if chat {
			var c tChat
			strict(t, raw, &c)
			id, object, created, choices, usage = c.ID, c.Object, c.Created, len(c.Choices), c.Usage
			for _, ch := range c.Choices {
				if ch.Delta == nil || ch.Message.Role != "" {
					t.Fatalf("chunk %d: chat chunk needs delta, not message: %s", ci, raw)
				}
				i := ch.Index
				if ch.Delta.Role == "assistant" {
					roleSeen[i] = true
				} else if !roleSeen[i] {
					t.Fatalf("chunk %d: content for choice %d before its role chunk", ci, i)
				}
				if ch.Delta.Content != nil {
					res.text[i] += *ch.Delta.Content
				}
				if res.finish[i] != "" {
					t.Fatalf("chunk %d: choice %d continues after finishing", ci, i)
				}
				if ch.FinishReason != nil {
					res.finish[i] = *ch.FinishReason
				}
				if ch.Logprobs != nil {
					if res.chatLP[i] == nil {
						res.chatLP[i] = &tChatLP{}
					}
					res.chatLP[i].Content = append(res.chatLP[i].Content, ch.Logprobs.Content...)
				}
			}
			if object != "chat.completion.chunk" {
				t.Fatalf("chunk object %q", object)
			}
		} else {
			var c tCompletion
			strict(t, raw, &c)
			id, object, created, choices, usage = c.ID, c.Object, c.Created, len(c.Choices), c.Usage
			for _, ch := range c.Choices {
				i := ch.Index
				if res.finish[i] != "" {
					t.Fatalf("chunk %d: choice %d continues after finishing", ci, i)
				}
				res.text[i] += ch.Text
				if ch.FinishReason != nil {
					res.finish[i] = *ch.FinishReason
				}
				if ch.Logprobs != nil {
					if res.legacy[i] == nil {
						res.legacy[i] = &tLegacyLP{}
					}
					l := res.legacy[i]
					l.Tokens = append(l.Tokens, ch.Logprobs.Tokens...)
					l.TokenLogprobs = append(l.TokenLogprobs, ch.Logprobs.TokenLogprobs...)
					l.TopLogprobs = append(l.TopLogprobs, ch.Logprobs.TopLogprobs...)
					l.TextOffset = append(l.TextOffset, ch.Logprobs.TextOffset...)
				}
			}
			if object != "text_completion" {
				t.Fatalf("chunk object %q", object)
			}
		}
		if ci == 0 {
			res.id, res.created = id, created
		} else if id != res.id || created != res.created {
			t.Fatalf("chunk %d: id/created changed", ci)
		}
		if last && includeUsage {
			if choices != 0 || usage == nil {
				t.Fatalf("usage chunk must have empty choices and a usage: %s", raw)
			}
			res.usage = usage
		} else if choices != 1 {
			t.Fatalf("chunk %d has %d choices, want 1", ci, choices)
		}
	}
	for i := range res.finish {
		if res.finish[i] == "" {
			t.Fatalf("choice %d never finished", i)
		}
	}
	return res
}

// greedyRef computes a greedy generation independently of the engine and
// the server: argmax of the fake logits (BOS/UNK never chosen), ending at
// EOS, at the first stop string (cut there) or after maxTokens.
func greedyRef(tok *fakeTokenizer, prompt []int32, maxTokens int, stops []string) (text string, tokens int, finish string) {
	seq := append([]int32(nil), prompt...)
	for tokens < maxTokens {
		l := fakeLogits(seq)
		best := -1
		for v := range l {
			if int32(v) == bosID || int32(v) == unkID {
				continue
			}
			if best < 0 || l[v] > l[best] {
				best = v
			}
		}
		id := int32(best)
		seq = append(seq, id)
		tokens++
		if id == eosID {
			return text, tokens, "stop"
		}
		s, _ := tok.TokenString(id)
		text += s
		cut := -1
		for _, st := range stops {
			if i := strings.Index(text, st); i >= 0 && (cut < 0 || i < cut) {
				cut = i
			}
		}
		if cut >= 0 {
			return text[:cut], tokens, "stop"
		}
	}
	return text, tokens, "length"
}

// promptIDs is what the fake tokenizer makes of a completions prompt.
func promptIDs(tok *fakeTokenizer, text string) []int32 {
	ids, _ := tok.Encode(text, true)
	return ids
}

// chatIDs is what the fake template and tokenizer make of user messages.
func chatIDs(tok *fakeTokenizer, msgs []ChatMessage) []int32 {
	s, err := tok.ApplyChatTemplate(msgs, true)
	if err != nil {
		panic(err)
	}
	ids, _ := tok.Encode(s, false)
	return ids
}

func words(n int, seed int) string {
	var b []string
	for i := range n {
		b = append(b, fakeWords[7+(i*7+seed*13)%(len(fakeWords)-8)])
	}
	return strings.Join(b, " ")
}

func userMsg(text string) []map[string]any {
	return []map[string]any{{"role": "user", "content": text}}
}
