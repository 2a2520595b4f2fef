// Package datadriven runs data-driven test scripts (raft and Pebble style):
// each case is a command line, optional input, "----" and the expected
// output. Run tests with -rewrite to regenerate the expected outputs.
package datadriven

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// A small data-driven test runner. A script is a list of cases:
//
//	# comment
//	command pos key=value key=v1,v2
//	optional input lines
//	----
//	expected output (no blank lines)
//
// Cases are separated by blank lines. Run with -rewrite to replace every
// expected output with the actual one.

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of testdata scripts")

// Arg is one argument of a command: key=val, or a bare positional word.
type Arg struct {
	key, val string
	eq       bool // written as key=val
}

// Case is one command of a script with its input lines.
type Case struct {
	Pos   string // file:line of the command
	Cmd   string
	Args  []Arg
	Input string
}

// Has reports whether the command has an argument key.
func (c *Case) Has(key string) bool {
	for _, a := range c.Args {
		if a.key == key {
			return true
		}
	}
	return false
}

// Str returns argument key's value, or def.
func (c *Case) Str(key, def string) string {
	for _, a := range c.Args {
		if a.key == key {
			return a.val
		}
	}
	return def
}

// Positional returns the i-th argument without '='.
func (c *Case) Positional(i int) (string, error) {
	for _, a := range c.Args {
		if !a.eq {
			if i == 0 {
				return a.key, nil
			}
			i--
		}
	}
	return "", fmt.Errorf("%s: missing positional argument", c.Cmd)
}

// Int returns argument key as an int, or def when absent.
func (c *Case) Int(key string, def int) (int, error) {
	v := c.Str(key, "")
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("%s: %s=%q: %w", c.Cmd, key, v, err)
	}
	return n, nil
}

// Bool returns argument key as a bool, or def when absent.
func (c *Case) Bool(key string, def bool) (bool, error) {
	v := c.Str(key, "")
	if v == "" {
		if c.Has(key) {
			return true, nil
		}
		return def, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("%s: %s=%q: %w", c.Cmd, key, v, err)
	}
	return b, nil
}

func parseCommand(line string) (string, []Arg) {
	fields := strings.Fields(line)
	var args []Arg
	for _, f := range fields[1:] {
		k, v, eq := strings.Cut(f, "=")
		args = append(args, Arg{k, v, eq})
	}
	return fields[0], args
}

// RunScripts runs every testdata file matching glob as a subtest, each
// with a fresh handler from newHandler.
func RunScripts(t *testing.T, glob string, newHandler func(t *testing.T) func(c *Case) string) {
	files, err := filepath.Glob(glob)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no scripts match %s", glob)
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			RunScript(t, path, newHandler(t))
		})
	}
}

// RunScript feeds each case of the script at path to do and compares its
// output with the expected one.
func RunScript(t *testing.T, path string, do func(c *Case) string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	var out strings.Builder
	for i := 0; i < len(lines); {
		line := lines[i]
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			out.WriteString(line + "\n")
			i++
			continue
		}
		c := &Case{Pos: fmt.Sprintf("%s:%d", path, i+1)}
		c.Cmd, c.Args = parseCommand(line)
		out.WriteString(line + "\n")
		i++
		var input []string
		for i < len(lines) && lines[i] != "----" {
			input = append(input, lines[i])
			out.WriteString(lines[i] + "\n")
			i++
		}
		if i == len(lines) {
			t.Fatalf("%s: no ---- after the command", c.Pos)
		}
		out.WriteString("----\n")
		i++
		c.Input = strings.Join(input, "\n")
		var expected []string
		for i < len(lines) && strings.TrimSpace(lines[i]) != "" {
			expected = append(expected, lines[i])
			i++
		}
		actual := strings.TrimRight(do(c), "\n")
		if actual == "" {
			actual = "ok"
		}
		if strings.Contains(actual, "\n\n") {
			t.Fatalf("%s: output has a blank line:\n%s", c.Pos, actual)
		}
		if *rewrite {
			out.WriteString(actual + "\n")
			continue
		}
		if want := strings.Join(expected, "\n"); actual != want {
			t.Errorf("%s: %s\nexpected:\n%s\ngot:\n%s", c.Pos, line, want, actual)
		}
	}
	if *rewrite {
		if err := os.WriteFile(path, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
