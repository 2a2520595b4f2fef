package api

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestAuth(t *testing.T) {
	const key = "sk-test-0123456789"
	cases := []struct {
		name   string
		key    string // configured
		method string
		path   string
		header string // Authorization
		status int
	}{
		{"no key configured", "", "GET", "/v1/models", "", 200},
		{"missing", key, "GET", "/v1/models", "", 401},
		{"wrong", key, "GET", "/v1/models", "Bearer sk-wrong", 401},
		{"prefix of key", key, "GET", "/v1/models", "Bearer sk-test", 401},
		{"key plus suffix", key, "GET", "/v1/models", "Bearer " + key + "x", 401},
		{"not bearer", key, "GET", "/v1/models", "Basic " + key, 401},
		{"bare key", key, "GET", "/v1/models", key, 401},
		{"right", key, "GET", "/v1/models", "Bearer " + key, 200},
		{"scheme case-insensitive", key, "GET", "/v1/models", "bearer " + key, 200},
		{"completions guarded", key, "POST", "/v1/completions", "", 401},
		{"chat guarded", key, "POST", "/v1/chat/completions", "Bearer nope", 401},
		{"tokenize guarded", key, "POST", "/tokenize", "", 401},
		{"unknown route guarded", key, "GET", "/secret", "", 401},
		{"health open", key, "GET", "/health", "", 200},
		{"metrics open", key, "GET", "/metrics", "", 200},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, func(o *Options) { o.APIKey = tc.key })
			var hdr []string
			if tc.header != "" {
				hdr = []string{"Authorization", tc.header}
			}
			rec := e.do(t, tc.method, tc.path, "", hdr...)
			if rec.Code != tc.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.status, rec.Body)
			}
			if tc.status == 401 {
				er := decodeError(t, rec)
				if er.Type != "authentication_error" || er.Code == nil || *er.Code != "invalid_api_key" {
					t.Errorf("401 body %+v", er)
				}
				if !strings.HasPrefix(rec.Header().Get("WWW-Authenticate"), "Bearer") {
					t.Errorf("401 without WWW-Authenticate")
				}
			}
		})
	}
}

func TestRoutesAndMethods(t *testing.T) {
	cases := []struct {
		method, path string
		status       int
		allow        string
	}{
		{"GET", "/nope", 404, ""},
		{"POST", "/v1/embeddings", 404, ""},
		{"GET", "/v1/completions", 405, "POST"},
		{"PUT", "/v1/chat/completions", 405, "POST"},
		{"POST", "/v1/models", 405, "GET, HEAD"},
		{"DELETE", "/health", 405, "GET, HEAD"},
		{"GET", "/tokenize", 405, "POST"},
		{"POST", "/metrics", 405, "GET, HEAD"},
	}
	e := newEnv(t, nil)
	for _, tc := range cases {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			rec := e.do(t, tc.method, tc.path, "")
			if rec.Code != tc.status {
				t.Fatalf("status %d, want %d", rec.Code, tc.status)
			}
			decodeError(t, rec)
			if got := rec.Header().Get("Allow"); got != tc.allow {
				t.Errorf("Allow %q, want %q", got, tc.allow)
			}
		})
	}
}

func TestBodyLimit(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.MaxBodyBytes = 1024 })
	small := `{"prompt":"the cat","max_tokens":1}`
	big := `{"prompt":"` + strings.Repeat("the ", 300) + `","max_tokens":1}`
	cases := []struct {
		name, path, body string
		status           int
	}{
		{"small completion", "/v1/completions", small, 200},
		{"big completion", "/v1/completions", big, 413},
		{"big chat", "/v1/chat/completions", big, 413},
		{"big tokenize", "/tokenize", big, 413},
		{"big detokenize", "/detokenize", big, 413},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := e.do(t, "POST", tc.path, tc.body)
			if rec.Code != tc.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.status, rec.Body)
			}
			if tc.status == 413 && !strings.Contains(decodeError(t, rec).Message, "1024 bytes") {
				t.Errorf("413 message does not name the limit: %s", rec.Body)
			}
		})
	}
}

