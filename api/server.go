package api

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/trigon-llm/trigon/telemetry"
)

// Options configures a Server. Zero limits take the defaults below.
type Options struct {
	Engine    Engine    // required
	Tokenizer Tokenizer // required
	Model     ModelInfo // ID and MaxContext required

	// APIKey, when set, is required as "Authorization: Bearer <key>" on
	// every route except /health and /metrics, which stay open so that
	// load balancers and Prometheus need no secret. Put /metrics behind
	// the network if it must not be public.
	APIKey string

	// MaxBodyBytes caps a request body (413 beyond). Default 8 MiB: a
	// 128k-token prompt as token ids is about 1 MiB.
	MaxBodyBytes int64
	// BodyReadTimeout bounds reading one request body, so a slow client
	// cannot hold a connection open forever. Default 30 s. (The write side
	// has no timeout: streams legitimately last minutes.)
	BodyReadTimeout time.Duration
	// MaxN caps "n". Default 8.
	MaxN int
	// MaxStopStrings caps the number of stop strings. Default 16 (OpenAI
	// allows 4; open-model clients often send more).
	MaxStopStrings int
	// MaxStopStringBytes caps the length of one stop string. Default 256.
	MaxStopStringBytes int
	// MaxStopTokenIDs caps "stop_token_ids". Default 64.
	MaxStopTokenIDs int
	// MaxTokensCap caps max_tokens; 0 leaves only the context bound.
	MaxTokensCap int

	// Metrics receives the per-request series (see package telemetry for
	// who records what) and is served on /metrics. Nil: the server makes
	// its own, labelled model_name=Model.ID (telemetry.NewMetricsFor),
	// reachable through Server.Metrics.
	Metrics *telemetry.Metrics
	// TracerProvider makes one span per request. Nil: the global provider
	// (a no-op unless telemetry.Tracing installed one).
	TracerProvider trace.TracerProvider
	// Logger receives engine failures and broken streams. Nil: slog.Default().
	Logger *slog.Logger
	// ProfileDir, when set, serves POST /start_profile and /stop_profile
	// (vLLM's routes): a Go CPU profile and an execution trace of the
	// process between the two, written into this directory. Empty: the
	// routes are not served.
	ProfileDir string
}

// Server serves the OpenAI-compatible API. Build it with New.
type Server struct {
	opts    Options
	keyHash [32]byte
	metrics *telemetry.Metrics
	tracer  trace.Tracer
	log     *slog.Logger
	// propagator reads W3C traceparent/tracestate from incoming headers
	// whatever the global propagator is, so traces continue across hops.
	propagator propagation.TextMapPropagator
	handler    http.Handler

	// mu guards draining, the count of generation replies in flight
	// (requests handed to the engine whose reply is not yet written) and
	// the body reads in progress; idle is closed when the count of replies
	// drops to zero, nil while it is.
	mu       sync.Mutex
	draining bool
	replies  int
	idle     chan struct{}
	// reading holds the connections of the requests whose body is being
	// read and began before the drain: Drain cuts those reads short.
	reading map[*http.ResponseController]struct{}
}

