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
	"strings"
	"testing"
	"time"
)

// TestDrain: after Drain, new generation requests get 503 in the OpenAI
// error shape and /health says "draining", while a stream in flight goes
// on to its end; a request still sending its body gets the same 503 at
// once (before that stream ends) and its connection is closed;
// WaitReplies waits for the stream's reply and not for the stalled
// request.
func TestDrain(t *testing.T) {
	// A body timeout far beyond the test's: only the drain can answer the
	// stalled client.
	e := newEnv(t, func(o *Options) { o.BodyReadTimeout = time.Hour })
	e.eng.delay = 20 * time.Millisecond
	ts := httptest.NewServer(e.srv.Handler())
	defer ts.Close()

	// A client stalled in its body: it must not hold up WaitReplies.
	stalled, err := net.Dial("tcp", ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()
	fmt.Fprintf(stalled, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\":")

	body := mustJSON(t, map[string]any{"prompt": "the", "max_tokens": 50, "ignore_eos": true, "stream": true})
	resp, err := http.Post(ts.URL+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil { // the stream has begun
		t.Fatal(err)
	}

	// The stalled request must have reached its handler (it is reading
	// the body) before the drain: the drain is what must answer it.
	waitReading(t, e.srv)
	e.srv.Drain()
	// Read while the stream is still running: the stalled client's
	// answer must not wait for the drain's end. The deadline only keeps a
	// broken server from hanging the test.
	stalled.SetReadDeadline(time.Now().Add(10 * time.Second))
	sbr := bufio.NewReader(stalled)
	if sr, err := http.ReadResponse(sbr, nil); err != nil {
		t.Errorf("the stalled client after Drain: %v, want a 503", err)
	} else {
		var er struct {
			Error struct {
				Type string `json:"type"`
			} `json:"error"`
		}
		err := json.NewDecoder(sr.Body).Decode(&er)
		sr.Body.Close()
		if sr.StatusCode != http.StatusServiceUnavailable || err != nil || er.Error.Type != typeUnavailable || !sr.Close {
			t.Errorf("the stalled client after Drain: %d %+v (%v), Connection: close %v; want 503 %s and close",
				sr.StatusCode, er, err, sr.Close, typeUnavailable)
		}
	}

	for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
		r, err := http.Post(ts.URL+path, "application/json", strings.NewReader(`{"prompt":"the","messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Fatalf("%s while draining: %v", path, err)
		}
		var er struct {
			Error struct {
				Message string  `json:"message"`
				Type    string  `json:"type"`
				Param   *string `json:"param"`
				Code    *string `json:"code"`
			} `json:"error"`
		}
		err = json.NewDecoder(r.Body).Decode(&er)
		r.Body.Close()
		if r.StatusCode != http.StatusServiceUnavailable || err != nil || er.Error.Type != typeUnavailable ||
			!strings.Contains(er.Error.Message, "shutting down") {
			t.Errorf("%s while draining: %d %+v (%v), want 503 %s 'shutting down'", path, r.StatusCode, er, err, typeUnavailable)
		}
	}
	if r, err := http.Get(ts.URL + "/health"); err != nil || r.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("/health while draining: %v %v, want 503", r, err)
	} else {
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if !strings.Contains(string(b), "draining") {
			t.Errorf("/health while draining: %s", b)
		}
	}

	// The stream is still running: WaitReplies waits for it.
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := e.srv.WaitReplies(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitReplies with a stream running: %v, want DeadlineExceeded", err)
	}
	waited := make(chan error, 1)
	go func() { waited <- e.srv.WaitReplies(context.Background()) }()
	rest, err := io.ReadAll(br)
	if err != nil || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") || !strings.Contains(string(rest), `"finish_reason":"length"`) {
		t.Errorf("the stream in flight while draining ended with %q (%v), want its last chunk and [DONE]", tail(string(rest)), err)
	}
	select {
	case err := <-waited:
		if err != nil {
			t.Errorf("WaitReplies: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WaitReplies did not return after the last reply (a stalled body holding it?)")
	}
	if n, err := io.Copy(io.Discard, sbr); n != 0 || err != nil {
		t.Errorf("the stalled client's connection after the 503: %d more bytes, %v; want it closed", n, err)
	}
}

// waitReading waits until some request is reading its body.
func waitReading(t *testing.T, s *Server) {
	t.Helper()
	for range 1000 {
		s.mu.Lock()
		n := len(s.reading)
		s.mu.Unlock()
		if n > 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("the stalled request never began reading its body")
}
