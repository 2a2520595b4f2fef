package sample

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

type step struct {
	tok  int32
	text string
	// what Add must return
	emit   string
	done   bool
	reason string
}

const eos = 2

func TestStopChecker(t *testing.T) {
	for _, c := range []struct {
		name  string
		p     Params
		steps []step
		match string
		id    int32
	}{
		{
			name: "no stop",
			p:    Params{},
			steps: []step{
				{10, "Hello", "Hello", false, ""},
				{11, " big", " big", false, ""},
				{12, " world", " world", false, ""},
			},
			id: -1,
		},
		{
			name: "stop string inside one token",
			p:    Params{Stop: []string{"wor"}},
			steps: []step{
				{10, "Hello", "Hello", false, ""},
				{11, " world!", " ", true, ReasonStop},
			},
			match: "wor", id: -1,
		},
		{
			name: "stop string split across tokens",
			p:    Params{Stop: []string{"STOP"}},
			steps: []step{
				{10, "abc S", "abc ", false, ""},
				{11, "TO", "", false, ""},
				{12, "P tail", "", true, ReasonStop},
			},
			match: "STOP", id: -1,
		},
		{
			name: "partial match released",
			p:    Params{Stop: []string{"STOP"}},
			steps: []step{
				{10, "abc ST", "abc ", false, ""},
				{11, "OX", "STOX", false, ""},
				{12, "S", "", false, ""},
			},
			id: -1,
		},
		{
			name: "overlapping partial matches",
			p:    Params{Stop: []string{"aab"}},
			steps: []step{
				{10, "a", "", false, ""},
				{11, "a", "", false, ""},
				{12, "a", "a", false, ""},
				{13, "b", "", true, ReasonStop},
			},
			match: "aab", id: -1,
		},
		{
			name: "self-overlapping stop",
			p:    Params{Stop: []string{"abab"}},
			steps: []step{
				{10, "xab", "x", false, ""},
				{11, "aa", "aba", false, ""}, // the last "a" may start a new match
				{12, "bab", "", true, ReasonStop},
			},
			match: "abab", id: -1,
		},
		{
			name: "earliest of several stops",
			p:    Params{Stop: []string{"xyz", "bc"}},
			steps: []step{
				{10, "abcxyz", "a", true, ReasonStop},
			},
			match: "bc", id: -1,
		},
		{
			name: "EOS releases held text, drops its own",
			p:    Params{Stop: []string{"ZZ"}},
			steps: []step{
				{10, "aZ", "a", false, ""},
				{eos, "</s>", "Z", true, ReasonStop},
			},
			id: eos,
		},
		{
			name: "ignore EOS",
			p:    Params{IgnoreEOS: true},
			steps: []step{
				{eos, "</s>", "</s>", false, ""},
				{10, "x", "x", false, ""},
			},
			id: -1,
		},
		{
			name: "stop token id",
			p:    Params{StopTokenIDs: []int32{77}},
			steps: []step{
				{10, "a", "a", false, ""},
				{77, "<|im_end|>", "", true, ReasonStop},
			},
			id: 77,
		},
		{
			name: "min tokens delays EOS, stop ids and stop strings",
			p:    Params{MinTokens: 3, Stop: []string{"!"}, StopTokenIDs: []int32{77}},
			steps: []step{
				{eos, "", "", false, ""},
				{77, "!", "!", false, ""},
				{10, "a!b", "a", true, ReasonStop},
			},
			match: "!", id: -1,
		},
		{
			name: "stop string straddling min tokens",
			p:    Params{MinTokens: 2, Stop: []string{"END"}},
			steps: []step{
				{10, "xEN", "x", false, ""},
				{11, "D", "", true, ReasonStop},
			},
			match: "END", id: -1,
		},
		{
			name: "multi-byte stop",
			p:    Params{Stop: []string{"ïx"}},
			steps: []step{
				{10, "na", "na", false, ""},
				{11, "ï", "", false, ""},
				{12, "ve", "ïve", false, ""},
				{13, "ïx", "", true, ReasonStop},
			},
			id: -1, match: "ïx",
		},
		{
			name: "done stays done",
			p:    Params{StopTokenIDs: []int32{77}},
			steps: []step{
				{77, "", "", true, ReasonStop},
				{11, "b", "", true, ReasonStop},
			},
			id: 77,
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			sc := NewStopChecker(c.p, []int32{eos, 3})
			for i, s := range c.steps {
				done, reason, emit := sc.Add(s.tok, s.text)
				if done != s.done || reason != s.reason || emit != s.emit {
					t.Fatalf("step %d Add(%d, %q) = %v, %q, %q; want %v, %q, %q", i, s.tok, s.text, done, reason, emit, s.done, s.reason, s.emit)
				}
			}
			if str, id := sc.Match(); str != c.match || id != c.id {
				t.Errorf("Match() = %q, %d; want %q, %d", str, id, c.match, c.id)
			}
		})
	}
}