// New checks opts, fills defaults and builds the routes.
func New(opts Options) (*Server, error) {
	if opts.Engine == nil || opts.Tokenizer == nil {
		return nil, errors.New("api: Options.Engine and Options.Tokenizer are required")
	}
	if opts.Model.ID == "" {
		return nil, errors.New("api: Options.Model.ID is required")
	}
	if opts.Model.MaxContext <= 0 {
		return nil, fmt.Errorf("api: Options.Model.MaxContext must be positive, got %d", opts.Model.MaxContext)
	}
	setDefault := func(v *int, def int, name string) error {
		if *v == 0 {
			*v = def
		}
		if *v < 0 {
			return fmt.Errorf("api: Options.%s must not be negative, got %d", name, *v)
		}
		return nil
	}
	for _, d := range []struct {
		v    *int
		def  int
		name string
	}{
		{&opts.MaxN, 8, "MaxN"},
		{&opts.MaxStopStrings, 16, "MaxStopStrings"},
		{&opts.MaxStopStringBytes, 256, "MaxStopStringBytes"},
		{&opts.MaxStopTokenIDs, 64, "MaxStopTokenIDs"},
		{&opts.MaxTokensCap, 0, "MaxTokensCap"},
	} {
		if err := setDefault(d.v, d.def, d.name); err != nil {
			return nil, err
		}
	}
	if opts.MaxBodyBytes == 0 {
		opts.MaxBodyBytes = 8 << 20
	}
	if opts.MaxBodyBytes < 0 {
		return nil, fmt.Errorf("api: Options.MaxBodyBytes must not be negative, got %d", opts.MaxBodyBytes)
	}
	if opts.BodyReadTimeout == 0 {
		opts.BodyReadTimeout = 30 * time.Second
	}
	if opts.Model.OwnedBy == "" {
		opts.Model.OwnedBy = "trigon"
	}
	s := &Server{opts: opts, metrics: opts.Metrics, log: opts.Logger, propagator: propagation.TraceContext{}}
	if s.metrics == nil {
		s.metrics = telemetry.NewMetricsFor(opts.Model.ID)
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	tp := opts.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	s.tracer = tp.Tracer("github.com/trigon-llm/trigon/api")
	if opts.APIKey != "" {
		s.keyHash = sha256.Sum256([]byte(opts.APIKey))
	}
	s.handler = s.routes()
	return s, nil
}

// Handler returns the HTTP handler for every route.
func (s *Server) Handler() http.Handler { return s.handler }

// Drain makes the server refuse new generation requests with 503 (in the
// OpenAI error shape; /health answers 503 "draining" too) while the
// requests in flight go on. A request whose body is still arriving is not
// in flight yet: its read ends at once and it gets the same 503, so that
// a slow client holds neither the drain nor the socket until its body
// timeout. It is the first step of a graceful shutdown: stop the engine
// next (it ends the requests it still runs), then wait with WaitReplies
// for their replies to be written, then close the http.Server.
func (s *Server) Drain() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.draining = true
	for rc := range s.reading {
		// A deadline in the past wakes the blocked read with
		// os.ErrDeadlineExceeded; readBody turns that into the 503.
		// ErrNotSupported (a recorder) leaves nothing blocked on a socket.
		_ = rc.SetReadDeadline(time.Now())
	}
}

// WaitReplies returns once no generation request is in flight: every
// request handed to the engine has its reply written and flushed to the
// connection. Requests still reading their body do not count, so a
// stalled client cannot hold up a shutdown. It returns ctx's error if ctx
// ends first.
func (s *Server) WaitReplies(ctx context.Context) error {
	s.mu.Lock()
	idle := s.idle
	s.mu.Unlock()
	if idle == nil {
		return nil
	}
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// beginReply counts a generation reply in; it is false while draining.
func (s *Server) beginReply() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.draining {
		return false
	}
	if s.replies == 0 {
		s.idle = make(chan struct{})
	}
	s.replies++
	return true
}

// endReply flushes the reply to the connection and counts it out.
func (s *Server) endReply(w http.ResponseWriter) {
	// ErrNotSupported (a recorder) or a gone client: nothing to flush.
	_ = http.NewResponseController(w).Flush()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.replies--
	if s.replies == 0 {
		close(s.idle)
		s.idle = nil
	}
}

func (s *Server) isDraining() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.draining
}

// unavailable is the 503 for a generation request while the model loads
// or the server drains, or nil.
func (s *Server) unavailable() *Error {
	switch {
	case s.isDraining():
		return engineError(ErrShuttingDown)
	case !s.opts.Engine.Ready():
		return engineError(ErrNotReady)
	}
	return nil
}

// Metrics returns the metrics the server records into, so the engine can
// record its own series into the same registry.
func (s *Server) Metrics() *telemetry.Metrics { return s.metrics }

