package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/api"
	"github.com/trigon-llm/trigon/engine"
)

// TestEngineRefusalsAre400: requests the engine refuses (more KV cache
// than the server has, more choices than it runs at once) are the
// client's errors: 400 with the reason, streamed or not, never a 500,
// and the text carries neither the engine's internal prefix nor the
// "bad request: " the status says already.
func TestEngineRefusalsAre400(t *testing.T) {
	// 7 blocks of 16 tokens (the null block one of them) hold 96 tokens.
	hs, _ := startServer(t, engine.LoadOptions{KVBlocks: 7, MaxSeqs: 2, MaxBatchedTokens: 64})
	prompt := make([]int32, 90)
	for i := range prompt {
		prompt[i] = int32(5 + i)
	}
	cases := []struct {
		name string
		body map[string]any
		msg  string
	}{
		{"past the KV cache", map[string]any{"prompt": prompt, "max_tokens": 20}, "more than the 96 the server's KV cache holds"},
		{"past the KV cache, streamed", map[string]any{"prompt": prompt, "max_tokens": 20, "stream": true}, "more than the 96"},
		{"n over the sequences", map[string]any{"prompt": []int32{5, 6}, "max_tokens": 2, "n": 3}, "n=3 exceeds the 2 sequences"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b, _ := json.Marshal(tc.body)
			resp, err := http.Post(hs.URL+"/v1/completions", "application/json", bytes.NewReader(b))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var er struct {
				Error struct {
					Message string `json:"message"`
					Type    string `json:"type"`
				} `json:"error"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&er); err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusBadRequest || er.Error.Type != "invalid_request_error" ||
				!strings.Contains(er.Error.Message, tc.msg) || strings.Contains(er.Error.Message, "engine:") ||
				strings.Contains(er.Error.Message, "bad request") {
				t.Errorf("status %d, %+v; want 400 invalid_request_error saying %q, without 'engine:' or 'bad request'", resp.StatusCode, er.Error, tc.msg)
			}
		})
	}
}

// TestEventErrors: a final event whose error wraps engine.ErrBadRequest
// (a request the scheduler refuses once queued) reaches the api as its
// ErrBadRequest, so the client gets 400; other errors stay as they are.
func TestEventErrors(t *testing.T) {
	refused := fmt.Errorf("%w: sched: request 1: too large", engine.ErrBadRequest)
	fault := errors.New("device fault")
	for _, tc := range []struct {
		err     error
		bad     bool
		message string
	}{
		{refused, true, "bad request: sched: request 1: too large"},
		{fault, false, "device fault"},
	} {
		got := toAPIEvent(engine.Event{FinishReason: engine.FinishError, Err: tc.err}).Err
		if errors.Is(got, api.ErrBadRequest) != tc.bad || got.Error() != tc.message {
			t.Errorf("%v: got %v (ErrBadRequest %v), want %q (ErrBadRequest %v)", tc.err, got, errors.Is(got, api.ErrBadRequest), tc.message, tc.bad)
		}
	}
}
