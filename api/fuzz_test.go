package api

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
)

// checkPlan asserts the invariants validation promises the engine.
func checkPlan(t *testing.T, s *Server, p *genPlan) {
	r := p.req
	sp := r.Sampling
	switch {
	case r.N < 1 || r.N > s.opts.MaxN:
		t.Fatalf("n %d", r.N)
	case sp.MaxTokens < 1 || len(r.Prompt)+sp.MaxTokens > s.opts.Model.MaxContext:
		t.Fatalf("max_tokens %d with prompt %d", sp.MaxTokens, len(r.Prompt))
	case sp.MinTokens < 0 || sp.MinTokens > sp.MaxTokens:
		t.Fatalf("min_tokens %d", sp.MinTokens)
	case sp.Temperature < 0 || sp.Temperature > 2, sp.TopP <= 0 || sp.TopP > 1, sp.MinP < 0 || sp.MinP > 1, sp.TopK < 0:
		t.Fatalf("sampling out of range: %+v", sp)
	case sp.RepetitionPenalty <= 0, sp.PresencePenalty < -2 || sp.PresencePenalty > 2, sp.FrequencyPenalty < -2 || sp.FrequencyPenalty > 2:
		t.Fatalf("penalties out of range: %+v", sp)
	case len(sp.Stop) > s.opts.MaxStopStrings:
		t.Fatalf("%d stop strings", len(sp.Stop))
	case r.TopLogprobs < 0 || r.TopLogprobs > maxTopLogprobs || (r.TopLogprobs > 0 && !r.Logprobs):
		t.Fatalf("logprobs %v top %d", r.Logprobs, r.TopLogprobs)
	case len(r.Prompt) == 0:
		t.Fatal("empty prompt")
	}
	for _, st := range sp.Stop {
		if st == "" || len(st) > s.opts.MaxStopStringBytes {
			t.Fatalf("stop %q", st)
		}
	}
	for _, id := range append(append([]int32(nil), r.Prompt...), sp.StopTokenIDs...) {
		if _, ok := s.opts.Tokenizer.TokenString(id); !ok {
			t.Fatalf("id %d not in vocab", id)
		}
	}
}

// fuzzRequest parses body; when valid, it also serves it end to end and
// checks the reply is well-formed.
func fuzzRequest(t *testing.T, e *env, path string, body []byte) {
	parse := e.srv.parseCompletion
	if path == "/v1/chat/completions" {
		parse = e.srv.parseChat
	}
	p, apiErr := parse(body)
	if apiErr != nil {
		if apiErr.Status != 400 && apiErr.Status != 404 {
			t.Fatalf("status %d for a client error", apiErr.Status)
		}
		if apiErr.Message == "" {
			t.Fatal("error without message")
		}
		if _, err := json.Marshal(apiErr); err != nil {
			t.Fatalf("error not encodable: %v", err)
		}
		return
	}
	checkPlan(t, e.srv, p)
	rec := httptest.NewRecorder()
	e.srv.Handler().ServeHTTP(rec, httptest.NewRequest("POST", path, strings.NewReader(string(body))))
	if rec.Code != 200 {
		t.Fatalf("valid request got %d: %s", rec.Code, rec.Body)
	}
	if p.stream {
		parseSSE(t, rec.Body.String())
	} else if !json.Valid(rec.Body.Bytes()) {
		t.Fatalf("reply is not JSON: %s", rec.Body)
	}
}

func FuzzCompletionRequest(f *testing.F) {
	for _, s := range []string{
		`{"prompt":"the cat","max_tokens":3}`,
		`{"prompt":[7,8,9],"max_tokens":2,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"prompt":[[7]],"n":3,"logprobs":2,"seed":5,"temperature":0.7,"top_p":0.9,"top_k":4,"min_p":0.05}`,
		`{"prompt":["héllo 日本"],"echo":true,"stop":["a","b"],"stop_token_ids":[9],"min_tokens":1,"max_tokens":4}`,
		`{"prompt":"x","presence_penalty":1,"frequency_penalty":-1,"repetition_penalty":1.3,"ignore_eos":true}`,
		`{"prompt":"the","response_format":{"type":"text"},"best_of":1,"suffix":"","logit_bias":{}}`,
		`{"prompt":null}`, `[]`, `{"prompt":[1e3]}`, `{"prompt":"a","max_tokens":-1}`,
	} {
		f.Add([]byte(s))
	}
	e := newEnv(f, nil)
	f.Fuzz(func(t *testing.T, body []byte) {
		fuzzRequest(t, e, "/v1/completions", body)
	})
}

func FuzzChatRequest(f *testing.F) {
	for _, s := range []string{
		`{"messages":[{"role":"user","content":"the cat"}],"max_tokens":3}`,
		`{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"dog"}]}],"stream":true}`,
		`{"messages":[{"role":"developer","content":"x"},{"role":"user","content":"y"},{"role":"assistant","content":null},{"role":"user","content":"z"}],"n":2,"logprobs":true,"top_logprobs":3}`,
		`{"messages":[{"role":"user","content":"a"}],"max_completion_tokens":5,"max_tokens":2,"stop":"b","seed":-3,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"messages":[{"role":"user","content":"a"}],"tools":[],"tool_choice":"none","response_format":{"type":"json_object"}}`,
		`{"messages":[]}`, `{"messages":[{"role":"tool"}]}`, `{"messages":"hi"}`, `null`, `{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}`,
	} {
		f.Add([]byte(s))
	}
	e := newEnv(f, nil)
	f.Fuzz(func(t *testing.T, body []byte) {
		fuzzRequest(t, e, "/v1/chat/completions", body)
	})
}