// NewHTTPServer wraps h in an http.Server with limits suited to an API
// server: headers must arrive within 10 s and stay under 64 KiB, idle
// keep-alive connections close after 2 minutes. There is deliberately no
// ReadTimeout or WriteTimeout: net/http would cancel the request context
// when either expires mid-stream, aborting long generations; bodies get
// their own deadline (Options.BodyReadTimeout) instead. On shutdown call
// http.Server.Shutdown with a deadline: open streams finish or are cut.
func NewHTTPServer(addr string, h http.Handler) *http.Server {
	return &http.Server{
		Addr:              addr,
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
}

// route serves one path and answers 405 (with Allow) for other methods.
// GET routes also answer HEAD, as probes expect.
type route struct {
	methods map[string]http.HandlerFunc
	allow   string
}

func newRoute(m map[string]http.HandlerFunc) *route {
	r := &route{methods: m}
	var names []string
	for k := range m {
		names = append(names, k)
	}
	if _, ok := m["GET"]; ok {
		names = append(names, "HEAD")
	}
	slices.Sort(names)
	r.allow = strings.Join(names, ", ")
	return r
}

func (rt *route) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	method := r.Method
	if method == "HEAD" {
		method = "GET"
	}
	h, ok := rt.methods[method]
	if !ok {
		w.Header().Set("Allow", rt.allow)
		writeError(w, &Error{Status: http.StatusMethodNotAllowed, Type: typeInvalidRequest,
			Message: fmt.Sprintf("method %s is not allowed on %s; allowed: %s", r.Method, r.URL.Path, rt.allow)})
		return
	}
	h(w, r)
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/v1/completions", newRoute(map[string]http.HandlerFunc{"POST": s.handleCompletions}))
	mux.Handle("/v1/chat/completions", newRoute(map[string]http.HandlerFunc{"POST": s.handleChat}))
	mux.Handle("/v1/models", newRoute(map[string]http.HandlerFunc{"GET": s.handleModels}))
	mux.Handle("/v1/models/{model...}", newRoute(map[string]http.HandlerFunc{"GET": s.handleModel}))
	mux.Handle("/tokenize", newRoute(map[string]http.HandlerFunc{"POST": s.handleTokenize}))
	mux.Handle("/detokenize", newRoute(map[string]http.HandlerFunc{"POST": s.handleDetokenize}))
	mux.Handle("/health", newRoute(map[string]http.HandlerFunc{"GET": s.handleHealth}))
	mux.Handle("/metrics", newRoute(map[string]http.HandlerFunc{"GET": s.metrics.Handler().ServeHTTP}))
	if s.opts.ProfileDir != "" {
		p := &profiler{dir: s.opts.ProfileDir}
		mux.Handle("/start_profile", newRoute(map[string]http.HandlerFunc{"POST": p.start}))
		mux.Handle("/stop_profile", newRoute(map[string]http.HandlerFunc{"POST": p.stop}))
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &Error{Status: http.StatusNotFound, Type: typeNotFound,
			Message: fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path)})
	})
	return s.auth(mux)
}

// openPaths need no API key: health probes and metric scrapers.
var openPaths = map[string]bool{"/health": true, "/metrics": true}

// auth checks the bearer key in constant time. Both sides are hashed first,
// so the comparison also hides the key's length.
func (s *Server) auth(next http.Handler) http.Handler {
	if s.opts.APIKey == "" {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if openPaths[r.URL.Path] {
			next.ServeHTTP(w, r)
			return
		}
		h := r.Header.Get("Authorization")
		scheme, key, found := strings.Cut(h, " ")
		if !found || !strings.EqualFold(scheme, "Bearer") {
			writeError(w, &Error{Status: http.StatusUnauthorized, Type: typeAuthentication, Code: "invalid_api_key",
				Message: "missing API key: send 'Authorization: Bearer <key>'"})
			return
		}
		got := sha256.Sum256([]byte(strings.TrimSpace(key)))
		if subtle.ConstantTimeCompare(got[:], s.keyHash[:]) != 1 {
			writeError(w, &Error{Status: http.StatusUnauthorized, Type: typeAuthentication, Code: "invalid_api_key",
				Message: "incorrect API key"})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// readBody reads the whole body under the size cap and the read deadline.
// A read in progress when the drain begins is cut short by Drain and
// answered 503. Once the server drains, a generation request (gen) is
// refused before its body is read; any other request keeps its deadline,
// and the http.Server's close ends a read still waiting then.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request, gen bool) ([]byte, *Error) {
	rc := http.NewResponseController(w)
	if !s.startRead(rc, gen) {
		closeAfterReply(w)
		return nil, engineError(ErrShuttingDown)
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes))
	draining := s.endRead(rc)
	if err == nil {
		_ = rc.SetReadDeadline(time.Time{})
		return body, nil
	}
	closeAfterReply(w)
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return nil, &Error{Status: http.StatusRequestEntityTooLarge, Type: typeInvalidRequest,
			Message: fmt.Sprintf("the request body exceeds the limit of %d bytes", mbe.Limit)}
	}
	if errors.Is(err, os.ErrDeadlineExceeded) && draining {
		return nil, engineError(ErrShuttingDown)
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return nil, &Error{Status: http.StatusRequestTimeout, Type: typeInvalidRequest,
			Message: fmt.Sprintf("the request body did not arrive within %s", s.opts.BodyReadTimeout)}
	}
	return nil, badRequest("", "reading the request body: %v", err)
}

