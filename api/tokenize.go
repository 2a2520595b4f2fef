package api

import (
	"encoding/json"
	"net/http"
)

// tokenizeRequest is vLLM's /tokenize body: either a prompt or chat
// messages (rendered with the chat template), never both.
type tokenizeRequest struct {
	Model               string          `json:"model"`
	Prompt              *string         `json:"prompt"`
	Messages            []chatMessageIn `json:"messages"`
	AddGenerationPrompt *bool           `json:"add_generation_prompt"`
	AddSpecialTokens    *bool           `json:"add_special_tokens"`
	ReturnTokenStrs     bool            `json:"return_token_strs"`
}

type tokenizeResponse struct {
	Count       int      `json:"count"`
	MaxModelLen int      `json:"max_model_len"`
	Tokens      []int32  `json:"tokens"`
	TokenStrs   []string `json:"token_strs"`
}

func (s *Server) handleTokenize(w http.ResponseWriter, r *http.Request) {
	body, e := s.readBody(w, r, false)
	if e != nil {
		writeError(w, e)
		return
	}
	var req tokenizeRequest
	if e := decodeJSON(body, &req); e != nil {
		writeError(w, e)
		return
	}
	if e := s.checkModel(req.Model); e != nil {
		writeError(w, e)
		return
	}
	var ids []int32
	switch {
	case req.Prompt != nil && req.Messages != nil:
		writeError(w, badRequest("messages", "send either 'prompt' or 'messages', not both"))
		return
	case req.Prompt != nil:
		// Like completions: special tokens (BOS) are added by default.
		ids, e = s.encode(*req.Prompt, boolOr(req.AddSpecialTokens, true), "prompt")
	case req.Messages != nil:
		// Like chat: the template already writes BOS, so no special tokens.
		ids, e = s.encodeChat(req.Messages, boolOr(req.AddGenerationPrompt, true), boolOr(req.AddSpecialTokens, false))
	default:
		e = badRequest("prompt", "send 'prompt' or 'messages'")
	}
	if e != nil {
		writeError(w, e)
		return
	}
	resp := tokenizeResponse{Count: len(ids), MaxModelLen: s.opts.Model.MaxContext, Tokens: ids}
	if resp.Tokens == nil {
		resp.Tokens = []int32{}
	}
	if req.ReturnTokenStrs {
		resp.TokenStrs = make([]string, len(ids))
		for i, id := range ids {
			resp.TokenStrs[i], _ = s.opts.Tokenizer.TokenString(id)
		}
	}
	writeJSON(w, http.StatusOK, resp)
}

type detokenizeRequest struct {
	Model  string          `json:"model"`
	Tokens json.RawMessage `json:"tokens"`
}

func (s *Server) handleDetokenize(w http.ResponseWriter, r *http.Request) {
	body, e := s.readBody(w, r, false)
	if e != nil {
		writeError(w, e)
		return
	}
	var req detokenizeRequest
	if e := decodeJSON(body, &req); e != nil {
		writeError(w, e)
		return
	}
	if e := s.checkModel(req.Model); e != nil {
		writeError(w, e)
		return
	}
	if isNull(req.Tokens) {
		writeError(w, badRequest("tokens", "'tokens' is required"))
		return
	}
	ids, e := s.tokenIDs(req.Tokens, "tokens")
	if e != nil {
		writeError(w, e)
		return
	}
	text, err := s.opts.Tokenizer.Decode(ids, false)
	if err != nil {
		writeError(w, badRequest("tokens", "decoding tokens: %v", err))
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Prompt string `json:"prompt"`
	}{text})
}

func boolOr(p *bool, def bool) bool {
	if p == nil {
		return def
	}
	return *p
}

// encode tokenizes client text. A tokenizer failure on client text is
// reported as the client's problem (400), with the field named.
func (s *Server) encode(text string, addSpecial bool, param string) ([]int32, *Error) {
	ids, err := s.opts.Tokenizer.Encode(text, addSpecial)
	if err != nil {
		return nil, badRequest(param, "tokenizing '%s': %v", param, err)
	}
	return ids, nil
}

// encodeChat validates messages, applies the chat template and tokenizes.
func (s *Server) encodeChat(in []chatMessageIn, addGen, addSpecial bool) ([]int32, *Error) {
	msgs, e := chatMessages(in)
	if e != nil {
		return nil, e
	}
	text, err := s.opts.Tokenizer.ApplyChatTemplate(msgs, addGen)
	if err != nil {
		return nil, badRequest("messages", "applying the chat template: %v", err)
	}
	return s.encode(text, addSpecial, "messages")
}
