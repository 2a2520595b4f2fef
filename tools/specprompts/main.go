// Command specprompts writes the prompt sets that speculative decoding is
// measured on (docs/speculative.md), from the default model's held-out Go
// sources (models/default/heldout.go.txt, files it did not train on), as
// JSONL files of {"prompt": "..."} objects, vLLM's custom dataset format,
// read by `trigon bench serve --dataset-name custom --dataset-path FILE`:
//
//   - edit.jsonl: code-editing prompts. A Go function of the held-out text
//     (or a run of declarations, 20 to 60 lines), then a comment that
//     announces it again with a change and the first three lines of the
//     changed version, so that a completion model continues by writing the
//     code out again (a longer start leaves a small model less room to
//     wander off). Most of the continuation is in the prompt: where
//     prompt lookup has the most to find.
//   - heldout.jsonl: held-out Go to continue. Runs of whole lines of about 300
//     tokens, each from the start of a file or of a top-level declaration
//     (with its doc comment), taken in turn from every file.
//
// The output depends only on the input text and the tokenizer, so the files
// are remade byte for byte:
//
//	go run ./tools/specprompts                # writes models/default/prompts/
//	go run ./tools/specprompts -check         # fails if they are not what it would write
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/trigon-llm/trigon/tokenizer"
)

// Options are the sizes of the prompt sets. The token bounds are in the
// default model's tokens; an edit prompt and its continuation must fit the
// model's context of 1024 with room for the benchmark's 256 output tokens.
type Options struct {
	N                int // prompts per set
	EditMinLines     int // a block's lines, doc comments included
	EditGrowLines    int // a block shorter than this takes the next declaration too
	EditMaxLines     int
	EditMaxTokens    int // the whole edit prompt
	EditHeadLines    int // lines of the changed version the prompt starts
	HeldoutMinTokens int // a held-out prompt stops at the first line end at or past HeldoutTarget,
	HeldoutTarget    int // or before a line that would take it past HeldoutMaxTokens
	HeldoutMaxTokens int // when it already has HeldoutMinTokens
}

// DefaultOptions are the sets' sizes as committed.
func DefaultOptions() Options {
	return Options{
		N: 50, EditMinLines: 20, EditGrowLines: 30, EditMaxLines: 60, EditMaxTokens: 700, EditHeadLines: 3,
		HeldoutMinTokens: 200, HeldoutTarget: 300, HeldoutMaxTokens: 400,
	}
}

// Counter counts a text's tokens.
type Counter func(string) (int, error)

// Sets are the two prompt sets.
type Sets struct {
	Edit    []string
	Heldout []string
}

func main() {
	in := flag.String("in", "models/default/heldout.go.txt", "held-out Go text (files concatenated)")
	tokDir := flag.String("tokenizer", "models/default/hf", "directory with the default model's tokenizer.json")
	out := flag.String("out", "models/default/prompts", "output directory")
	check := flag.Bool("check", false, "compare with the files in -out instead of writing them")
	flag.Parse()
	if err := run(*in, *tokDir, *out, *check); err != nil {
		fmt.Fprintln(os.Stderr, "specprompts:", err)
		os.Exit(1)
	}
}

func run(in, tokDir, out string, check bool) error {
	src, err := os.ReadFile(in)
	if err != nil {
		return err
	}
	tok, err := tokenizer.FromHFDir(tokDir)
	if err != nil {
		return fmt.Errorf("tokenizer: %w", err)
	}
	count := func(s string) (int, error) {
		ids, err := tok.Encode(s, false)
		return len(ids), err
	}
	sets, err := Build(string(src), count, DefaultOptions())
	if err != nil {
		return err
	}
	files := map[string][]byte{"edit.jsonl": JSONL(sets.Edit), "heldout.jsonl": JSONL(sets.Heldout)}
	for _, name := range []string{"edit.jsonl", "heldout.jsonl"} {
		path := filepath.Join(out, name)
		if check {
			have, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if !bytes.Equal(have, files[name]) {
				return fmt.Errorf("%s is not what specprompts writes (run go run ./tools/specprompts)", path)
			}
			continue
		}
		if err := os.MkdirAll(out, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, files[name], 0o644); err != nil {
			return err
		}
		fmt.Printf("wrote %s (%d bytes)\n", path, len(files[name]))
	}
	return nil
}

// JSONL is one {"prompt": p} object a line.
func JSONL(prompts []string) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	for _, p := range prompts {
		// A struct of one string field cannot fail to encode.
		_ = enc.Encode(struct {
			Prompt string `json:"prompt"`
		}{p})
	}
	return b.Bytes()
}

