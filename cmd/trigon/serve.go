package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/trigon-llm/trigon/api"
	"github.com/trigon-llm/trigon/engine"
	"github.com/trigon-llm/trigon/sample"
	"github.com/trigon-llm/trigon/telemetry"
	"github.com/trigon-llm/trigon/tokenizer"
)

func serveCmd() *cobra.Command {
	var mf modelFlags
	var host, apiKey, name, otlp, profileDir string
	var port, maxQueue int
	var shutdown time.Duration
	var verbose bool
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve a model over an OpenAI-compatible HTTP API",
		Long: "serve loads a model (default: the embedded Go-code model) and serves /v1/completions,\n" +
			"/v1/chat/completions, /v1/models, /tokenize, /detokenize, /health and /metrics.\n" +
			"SIGTERM or SIGINT stops admitting requests (they get 503), lets the running ones finish for\n" +
			"--shutdown-timeout, then ends the rest with finish_reason \"abort\" and exits; a second signal\n" +
			"exits at once.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := mf.check(); err != nil {
				return err
			}
			if port < 0 || port > 65535 {
				return fmt.Errorf("--port %d: want 0 to 65535 (0: any free port)", port)
			}
			if maxQueue < 1 {
				return fmt.Errorf("--max-queue %d: want at least 1", maxQueue)
			}
			if shutdown < 0 {
				return fmt.Errorf("--shutdown-timeout %v: want 0 or more", shutdown)
			}
			if r := mf.mixedRatio; r != 0 && !(r > 1 && !math.IsInf(r, 1)) {
				return fmt.Errorf("--max-mixed-step-ratio %g: want 0 (no cap) or a ratio above 1", r)
			}
			if apiKey == "" {
				apiKey = os.Getenv("TRIGON_API_KEY")
			}
			log := newLogger(cmd.ErrOrStderr(), true)
			ctx, stopSignals := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, os.Interrupt)
			defer stopSignals()
			// After the first signal the default action is back: a second
			// one ends the process without waiting for the drain.
			go func() { <-ctx.Done(); stopSignals() }()
			shutdownTracing, err := telemetry.Tracing(ctx, telemetry.TracingOptions{Endpoint: otlp})
			if err != nil {
				return err
			}
			defer func() {
				// Spans still buffered get a bounded time to leave: an
				// unreachable collector must not hold the exit.
				fctx, cancel := context.WithTimeout(context.Background(), tracingFlushTimeout)
				defer cancel()
				shutdownTracing(fctx)
			}()
			mf.maxQueue = maxQueue
			mf.warm = true
			if name == "" {
				name = modelName(mf.model)
			}
			ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
			if err != nil {
				return err
			}
			return serve(ctx, ln, serveOptions{
				name: name, apiKey: apiKey, shutdown: shutdown, maxContext: mf.maxContext, log: log, profileDir: profileDir,
				modelPath: mf.modelPath,
				describe:  func() (*tokenizer.Tokenizer, int, error) { return mf.describe(log) },
				load: func(m *telemetry.Metrics) (*engine.Loaded, func(), error) {
					return mf.load(context.Background(), log, m)
				},
			})
		},
	}
	mf.register(cmd)
	fl := cmd.Flags()
	fl.StringVar(&host, "host", "127.0.0.1", "address to listen on (loopback by default)")
	fl.IntVar(&port, "port", 8000, "port to listen on")
	fl.StringVar(&apiKey, "api-key", "", "require this Bearer key (also $TRIGON_API_KEY)")
	fl.StringVar(&name, "served-model-name", "", "model name clients use (default: the model's directory or file name)")
	fl.IntVar(&maxQueue, "max-queue", 256, "most requests waiting to start; more get 429")
	fl.Float64Var(&mf.mixedRatio, "max-mixed-step-ratio", 0, "cap the prefill of a step beside decodes so that it takes at most this many times their decode step, more as the decodes fill the device (timed at load; on a GPU, 2 holds a steady load's p99 token gap near 3x its median, at some throughput at full load; 0: no cap)")
	fl.DurationVar(&shutdown, "shutdown-timeout", 30*time.Second, "how long to drain on SIGTERM before aborting requests")
	fl.StringVar(&otlp, "otlp-endpoint", "", "OTLP/HTTP endpoint for traces (off when empty)")
	fl.StringVar(&profileDir, "profile-dir", "", "serve POST /start_profile and /stop_profile (as vLLM's profiler dir does): a Go CPU profile and execution trace of the server between the two, written here (off when empty)")
	fl.BoolVarP(&verbose, "verbose", "v", false, "unused; serve always logs at info level")
	return cmd
}

// writeGrace bounds the wait, once the engine has stopped, for the last
// replies (each stream's final chunk and [DONE]) to be written: clients
// that read get them at once; a connection whose client does not read is
// closed after this.
const writeGrace = time.Second

