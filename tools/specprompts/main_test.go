package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/tokenizer"
)

const repo = "../.."

// The committed prompt sets are what the program writes from the committed
// held-out text and tokenizer.
func TestCommittedSetsUpToDate(t *testing.T) {
	if err := run(repo+"/models/default/heldout.go.txt", repo+"/models/default/hf", repo+"/models/default/prompts", true); err != nil {
		t.Fatal(err)
	}
}

func readJSONL(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var v map[string]any
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		p, ok := v["prompt"].(string)
		if !ok || len(v) != 1 {
			t.Fatalf("%s: line %q is not one {\"prompt\": string} object", path, sc.Text())
		}
		out = append(out, p)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// The committed sets have the shapes docs/speculative.md states: 50 distinct
// prompts each; an edit prompt holds held-out code, then an announcing
// comment and one line, within the token bound; a held-out prompt is
// held-out text of 200 to 400 tokens.
func TestCommittedSetsShape(t *testing.T) {
	tok, err := tokenizer.FromHFDir(repo + "/models/default/hf")
	if err != nil {
		t.Fatal(err)
	}
	held, err := os.ReadFile(repo + "/models/default/heldout.go.txt")
	if err != nil {
		t.Fatal(err)
	}
	o := DefaultOptions()
	count := func(s string) int {
		ids, err := tok.Encode(s, false)
		if err != nil {
			t.Fatal(err)
		}
		return len(ids)
	}
	for _, tc := range []struct {
		file  string
		check func(t *testing.T, p string)
	}{
		{"edit.jsonl", func(t *testing.T, p string) {
			if n := count(p); n > o.EditMaxTokens {
				t.Errorf("%d tokens, more than %d", n, o.EditMaxTokens)
			}
			lines := strings.Split(strings.TrimSuffix(p, "\n"), "\n")
			c := len(lines) - 1 - o.EditHeadLines // the announcing comment
			if c < o.EditMinLines+2 || !strings.HasPrefix(lines[0], "package ") {
				t.Fatalf("not a package line and a block: %q", p)
			}
			code := strings.Join(lines[2:c-1], "\n")
			if !bytes.Contains(held, []byte(code)) || len(lines[2:c-1]) < o.EditMinLines {
				t.Errorf("code not %d lines or more of the held-out text: %q", o.EditMinLines, code)
			}
			if !strings.HasPrefix(lines[c], "// The same ") || lines[c-1] != "" {
				t.Errorf("no announcing comment after a blank line: %q", lines[c-1:])
			}
			if first := lines[c+1]; strings.TrimSpace(first) == "" || strings.HasPrefix(first, "//") {
				t.Errorf("changed version starts with %q, no code line", first)
			}
		}},
		{"heldout.jsonl", func(t *testing.T, p string) {
			if n := count(p); n < o.HeldoutMinTokens || n > o.HeldoutMaxTokens {
				t.Errorf("%d tokens, outside %d-%d", n, o.HeldoutMinTokens, o.HeldoutMaxTokens)
			}
			if !bytes.Contains(held, []byte(p)) || !strings.HasSuffix(p, "\n") {
				t.Errorf("not whole lines of the held-out text: %q", p)
			}
		}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			ps := readJSONL(t, repo+"/models/default/prompts/"+tc.file)
			if len(ps) != o.N {
				t.Fatalf("%d prompts, want %d", len(ps), o.N)
			}
			seen := map[string]bool{}
			for _, p := range ps {
				if seen[p] {
					t.Errorf("prompt twice: %.80q", p)
				}
				seen[p] = true
				tc.check(t, p)
			}
		})
	}
}

const fileA = `// Copyright 2020 The Go Authors.

package a

// F is long.
func F(x int) int {
	y := x
	y++
	y++
	return y
}

func (r *T) G() int { return 1 }

type T struct{ n int }
`

const fileB = `// Copyright 2021 The Go Authors.

package b

var V = 1
`

func bytesCount(s string) (int, error) { return len(s), nil }