// goFile is one file of the held-out text.
type goFile struct {
	text string
	fset *token.FileSet
	ast  *ast.File
}

// SplitFiles cuts the concatenated held-out text into its files: each one
// starts with a copyright line (the Go distribution's files all do, and
// none has another at the start of a line), and every piece must parse.
func SplitFiles(text string) ([]goFile, error) {
	const mark = "// Copyright "
	var starts []int
	for i := 0; i < len(text); {
		if strings.HasPrefix(text[i:], mark) {
			starts = append(starts, i)
		}
		j := strings.IndexByte(text[i:], '\n')
		if j < 0 {
			break
		}
		i += j + 1
	}
	if len(starts) == 0 || starts[0] != 0 {
		return nil, errors.New("held-out text does not start with a copyright line")
	}
	var files []goFile
	for k, s := range starts {
		e := len(text)
		if k+1 < len(starts) {
			e = starts[k+1]
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, fmt.Sprintf("file%d.go", k), text[s:e], parser.ParseComments)
		if err != nil {
			return nil, fmt.Errorf("held-out file %d (byte %d): %w", k, s, err)
		}
		files = append(files, goFile{text: text[s:e], fset: fset, ast: f})
	}
	return files, nil
}

// Build makes both sets from the held-out text.
func Build(text string, count Counter, o Options) (Sets, error) {
	files, err := SplitFiles(text)
	if err != nil {
		return Sets{}, err
	}
	edit, err := editPrompts(files, count, o)
	if err != nil {
		return Sets{}, err
	}
	held, err := heldoutPrompts(files, count, o)
	if err != nil {
		return Sets{}, err
	}
	return Sets{Edit: edit, Heldout: held}, nil
}

// A block is a run of consecutive top-level declarations of one held-out
// file that an edit prompt holds: a function alone where one is long
// enough, else a function or type with what follows it.
type block struct {
	pkg      string
	first    ast.Decl // the first declaration, the one an edit names
	decls    int      // how many declarations it holds
	funcs    int      // how many of them are functions
	comments bool     // whether a comment stands in the block
	text     string   // from the first declaration's doc comment to the last's end
	code     []string // its lines from the first declaration's first (after its doc comment)
	start    int      // byte offsets in the file
	end      int
}

func (b block) noun() string {
	switch fn, ok := b.first.(*ast.FuncDecl); {
	case ok && b.decls == 1 && fn.Recv != nil:
		return "method"
	case ok && b.decls == 1:
		return "function"
	}
	return "code"
}

// name is the identifier the first declaration declares, and whether it
// declares one (a function, or a type, constant or variable spec).
func (b block) name() (string, bool) {
	switch d := b.first.(type) {
	case *ast.FuncDecl:
		return d.Name.Name, true
	case *ast.GenDecl:
		if len(d.Specs) == 1 {
			switch sp := d.Specs[0].(type) {
			case *ast.TypeSpec:
				return sp.Name.Name, true
			case *ast.ValueSpec:
				if len(sp.Names) == 1 && sp.Names[0].Name != "_" {
					return sp.Names[0].Name, true
				}
			}
		}
	}
	return "", false
}

// An edit is a change announced by a comment; head is the changed
// version's first EditHeadLines lines, and ok says whether the change
// applies.
type edit func(b block, n int) (comment string, head []string, ok bool)

// head is the first n lines of code, each changed by f.
func head(code []string, n int, f func(string) string) []string {
	out := slices.Clone(code[:min(n, len(code))])
	for i := range out {
		out[i] = f(out[i])
	}
	return out
}

func same(s string) string { return s }