func TestModels(t *testing.T) {
	e := newEnv(t, nil)
	type card struct {
		ID          string `json:"id"`
		Object      string `json:"object"`
		Created     int64  `json:"created"`
		OwnedBy     string `json:"owned_by"`
		MaxModelLen int    `json:"max_model_len"`
	}
	want := card{testModel, "model", 1700000000, "trigon", testMaxCtx}
	rec := e.do(t, "GET", "/v1/models", "")
	var list struct {
		Object string `json:"object"`
		Data   []card `json:"data"`
	}
	strict(t, rec.Body.Bytes(), &list)
	if list.Object != "list" || len(list.Data) != 1 || list.Data[0] != want {
		t.Errorf("models %+v", list)
	}
	rec = e.do(t, "GET", "/v1/models/"+testModel, "")
	var one card
	strict(t, rec.Body.Bytes(), &one)
	if one != want {
		t.Errorf("model %+v", one)
	}
	if rec := e.do(t, "GET", "/v1/models/org/other-model", ""); rec.Code != 404 {
		t.Errorf("unknown model: status %d", rec.Code)
	} else if er := decodeError(t, rec); er.Param == nil || *er.Param != "model" {
		t.Errorf("404 %+v", er)
	}
	// A served name with a slash (hub-style) is one model, not a sub-route.
	e2 := newEnv(t, func(o *Options) { o.Model.ID = "org/name-7b" })
	if rec := e2.do(t, "GET", "/v1/models/org/name-7b", ""); rec.Code != 200 {
		t.Errorf("slashed model id: status %d", rec.Code)
	}
}

func TestTokenize(t *testing.T) {
	e := newEnv(t, nil)
	msgs := []ChatMessage{{Role: "system", Content: "be brief"}, {Role: "user", Content: "the cat sat"}}
	tmplNoGen, _ := e.tok.ApplyChatTemplate(msgs, false)
	idsNoGen, _ := e.tok.Encode(tmplNoGen, false)
	cases := []struct {
		name string
		body string
		want []int32
		strs bool
	}{
		{"prompt adds special by default", `{"prompt":"the cat héllo"}`, promptIDs(e.tok, "the cat héllo"), false},
		{"prompt without special", `{"prompt":"the cat","add_special_tokens":false}`, []int32{7, 8}, false},
		{"prompt with strings", `{"model":"fake-model","prompt":"日本 😀","return_token_strs":true}`, promptIDs(e.tok, "日本 😀"), true},
		{"messages", `{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"the cat sat"}]}`,
			chatIDs(e.tok, msgs), false},
		{"messages without generation prompt", `{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"the cat sat"}],"add_generation_prompt":false}`,
			idsNoGen, false},
		{"empty prompt", `{"prompt":"","add_special_tokens":false}`, []int32{}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := e.do(t, "POST", "/tokenize", tc.body)
			if rec.Code != 200 {
				t.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
			var got struct {
				Count       int      `json:"count"`
				MaxModelLen int      `json:"max_model_len"`
				Tokens      []int32  `json:"tokens"`
				TokenStrs   []string `json:"token_strs"`
			}
			strict(t, rec.Body.Bytes(), &got)
			if !reflect.DeepEqual(got.Tokens, tc.want) || got.Count != len(tc.want) || got.MaxModelLen != testMaxCtx {
				t.Errorf("got %+v, want tokens %v", got, tc.want)
			}
			if tc.strs {
				for i, id := range tc.want {
					if s, _ := e.tok.TokenString(id); got.TokenStrs[i] != s {
						t.Errorf("token_strs[%d] = %q, want %q", i, got.TokenStrs[i], s)
					}
				}
			} else if got.TokenStrs != nil {
				t.Errorf("token_strs present without return_token_strs")
			}
		})
	}
	errCases := []struct{ name, path, body, param string }{
		{"both", "/tokenize", `{"prompt":"a","messages":[{"role":"user","content":"a"}]}`, "messages"},
		{"neither", "/tokenize", `{}`, "prompt"},
		{"bad role", "/tokenize", `{"messages":[{"role":"robot","content":"a"}]}`, "messages[0].role"},
		{"prompt type", "/tokenize", `{"prompt":5}`, "prompt"},
		{"detok missing", "/detokenize", `{}`, "tokens"},
		{"detok bad id", "/detokenize", `{"tokens":[7,-3]}`, "tokens[1]"},
		{"detok out of vocab", "/detokenize", `{"tokens":[7,70000]}`, "tokens[1]"},
		{"detok strings", "/detokenize", `{"tokens":["a"]}`, "tokens"},
		{"detok wrong model", "/detokenize", `{"model":"x","tokens":[7]}`, "model"},
	}
	for _, tc := range errCases {
		t.Run(tc.name, func(t *testing.T) {
			rec := e.do(t, "POST", tc.path, tc.body)
			if rec.Code != 400 && rec.Code != 404 {
				t.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
			if er := decodeError(t, rec); er.Param == nil || *er.Param != tc.param {
				t.Errorf("param %v, want %q", er.Param, tc.param)
			}
		})
	}
}

// TestDetokenizeRoundTrip decodes random token ids and compares with the
// tokenizer directly, then re-tokenizes the text.
func TestDetokenizeRoundTrip(t *testing.T) {
	rng := testRand(t)
	e := newEnv(t, nil)
	for i := range 10 {
		ids := []int32{}
		for range 1 + rng.IntN(20) {
			ids = append(ids, int32(3+rng.IntN(len(fakeWords)-4))) // words only
		}
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			rec := e.do(t, "POST", "/detokenize", mustJSON(t, map[string]any{"tokens": ids}))
			var got struct {
				Prompt string `json:"prompt"`
			}
			strict(t, rec.Body.Bytes(), &got)
			want, _ := e.tok.Decode(ids, false)
			if got.Prompt != want {
				t.Fatalf("prompt %q, want %q", got.Prompt, want)
			}
			rec = e.do(t, "POST", "/tokenize", mustJSON(t, map[string]any{"prompt": got.Prompt, "add_special_tokens": false}))
			var tk struct {
				Tokens []int32 `json:"tokens"`
			}
			json.Unmarshal(rec.Body.Bytes(), &tk)
			if !reflect.DeepEqual(tk.Tokens, ids) {
				t.Errorf("round trip %v -> %v", ids, tk.Tokens)
			}
		})
	}
}

