package tokenizer

import (
	"errors"
	"fmt"
	"strings"

	"github.com/ardanlabs/jinja"
)

// Message is one chat turn handed to the model's chat template.
type Message struct {
	Role    string
	Content string
	// Name is passed as message.name when non-empty.
	Name string
	// ReasoningContent is passed as message.reasoning_content when
	// non-empty (Qwen3-style templates render it inside <think>).
	ReasoningContent string
}

// Limits on rendering a chat template. Templates come from model files, so
// rendering must end and stay small whatever they contain. Guards woven
// into the template (see guardTemplate) count every for-loop iteration,
// every macro call and every byte written by {{ }}, and check the size of
// every value a {% set %} stores; range() is bounded. What no guard sees is
// the inside of one expression: 'x' * 10**9, or a long chain of ~ over a
// stored value, can still build a large string before a guard looks at
// it; such a template is a hostile file.
const (
	maxTemplateBytes   = 1 << 20
	maxLoopIterations  = 1 << 20 // over one render, all loops together
	maxMacroDepth      = 64
	maxMacroCalls      = 1 << 16
	maxRangeLen        = 1 << 16
	guardLoopName      = "__trigon_loop"
	guardEnterName     = "__trigon_enter"
	guardLeaveName     = "__trigon_leave"
	guardOutName       = "__trigon_out"
	guardValName       = "__trigon_val"
	guardAssignVarName = "__trigon_guard"
)

// maxRenderedBytes bounds a render's output and any value it stores. A
// variable so that tests can lower it.
var maxRenderedBytes = 64 << 20

// chatTemplate is a compiled, guarded template.
type chatTemplate struct {
	source string // as the model file has it
	tmpl   *jinja.Template
}

func compileChatTemplate(src string) (*chatTemplate, error) {
	if len(src) > maxTemplateBytes {
		return nil, fmt.Errorf("chat template is %d bytes, more than %d", len(src), maxTemplateBytes)
	}
	guarded, err := guardTemplate(src)
	if err != nil {
		return nil, fmt.Errorf("chat template: %w", err)
	}
	tmpl, err := compileNoPanic(guarded)
	if err != nil {
		return nil, fmt.Errorf("chat template: %w", err)
	}
	return &chatTemplate{source: src, tmpl: tmpl}, nil
}

func compileNoPanic(src string) (t *jinja.Template, err error) {
	defer func() {
		if r := recover(); r != nil {
			t, err = nil, fmt.Errorf("compile panicked: %v", r)
		}
	}()
	return jinja.Compile(src)
}

// HasChatTemplate reports whether the tokenizer carries a chat template.
func (t *Tokenizer) HasChatTemplate() bool { return t.chat != nil }

// ApplyChatTemplate renders msgs with the model's chat template, as
// transformers' apply_chat_template(msgs, tokenize=False,
// add_generation_prompt=...) does. Errors raised by the template
// (raise_exception) come back as errors.
func (t *Tokenizer) ApplyChatTemplate(msgs []Message, addGenerationPrompt bool) (string, error) {
	return t.ApplyChatTemplateVars(msgs, addGenerationPrompt, nil)
}

// ApplyChatTemplateVars is ApplyChatTemplate with extra template variables
// (for example "enable_thinking" for Qwen3), converted with
// jinja.FromGoValue. They cannot replace the variables the renderer sets.
func (t *Tokenizer) ApplyChatTemplateVars(msgs []Message, addGenerationPrompt bool, vars map[string]any) (string, error) {
	if t.chat == nil {
		return "", errors.New("apply chat template: the tokenizer has no chat template")
	}
	data := make(map[string]jinja.Value, len(vars)+12)
	for k, v := range vars {
		data[k] = jinja.FromGoValue(v)
	}
	list := make([]jinja.Value, len(msgs))
	for i, m := range msgs {
		d := jinja.NewDict()
		dd := d.AsDict()
		dd.Set("role", jinja.NewString(m.Role))
		dd.Set("content", jinja.NewString(m.Content))
		if m.Name != "" {
			dd.Set("name", jinja.NewString(m.Name))
		}
		if m.ReasoningContent != "" {
			dd.Set("reasoning_content", jinja.NewString(m.ReasoningContent))
		}
		list[i] = d
	}
	data["messages"] = jinja.NewList(list)
	data["add_generation_prompt"] = jinja.NewBool(addGenerationPrompt)
	for name, id := range map[string]TokenID{"bos_token": t.bos, "unk_token": t.unk, "pad_token": t.pad} {
		if id >= 0 {
			data[name] = jinja.NewString(t.pieces[id])
		}
	}
	if len(t.eos) > 0 {
		data["eos_token"] = jinja.NewString(t.pieces[t.eos[0]])
	}
	g := &renderGuard{}
	g.install(data)
	out, err := renderNoPanic(t.chat.tmpl, data)
	if err != nil {
		return "", fmt.Errorf("apply chat template: %w", err)
	}
	if len(out) > maxRenderedBytes { // text outside {{ }} counts too
		return "", fmt.Errorf("apply chat template: output of %d bytes is over the limit", len(out))
	}
	return out, nil
}