func TestBuild(t *testing.T) {
	small := Options{N: 2, EditMinLines: 3, EditGrowLines: 7, EditMaxLines: 8, EditMaxTokens: 1000, EditHeadLines: 3,
		HeldoutMinTokens: 10, HeldoutTarget: 30, HeldoutMaxTokens: 60}
	for _, tc := range []struct {
		name    string
		text    string
		o       Options
		edit    []string // substrings each edit prompt must hold, in order
		heldout []string // the held-out prompts
		err     string
	}{
		{
			name: "two files",
			text: fileA + fileB,
			o:    small,
			edit: []string{
				// F alone is 7 lines: grown by nothing (G would pass 8).
				"package a\n\n// F is long.\nfunc F(x int) int {\n\ty := x\n\ty++\n\ty++\n\treturn y\n}\n\n// The same function, renamed to F2:\nfunc F2(x int) int {\n\ty := x\n\ty++\n",
				// G and T are 3 lines together; the rename edit is the first
				// to try for the second prompt (G takes the receiver's turn).
				"package a\n\nfunc (r *T) G() int { return 1 }\n\ntype T struct{ n int }\n\n// The same code, with the receiver of G renamed to recv:\nfunc (recv *T) G() int { return 1 }\n\ntype T struct{ n int }\n",
			},
			heldout: []string{
				// The first line reaches 30 bytes.
				"// Copyright 2020 The Go Authors.\n",
				"// Copyright 2021 The Go Authors.\n",
			},
		},
		{name: "no copyright", text: "package a\n", o: small, err: "does not start with a copyright line"},
		{name: "not Go", text: "// Copyright x\nfunc {\n", o: small, err: "held-out file 0"},
		{name: "too few blocks", text: fileA + fileB, o: func() Options { o := small; o.N = 3; return o }(), err: "edit prompts: only 2 blocks"},
		{name: "token bound", text: fileA + fileB, o: func() Options { o := small; o.EditMaxTokens = 150; return o }(), err: "edit prompts: only 1 blocks"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sets, err := Build(tc.text, bytesCount, tc.o)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(sets.Edit) != len(tc.edit) {
				t.Fatalf("%d edit prompts %q, want %d", len(sets.Edit), sets.Edit, len(tc.edit))
			}
			for i, want := range tc.edit {
				if sets.Edit[i] != want {
					t.Errorf("edit prompt %d:\n%q\nwant\n%q", i, sets.Edit[i], want)
				}
			}
			if strings.Join(sets.Heldout, "|") != strings.Join(tc.heldout, "|") {
				t.Errorf("held-out prompts %q, want %q", sets.Heldout, tc.heldout)
			}
		})
	}
}

func TestReplaceWord(t *testing.T) {
	for _, tc := range []struct {
		line, old, repl, want string
		ok                    bool
	}{
		{"func (s *S) Size() int {", "s", "recv", "func (recv *S) Size() int {", true},
		{"func (s *S) Size() int {", "Size", "Size2", "func (s *S) Size2() int {", true},
		{"func sizes(size int) {", "size", "size2", "func sizes(size2 int) {", true},
		{"func f() {", "g", "h", "", false},
		{"func ab() {", "a", "x", "", false},
	} {
		got, ok := replaceWord(tc.line, tc.old, tc.repl)
		if got != tc.want || ok != tc.ok {
			t.Errorf("replaceWord(%q, %q, %q) = %q, %v; want %q, %v", tc.line, tc.old, tc.repl, got, ok, tc.want, tc.ok)
		}
	}
}

func TestReplaceWords(t *testing.T) {
	for _, tc := range []struct{ line, old, repl, want string }{
		{"func (s *S) f() { s.n = s.m + ss }", "s", "recv", "func (recv *S) f() { recv.n = recv.m + ss }"},
		{"x := r", "r", "r", "x := r"},
		{"none here", "s", "t", "none here"},
		{"s", "s", "ss", "ss"},
	} {
		if got := replaceWords(tc.line, tc.old, tc.repl); got != tc.want {
			t.Errorf("replaceWords(%q, %q, %q) = %q, want %q", tc.line, tc.old, tc.repl, got, tc.want)
		}
	}
}

func TestJSONL(t *testing.T) {
	got := string(JSONL([]string{"a<b>\n\t\"c\"", ""}))
	want := "{\"prompt\":\"a<b>\\n\\t\\\"c\\\"\"}\n{\"prompt\":\"\"}\n"
	if got != want {
		t.Errorf("JSONL = %q, want %q", got, want)
	}
}