var edits = []edit{
	func(b block, n int) (string, []string, bool) { // rename: the declaration only
		name, ok := b.name()
		if !ok {
			return "", nil, false
		}
		first, ok := replaceWord(b.code[0], name, name+"2")
		h := append([]string{first}, head(b.code[1:], n-1, same)...)
		if b.noun() == "code" {
			return fmt.Sprintf("// The same code, with %s renamed to %s2:", name, name), h, ok
		}
		return fmt.Sprintf("// The same %s, renamed to %s2:", b.noun(), name), h, ok
	},
	func(b block, n int) (string, []string, bool) { // receiver: every use in the head
		fn, ok := b.first.(*ast.FuncDecl)
		if !ok || fn.Recv == nil || len(fn.Recv.List) != 1 || len(fn.Recv.List[0].Names) != 1 {
			return "", nil, false
		}
		recv := fn.Recv.List[0].Names[0].Name
		if recv == "_" || recv == "recv" {
			return "", nil, false
		}
		h := head(b.code, n, func(s string) string { return replaceWords(s, recv, "recv") })
		if b.noun() == "code" {
			return fmt.Sprintf("// The same code, with the receiver of %s renamed to recv:", fn.Name.Name), h, true
		}
		return "// The same method, with the receiver renamed to recv:", h, true
	},
	func(b block, n int) (string, []string, bool) { // comments: comment lines left out
		if !b.comments {
			return "", nil, false
		}
		var code []string
		for _, l := range b.code {
			if !strings.HasPrefix(strings.TrimSpace(l), "//") {
				code = append(code, l)
			}
		}
		return fmt.Sprintf("// The same %s, without its comments:", b.noun()), head(code, n, same), true
	},
	func(b block, n int) (string, []string, bool) { // errors: the head unchanged
		if b.funcs == 0 {
			return "", nil, false
		}
		return fmt.Sprintf("// The same %s, with every returned error wrapped by fmt.Errorf:", b.noun()), head(b.code, n, same), true
	},
}

// replaceWord replaces the first whole-word occurrence of old in line.
func replaceWord(line, old, repl string) (string, bool) {
	j := wordIndex(line, old)
	if j < 0 {
		return "", false
	}
	return line[:j] + repl + line[j+len(old):], true
}

// replaceWords replaces every whole-word occurrence of old in line.
func replaceWords(line, old, repl string) string {
	var b strings.Builder
	for {
		j := wordIndex(line, old)
		if j < 0 {
			return b.String() + line
		}
		b.WriteString(line[:j])
		b.WriteString(repl)
		line = line[j+len(old):]
	}
}

// wordIndex is the offset of the first whole-word occurrence of old in
// line, or -1.
func wordIndex(line, old string) int {
	for i := 0; ; {
		j := strings.Index(line[i:], old)
		if j < 0 {
			return -1
		}
		j += i
		e := j + len(old)
		if (j == 0 || !isIdent(line[j-1])) && (e == len(line) || !isIdent(line[e])) {
			return j
		}
		i = j + 1
	}
}

func isIdent(c byte) bool {
	return c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80
}

// blocks are the file's blocks of EditMinLines..EditMaxLines lines: one
// from each declaration but the imports, grown by the declarations after it
// while it is shorter than EditGrowLines and stays within EditMaxLines. Those that do not overlap the one
// before them (from the file's start) come first, then the rest.
func blocks(f goFile, o Options) []block {
	decls := f.ast.Decls
	var all []block
	for i, d := range decls {
		if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.IMPORT {
			continue
		}
		line0 := f.fset.Position(declStart(d)).Line
		j := i
		for j+1 < len(decls) && f.fset.Position(decls[j].End()).Line-line0+1 < o.EditGrowLines &&
			f.fset.Position(decls[j+1].End()).Line-line0+1 <= o.EditMaxLines {
			j++
		}
		lines := f.fset.Position(decls[j].End()).Line - line0 + 1
		if lines < o.EditMinLines || lines > o.EditMaxLines {
			continue
		}
		b := block{pkg: f.ast.Name.Name, first: d,
			start: f.fset.Position(declStart(d)).Offset, end: f.fset.Position(decls[j].End()).Offset}
		b.text = f.text[b.start:b.end]
		b.code = strings.Split(f.text[f.fset.Position(d.Pos()).Offset:b.end], "\n")
		b.decls = j + 1 - i
		for _, dd := range decls[i : j+1] {
			if _, ok := dd.(*ast.FuncDecl); ok {
				b.funcs++
			}
		}
		for _, c := range f.ast.Comments {
			if off := f.fset.Position(c.Pos()).Offset; off >= b.start && off < b.end {
				b.comments = true
				break
			}
		}
		all = append(all, b)
	}
	var first, rest []block
	end := 0
	for _, b := range all {
		if b.start >= end {
			first = append(first, b)
			end = b.end
		} else {
			rest = append(rest, b)
		}
	}
	return append(first, rest...)
}