func renderNoPanic(t *jinja.Template, data map[string]jinja.Value) (out string, err error) {
	defer func() {
		if r := recover(); r != nil {
			out, err = "", fmt.Errorf("render panicked: %v", r)
		}
	}()
	return t.RenderValues(data)
}

// renderGuard counts one render's loop iterations and macro calls.
type renderGuard struct {
	iterations int64
	depth      int
	calls      int
	written    int64
}

// valueSize estimates the bytes a value prints as.
func valueSize(v jinja.Value) int64 {
	if v.IsString() {
		return int64(len(v.AsString()))
	}
	if v.IsList() || v.IsDict() {
		return int64(len(v.String()))
	}
	return 16
}

func (g *renderGuard) install(data map[string]jinja.Value) {
	data[guardLoopName] = jinja.NewCallable(guardLoopName, func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		if len(args) != 1 {
			return jinja.Undefined(), errors.New("loop guard: want one argument")
		}
		v := args[0]
		var n int
		switch {
		case v.IsList():
			n = v.AsList().Len()
		case v.IsDict():
			n = v.AsDict().Len()
		case v.IsString():
			n = len(v.AsString())
		}
		g.iterations += int64(n)
		if g.iterations > maxLoopIterations {
			return jinja.Undefined(), fmt.Errorf("template loops ran more than %d iterations", maxLoopIterations)
		}
		return v, nil
	})
	data[guardEnterName] = jinja.NewCallable(guardEnterName, func([]jinja.Value, map[string]jinja.Value) (jinja.Value, error) {
		g.depth++
		g.calls++
		if g.depth > maxMacroDepth {
			return jinja.Undefined(), fmt.Errorf("template macros nested more than %d deep", maxMacroDepth)
		}
		if g.calls > maxMacroCalls {
			return jinja.Undefined(), fmt.Errorf("template called macros more than %d times", maxMacroCalls)
		}
		return jinja.NewString(""), nil
	})
	data[guardLeaveName] = jinja.NewCallable(guardLeaveName, func([]jinja.Value, map[string]jinja.Value) (jinja.Value, error) {
		g.depth--
		return jinja.NewString(""), nil
	})
	data[guardOutName] = jinja.NewCallable(guardOutName, func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		if len(args) != 1 {
			return jinja.Undefined(), errors.New("output guard: want one argument")
		}
		g.written += valueSize(args[0])
		if g.written > int64(maxRenderedBytes) {
			return jinja.Undefined(), fmt.Errorf("template output is over %d bytes", maxRenderedBytes)
		}
		return args[0], nil
	})
	data[guardValName] = jinja.NewCallable(guardValName, func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		if len(args) != 1 {
			return jinja.Undefined(), errors.New("value guard: want one argument")
		}
		if valueSize(args[0]) > int64(maxRenderedBytes) {
			return jinja.Undefined(), fmt.Errorf("template stored a value over %d bytes", maxRenderedBytes)
		}
		return args[0], nil
	})
	data["range"] = jinja.NewCallable("range", boundedRange)
}

