package sample

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

func feedAll(s string) (ok, complete bool) {
	st := JSONState{TopObject: true}
	if !st.Feed(s) {
		return false, false
	}
	return true, st.Complete()
}

func TestJSONStateTable(t *testing.T) {
	for _, tc := range []struct {
		in           string
		ok, complete bool
	}{
		{`{}`, true, true},
		{` { "a" : 1 } `, true, true},
		{`{"a":[1,2.5e-3,-0,true,false,null,"x\u00e9\n"],"b":{}}`, true, true},
		{`{"a":`, true, false},
		{`{"a":tr`, true, false},
		{`{"a":1.`, true, false},
		{`{"a":"\u00`, true, false},
		{`[1]`, false, false}, // the top level must be an object
		{`"x"`, false, false},
		{`{"a" 1}`, false, false},  // missing colon
		{`{"a":01}`, false, false}, // leading zero
		{`{"a":1,}`, false, false}, // trailing comma
		{`{a:1}`, false, false},    // unquoted key
		{`{"a":tru}`, false, false},
		{`{"a":"\x"}`, false, false},
		{"{\"a\":\"\n\"}", false, false}, // raw control character in a string
		{`{}}`, false, false},
		{`{} x`, false, false},
		{`{"a":[}`, false, false},
		{`{"a":-}`, false, false},
		{`{"a":1e}`, false, false},
	} {
		ok, complete := feedAll(tc.in)
		if ok != tc.ok || complete != tc.complete {
			t.Errorf("%q: ok %v complete %v, want %v %v", tc.in, ok, complete, tc.ok, tc.complete)
		}
	}
}

// randomValue builds a random JSON value of bounded depth.
func randomValue(r *rand.Rand, depth int) any {
	switch k := r.IntN(8); {
	case depth > 3 || k == 0:
		return r.NormFloat64() * math.Pow(10, float64(r.IntN(12)-6))
	case k == 1:
		return r.IntN(2) == 0
	case k == 2:
		return nil
	case k == 3:
		b := make([]rune, r.IntN(6))
		for i := range b {
			alphabet := []rune("aZ \"\\/\n\té€😀\x01")
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		return string(b)
	case k < 6:
		a := make([]any, r.IntN(4))
		for i := range a {
			a[i] = randomValue(r, depth+1)
		}
		return a
	default:
		m := map[string]any{}
		for i := range r.IntN(4) {
			m[strings.Repeat("k", i+1)] = randomValue(r, depth+1)
		}
		return m
	}
}

// TestJSONStateMatchesEncodingJSON: every object encoding/json writes is
// accepted byte by byte and complete at its end; every text the checker
// accepts as complete, encoding/json calls valid; random corruptions that
// the checker rejects are invalid to encoding/json, unless only a prefix
// issue (an incomplete text is not rejected).
func TestJSONStateMatchesEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		m := map[string]any{"v": randomValue(r, 0)}
		raw, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if r.IntN(2) == 0 {
			raw, _ = json.MarshalIndent(m, "", "  ")
		}
		if ok, complete := feedAll(string(raw)); !ok || !complete {
			t.Fatalf("valid %s: ok %v complete %v", raw, ok, complete)
		}
		// Corrupt one byte.
		bad := []byte(string(raw))
		const corrupt = "{}[]\",:0-.eE tfn\\x"
		bad[r.IntN(len(bad))] = corrupt[r.IntN(len(corrupt))]
		ok, complete := feedAll(string(bad))
		valid := json.Valid(bad) && len(bad) > 0 && strings.TrimSpace(string(bad))[0] == '{'
		if ok && complete && !valid {
			t.Fatalf("checker accepts %q as complete, encoding/json does not", bad)
		}
		if valid && !(ok && complete) {
			t.Fatalf("encoding/json accepts %q, checker: ok %v complete %v", bad, ok, complete)
		}
	}
}

// TestJSONConstraintMask: over a toy vocabulary, masked tokens are exactly
// those that would break the JSON, EOS only once the object is complete,
// and then nothing but EOS.
func TestJSONConstraintMask(t *testing.T) {
	texts := []string{"", `{"`, `a`, `":`, ` 1`, `}`, `]`, `x`, `"`, ""} // 0 and 9: special
	const eos = 9
	c := NewJSONConstraint(texts, []int32{eos})
	allowed := func() []int {
		l := make([]float32, len(texts))
		c.Mask(l)
		var ids []int
		for i, v := range l {
			if !math.IsInf(float64(v), -1) {
				ids = append(ids, i)
			}
		}
		return ids
	}
	for _, step := range []struct {
		accept []int32
		want   []int
	}{
		{nil, []int{1}},                       // only `{"` starts an object
		{[]int32{1, 2, 3}, []int{1, 3, 4, 8}}, // after {"a": a value: an object, a number, or a string (`":` opens one)
		{[]int32{4}, []int{5}},                // after {"a": 1 only } (" 1" would put a 1 after a space-ended number)
		{[]int32{5}, []int{eos}},              // complete: EOS and nothing else
	} {
		for _, id := range step.accept {
			c.Accept(id)
		}
		if got := allowed(); !equalInts(got, step.want) {
			t.Fatalf("after %v: allowed %v, want %v", step.accept, got, step.want)
		}
	}
	if !c.Complete() {
		t.Fatal("object not complete")
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// FuzzJSONState: the checker and encoding/json agree on complete objects,
// and every prefix of a text the checker accepts is accepted too.
func FuzzJSONState(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":[1,2,{"b":null}],"c":"\u00e9"}`, `{"a":1e5}`, ` {"x": -0.5E-3 } `, `{"a"`, `[1]`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ok, complete := feedAll(s)
		valid := json.Valid([]byte(s)) && strings.HasPrefix(strings.TrimLeft(s, " \t\r\n"), "{")
		if ok && complete && !valid {
			t.Fatalf("checker: complete object %q; encoding/json: invalid", s)
		}
		if valid && !(ok && complete) {
			t.Fatalf("encoding/json: valid object %q; checker: ok %v complete %v", s, ok, complete)
		}
		if ok {
			for i := range len(s) {
				if p, _ := feedAll(s[:i]); !p {
					t.Fatalf("checker accepts %q but not its prefix %q", s, s[:i])
				}
			}
		}
	})
}