// TestClientDisconnectCancels runs a real HTTP server: a client that goes
// away mid-stream (or mid non-streamed request) must cancel the engine's
// context, so the engine frees the request's KV blocks.
func TestClientDisconnectCancels(t *testing.T) {
	for _, stream := range []bool{true, false} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			e := newEnv(t, nil)
			e.eng.delay = 20 * time.Millisecond
			ts := httptest.NewServer(e.srv.Handler())
			defer ts.Close()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			body := mustJSON(t, map[string]any{"prompt": "the", "max_tokens": 60, "ignore_eos": true, "stream": stream})
			req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/v1/completions", strings.NewReader(body))
			done := make(chan struct{})
			go func() {
				defer close(done)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return // cancelled before the headers (non-streamed)
				}
				defer resp.Body.Close()
				// Read two events, then hang up.
				br := bufio.NewReader(resp.Body)
				for n := 0; n < 4; {
					if _, err := br.ReadString('\n'); err != nil {
						return
					}
					n++
				}
				cancel()
				io.Copy(io.Discard, br)
			}()
			if !stream {
				// Hang up once the engine is generating.
				deadline := time.Now().Add(10 * time.Second)
				for e.eng.lastRequest() == nil && time.Now().Before(deadline) {
					time.Sleep(5 * time.Millisecond)
				}
				time.Sleep(50 * time.Millisecond)
				cancel()
			}
			select {
			case <-e.eng.cancelled:
			case <-time.After(10 * time.Second):
				t.Fatal("engine never saw the context cancelled")
			}
			<-done
			ts.Close() // waits for the handler to finish
			fams := scrapeMetrics(t, e)
			if got := metricValue(t, fams, "trigon_request_success_total", "finished_reason", "abort"); got != 1 {
				t.Errorf("aborted choices counted %g, want 1", got)
			}
		})
	}
}

// TestNewHTTPServer checks the limits of the http.Server helper.
func TestNewHTTPServer(t *testing.T) {
	hs := NewHTTPServer(":0", http.NotFoundHandler())
	if hs.ReadHeaderTimeout <= 0 || hs.MaxHeaderBytes <= 0 || hs.IdleTimeout <= 0 {
		t.Errorf("limits not set: %+v", hs)
	}
	if hs.ReadTimeout != 0 || hs.WriteTimeout != 0 {
		t.Errorf("read/write timeouts would cut long streams")
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	tok := newFakeTokenizer()
	eng := newFakeEngine(tok)
	good := ModelInfo{ID: "m", MaxContext: 10}
	cases := []struct {
		name string
		opts Options
	}{
		{"no engine", Options{Tokenizer: tok, Model: good}},
		{"no tokenizer", Options{Engine: eng, Model: good}},
		{"no model id", Options{Engine: eng, Tokenizer: tok, Model: ModelInfo{MaxContext: 10}}},
		{"no context", Options{Engine: eng, Tokenizer: tok, Model: ModelInfo{ID: "m"}}},
		{"negative n", Options{Engine: eng, Tokenizer: tok, Model: good, MaxN: -1}},
		{"negative body", Options{Engine: eng, Tokenizer: tok, Model: good, MaxBodyBytes: -1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(tc.opts); err == nil {
				t.Error("accepted")
			}
		})
	}
}

// TestSlowBodyTimesOut sends headers and half a body over a raw connection
// and stalls: the body deadline must answer 408 instead of waiting forever.
func TestSlowBodyTimesOut(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.BodyReadTimeout = 100 * time.Millisecond })
	ts := httptest.NewServer(e.srv.Handler())
	defer ts.Close()
	conn, err := net.Dial("tcp", ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\":")
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no response: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("status %d, want 408", resp.StatusCode)
	}
	if e.eng.lastRequest() != nil {
		t.Error("a partial body reached the engine")
	}
	// The rest of the body never comes: the server must close the
	// connection after the reply instead of waiting to drain the body.
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatalf("reading the 408 body: %v", err)
	}
	if n, err := conn.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("after the 408 the connection stayed open: read %d bytes, err %v; want EOF", n, err)
	}
}