// boundedRange is Python's range() with a cap on its length.
func boundedRange(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	var start, stop, step int64 = 0, 0, 1
	toInt := func(v jinja.Value) (int64, error) {
		if !v.IsInt() {
			return 0, fmt.Errorf("range: argument %s is not an integer", v.String())
		}
		return v.AsInt(), nil
	}
	var err error
	switch len(args) {
	case 1:
		stop, err = toInt(args[0])
	case 2, 3:
		if start, err = toInt(args[0]); err == nil {
			stop, err = toInt(args[1])
		}
		if err == nil && len(args) == 3 {
			step, err = toInt(args[2])
		}
	default:
		return jinja.Undefined(), fmt.Errorf("range: want 1 to 3 arguments, got %d", len(args))
	}
	if err != nil {
		return jinja.Undefined(), err
	}
	if step == 0 {
		return jinja.Undefined(), errors.New("range: step must not be zero")
	}
	var count int64
	switch {
	case step > 0 && stop > start:
		count = (stop-start-1)/step + 1
	case step < 0 && stop < start:
		count = (start-stop-1)/(-step) + 1
	}
	if count > maxRangeLen || count < 0 {
		return jinja.Undefined(), fmt.Errorf("range: %d items is more than %d", count, maxRangeLen)
	}
	items := make([]jinja.Value, count)
	for i := range items {
		items[i] = jinja.NewInt(start + int64(i)*step)
	}
	return jinja.NewList(items), nil
}

// guardTemplate weaves the render guards into a template's source:
//
//	{{ EXPR }}                    ->  {{ __trigon_out(EXPR) }}
//	{% set T = EXPR %}            ->  {% set T = __trigon_val(EXPR) %}
//	{% for x in ITER ... %}       ->  {% for x in __trigon_loop(ITER) ... %}
//	{% macro m(...) %}BODY{% endmacro %}
//	    -> {% macro m(...) %}{% set __trigon_guard = __trigon_enter() %}BODY{% set __trigon_guard = __trigon_leave() %}{% endmacro %}
//
// The inserted tags carry the whitespace-control flags of the tags next to
// them, so the template renders exactly as before (checked in chat_test.go).
// Tags are found the way ardanlabs/jinja's scanner finds them: "{%", "{{"
// and "{#" open a tag, and quoted strings inside {% %} and {{ }} are
// skipped when looking for the closer.
func guardTemplate(src string) (string, error) {
	var out strings.Builder
	out.Grow(len(src) + 256)
	i := 0
	for i < len(src) {
		j := strings.IndexByte(src[i:], '{')
		if j < 0 || i+j+1 >= len(src) {
			out.WriteString(src[i:])
			break
		}
		j += i
		var closer string
		switch src[j+1] {
		case '{':
			closer = "}}"
		case '%':
			closer = "%}"
		case '#':
			closer = "#}"
		default:
			out.WriteString(src[i : j+1])
			i = j + 1
			continue
		}
		out.WriteString(src[i:j])
		end, bodyStart, bodyEnd, trimL, trimR, ok := scanTag(src, j, closer)
		if !ok {
			return "", fmt.Errorf("unclosed tag at byte %d", j)
		}
		body := src[bodyStart:bodyEnd]
		if closer == "}}" && strings.TrimSpace(body) != "" {
			out.WriteString(exprText(trimL, trimR, guardOutName+"("+strings.TrimSpace(body)+")"))
			i = end
			continue
		}
		if closer != "%}" {
			out.WriteString(src[j:end])
			i = end
			continue
		}
		kw, rest := stmtKeyword(body)
		switch kw {
		case "set":
			if eq := findAssign(rest); eq >= 0 && findComma(rest[:eq]) < 0 {
				out.WriteString(tagText(trimL, trimR, "set "+rest[:eq]+"= "+guardValName+"("+strings.TrimSpace(rest[eq+1:])+")"))
			} else {
				out.WriteString(src[j:end])
			}
		case "for":
			nb, err := guardFor(rest)
			if err != nil {
				return "", err
			}
			out.WriteString(tagText(trimL, trimR, "for "+nb))
		case "macro":
			out.WriteString(src[j:end])
			out.WriteString(tagText(false, trimR, "set "+guardAssignVarName+" = "+guardEnterName+"()"))
		case "endmacro":
			out.WriteString(tagText(trimL, false, "set "+guardAssignVarName+" = "+guardLeaveName+"()"))
			out.WriteString(src[j:end])
		default:
			out.WriteString(src[j:end])
		}
		i = end
	}
	return out.String(), nil
}