// editPrompts takes the blocks in turn from every file (the first of each
// file, then the second, ...); the i-th prompt made gets the i-th edit of
// the list, or the next one that applies to its block. A block whose
// prompt passes EditMaxTokens is left out.
func editPrompts(files []goFile, count Counter, o Options) ([]string, error) {
	perFile := make([][]block, len(files))
	most := 0
	for i, f := range files {
		perFile[i] = blocks(f, o)
		most = max(most, len(perFile[i]))
	}
	var out []string
	for round := 0; round < most && len(out) < o.N; round++ {
		for _, bs := range perFile {
			if round >= len(bs) || len(out) == o.N {
				continue
			}
			b := bs[round]
			for try := 0; try < len(edits); try++ {
				comment, h, ok := edits[(len(out)+try)%len(edits)](b, o.EditHeadLines)
				if !ok {
					continue
				}
				p := "package " + b.pkg + "\n\n" + b.text + "\n\n" + comment + "\n" + strings.Join(h, "\n") + "\n"
				n, err := count(p)
				if err != nil {
					return nil, err
				}
				if n <= o.EditMaxTokens {
					out = append(out, p)
				}
				break
			}
		}
	}
	if len(out) < o.N {
		return nil, fmt.Errorf("edit prompts: only %d blocks of %d-%d lines fit %d tokens, want %d",
			len(out), o.EditMinLines, o.EditMaxLines, o.EditMaxTokens, o.N)
	}
	return out, nil
}

// heldoutPrompts takes runs of whole lines from every file in turn: the
// file's start, then the first top-level declaration past the end of the
// file's previous prompt, and so on. The held-out text being small, where
// that gives fewer than N, runs from the declarations not yet used as a
// start follow, again from every file in turn, overlapping the first ones.
func heldoutPrompts(files []goFile, count Counter, o Options) ([]string, error) {
	used := make([]map[int]bool, len(files))
	for i := range used {
		used[i] = map[int]bool{}
	}
	var out []string
	take := func(fi, start int) (int, bool, error) {
		used[fi][start] = true
		p, end, ok, err := lineRun(files[fi].text, start, count, o)
		if ok && err == nil {
			out = append(out, p)
		}
		return end, ok, err
	}
	pos := make([]int, len(files)) // where each file's next prompt may start
	for len(out) < o.N {
		added := false
		for fi, f := range files {
			if len(out) == o.N {
				break
			}
			start, ok := nextStart(f, pos[fi])
			if !ok {
				continue
			}
			end, ok, err := take(fi, start)
			if err != nil {
				return nil, err
			}
			pos[fi] = len(f.text)
			if ok {
				pos[fi] = end
				added = true
			}
		}
		if !added {
			break
		}
	}
	starts := make([][]int, len(files))
	most := 0
	for fi, f := range files {
		for _, d := range f.ast.Decls {
			if off := f.fset.Position(declStart(d)).Offset; !used[fi][off] {
				starts[fi] = append(starts[fi], off)
			}
		}
		most = max(most, len(starts[fi]))
	}
	for round := 0; round < most && len(out) < o.N; round++ {
		for fi := range files {
			if round < len(starts[fi]) && len(out) < o.N {
				if _, _, err := take(fi, starts[fi][round]); err != nil {
					return nil, err
				}
			}
		}
	}
	if len(out) < o.N {
		return nil, fmt.Errorf("held-out prompts: only %d runs of %d-%d tokens, want %d",
			len(out), o.HeldoutMinTokens, o.HeldoutMaxTokens, o.N)
	}
	return out, nil
}

// declStart is where a top-level declaration starts: its doc comment, if
// it has one.
func declStart(d ast.Decl) token.Pos {
	switch d := d.(type) {
	case *ast.FuncDecl:
		if d.Doc != nil {
			return d.Doc.Pos()
		}
	case *ast.GenDecl:
		if d.Doc != nil {
			return d.Doc.Pos()
		}
	}
	return d.Pos()
}

// nextStart is the first prompt start at or after byte at: the file's
// start, else the first top-level declaration there.
func nextStart(f goFile, at int) (int, bool) {
	if at == 0 {
		return 0, true
	}
	for _, d := range f.ast.Decls {
		if off := f.fset.Position(declStart(d)).Offset; off >= at {
			return off, true
		}
	}
	return 0, false
}

// lineRun is the run of whole lines from start that reaches
// HeldoutTarget tokens, cut before a line that would pass
// HeldoutMaxTokens; ok is false where the file ends first or the cut
// leaves fewer than HeldoutMinTokens.
func lineRun(text string, start int, count Counter, o Options) (string, int, bool, error) {
	end := start
	prev := 0
	for end < len(text) {
		e := strings.IndexByte(text[end:], '\n')
		if e < 0 {
			e = len(text) - end - 1
		}
		n, err := count(text[start : end+e+1])
		if err != nil {
			return "", 0, false, err
		}
		if n > o.HeldoutMaxTokens {
			return text[start:end], end, prev >= o.HeldoutMinTokens, nil
		}
		end += e + 1
		prev = n
		if n >= o.HeldoutTarget {
			return text[start:end], end, true, nil
		}
	}
	return "", 0, false, nil
}
