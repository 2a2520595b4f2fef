package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// Error types in the "type" field of OpenAI-shaped error bodies. Clients
// switch on the HTTP status; the type is for humans and logs.
const (
	typeInvalidRequest = "invalid_request_error"
	typeAuthentication = "authentication_error"
	typeNotFound       = "not_found_error"
	typeRateLimit      = "rate_limit_error"
	typeServer         = "server_error"
	typeUnavailable    = "service_unavailable_error"
)

// Error is an error reply in OpenAI's shape:
//
//	{"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
//
// Param names the offending request field (dotted path, "messages[2].role")
// and Code a machine-readable reason; both are null when empty.
type Error struct {
	Status  int
	Message string
	Type    string
	Param   string
	Code    string
}

func (e *Error) Error() string {
	if e.Param != "" {
		return fmt.Sprintf("%d %s (param %s): %s", e.Status, e.Type, e.Param, e.Message)
	}
	return fmt.Sprintf("%d %s: %s", e.Status, e.Type, e.Message)
}

// MarshalJSON writes the wrapped {"error": {...}} body.
func (e *Error) MarshalJSON() ([]byte, error) {
	return marshal(struct {
		Error errorBody `json:"error"`
	}{e.body()})
}

// errorBody is the inner object; it is also what a stream sends as
// data: {"error": ...} once the 200 status is committed.
type errorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func (e *Error) body() errorBody {
	b := errorBody{Message: e.Message, Type: e.Type}
	if e.Param != "" {
		b.Param = &e.Param
	}
	if e.Code != "" {
		b.Code = &e.Code
	}
	return b
}

func badRequest(param, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Type: typeInvalidRequest, Param: param,
		Message: fmt.Sprintf(format, args...)}
}

// writeError sends e as the JSON reply.
func writeError(w http.ResponseWriter, e *Error) {
	if e.Status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="trigon"`)
	}
	writeJSON(w, e.Status, e)
}

// marshal encodes v without HTML escaping: API clients read the text
// verbatim, and "<|end|>" should not arrive as "\u003c|end|\u003e".
func marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := marshal(v)
	if err != nil {
		// Only our own response types reach here; failing to encode one is
		// a bug, reported as a plain 500 rather than a panic.
		status = http.StatusInternalServerError
		b = []byte(`{"error":{"message":"internal error encoding the response","type":"server_error","param":null,"code":null}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// engineError maps an error from the engine to an HTTP error.
func engineError(err error) *Error {
	switch {
	case errors.Is(err, ErrQueueFull):
		return &Error{Status: http.StatusTooManyRequests, Type: typeRateLimit, Code: "queue_full", Message: err.Error()}
	case errors.Is(err, ErrNotReady), errors.Is(err, ErrShuttingDown):
		return &Error{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Message: err.Error()}
	case errors.Is(err, ErrBadRequest):
		return &Error{Status: http.StatusBadRequest, Type: typeInvalidRequest, Message: badRequestText(err)}
	case errors.Is(err, errEngineProtocol):
		return &Error{Status: http.StatusInternalServerError, Type: typeServer, Message: "internal server error"}
	}
	return &Error{Status: http.StatusInternalServerError, Type: typeServer, Message: "internal server error: " + err.Error()}
}

// badRequestText is the message a client is shown for err, which wraps
// ErrBadRequest: its text without the "bad request: " that
// fmt.Errorf("%w: ...", ErrBadRequest) puts first, which the 400 and the
// error type say already.
func badRequestText(err error) string {
	msg := err.Error()
	if rest, ok := strings.CutPrefix(msg, ErrBadRequest.Error()+": "); ok && rest != "" {
		return rest
	}
	return msg
}

// errEngineProtocol marks an engine that broke the Engine contract (an
// event for a choice that does not exist, a channel closed early).
var errEngineProtocol = errors.New("engine broke the event protocol")