// scanTag finds the end of the tag opened at src[j:j+2].
func scanTag(src string, j int, closer string) (end, bodyStart, bodyEnd int, trimL, trimR, ok bool) {
	i := j + 2
	if i < len(src) && src[i] == '-' {
		trimL = true
		i++
	}
	bodyStart = i
	for i < len(src) {
		c := src[i]
		if closer != "#}" && (c == '\'' || c == '"') {
			i++
			for i < len(src) && src[i] != c {
				if src[i] == '\\' && i+1 < len(src) {
					i++
				}
				i++
			}
			i++ // closing quote
			continue
		}
		if c == '-' && i+2 < len(src) && src[i+1] == closer[0] && src[i+2] == closer[1] {
			return i + 3, bodyStart, i, trimL, true, true
		}
		if i+1 < len(src) && c == closer[0] && src[i+1] == closer[1] {
			return i + 2, bodyStart, i, trimL, false, true
		}
		i++
	}
	return 0, 0, 0, false, false, false
}

func tagText(trimL, trimR bool, body string) string {
	var b strings.Builder
	b.WriteString("{%")
	if trimL {
		b.WriteByte('-')
	}
	b.WriteByte(' ')
	b.WriteString(body)
	b.WriteByte(' ')
	if trimR {
		b.WriteByte('-')
	}
	b.WriteString("%}")
	return b.String()
}

func exprText(trimL, trimR bool, body string) string {
	t := tagText(trimL, trimR, body)
	return "{{" + t[2:len(t)-2] + "}}"
}

// findAssign finds the "=" of an assignment outside quotes and brackets.
func findAssign(s string) int {
	return scanTopLevel(s, func(i int) bool {
		if s[i] != '=' {
			return false
		}
		prevOp := i > 0 && strings.IndexByte("=!<>", s[i-1]) >= 0
		nextEq := i+1 < len(s) && s[i+1] == '='
		return !prevOp && !nextEq
	})
}

func findComma(s string) int { return scanTopLevel(s, func(i int) bool { return s[i] == ',' }) }

// scanTopLevel returns the first index outside quotes and brackets where
// hit is true, or -1.
func scanTopLevel(s string, hit func(i int) bool) int {
	depth := 0
	var quote byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		if quote != 0 {
			if c == '\\' {
				i++
			} else if c == quote {
				quote = 0
			}
			continue
		}
		switch c {
		case '\'', '"':
			quote = c
			continue
		case '(', '[', '{':
			depth++
			continue
		case ')', ']', '}':
			depth--
			continue
		}
		if depth == 0 && hit(i) {
			return i
		}
	}
	return -1
}

func stmtKeyword(body string) (kw, rest string) {
	s := strings.TrimSpace(body)
	k := 0
	for k < len(s) && isIdentByte(s[k]) {
		k++
	}
	return s[:k], s[k:]
}

func isIdentByte(c byte) bool {
	return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
}

// guardFor wraps the iterable of "x in ITER [if COND] [recursive]".
func guardFor(rest string) (string, error) {
	in := findKeyword(rest, "in")
	if in < 0 {
		return "", fmt.Errorf("for loop without 'in': %q", rest)
	}
	iter := rest[in+2:]
	tail := ""
	if k := findKeyword(iter, "recursive"); k >= 0 {
		iter, tail = iter[:k], iter[k:]
	}
	if k := findKeyword(iter, "if"); k >= 0 {
		iter, tail = iter[:k], iter[k:]+tail
	}
	if strings.TrimSpace(iter) == "" {
		return "", fmt.Errorf("for loop without an iterable: %q", rest)
	}
	return rest[:in] + "in " + guardLoopName + "(" + strings.TrimSpace(iter) + ") " + tail, nil
}

// findKeyword finds kw as a whole word outside quotes and brackets.
func findKeyword(s, kw string) int {
	return scanTopLevel(s, func(i int) bool {
		return strings.HasPrefix(s[i:], kw) &&
			(i == 0 || !isIdentByte(s[i-1])) &&
			(i+len(kw) == len(s) || !isIdentByte(s[i+len(kw)]))
	})
}