// startRead sets the body's read deadline and registers the read for
// Drain to cut short; it is false for a generation request (gen) once the
// server drains: that request is refused unread. Under mu, so that a read
// starts either before Drain (and is cut short by it) or after it (and
// is not registered), and Drain's deadline is never overwritten by this
// one.
func (s *Server) startRead(rc *http.ResponseController, gen bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.draining && gen {
		return false
	}
	// ErrNotSupported (a recorder in tests, some middlewares) leaves the
	// connection's own timeouts in charge; nothing else can fail here.
	_ = rc.SetReadDeadline(time.Now().Add(s.opts.BodyReadTimeout))
	if s.draining {
		return true
	}
	if s.reading == nil {
		s.reading = make(map[*http.ResponseController]struct{})
	}
	s.reading[rc] = struct{}{}
	return true
}

// endRead unregisters a read (after it, Drain must not touch the
// connection: the handler may return) and reports whether the server is
// draining.
func (s *Server) endRead(rc *http.ResponseController) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.reading, rc)
	return s.draining
}

// lingerAfterReply bounds how long a connection that closes after an
// early reply (one sent before its request body was read) stays open:
// long enough for the reply to reach a client that is still sending, so
// that closing with its bytes unread does not reset the connection under
// the reply; short, so that a stalled client cannot hold the socket.
const lingerAfterReply = 500 * time.Millisecond

// closeAfterReply makes the connection close once the reply is sent,
// for a reply that leaves (part of) the request body unread. net/http
// reads what is left of the body after the handler returns, with the
// connection's read deadline; without a near deadline it would wait for a
// stalled client indefinitely, holding the socket and the server's drain.
func closeAfterReply(w http.ResponseWriter) {
	w.Header().Set("Connection", "close")
	// ErrNotSupported (a recorder in tests): nothing to hold open.
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(lingerAfterReply))
}

// newID returns prefix + 32 random hex digits.
func newID(prefix string) string {
	var b [16]byte
	rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return prefix + hex.EncodeToString(b[:])
}

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	if s.isDraining() {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "draining"})
		return
	}
	if !s.opts.Engine.Ready() {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "loading"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

type modelCard struct {
	ID          string `json:"id"`
	Object      string `json:"object"`
	Created     int64  `json:"created"`
	OwnedBy     string `json:"owned_by"`
	MaxModelLen int    `json:"max_model_len"`
}

func (s *Server) card() modelCard {
	m := s.opts.Model
	return modelCard{ID: m.ID, Object: "model", Created: m.Created, OwnedBy: m.OwnedBy, MaxModelLen: m.MaxContext}
}

func (s *Server) handleModels(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, struct {
		Object string      `json:"object"`
		Data   []modelCard `json:"data"`
	}{"list", []modelCard{s.card()}})
}

func (s *Server) handleModel(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("model")
	if name != s.opts.Model.ID {
		writeError(w, &Error{Status: http.StatusNotFound, Type: typeNotFound, Param: "model", Code: "model_not_found",
			Message: fmt.Sprintf("The model '%s' does not exist.", name)})
		return
	}
	writeJSON(w, http.StatusOK, s.card())
}