// finishGrace bounds the wait, once every reply is written, for net/http
// to end the responses (the last chunk of a stream's body) before the
// connections are closed: a write of a few bytes, unless the client has
// stopped reading.
const finishGrace = 200 * time.Millisecond

// tracingFlushTimeout bounds the export of buffered spans at exit.
const tracingFlushTimeout = 2 * time.Second

// serveOptions are what serve needs besides the listener.
type serveOptions struct {
	name, apiKey string
	profileDir   string // api.Options.ProfileDir
	shutdown     time.Duration
	maxContext   int
	log          *slog.Logger
	modelPath    func() (string, error)
	// describe, when set, gives the tokenizer and context length instead
	// of reading them at modelPath (a dummy model has no files).
	describe func() (*tokenizer.Tokenizer, int, error)
	// load uploads the model and starts its engine (the slow part).
	load func(*telemetry.Metrics) (*engine.Loaded, func(), error)
}

// serve answers HTTP on ln at once (/health says 503 until the model is
// loaded), loads the model, and serves until ctx ends; then it drains
// (drain) and returns.
func serve(ctx context.Context, ln net.Listener, opts serveOptions) error {
	// The tokenizer and the context length are cheap to read; the HTTP
	// layer needs them up front.
	tok, ctxLen, err := opts.info()
	if err != nil {
		return err
	}
	metrics := telemetry.NewMetricsFor(opts.name)
	eng := &apiEngine{}
	srv, err := api.New(api.Options{
		Engine:     eng,
		Tokenizer:  apiTokenizer{tok},
		Model:      api.ModelInfo{ID: opts.name, MaxContext: ctxLen, Created: time.Now().Unix()},
		APIKey:     opts.apiKey,
		Metrics:    metrics,
		Logger:     opts.log,
		ProfileDir: opts.profileDir,
	})
	if err != nil {
		return err
	}
	hs := api.NewHTTPServer(ln.Addr().String(), srv.Handler())
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	opts.log.Info("listening; loading the model", "addr", "http://"+ln.Addr().String(), "model", opts.name, "auth", opts.apiKey != "")

	l, stopEngine, err := opts.load(metrics)
	if err != nil {
		hs.Close()
		return err
	}
	defer stopEngine()
	if l.Context != ctxLen {
		hs.Close()
		return fmt.Errorf("serve: context length %d after loading, %d announced", l.Context, ctxLen)
	}
	eng.l.Store(l)
	opts.log.Info("serving", "addr", "http://"+ln.Addr().String())
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	drain(srv, hs, l.Engine, opts.shutdown, opts.log)
	return nil
}

// info is describe's, or the tokenizer and context length at modelPath.
func (o serveOptions) info() (*tokenizer.Tokenizer, int, error) {
	if o.describe != nil {
		return o.describe()
	}
	path, err := o.modelPath()
	if err != nil {
		return nil, 0, err
	}
	tok, err := engine.LoadTokenizer(path)
	if err != nil {
		return nil, 0, err
	}
	ctxLen, err := engine.ContextLength(path, o.maxContext)
	if err != nil {
		return nil, 0, err
	}
	return tok, ctxLen, nil
}

// drain shuts the server down gracefully. The listener stays open, so
// that requests arriving meanwhile get a 503 (not a refused connection)
// and clients retry elsewhere; keep-alive is off, so connections close
// after their reply. The engine runs what it has for up to timeout, then
// aborts the rest after the step in progress: every stream then ends
// with a final chunk, finish_reason "abort", and [DONE], and a
// non-streamed request gets its reply, finish_reason "abort". A client
// still sending its body when the drain begins gets its 503 at once
// (api.Server.Drain). Once those replies are written and their responses
// finished (writeGrace at most), every connection is closed.
func drain(srv *api.Server, hs *http.Server, eng *engine.Engine, timeout time.Duration, log *slog.Logger) {
	start := time.Now()
	log.Info("draining: new requests get 503; a second signal exits at once", "timeout", timeout)
	srv.Drain()
	hs.SetKeepAlivesEnabled(false)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := eng.Shutdown(ctx); err != nil {
		log.Warn("shutdown timeout reached: aborted the requests still running", "timeout", timeout)
	}
	wctx, wcancel := context.WithTimeout(context.Background(), writeGrace)
	defer wcancel()
	if err := srv.WaitReplies(wctx); err != nil {
		log.Warn("closing connections whose clients did not read their last reply", "grace", writeGrace)
	}
	// Shutdown before Close: a reply's handler has returned, but net/http
	// may not have written the end of its chunked body yet; Shutdown waits
	// for connections to finish their responses (finishGrace at most), and
	// Close then cuts what is left (clients still sending a body).
	fctx, fcancel := context.WithTimeout(context.Background(), finishGrace)
	defer fcancel()
	if err := hs.Shutdown(fctx); err != nil {
		hs.Close()
	}
	log.Info("stopped", "drained_for", time.Since(start).Round(time.Millisecond))
}

