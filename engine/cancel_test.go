package engine_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/trigon-llm/trigon/engine"
)

// TestCancelledStreamIsAPrefix: a reader that cancels its request and
// reads on gets a prefix of the request's events, never a stream with
// events missing in its middle. Here the request runs to its end while
// the reader waits, so that the events fill the channel and queue behind
// it; then the reader cancels and drains.
func TestCancelledStreamIsAPrefix(t *testing.T) {
	l := start(t, nil, engine.LoadOptions{MaxBatchedTokens: 64})
	prompt := []int32{5, 6, 7, 8}
	want := submit(t, l, context.Background(), prompt, 1, greedy(200))[0].tokens
	for try := range 3 {
		ctx, cancel := context.WithCancel(context.Background())
		ch, err := l.Engine.Submit(ctx, &engine.Request{Prompt: prompt, N: 1, Params: greedy(200)})
		if err != nil {
			t.Fatal(err)
		}
		waitIdle(t, l) // every event queued, the channel full
		time.Sleep(10 * time.Millisecond)
		cancel()
		var got []int32
		var final *engine.Event
		for ev := range ch {
			if final != nil {
				t.Fatalf("try %d: event after the final one", try)
			}
			got = append(got, ev.TokenIDs...)
			if ev.FinishReason != "" {
				final = &ev
			}
		}
		if len(got) > len(want) || !slices.Equal(got, want[:len(got)]) {
			t.Fatalf("try %d: cancelled, the stream gave %d tokens that are not a prefix of the request's %d%s",
				try, len(got), len(want), firstDiff(got, want))
		}
		if final != nil && final.CompletionTokens != len(got) {
			t.Fatalf("try %d: final event counts %d completion tokens, %d streamed before it", try, final.CompletionTokens, len(got))
		}
	}
}

// firstDiff says where two token lists part.
func firstDiff(a, b []int32) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return fmt.Sprintf(": they part at token %d", i)
		}
	}
	if len(a) != len(b) {
		return fmt.Sprintf(": one stops at %d tokens", min(len(a), len(b)))
	}
	return ""
}
