package api

import (
	"fmt"
	"strings"
	"testing"
)

func TestValidationErrors(t *testing.T) {
	const cmpl, chat = "/v1/completions", "/v1/chat/completions"
	user := `"messages":[{"role":"user","content":"the cat"}]`
	longPrompt := words(60, 1) // 60 words + BOS = 61 tokens
	longChat := words(50, 2)   // 50 words + 3 template tokens = 53 tokens
	cases := []struct {
		name   string
		path   string
		body   string
		status int
		param  string // "" means param must be null
		msg    string // substring of the message
	}{
		{"empty body", cmpl, ``, 400, "", "empty"},
		{"bad json", cmpl, `{"prompt": "x",}`, 400, "", "not valid JSON"},
		{"truncated json", chat, `{"messages": [`, 400, "", "not valid JSON"},
		{"trailing garbage", cmpl, `{"prompt":"the"} x`, 400, "", "not valid JSON"},
		{"array body", cmpl, `[1,2]`, 400, "", "must be a JSON object"},
		{"string temperature", cmpl, `{"prompt":"the","temperature":"hot"}`, 400, "temperature", "expected a number"},
		{"float n", cmpl, `{"prompt":"the","n":1.5}`, 400, "n", "expected an integer"},
		{"string max_tokens", chat, `{` + user + `,"max_tokens":"10"}`, 400, "max_tokens", "expected an integer"},
		{"bool stream wrong", cmpl, `{"prompt":"the","stream":"yes"}`, 400, "stream", "expected a boolean"},
		{"messages object", chat, `{"messages":{"role":"user"}}`, 400, "messages", "expected an array"},
		{"role number", chat, `{"messages":[{"role":1,"content":"x"}]}`, 400, "messages.role", "expected a string"},
		{"seed overflow", cmpl, `{"prompt":"the","seed":18446744073709551616}`, 400, "seed", "expected an integer"},
		{"temperature high", cmpl, `{"prompt":"the","temperature":2.5}`, 400, "temperature", "between 0 and 2"},
		{"temperature negative", chat, `{` + user + `,"temperature":-0.1}`, 400, "temperature", "between 0 and 2"},
		{"top_p zero", cmpl, `{"prompt":"the","top_p":0}`, 400, "top_p", "(0, 1]"},
		{"top_p high", chat, `{` + user + `,"top_p":1.01}`, 400, "top_p", "(0, 1]"},
		{"top_k negative", cmpl, `{"prompt":"the","top_k":-2}`, 400, "top_k", "top_k"},
		{"min_p high", cmpl, `{"prompt":"the","min_p":1.5}`, 400, "min_p", "between 0 and 1"},
		{"presence high", cmpl, `{"prompt":"the","presence_penalty":2.5}`, 400, "presence_penalty", "between -2 and 2"},
		{"frequency low", chat, `{` + user + `,"frequency_penalty":-3}`, 400, "frequency_penalty", "between -2 and 2"},
		{"repetition zero", cmpl, `{"prompt":"the","repetition_penalty":0}`, 400, "repetition_penalty", "(0, 10]"},
		{"n zero", cmpl, `{"prompt":"the","n":0}`, 400, "n", "between 1 and 4"},
		{"n over cap", chat, `{` + user + `,"n":5}`, 400, "n", "between 1 and 4"},
		{"logprobs over", cmpl, `{"prompt":"the","logprobs":21}`, 400, "logprobs", "between 0 and 20"},
		{"logprobs negative", cmpl, `{"prompt":"the","logprobs":-1}`, 400, "logprobs", "between 0 and 20"},
		{"top_logprobs over", chat, `{` + user + `,"logprobs":true,"top_logprobs":21}`, 400, "top_logprobs", "between 0 and 20"},
		{"top_logprobs without logprobs", chat, `{` + user + `,"top_logprobs":2}`, 400, "top_logprobs", "requires 'logprobs'"},
		{"max_tokens zero", cmpl, `{"prompt":"the","max_tokens":0}`, 400, "max_tokens", "at least 1"},
		{"max_tokens negative", chat, `{` + user + `,"max_tokens":-5}`, 400, "max_tokens", "at least 1"},
		{"max_completion_tokens zero", chat, `{` + user + `,"max_tokens":5,"max_completion_tokens":0}`, 400, "max_completion_tokens", "at least 1"},
		{"max_tokens over cap", cmpl, `{"prompt":"the","max_tokens":40}`, 400, "max_tokens", "at most 32"},
		{"min_tokens negative", cmpl, `{"prompt":"the","min_tokens":-1}`, 400, "min_tokens", ">= 0"},
		{"min_tokens over max", cmpl, `{"prompt":"the","max_tokens":3,"min_tokens":4}`, 400, "min_tokens", "must not exceed"},
		{"too many stops", cmpl, `{"prompt":"the","stop":["a","b","c","d"]}`, 400, "stop", "at most 3 stop strings"},
		{"stop too long", chat, `{` + user + `,"stop":"` + strings.Repeat("x", 17) + `"}`, 400, "stop[0]", "at most 16 bytes"},
		{"empty stop", cmpl, `{"prompt":"the","stop":["a",""]}`, 400, "stop[1]", "must not be empty"},
		{"stop number", cmpl, `{"prompt":"the","stop":5}`, 400, "stop", "string or an array"},
		{"stop mixed array", cmpl, `{"prompt":"the","stop":["a",1]}`, 400, "stop", "string or an array"},
		{"stop_token_ids out of vocab", cmpl, `{"prompt":"the","stop_token_ids":[5,100000]}`, 400, "stop_token_ids[1]", "not in the vocabulary"},
		{"stop_token_ids negative", cmpl, `{"prompt":"the","stop_token_ids":[-1]}`, 400, "stop_token_ids[0]", "out of range"},
		{"empty messages", chat, `{"messages":[]}`, 400, "messages", "non-empty"},
		{"missing messages", chat, `{"model":"fake-model"}`, 400, "messages", "non-empty"},
		{"bad role", chat, `{"messages":[{"role":"wizard","content":"x"}]}`, 400, "messages[0].role", "must be one of"},
		{"missing role", chat, `{"messages":[{"content":"x"}]}`, 400, "messages[0].role", "required"},
		{"tool role", chat, `{"messages":[{"role":"user","content":"a"},{"role":"tool","content":"x"}]}`, 400, "messages[1].role", "tool calls"},
		{"null user content", chat, `{"messages":[{"role":"user","content":null}]}`, 400, "messages[0].content", "required"},
		{"image part", chat, `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, 400, "messages[0].content[0].type", "text only"},
		{"text part without text", chat, `{"messages":[{"role":"user","content":[{"type":"text"}]}]}`, 400, "messages[0].content[0].text", "needs 'text'"},
		{"content number", chat, `{"messages":[{"role":"user","content":3}]}`, 400, "messages[0].content", "string or an array"},
		{"template error", chat, `{"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"}]}`, 400, "messages", "roles must alternate"},
		{"tools", chat, `{` + user + `,"tools":[{"type":"function","function":{"name":"f"}}]}`, 400, "tools", "not supported"},
		{"tool_choice", chat, `{` + user + `,"tool_choice":"required"}`, 400, "tool_choice", "not supported"},
		{"assistant tool_calls", chat, `{"messages":[{"role":"user","content":"a"},{"role":"assistant","tool_calls":[{"id":"1"}]}]}`, 400, "messages[1].tool_calls", "not supported"},
		{"json schema", cmpl, `{"prompt":"the","response_format":{"type":"json_schema"}}`, 400, "response_format.type", "not to a schema"},
		{"bad response format", chat, `{` + user + `,"response_format":{"type":"yaml"}}`, 400, "response_format.type", "must be one of"},
		{"logit_bias", cmpl, `{"prompt":"the","logit_bias":{"5":10}}`, 400, "logit_bias", "not supported"},
		{"suffix", cmpl, `{"prompt":"the","suffix":"end"}`, 400, "suffix", "not supported"},
		{"best_of", cmpl, `{"prompt":"the","best_of":3}`, 400, "best_of", "only equal 'n'"},
		{"echo with logprobs", cmpl, `{"prompt":"the","echo":true,"logprobs":2}`, 400, "echo", "not supported"},
		{"stream_options without stream", chat, `{` + user + `,"stream_options":{"include_usage":true}}`, 400, "stream_options", "only allowed"},
		{"missing prompt", cmpl, `{"max_tokens":3}`, 400, "prompt", "required"},
		{"null prompt", cmpl, `{"prompt":null}`, 400, "prompt", "required"},
		{"prompt number", cmpl, `{"prompt":42}`, 400, "prompt", "must be a string"},
		{"prompt empty array", cmpl, `{"prompt":[]}`, 400, "prompt", "must not be empty"},
		{"prompt batch", cmpl, `{"prompt":["the cat","the dog"]}`, 400, "prompt", "batched prompts"},
		{"prompt token batch", cmpl, `{"prompt":[[7,8],[9]]}`, 400, "prompt", "batched prompts"},
		{"prompt empty token list", cmpl, `{"prompt":[[]]}`, 400, "prompt[0]", "must not be empty"},
		{"prompt bad token", cmpl, `{"prompt":[7,8,9999]}`, 400, "prompt[2]", "not in the vocabulary"},
		{"prompt float token", cmpl, `{"prompt":[7,8.5]}`, 400, "prompt", "integer token ids"},
		{"prompt object", cmpl, `{"prompt":[{"a":1}]}`, 400, "prompt", "must be a string"},
		{"prompt tokenizer error", cmpl, `{"prompt":"the __fail__"}`, 400, "prompt", "cannot encode"},
		{"prompt empty after tokenization", cmpl, `{"prompt":"","add_special_tokens":false}`, 400, "prompt", "empty after tokenization"},
		{"unknown model", cmpl, `{"model":"gpt-4","prompt":"the"}`, 404, "model", "does not exist"},
		{"unknown model chat", chat, `{"model":"other",` + user + `}`, 404, "model", "does not exist"},
		{"prompt too long", cmpl, `{"prompt":"` + longPrompt + `","max_tokens":10}`, 400, "prompt",
			fmt.Sprintf("'max_tokens' is too large: 10. This model's maximum context length is %d tokens and your prompt has %d tokens (10 > %d - %d). Please reduce the length of the prompt or 'max_tokens'.",
				testMaxCtx, 61, testMaxCtx, 61)},
		{"prompt alone too long", cmpl, `{"prompt":"` + words(70, 3) + `"}`, 400, "prompt",
			fmt.Sprintf("This model's maximum context length is %d tokens. However, your prompt has %d tokens, which leaves 0 for the completion (at least 1 needed). Please reduce the length of the prompt.", testMaxCtx, 71)},
		{"prompt alone too long, max_tokens", cmpl, `{"prompt":"` + words(70, 3) + `","max_tokens":5}`, 400, "prompt",
			fmt.Sprintf("However, your prompt has %d tokens, which leaves 0 for the completion", 71)},
		{"chat too long", chat, `{"messages":[{"role":"user","content":"` + longChat + `"}],"max_completion_tokens":20}`, 400, "messages",
			fmt.Sprintf("'max_completion_tokens' is too large: 20. This model's maximum context length is %d tokens and your messages have %d tokens (20 > %d - %d). Please reduce the length of the messages or 'max_completion_tokens'.",
				testMaxCtx, 53, testMaxCtx, 53)},
		{"chat prompt alone too long", chat, `{"messages":[{"role":"user","content":"` + words(70, 3) + `"}]}`, 400, "messages",
			fmt.Sprintf("This model's maximum context length is %d tokens. However, your messages have %d tokens, which leaves 0 for the completion (at least 1 needed). Please reduce the length of the messages.", testMaxCtx, 73)},
		{"huge max_tokens", cmpl, `{"prompt":"the","max_tokens":9223372036854775807}`, 400, "max_tokens", "at most 32"},
	}
	e := newEnv(t, func(o *Options) {
		o.MaxStopStrings = 3
		o.MaxStopStringBytes = 16
		o.MaxTokensCap = 32
	})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := len(e.eng.requests)
			rec := e.do(t, "POST", tc.path, tc.body)
			if rec.Code != tc.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.status, rec.Body)
			}
			er := decodeError(t, rec)
			if !strings.Contains(er.Message, tc.msg) {
				t.Errorf("message %q does not contain %q", er.Message, tc.msg)
			}
			gotParam := ""
			if er.Param != nil {
				gotParam = *er.Param
			}
			if gotParam != tc.param {
				t.Errorf("param %q, want %q", gotParam, tc.param)
			}
			if len(e.eng.requests) != before {
				t.Errorf("an invalid request reached the engine")
			}
		})
	}
}

// TestHugeMaxTokensWithoutCap checks the context check cannot overflow.
func TestHugeMaxTokensWithoutCap(t *testing.T) {
	e := newEnv(t, nil)
	rec := e.do(t, "POST", "/v1/completions", `{"prompt":"the","max_tokens":9223372036854775807}`)
	if rec.Code != 400 {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	er := decodeError(t, rec)
	if !strings.Contains(er.Message, "maximum context length") || er.Code == nil || *er.Code != "context_length_exceeded" {
		t.Errorf("got %+v", er)
	}
}

// TestValidRequestsAccepted covers the accepted shapes that validation
// must not refuse.
func TestValidRequestsAccepted(t *testing.T) {
	cases := []struct{ name, path, body string }{
		{"prompt ids", "/v1/completions", `{"prompt":[7,8,9],"max_tokens":2}`},
		{"prompt one-string batch", "/v1/completions", `{"prompt":["the cat"],"max_tokens":2}`},
		{"prompt one-id batch", "/v1/completions", `{"prompt":[[7,8]],"max_tokens":2}`},
		{"model named", "/v1/completions", `{"model":"fake-model","prompt":"the","max_tokens":2}`},
		{"unknown fields ignored", "/v1/completions", `{"prompt":"the","max_tokens":2,"user":"u1","metadata":{"a":1},"foo":[1,2]}`},
		{"nulls are absent", "/v1/completions", `{"prompt":"the","max_tokens":null,"temperature":null,"stop":null,"n":null,"seed":null}`},
		{"top_k -1", "/v1/completions", `{"prompt":"the","max_tokens":2,"top_k":-1}`},
		{"negative seed", "/v1/completions", `{"prompt":"the","max_tokens":2,"seed":-7}`},
		{"best_of equal n", "/v1/completions", `{"prompt":"the","max_tokens":2,"best_of":2,"n":2}`},
		{"empty suffix", "/v1/completions", `{"prompt":"the","max_tokens":2,"suffix":""}`},
		{"text format", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"response_format":{"type":"text"}}`},
		{"developer role", "/v1/chat/completions", `{"messages":[{"role":"developer","content":"be brief"},{"role":"user","content":"hi"}],"max_tokens":2}`},
		{"text parts", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"text","text":"the"},{"type":"text","text":"cat"}]}],"max_tokens":2}`},
		{"assistant null content", "/v1/chat/completions", `{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":null,"tool_calls":[]},{"role":"user","content":"b"}],"max_tokens":2}`},
		{"empty tools", "/v1/chat/completions", `{"messages":[{"role":"user","content":"a"}],"tools":[],"tool_choice":"none","max_tokens":2}`},
		{"top_logprobs zero without logprobs", "/v1/chat/completions", `{"messages":[{"role":"user","content":"a"}],"top_logprobs":0,"max_tokens":2}`},
	}
	e := newEnv(t, nil)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := e.do(t, "POST", tc.path, tc.body)
			if rec.Code != 200 {
				t.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
		})
	}
}

