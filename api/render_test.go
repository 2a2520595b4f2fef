package api

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestOrderedTopKeysUnique checks that a legacy top_logprobs object never
// repeats a key, also when distinct tokens render to the same JSON string:
// a byte-level BPE token holding part of a UTF-8 sequence is written with
// U+FFFD in place of its bytes, so several such tokens share one key. The
// first (most likely) entry of a key is the one kept.
func TestOrderedTopKeysUnique(t *testing.T) {
	type kv struct {
		key string
		lp  float64
	}
	for _, tc := range []struct {
		name string
		in   orderedTop
		want []kv
	}{
		{"distinct", orderedTop{{"a", -1}, {"b", -2}}, []kv{{"a", -1}, {"b", -2}}},
		{"same token text", orderedTop{{"a", -1}, {"a", -2}, {"b", -3}}, []kv{{"a", -1}, {"b", -3}}},
		{"partial UTF-8 bytes", orderedTop{{"\xe4", -0.5}, {"x", -1}, {"\xe5", -2}, {"\xe6", -3}},
			[]kv{{"\ufffd", -0.5}, {"x", -1}}},
		{"two-byte partials", orderedTop{{"\xe4\xb8", -1}, {"\xe5\xb8", -2}, {"\ufffd\ufffd", -3}},
			[]kv{{"\ufffd\ufffd", -1}}},
		{"partial next to its rendering", orderedTop{{"\ufffd", -1}, {"\x80", -2}}, []kv{{"\ufffd", -1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := marshal(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			dec := json.NewDecoder(strings.NewReader(string(b)))
			if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
				t.Fatalf("%s: not an object (%v, %v)", b, tok, err)
			}
			var got []kv
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					t.Fatalf("%s: %v", b, err)
				}
				var v float64
				if err := dec.Decode(&v); err != nil {
					t.Fatalf("%s: %v", b, err)
				}
				got = append(got, kv{k.(string), v})
			}
			if len(got) != len(tc.want) {
				t.Fatalf("%s: got %d entries %v, want %v", b, len(got), got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("%s: entry %d is %v, want %v", b, i, got[i], tc.want[i])
				}
			}
		})
	}
}
