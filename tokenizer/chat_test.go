package tokenizer

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/ardanlabs/jinja"
)

// guardTestTemplates exercise what guardTemplate rewrites (for loops with
// filters, else branches and whitespace control; macros, nested and
// trimmed) next to what it must leave alone (tags inside strings, comments).
var guardTestTemplates = map[string]string{
	"loops": "{% for m in messages if m.role != 'system' %}\n  [{{ loop.index }}] {{ m.content }}\n{% else %}none{% endfor %}" +
		"{%- for i in range(3) -%} {{ i }} {%- endfor %}",
	"trimmed macro": "{%- macro show(m, sep='|') -%}\n    {{ m.role }}{{ sep }}{{ m.content }}\n{%- endmacro -%}\n" +
		"{%- for m in messages %}\n{{ show(m) }}\n{%- endfor %}",
	"plain macro": "{% macro wrap(x) %}\n<{{ x }}>\n{% endmacro %}\n{% macro twice(x) %}{{ wrap(x) }}{{ wrap(x) }}{% endmacro %}" +
		"{% for m in messages %}{{ twice(m.content) }}{% endfor %}",
	"strings and comments": "{# {% for x in y %} #}{{ '{% for a in b %}' }}{% set s = \"{% macro %}\" %}{{ s }}" +
		"{% for m in messages[::-1] %}{{ m.role|upper }}{% endfor %}",
	"nested loops": "{% for a in messages %}{% for b in messages %}{{ a.role[0] }}{{ b.role[0] }} {% endfor %}\n{% endfor %}",
	"call block":   "{% macro box() %}[{{ caller() }}]{% endmacro %}{% call box() %}{{ messages|length }}{% endcall %}",
	"sets": "{% set a = 1 %}{% set b = 2 %}{% set x = a == b %}{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}" +
		"{% set blk %}[{{ ns.n }}]{% endset %}{{ x }}{{ blk }}{{- ' trimmed ' -}} {{ {'k': [1, 2]} }} {{ none }}",
}

var guardTestConversation = []Message{
	{Role: "system", Content: "Be brief."},
	{Role: "user", Content: "Hi\nthere"},
	{Role: "assistant", Content: "  Hello!  "},
}

func messagesValue(msgs []Message) map[string]any {
	var list []any
	for _, m := range msgs {
		list = append(list, map[string]any{"role": m.Role, "content": m.Content})
	}
	return map[string]any{"messages": list, "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"}
}

// TestGuardPreservesOutput renders each template as written and with the
// guards woven in: the output must be identical.
func TestGuardPreservesOutput(t *testing.T) {
	templates := map[string]string{}
	for k, v := range guardTestTemplates {
		templates[k] = v
	}
	var qwen struct {
		ChatTemplate string `json:"chat_template"`
	}
	if err := json.Unmarshal(readMaybeGz(t, "testdata/qwen3.tokenizer_config.json"), &qwen); err != nil {
		t.Fatal(err)
	}
	templates["qwen3"] = qwen.ChatTemplate
	for name, src := range templates {
		t.Run(name, func(t *testing.T) {
			plain, err := jinja.Compile(src)
			if err != nil {
				t.Fatal(err)
			}
			want, err := plain.Render(messagesValue(guardTestConversation))
			if err != nil {
				t.Fatal(err)
			}
			guarded, err := compileChatTemplate(src)
			if err != nil {
				t.Fatal(err)
			}
			got, err := guarded.tmpl.RenderValues(withGuards(messagesValue(guardTestConversation)))
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Fatalf("guarded render differs\n got %q\nwant %q", got, want)
			}
			if want == "" {
				t.Fatal("template rendered nothing; the comparison proves little")
			}
		})
	}
}

func withGuards(data map[string]any) map[string]jinja.Value {
	vals := map[string]jinja.Value{}
	for k, v := range data {
		vals[k] = jinja.FromGoValue(v)
	}
	(&renderGuard{}).install(vals)
	return vals
}