func modelName(path string) string {
	if path == "" {
		return "trigon-go-default"
	}
	return strings.TrimSuffix(filepath.Base(filepath.Clean(path)), ".gguf")
}

// apiEngine adapts the engine to the HTTP layer's interface. It is not
// ready until the model is loaded.
type apiEngine struct{ l atomic.Pointer[engine.Loaded] }

func (a *apiEngine) Ready() bool {
	l := a.l.Load()
	return l != nil && l.Engine.Ready()
}

func (a *apiEngine) Generate(ctx context.Context, r *api.GenerateRequest) (<-chan api.Event, error) {
	l := a.l.Load()
	if l == nil {
		return nil, api.ErrNotReady
	}
	sp := r.Sampling
	req := &engine.Request{
		ID: r.RequestID, Prompt: r.Prompt, N: r.N,
		Params: sample.Params{
			Temperature: sp.Temperature, TopP: sp.TopP, TopK: sp.TopK, MinP: sp.MinP,
			RepetitionPenalty: sp.RepetitionPenalty, PresencePenalty: sp.PresencePenalty, FrequencyPenalty: sp.FrequencyPenalty,
			Seed: sp.Seed, MaxTokens: sp.MaxTokens, MinTokens: sp.MinTokens, Stop: sp.Stop, StopTokenIDs: sp.StopTokenIDs,
			IgnoreEOS: sp.IgnoreEOS, Logprobs: r.TopLogprobs,
		},
		Logprobs: r.Logprobs, TopLogprobs: r.TopLogprobs, SkipSpecialTokens: sp.SkipSpecialTokens,
		JSONObject: sp.JSONObject,
	}
	events, err := l.Engine.Submit(ctx, req)
	switch {
	case errors.Is(err, engine.ErrQueueFull):
		return nil, api.ErrQueueFull
	case errors.Is(err, engine.ErrClosed):
		return nil, api.ErrShuttingDown
	case errors.Is(err, engine.ErrBadRequest):
		return nil, clientError(err)
	case err != nil:
		return nil, err
	}
	out := make(chan api.Event, 16)
	go func() {
		defer close(out)
		for ev := range events {
			out <- toAPIEvent(ev)
		}
	}()
	return out, nil
}

// clientError turns an engine.ErrBadRequest into the api's, which the
// api answers 400 with the error's text; the text loses the engine's
// prefix, which means nothing to a client.
func clientError(err error) error {
	msg := strings.TrimPrefix(err.Error(), engine.ErrBadRequest.Error()+": ")
	return fmt.Errorf("%w: %s", api.ErrBadRequest, msg)
}

func toAPIEvent(ev engine.Event) api.Event {
	a := api.Event{
		Choice: ev.Choice, Text: ev.Text, TokenIDs: ev.TokenIDs, FinishReason: ev.FinishReason,
		Err: ev.Err, CachedPromptTokens: ev.CachedPromptTokens,
	}
	// A request the engine refuses once queued (the scheduler's own
	// checks) is the client's error, as one refused by Submit is.
	if errors.Is(ev.Err, engine.ErrBadRequest) {
		a.Err = clientError(ev.Err)
	}
	for _, lp := range ev.Logprobs {
		t := api.TokenLogprob{ID: lp.ID, Logprob: lp.Logprob}
		for _, top := range lp.Top {
			t.Top = append(t.Top, api.TopLogprob{ID: top.ID, Logprob: top.Logprob})
		}
		a.Logprobs = append(a.Logprobs, t)
	}
	return a
}

// apiTokenizer adapts the tokenizer to the HTTP layer's interface.
type apiTokenizer struct{ t *tokenizer.Tokenizer }

func (a apiTokenizer) Encode(text string, addSpecial bool) ([]int32, error) {
	return a.t.Encode(text, addSpecial)
}

func (a apiTokenizer) Decode(ids []int32, skipSpecial bool) (string, error) {
	return a.t.Decode(ids, skipSpecial)
}

func (a apiTokenizer) ApplyChatTemplate(msgs []api.ChatMessage, addGen bool) (string, error) {
	m := make([]tokenizer.Message, len(msgs))
	for i, x := range msgs {
		m[i] = tokenizer.Message{Role: x.Role, Content: x.Content}
	}
	return a.t.ApplyChatTemplate(m, addGen)
}

func (a apiTokenizer) TokenString(id int32) (string, bool) {
	b, ok := a.t.TokenBytes(id)
	return string(b), ok
}
