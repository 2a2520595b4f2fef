package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/trigon-llm/trigon/telemetry"
)

// genPlan is a validated generation request, ready for the engine, with
// what is needed to render the reply.
type genPlan struct {
	chat    bool
	id      string
	model   string
	created int64
	req     *GenerateRequest

	stream       bool
	includeUsage bool
	echo         string // completions "echo": prompt text prepended to each choice
	// topLogprobs is how many alternatives to show (req.TopLogprobs).
	topLogprobs int
}

func (s *Server) handleCompletions(w http.ResponseWriter, r *http.Request) {
	s.serveGeneration(w, r, "POST /v1/completions", s.parseCompletion)
}

func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) {
	s.serveGeneration(w, r, "POST /v1/chat/completions", s.parseChat)
}

// serveGeneration is the shared path of both generation endpoints: span,
// body, validation, engine call, reply.
func (s *Server) serveGeneration(w http.ResponseWriter, r *http.Request, spanName string,
	parse func([]byte) (*genPlan, *Error)) {
	start := time.Now()
	// Continue the caller's trace when a W3C traceparent header came in.
	ctx := s.propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	ctx, span := s.tracer.Start(ctx, spanName, trace.WithSpanKind(trace.SpanKindServer))
	defer span.End()

	// Refused before the body is read: a loading or draining server
	// answers at once, and closes the connection so that the client's
	// next request finds a server that can serve it.
	if e := s.unavailable(); e != nil {
		s.refuse(w, span, e)
		return
	}
	body, e := s.readBody(w, r, true)
	if e != nil {
		s.fail(w, span, e)
		return
	}
	plan, e := parse(body)
	if e != nil {
		s.fail(w, span, e)
		return
	}
	w.Header().Set("X-Request-Id", plan.id)
	sp := plan.req.Sampling
	span.SetAttributes(
		attribute.String("trigon.request_id", plan.id),
		attribute.String("gen_ai.request.model", plan.model),
		attribute.Int("gen_ai.request.max_tokens", sp.MaxTokens),
		attribute.Float64("gen_ai.request.temperature", float64(sp.Temperature)),
		attribute.Float64("gen_ai.request.top_p", float64(sp.TopP)),
		attribute.Int("gen_ai.request.choice.count", plan.req.N),
		attribute.Bool("trigon.stream", plan.stream),
		attribute.Int("gen_ai.usage.input_tokens", len(plan.req.Prompt)),
	)
	if !s.beginReply() {
		s.refuse(w, span, engineError(ErrShuttingDown))
		return
	}
	defer s.endReply(w)
	if !s.opts.Engine.Ready() {
		s.fail(w, span, engineError(ErrNotReady))
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events, err := s.opts.Engine.Generate(ctx, plan.req)
	if err != nil {
		e := engineError(err)
		if e.Status >= 500 {
			s.log.Error("engine rejected request", "request_id", plan.id, "err", err)
		}
		s.fail(w, span, e)
		return
	}
	s.metrics.AddPromptTokens(len(plan.req.Prompt))
	g := &generation{s: s, p: plan, w: w, span: span, start: start, choices: make([]choiceState, plan.req.N)}
	for i := range g.choices {
		g.choices[i].offset = utf8.RuneCountInString(plan.echo)
	}
	defer func() {
		// Stop the engine and drain, so its sends never block and its
		// resources are freed whatever path got us here.
		cancel()
		for range events {
		}
		// Choices the engine never finished (client gone, request failed)
		// count as aborted, so every choice is counted exactly once.
		for i := range g.choices {
			if g.choices[i].finish == "" {
				g.choices[i].finish = FinishAbort
				s.metrics.RequestFinished(FinishAbort)
			}
		}
		g.endSpan()
	}()
	if plan.stream {
		g.stream(ctx, events)
	} else {
		g.collect(ctx, events)
	}
}

// fail writes an error reply and records it on the span.
func (s *Server) fail(w http.ResponseWriter, span trace.Span, e *Error) {
	span.SetAttributes(attribute.Int("http.response.status_code", e.Status))
	span.SetStatus(codes.Error, e.Message)
	writeError(w, e)
}

// refuse answers a request the server cannot take now (503) and closes
// the connection after the reply, which is flushed at once: the server
// may be about to close its connections.
func (s *Server) refuse(w http.ResponseWriter, span trace.Span, e *Error) {
	closeAfterReply(w)
	s.fail(w, span, e)
	_ = http.NewResponseController(w).Flush()
}

// parseCompletion decodes and validates a /v1/completions body.
func (s *Server) parseCompletion(body []byte) (*genPlan, *Error) {
	var req completionRequest
	if e := decodeJSON(body, &req); e != nil {
		return nil, e
	}
	if e := s.checkModel(req.Model); e != nil {
		return nil, e
	}
	sp, n, e := s.sampling(&req.commonFields)
	if e != nil {
		return nil, e
	}
	if req.Suffix != nil && *req.Suffix != "" {
		return nil, badRequest("suffix", "'suffix' is not supported by this server")
	}
	if req.BestOf != nil && int(*req.BestOf) != n {
		return nil, badRequest("best_of", "'best_of' is not supported by this server (it may only equal 'n')")
	}
	p := &genPlan{id: newID("cmpl-"), model: s.opts.Model.ID, created: time.Now().Unix(),
		stream: req.Stream, includeUsage: req.StreamOptions != nil && req.StreamOptions.IncludeUsage}
	gr := &GenerateRequest{RequestID: p.id, N: n}
	if req.Logprobs != nil {
		k := int(*req.Logprobs)
		if k < 0 || k > maxTopLogprobs {
			return nil, badRequest("logprobs", "'logprobs' must be between 0 and %d, got %d", maxTopLogprobs, k)
		}
		gr.Logprobs, gr.TopLogprobs = true, k
		p.topLogprobs = k
	}
	if req.Echo && gr.Logprobs {
		return nil, badRequest("echo", "'echo' together with 'logprobs' is not supported: prompt logprobs are not computed")
	}
	prompt, text, e := s.completionPrompt(req.Prompt, boolOr(req.AddSpecialTokens, true), sp.SkipSpecialTokens)
	if e != nil {
		return nil, e
	}
	if req.Echo {
		p.echo = text
	}
	mt, e := s.resolveMaxTokens(req.MaxTokens.intPtr(), "max_tokens", defaultCompletionMaxTokens, len(prompt), sp.MinTokens, "prompt")
	if e != nil {
		return nil, e
	}
	sp.MaxTokens = mt
	gr.Prompt, gr.Sampling = prompt, sp
	p.req = gr
	return p, nil
}

// completionPrompt accepts a string, an array of token ids, or a batch of
// one of either. It returns the tokens and the prompt text (for echo).
// Batches of several prompts are refused: one request, one prompt, so that
// choices, usage and errors stay unambiguous.
func (s *Server) completionPrompt(raw json.RawMessage, addSpecial, skipSpecial bool) ([]int32, string, *Error) {
	const shapes = "'prompt' must be a string, an array of token ids, or a one-element array of either"
	text := func(raw json.RawMessage, param string) ([]int32, string, *Error) {
		var t string
		if err := json.Unmarshal(raw, &t); err != nil {
			return nil, "", badRequest(param, "%s", shapes)
		}
		ids, e := s.encode(t, addSpecial, param)
		return ids, t, e
	}
	ids := func(raw json.RawMessage, param string) ([]int32, string, *Error) {
		ids, e := s.tokenIDs(raw, param)
		if e != nil {
			return nil, "", e
		}
		if len(ids) == 0 {
			return nil, "", badRequest(param, "'%s' must not be empty", param)
		}
		t, err := s.opts.Tokenizer.Decode(ids, skipSpecial)
		if err != nil {
			return nil, "", badRequest(param, "decoding '%s': %v", param, err)
		}
		return ids, t, nil
	}
	var (
		out  []int32
		str  string
		e    *Error
		kind = rawKind(raw)
	)
	switch {
	case isNull(raw):
		return nil, "", badRequest("prompt", "'prompt' is required")
	case kind == 's':
		out, str, e = text(raw, "prompt")
	case kind == 'a':
		var elems []json.RawMessage
		if err := json.Unmarshal(raw, &elems); err != nil {
			return nil, "", badRequest("prompt", "%s", shapes)
		}
		if len(elems) == 0 {
			return nil, "", badRequest("prompt", "'prompt' must not be empty")
		}
		switch rawKind(elems[0]) {
		case '0':
			out, str, e = ids(raw, "prompt")
		case 's', 'a':
			if len(elems) > 1 {
				return nil, "", badRequest("prompt",
					"batched prompts (%d in one request) are not supported; send one request per prompt", len(elems))
			}
			if rawKind(elems[0]) == 's' {
				out, str, e = text(elems[0], "prompt[0]")
			} else {
				out, str, e = ids(elems[0], "prompt[0]")
			}
		default:
			return nil, "", badRequest("prompt", "%s", shapes)
		}
	default:
		return nil, "", badRequest("prompt", "%s", shapes)
	}
	if e != nil {
		return nil, "", e
	}
	if len(out) == 0 {
		return nil, "", badRequest("prompt", "the prompt is empty after tokenization")
	}
	return out, str, nil
}

// parseChat decodes and validates a /v1/chat/completions body.
func (s *Server) parseChat(body []byte) (*genPlan, *Error) {
	var req chatRequest
	if e := decodeJSON(body, &req); e != nil {
		return nil, e
	}
	if e := s.checkModel(req.Model); e != nil {
		return nil, e
	}
	if e := checkTools(req.Tools, req.ToolChoice); e != nil {
		return nil, e
	}
	sp, n, e := s.sampling(&req.commonFields)
	if e != nil {
		return nil, e
	}
	p := &genPlan{chat: true, id: newID("chatcmpl-"), model: s.opts.Model.ID, created: time.Now().Unix(),
		stream: req.Stream, includeUsage: req.StreamOptions != nil && req.StreamOptions.IncludeUsage}
	gr := &GenerateRequest{RequestID: p.id, N: n, Logprobs: boolOr(req.Logprobs, false)}
	if req.TopLogprobs != nil {
		k := int(*req.TopLogprobs)
		if k < 0 || k > maxTopLogprobs {
			return nil, badRequest("top_logprobs", "'top_logprobs' must be between 0 and %d, got %d", maxTopLogprobs, k)
		}
		if !gr.Logprobs && k > 0 {
			return nil, badRequest("top_logprobs", "'top_logprobs' requires 'logprobs' to be true")
		}
		gr.TopLogprobs, p.topLogprobs = k, k
	}
	prompt, e := s.encodeChat(req.Messages, boolOr(req.AddGenerationPrompt, true), boolOr(req.AddSpecialTokens, false))
	if e != nil {
		return nil, e
	}
	if len(prompt) == 0 {
		return nil, badRequest("messages", "the messages are empty after applying the chat template")
	}
	// OpenAI deprecated max_tokens for chat in favour of
	// max_completion_tokens; when both are sent the newer one wins.
	maxTok, param := req.MaxTokens, "max_tokens"
	if req.MaxCompletionTokens != nil {
		maxTok, param = req.MaxCompletionTokens, "max_completion_tokens"
	}
	mt, e := s.resolveMaxTokens(maxTok.intPtr(), param, 0, len(prompt), sp.MinTokens, "messages")
	if e != nil {
		return nil, e
	}
	sp.MaxTokens = mt
	gr.Prompt, gr.Sampling = prompt, sp
	p.req = gr
	return p, nil
}

// choiceState accumulates one choice of a running request.
type choiceState struct {
	text    strings.Builder // whole text (non-streamed replies)
	tokens  int
	finish  string
	err     error
	cached  int
	firstAt time.Time
	lastAt  time.Time
	offset  int // legacy logprobs text_offset of the next token
	chatLP  []chatTokenLogprob
	legacy  *legacyLogprobs
}

// generation is one request in flight: it consumes engine events and
// writes the reply.
type generation struct {
	s       *Server
	p       *genPlan
	w       http.ResponseWriter
	span    trace.Span
	start   time.Time
	choices []choiceState
	status  int
	gotTok  bool
}

// accept checks an event against the protocol and records its metrics.
func (g *generation) accept(ev Event) error {
	if ev.Choice < 0 || ev.Choice >= len(g.choices) {
		return fmt.Errorf("%w: event for choice %d of %d", errEngineProtocol, ev.Choice, len(g.choices))
	}
	st := &g.choices[ev.Choice]
	if st.finish != "" {
		return fmt.Errorf("%w: event for choice %d after it finished", errEngineProtocol, ev.Choice)
	}
	if g.p.req.Logprobs && len(ev.Logprobs) != len(ev.TokenIDs) {
		return fmt.Errorf("%w: %d logprobs for %d tokens", errEngineProtocol, len(ev.Logprobs), len(ev.TokenIDs))
	}
	now := time.Now()
	m := g.s.metrics
	if n := len(ev.TokenIDs); n > 0 {
		if st.firstAt.IsZero() {
			st.firstAt = now
			m.ObserveTTFT(now.Sub(g.start))
			if !g.gotTok {
				g.gotTok = true
				g.span.AddEvent("first_token")
			}
		} else {
			m.ObserveInterTokenLatency(now.Sub(st.lastAt))
		}
		st.lastAt = now
		st.tokens += n
		m.AddGenerationTokens(n)
	}
	if ev.FinishReason != "" {
		st.finish = ev.FinishReason
		st.err = ev.Err
		st.cached = ev.CachedPromptTokens
		m.ObserveE2ELatency(now.Sub(g.start))
		m.RequestFinished(ev.FinishReason)
	}
	return nil
}

// unfinished returns an error if the engine closed the channel before every
// choice ended.
func (g *generation) unfinished() error {
	for i := range g.choices {
		if g.choices[i].finish == "" {
			return fmt.Errorf("%w: stream closed before choice %d finished", errEngineProtocol, i)
		}
	}
	return nil
}

func (g *generation) usage() usageJSON {
	u := usageJSON{PromptTokens: len(g.p.req.Prompt)}
	cached := 0
	for i := range g.choices {
		u.CompletionTokens += g.choices[i].tokens
		cached = max(cached, g.choices[i].cached)
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	if cached > 0 {
		u.PromptTokensDetails = &promptTokenDetails{CachedTokens: cached}
	}
	return u
}

// endSpan records the outcome on the request span.
func (g *generation) endSpan() {
	u := g.usage()
	reasons := make([]string, len(g.choices))
	for i := range g.choices {
		reasons[i] = g.choices[i].finish
	}
	g.span.SetAttributes(
		attribute.Int("gen_ai.usage.output_tokens", u.CompletionTokens),
		attribute.StringSlice("gen_ai.response.finish_reasons", reasons),
	)
	if g.status != 0 {
		g.span.SetAttributes(attribute.Int("http.response.status_code", g.status))
	}
}

// engineFailure logs a failed choice or broken protocol and returns the
// error to show.
func (g *generation) engineFailure(err error) *Error {
	if err == nil {
		err = errors.New("the engine reported an error without a cause")
	}
	e := engineError(err)
	if e.Status >= 500 {
		g.s.log.Error("generation failed", "request_id", g.p.id, "err", err)
	}
	g.span.SetStatus(codes.Error, err.Error())
	return e
}

// collect builds a non-streamed reply.
func (g *generation) collect(ctx context.Context, events <-chan Event) {
	for ev := range events {
		if err := g.accept(ev); err != nil {
			g.fail(g.engineFailure(err))
			return
		}
		if ev.FinishReason == FinishError {
			g.fail(g.engineFailure(ev.Err))
			return
		}
		st := &g.choices[ev.Choice]
		st.text.WriteString(ev.Text)
		if g.p.req.Logprobs && len(ev.Logprobs) > 0 {
			if g.p.chat {
				st.chatLP = append(st.chatLP, g.s.chatLogprobsFor(ev.Logprobs, g.p.topLogprobs).Content...)
			} else {
				l := g.s.legacyLogprobsFor(ev.Logprobs, g.p.topLogprobs, &st.offset)
				if st.legacy == nil {
					st.legacy = l
				} else {
					st.legacy.appendLegacy(l)
				}
			}
		}
	}
	if ctx.Err() != nil {
		return // the client went away; nobody is left to answer
	}
	if err := g.unfinished(); err != nil {
		g.fail(g.engineFailure(err))
		return
	}
	g.status = http.StatusOK
	if g.p.chat {
		resp := chatResponse{ID: g.p.id, Object: "chat.completion", Created: g.p.created, Model: g.p.model,
			Choices: make([]chatChoice, len(g.choices)), Usage: g.usage()}
		for i := range g.choices {
			st := &g.choices[i]
			c := chatChoice{Index: i, Message: chatMessageOut{Role: "assistant", Content: st.text.String()},
				FinishReason: st.finish}
			if g.p.req.Logprobs {
				c.Logprobs = &chatLogprobs{Content: st.chatLP}
				if c.Logprobs.Content == nil {
					c.Logprobs.Content = []chatTokenLogprob{}
				}
			}
			resp.Choices[i] = c
		}
		writeJSON(g.w, http.StatusOK, resp)
		return
	}
	u, _ := json.Marshal(g.usage())
	resp := completionResponse{ID: g.p.id, Object: "text_completion", Created: g.p.created, Model: g.p.model,
		Choices: make([]completionChoice, len(g.choices)), Usage: u}
	for i := range g.choices {
		st := &g.choices[i]
		c := completionChoice{Index: i, Text: g.p.echo + st.text.String(), FinishReason: strPtr(st.finish)}
		if g.p.req.Logprobs {
			c.Logprobs = st.legacy
			if c.Logprobs == nil {
				c.Logprobs = g.s.legacyLogprobsFor(nil, 0, new(int))
			}
		}
		resp.Choices[i] = c
	}
	writeJSON(g.w, http.StatusOK, resp)
}

func (g *generation) fail(e *Error) {
	g.status = e.Status
	g.span.SetAttributes(attribute.Int("http.response.status_code", e.Status))
	writeError(g.w, e)
}

// stream writes a server-sent-event reply. The 200 status is committed
// with the first engine event, so a request that fails before producing
// anything still gets a proper error status.
func (g *generation) stream(ctx context.Context, events <-chan Event) {
	sse := &sseWriter{w: g.w, rc: http.NewResponseController(g.w), metrics: g.s.metrics}
	// streamFail reports an error: as a status while nothing is sent, as an
	// error event followed by [DONE] once the stream has begun.
	streamFail := func(e *Error) {
		if !sse.started {
			g.fail(e)
			return
		}
		g.status = http.StatusOK
		sse.send(e)
		sse.done()
	}
	for ev := range events {
		if err := g.accept(ev); err != nil {
			streamFail(g.engineFailure(err))
			return
		}
		if ev.FinishReason == FinishError {
			streamFail(g.engineFailure(ev.Err))
			return
		}
		if !sse.started {
			sse.start()
			g.status = http.StatusOK
			for i := range g.choices {
				if c := g.firstChunk(i); c != nil && sse.send(c) != nil {
					return
				}
			}
		}
		if c := g.deltaChunk(ev); c != nil && sse.send(c) != nil {
			return // client gone: the deferred cancel stops the engine
		}
	}
	if ctx.Err() != nil {
		return
	}
	if err := g.unfinished(); err != nil {
		streamFail(g.engineFailure(err))
		return
	}
	if g.p.includeUsage {
		u, _ := json.Marshal(g.usage())
		var chunk any
		if g.p.chat {
			chunk = chatChunk{ID: g.p.id, Object: "chat.completion.chunk", Created: g.p.created, Model: g.p.model,
				Choices: []chatChunkChoice{}, Usage: u}
		} else {
			chunk = completionResponse{ID: g.p.id, Object: "text_completion", Created: g.p.created, Model: g.p.model,
				Choices: []completionChoice{}, Usage: u}
		}
		if sse.send(chunk) != nil {
			return
		}
	}
	sse.done()
}

// usageNull is the "usage": null of intermediate chunks when the client
// asked for a usage chunk (OpenAI sends the key on every chunk then).
func (g *generation) usageNull() json.RawMessage {
	if g.p.includeUsage {
		return json.RawMessage("null")
	}
	return nil
}

// firstChunk opens choice i: the assistant role for chat, the echoed
// prompt for completions with echo, nothing otherwise.
func (g *generation) firstChunk(i int) any {
	if g.p.chat {
		return chatChunk{ID: g.p.id, Object: "chat.completion.chunk", Created: g.p.created, Model: g.p.model,
			Choices: []chatChunkChoice{{Index: i, Delta: chatDelta{Role: "assistant", Content: strPtr("")}}},
			Usage:   g.usageNull()}
	}
	if g.p.echo == "" {
		return nil
	}
	return completionResponse{ID: g.p.id, Object: "text_completion", Created: g.p.created, Model: g.p.model,
		Choices: []completionChoice{{Index: i, Text: g.p.echo}}, Usage: g.usageNull()}
}

// deltaChunk renders one event, or nil when it carries nothing to show
// (tokens held back by the engine, without logprobs).
func (g *generation) deltaChunk(ev Event) any {
	withLP := g.p.req.Logprobs && len(ev.Logprobs) > 0
	if ev.Text == "" && !withLP && ev.FinishReason == "" {
		return nil
	}
	var finish *string
	if ev.FinishReason != "" {
		finish = strPtr(ev.FinishReason)
	}
	if g.p.chat {
		c := chatChunkChoice{Index: ev.Choice, FinishReason: finish}
		if ev.Text != "" || withLP {
			c.Delta.Content = strPtr(ev.Text)
		}
		if withLP {
			c.Logprobs = g.s.chatLogprobsFor(ev.Logprobs, g.p.topLogprobs)
		}
		return chatChunk{ID: g.p.id, Object: "chat.completion.chunk", Created: g.p.created, Model: g.p.model,
			Choices: []chatChunkChoice{c}, Usage: g.usageNull()}
	}
	c := completionChoice{Index: ev.Choice, Text: ev.Text, FinishReason: finish}
	if withLP {
		c.Logprobs = g.s.legacyLogprobsFor(ev.Logprobs, g.p.topLogprobs, &g.choices[ev.Choice].offset)
	}
	return completionResponse{ID: g.p.id, Object: "text_completion", Created: g.p.created, Model: g.p.model,
		Choices: []completionChoice{c}, Usage: g.usageNull()}
}

// sseWriter frames server-sent events: "data: <json>\n\n", flushed per
// event, ending with "data: [DONE]\n\n".
type sseWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	metrics *telemetry.Metrics // each event's write and flush time
	started bool
	err     error
}

func (s *sseWriter) start() {
	h := s.w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	s.w.WriteHeader(http.StatusOK)
	s.started = true
}

func (s *sseWriter) send(v any) error {
	b, err := marshal(v)
	if err != nil {
		s.err = fmt.Errorf("encode event: %w", err)
		return s.err
	}
	return s.write(append(append([]byte("data: "), b...), '\n', '\n'))
}

func (s *sseWriter) done() error { return s.write([]byte("data: [DONE]\n\n")) }

func (s *sseWriter) write(b []byte) error {
	if s.err != nil {
		return s.err
	}
	t0 := time.Now()
	defer func() { s.metrics.ObserveStreamWrite(time.Since(t0)) }()
	if _, err := s.w.Write(b); err != nil {
		s.err = err
		return err
	}
	if err := s.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		s.err = err
		return err
	}
	return nil
}