// TestChatTemplateLimits feeds hostile templates: each must end with an
// error, not hang, blow the stack or panic.
func TestChatTemplateLimits(t *testing.T) {
	defer func(n int) { maxRenderedBytes = n }(maxRenderedBytes)
	maxRenderedBytes = 1 << 20
	long := strings.Repeat("x", 200)
	cases := map[string]string{
		"recursive macro":   "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
		"mutual recursion":  "{% macro a() %}{{ b() }}{% endmacro %}{% macro b() %}{{ a() }}{% endmacro %}{{ a() }}",
		"huge range":        "{% for i in range(1000000000) %}x{% endfor %}",
		"nested loops":      "{% for a in range(2000) %}{% for b in range(2000) %}{% endfor %}{% endfor %}",
		"raise":             "{{ raise_exception('no thanks') }}",
		"undefined call":    "{{ nope() }}",
		"macro call budget": "{% macro f() %}{% endmacro %}{% for i in range(60000) %}{{ f() }}{{ f() }}{% endfor %}",
		"range step zero":   "{{ range(1, 5, 0) }}",
		"doubling value":    "{% set ns = namespace(s='" + long + "') %}{% for i in range(14) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
		"big output":        "{% set s = '" + long + "' %}{% for i in range(10000) %}{{ s }}{{ s }}{% endfor %}",
	}
	for name, src := range cases {
		t.Run(name, func(t *testing.T) {
			ct, err := compileChatTemplate(src)
			if err != nil {
				return // refusing at compile time is fine too
			}
			tok := &Tokenizer{chat: ct, bos: -1, unk: -1, pad: -1}
			if out, err := tok.ApplyChatTemplate(guardTestConversation, true); err == nil {
				t.Fatalf("want an error, got %d bytes", len(out))
			}
		})
	}
}

func TestChatTemplateCompileErrors(t *testing.T) {
	for _, src := range []string{"{% for %}", "{% if x %}", "{{ 'unclosed }}", "{% for x in %}{% endfor %}", strings.Repeat("a", maxTemplateBytes+1)} {
		if _, err := compileChatTemplate(src); err == nil {
			t.Errorf("compile %.40q: want an error", src)
		}
	}
}

func TestChatTemplateVarsAndFields(t *testing.T) {
	ct, err := compileChatTemplate("{% for m in messages %}{{ m.role }}:{{ m.content }}" +
		"{% if m.name is defined %}({{ m.name }}){% endif %}" +
		"{% if m.reasoning_content is defined %}<think>{{ m.reasoning_content }}</think>{% endif %};{% endfor %}" +
		"{{ bos_token }}|{{ eos_token }}|{{ enable_thinking }}|{{ add_generation_prompt }}")
	if err != nil {
		t.Fatal(err)
	}
	tok := &Tokenizer{chat: ct, pieces: []string{"<s>", "</s>"}, bos: 0, eos: []TokenID{1}, unk: -1, pad: -1}
	got, err := tok.ApplyChatTemplateVars([]Message{
		{Role: "user", Content: "a", Name: "bob"},
		{Role: "assistant", Content: "b", ReasoningContent: "hmm"},
	}, false, map[string]any{"enable_thinking": false})
	if err != nil {
		t.Fatal(err)
	}
	want := "user:a(bob);assistant:b<think>hmm</think>;<s>|</s>|False|False"
	if got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestChatTemplateSourceForms(t *testing.T) {
	cases := []struct {
		raw     string
		want    string
		wantErr bool
	}{
		{`null`, "", false},
		{`"{{ x }}"`, "{{ x }}", false},
		{`[{"name":"tool_use","template":"T"},{"name":"default","template":"D"}]`, "D", false},
		{`[{"name":"tool_use","template":"T"}]`, "", true},
		{`42`, "", true},
	}
	for _, c := range cases {
		got, err := chatTemplateSource(json.RawMessage(c.raw))
		if (err != nil) != c.wantErr || got != c.want {
			t.Errorf("chatTemplateSource(%s) = %q, %v; want %q, error %v", c.raw, got, err, c.want, c.wantErr)
		}
	}
}