func TestStopCheckerFlush(t *testing.T) {
	sc := NewStopChecker(Params{Stop: []string{"<end>"}}, nil)
	if _, _, emit := sc.Add(1, "abc<en"); emit != "abc" {
		t.Fatalf("emit %q", emit)
	}
	if got := sc.Flush(); got != "<en" {
		t.Errorf("Flush = %q, want %q", got, "<en")
	}
	if got := sc.Flush(); got != "" {
		t.Errorf("second Flush = %q", got)
	}
}

func TestMask(t *testing.T) {
	inf := float32(math.Inf(-1))
	for _, c := range []struct {
		name      string
		p         Params
		generated int
		want      []float32
	}{
		{"before min tokens", Params{MinTokens: 2, StopTokenIDs: []int32{4, 99}}, 1, []float32{0, 1, inf, inf, inf, 5}},
		{"min tokens reached", Params{MinTokens: 2, StopTokenIDs: []int32{4}}, 2, []float32{0, 1, 2, 3, 4, 5}},
		{"ignore EOS", Params{MinTokens: 2, IgnoreEOS: true, StopTokenIDs: []int32{4}}, 0, []float32{0, 1, 2, 3, inf, 5}},
		{"no min tokens", Params{StopTokenIDs: []int32{4}}, 0, []float32{0, 1, 2, 3, 4, 5}},
	} {
		t.Run(c.name, func(t *testing.T) {
			sc := NewStopChecker(c.p, []int32{eos, 3})
			for range c.generated {
				sc.Add(10, "")
			}
			logits := []float32{0, 1, 2, 3, 4, 5}
			sc.Mask(logits)
			for i := range logits {
				if logits[i] != c.want[i] {
					t.Fatalf("logits %v, want %v", logits, c.want)
				}
			}
		})
	}
}

// TestStopStreamingProperty streams random text in random chunks against
// random stop strings (none a substring of another, so that the first
// match to complete is also the first in the text) and checks that the
// emitted text is exactly the text before the first stop string: nothing
// emitted ever has to be taken back.
func TestStopStreamingProperty(t *testing.T) {
	r := newRand(t)
	const alphabet = "abc"
	word := func(n int) string {
		var b strings.Builder
		for range n {
			b.WriteByte(alphabet[r.IntN(len(alphabet))])
		}
		return b.String()
	}
	for round := range 2000 {
		var stops []string
		for len(stops) < 1+r.IntN(3) {
			s := word(1 + r.IntN(4))
			ok := true
			for _, o := range stops {
				ok = ok && !strings.Contains(o, s) && !strings.Contains(s, o)
			}
			if ok {
				stops = append(stops, s)
			}
		}
		text := word(r.IntN(30))
		first, which := len(text), ""
		for _, s := range stops {
			if i := strings.Index(text, s); i >= 0 && i < first {
				first, which = i, s
			}
		}
		sc := NewStopChecker(Params{Stop: stops}, nil)
		var out strings.Builder
		done := false
		for rest := text; rest != "" && !done; {
			n := 1 + r.IntN(min(len(rest), 5))
			var emit, reason string
			done, reason, emit = sc.Add(10, rest[:n])
			rest = rest[n:]
			out.WriteString(emit)
			if done && reason != ReasonStop {
				t.Fatalf("reason %q", reason)
			}
		}
		if !done {
			out.WriteString(sc.Flush())
		}
		label := fmt.Sprintf("round %d: text %q stops %q", round, text, stops)
		if got := out.String(); got != text[:first] {
			t.Fatalf("%s: emitted %q, want %q", label, got, text[:first])
		}
		if done != (which != "") {
			t.Fatalf("%s: done = %v", label, done)
		}
		if m, _ := sc.Match(); m != which {
			t.Fatalf("%s: matched %q, want %q", label, m, which)
		}
	}
}
