package engine_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/backend/cpu"
	"github.com/trigon-llm/trigon/engine"
)

// slow wraps a backend and sleeps in every MatMul, so that a step of the
// tiny fixture model lasts long enough for requests to outlive a short
// shutdown deadline.
type slow struct {
	backend.Backend
	delay time.Duration
}

func (s slow) MatMul(out, x, w, bias backend.Tensor) error {
	time.Sleep(s.delay)
	return s.Backend.MatMul(out, x, w, bias)
}

// TestShutdown: Shutdown refuses new requests at once and lets running
// and queued ones go on until its deadline; then every choice still
// running or queued ends with exactly one final "abort" event, and
// Shutdown returns the deadline's error once the loop has stopped. With a
// deadline the requests beat, they finish on their own and it returns nil.
func TestShutdown(t *testing.T) {
	cases := []struct {
		name      string
		maxTokens int
		timeout   time.Duration
		want      string // finish reason of every choice
		wantErr   error
	}{
		{"deadline aborts", 1000, 300 * time.Millisecond, engine.FinishAbort, context.DeadlineExceeded},
		{"requests finish first", 4, 30 * time.Second, engine.FinishLength, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := slow{Backend: cpu.New(cpu.Options{Threads: 1}), delay: time.Millisecond}
			// Two sequences run at once: the third request (n=2) waits in
			// the queue, and must be aborted (or served) as well.
			l, err := engine.Load(engine.LoadOptions{Model: fixture, Backend: b, MaxSeqs: 2, MaxBatchedTokens: 64})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			ran := make(chan error, 1)
			go func() { ran <- l.Engine.Run(context.Background()) }()
			var chans []<-chan engine.Event
			ns := []int{1, 1, 2}
			for i, n := range ns {
				ch, err := l.Engine.Submit(context.Background(), &engine.Request{
					Prompt: []int32{5, 6, 7, int32(8 + i)}, N: n, Params: greedy(tc.maxTokens)})
				if err != nil {
					t.Fatal(err)
				}
				chans = append(chans, ch)
			}
			ctx, cancel := context.WithTimeout(context.Background(), tc.timeout)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- l.Engine.Shutdown(ctx) }()
			// Draining: new requests are refused while the others go on.
			for l.Engine.Ready() {
				time.Sleep(time.Millisecond)
			}
			if _, err := l.Engine.Submit(context.Background(), &engine.Request{Prompt: []int32{5}, N: 1, Params: greedy(2)}); !errors.Is(err, engine.ErrClosed) {
				t.Errorf("Submit while draining: %v, want ErrClosed", err)
			}
			for i, ch := range chans {
				for c, r := range collect(t, ch, ns[i]) {
					if r.final.FinishReason != tc.want {
						t.Errorf("request %d choice %d: finish %q after %d tokens, want %q", i, c, r.final.FinishReason, len(r.tokens), tc.want)
					}
				}
			}
			select {
			case err := <-done:
				if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
					t.Errorf("Shutdown: %v, want %v", err, tc.wantErr)
				}
			case <-time.After(tc.timeout + 10*time.Second):
				t.Fatal("Shutdown did not return")
			}
			if err := <-ran; err != nil {
				t.Errorf("Run: %v", err)
			}
			if _, err := l.Engine.Submit(context.Background(), &engine.Request{Prompt: []int32{5}, N: 1, Params: greedy(2)}); !errors.Is(err, engine.ErrClosed) {
				t.Errorf("Submit after Run returned: %v, want ErrClosed", err)
			}
		})
	}
}