// TestPromptShapes checks each accepted prompt shape reaches the engine as
// the tokens the tokenizer makes (or the ids given).
func TestPromptShapes(t *testing.T) {
	e := newEnv(t, nil)
	cases := []struct {
		name string
		body string
		want []int32
	}{
		{"string adds BOS", `{"prompt":"the cat sat","max_tokens":1}`, promptIDs(e.tok, "the cat sat")},
		{"string without special", `{"prompt":"the cat","max_tokens":1,"add_special_tokens":false}`, []int32{7, 8}},
		{"ids as given", `{"prompt":[9,3,12],"max_tokens":1}`, []int32{9, 3, 12}},
		{"nested ids", `{"prompt":[[12,13]],"max_tokens":1}`, []int32{12, 13}},
		{"one-string batch", `{"prompt":["dog ran"],"max_tokens":1}`, promptIDs(e.tok, "dog ran")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := e.do(t, "POST", "/v1/completions", tc.body)
			if rec.Code != 200 {
				t.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
			got := e.eng.lastRequest().Prompt
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("prompt %v, want %v", got, tc.want)
			}
		})
	}
}

// TestWholeNumberIntegers: an integer field takes a JSON number with no
// fractional part (16.0, 1e3), as vLLM's pydantic models do in lax mode,
// and it reaches the engine as the integer; 16.5 and integers past int64
// keep the type error, naming the field.
func TestWholeNumberIntegers(t *testing.T) {
	const cmpl, chat = "/v1/completions", "/v1/chat/completions"
	user := `"messages":[{"role":"user","content":"the cat"}]`
	cases := []struct {
		name, path, body string
		want             func(*GenerateRequest) any // the field as the engine gets it
		value            any
		param            string // a refusal: the field it names
	}{
		{"max_tokens", cmpl, `{"prompt":"the","max_tokens":16.0}`, func(r *GenerateRequest) any { return r.Sampling.MaxTokens }, 16, ""},
		{"max_tokens, exponent", cmpl, `{"prompt":"the","max_tokens":1.6e1}`, func(r *GenerateRequest) any { return r.Sampling.MaxTokens }, 16, ""},
		{"n", cmpl, `{"prompt":"the","max_tokens":2,"n":2.0}`, func(r *GenerateRequest) any { return r.N }, 2, ""},
		{"top_k", cmpl, `{"prompt":"the","max_tokens":2,"top_k":5.0}`, func(r *GenerateRequest) any { return r.Sampling.TopK }, 5, ""},
		{"top_k -1", cmpl, `{"prompt":"the","max_tokens":2,"top_k":-1.0}`, func(r *GenerateRequest) any { return r.Sampling.TopK }, 0, ""},
		{"seed", cmpl, `{"prompt":"the","max_tokens":2,"seed":3.0}`, func(r *GenerateRequest) any { return *r.Sampling.Seed }, uint64(3), ""},
		{"negative seed", cmpl, `{"prompt":"the","max_tokens":2,"seed":-7.0}`, func(r *GenerateRequest) any { return *r.Sampling.Seed }, uint64(1<<64 - 7), ""},
		{"min_tokens", cmpl, `{"prompt":"the","max_tokens":3,"min_tokens":2.0}`, func(r *GenerateRequest) any { return r.Sampling.MinTokens }, 2, ""},
		{"stop_token_ids", cmpl, `{"prompt":"the","max_tokens":2,"stop_token_ids":[5.0]}`, func(r *GenerateRequest) any { return fmt.Sprint(r.Sampling.StopTokenIDs) }, "[5]", ""},
		{"logprobs", cmpl, `{"prompt":"the","max_tokens":2,"logprobs":2.0}`, func(r *GenerateRequest) any { return r.TopLogprobs }, 2, ""},
		{"best_of", cmpl, `{"prompt":"the","max_tokens":2,"n":2,"best_of":2.0}`, func(r *GenerateRequest) any { return r.N }, 2, ""},
		{"prompt ids", cmpl, `{"prompt":[7.0,8],"max_tokens":2}`, func(r *GenerateRequest) any { return fmt.Sprint(r.Prompt) }, "[7 8]", ""},
		{"max_completion_tokens", chat, `{` + user + `,"max_completion_tokens":3.0}`, func(r *GenerateRequest) any { return r.Sampling.MaxTokens }, 3, ""},
		{"top_logprobs", chat, `{` + user + `,"max_tokens":2,"logprobs":true,"top_logprobs":1.0}`, func(r *GenerateRequest) any { return r.TopLogprobs }, 1, ""},
		{"max_tokens 16.5", cmpl, `{"prompt":"the","max_tokens":16.5}`, nil, nil, "max_tokens"},
		{"seed 3.5", cmpl, `{"prompt":"the","seed":3.5}`, nil, nil, "seed"},
		{"top_k past int64", chat, `{` + user + `,"top_k":1e19}`, nil, nil, "top_k"},
		{"n past float64", cmpl, `{"prompt":"the","n":1e400}`, nil, nil, "n"},
		{"min_tokens string", cmpl, `{"prompt":"the","min_tokens":"2"}`, nil, nil, "min_tokens"},
		{"stop_token_ids 5.5", cmpl, `{"prompt":"the","stop_token_ids":[5.5]}`, nil, nil, "stop_token_ids"},
	}
	e := newEnv(t, nil)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := e.do(t, "POST", tc.path, tc.body)
			if tc.param == "" {
				if rec.Code != 200 {
					t.Fatalf("status %d: %s", rec.Code, rec.Body)
				}
				if got := tc.want(e.eng.lastRequest()); got != tc.value {
					t.Errorf("the engine got %v (%T), want %v (%T)", got, got, tc.value, tc.value)
				}
				return
			}
			if rec.Code != 400 {
				t.Fatalf("status %d, want 400: %s", rec.Code, rec.Body)
			}
			er := decodeError(t, rec)
			if er.Param == nil || *er.Param != tc.param || !strings.Contains(er.Message, "invalid type for '"+tc.param+"': expected an integer") {
				t.Errorf("error %+v, want the type error of %s", er, tc.param)
			}
		})
	}
}
