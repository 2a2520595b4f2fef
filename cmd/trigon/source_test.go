package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/trigon-llm/trigon/engine"
	"github.com/trigon-llm/trigon/telemetry"
	"github.com/trigon-llm/trigon/tokenizer"
)

// syncBuffer is a log sink safe for the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// parseModelFlags fills modelFlags from args the way serve's flags do.
func parseModelFlags(t *testing.T, args ...string) *modelFlags {
	t.Helper()
	var mf modelFlags
	c := &cobra.Command{Use: "x"}
	mf.register(c)
	if err := c.ParseFlags(args); err != nil {
		t.Fatal(err)
	}
	return &mf
}

// serveFlags runs serve for the model flags on loopback until the test
// ends and returns its URL once /health says 200.
func serveFlags(t *testing.T, mf *modelFlags, log *slog.Logger) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- serve(ctx, ln, serveOptions{
			name: "dummy", shutdown: 5 * time.Second, maxContext: mf.maxContext, log: log,
			modelPath: mf.modelPath,
			describe:  func() (*tokenizer.Tokenizer, int, error) { return mf.describe(log) },
			load: func(m *telemetry.Metrics) (*engine.Loaded, func(), error) {
				return mf.load(context.Background(), log, m)
			},
		})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("serve: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("serve did not return")
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(url + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return url
			}
		}
		select {
		case err := <-done:
			t.Fatalf("serve returned before it was ready: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the dummy model never became ready")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func postJSON(t *testing.T, url string, body any, out any) {
	t.Helper()
	data, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: status %d: %s", url, resp.StatusCode, raw)
	}
	if err := json.Unmarshal(raw, out); err != nil {
		t.Fatalf("POST %s: %v: %s", url, err, raw)
	}
}

// TestServeDummyTiny serves random weights of the tiny preset on the CPU,
// with no file on disk: the synthetic tokenizer (and the warning that says
// so), or the one --tokenizer names; completions and chat answer.
func TestServeDummyTiny(t *testing.T) {
	for _, tc := range []struct {
		name      string
		args      []string
		synthetic bool
	}{
		{"synthetic tokenizer", nil, true},
		{"--tokenizer", []string{"--tokenizer", fixtureModel}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs syncBuffer
			log := slog.New(slog.NewTextHandler(&logs, nil))
			mf := parseModelFlags(t, append([]string{"--load-format", "dummy", "--model", "tiny", "--device", "cpu", "--threads", "2",
				"--max-seqs", "4", "--max-context", "256"}, tc.args...)...)
			url := serveFlags(t, mf, log)
			var comp struct {
				Choices []struct {
					Text         string `json:"text"`
					FinishReason string `json:"finish_reason"`
				} `json:"choices"`
				Usage struct {
					PromptTokens     int `json:"prompt_tokens"`
					CompletionTokens int `json:"completion_tokens"`
				} `json:"usage"`
			}
			postJSON(t, url+"/v1/completions", map[string]any{"prompt": "hello dummy", "max_tokens": 8, "temperature": 0, "ignore_eos": true}, &comp)
			if len(comp.Choices) != 1 || comp.Usage.CompletionTokens != 8 || comp.Choices[0].FinishReason != "length" {
				t.Fatalf("completion %+v: want 8 tokens, finish length", comp)
			}
			var tokz struct {
				Tokens []int32 `json:"tokens"`
			}
			postJSON(t, url+"/tokenize", map[string]any{"prompt": "hello dummy", "add_special_tokens": false}, &tokz)
			if tc.synthetic {
				// A byte a token, and sampled ids decode to words.
				if len(tokz.Tokens) != len("hello dummy") || strings.TrimSpace(comp.Choices[0].Text) == "" {
					t.Errorf("synthetic tokenizer: %d tokens for 11 bytes, completion %q", len(tokz.Tokens), comp.Choices[0].Text)
				}
				if !strings.Contains(logs.String(), "synthetic byte-level") {
					t.Errorf("no warning about the synthetic tokenizer in the log:\n%s", logs.String())
				}
			} else {
				if len(tokz.Tokens) >= len("hello dummy") {
					t.Errorf("--tokenizer: %d tokens for 11 bytes: not the fixture's BPE", len(tokz.Tokens))
				}
				if strings.Contains(logs.String(), "synthetic") {
					t.Errorf("synthetic tokenizer used despite --tokenizer:\n%s", logs.String())
				}
			}
			var chat struct {
				Choices []struct {
					Message struct {
						Content string `json:"content"`
					} `json:"message"`
				} `json:"choices"`
			}
			postJSON(t, url+"/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": "hi"}},
				"max_tokens": 4, "temperature": 0, "ignore_eos": true}, &chat)
			if len(chat.Choices) != 1 {
				t.Errorf("chat %+v", chat)
			}
		})
	}
}

func TestModelSourceErrors(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--load-format", "bogus"}, "want auto or dummy"},
		{[]string{"--load-format", "dummy", "--model", "no-such-arch"}, "not a known architecture"},
		{[]string{"--load-format", "dummy", "--model", "tiny", "--tokenizer", "/no/such/dir"}, "--tokenizer"},
	} {
		mf := parseModelFlags(t, tc.args...)
		_, _, err := mf.describe(log)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one mentioning %q", tc.args, err, tc.want)
		}
	}
	// A tokenizer larger than the model's vocabulary is refused at load.
	mf := parseModelFlags(t, "--load-format", "dummy", "--model", "tiny", "--device", "cpu", "--tokenizer", fixtureModel)
	mf.src = nil
	src, err := mf.source(log)
	if err != nil {
		t.Fatal(err)
	}
	src.cfg.VocabSize = 300
	if _, _, err := mf.load(context.Background(), log, nil); err == nil || !strings.Contains(err.Error(), "vocabulary") {
		t.Errorf("tokenizer of %d tokens on a 300-token model: %v", src.tok.VocabSize(), err)
	}
}
