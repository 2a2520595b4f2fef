package kvcache_test

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

type ddArg struct {
	key, val string
	eq       bool // written as key=val
}

type ddCase struct {
	pos   string // file:line of the command
	cmd   string
	args  []ddArg
	input string
}

func (c *ddCase) has(key string) bool {
	for _, a := range c.args {
		if a.key == key {
			return true
		}
	}
	return false
}

func (c *ddCase) str(key, def string) string {
	for _, a := range c.args {
		if a.key == key {
			return a.val
		}
	}
	return def
}

// positional returns the i-th argument without '='.
func (c *ddCase) positional(i int) (string, error) {
	for _, a := range c.args {
		if !a.eq {
			if i == 0 {
				return a.key, nil
			}
			i--
		}
	}
	return "", fmt.Errorf("%s: missing positional argument", c.cmd)
}

func (c *ddCase) int(key string, def int) (int, error) {
	v := c.str(key, "")
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("%s: %s=%q: %w", c.cmd, key, v, err)
	}
	return n, nil
}

func (c *ddCase) bool(key string, def bool) (bool, error) {
	v := c.str(key, "")
	if v == "" {
		if c.has(key) {
			return true, nil
		}
		return def, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("%s: %s=%q: %w", c.cmd, key, v, err)
	}
	return b, nil
}

func parseCommand(line string) (string, []ddArg) {
	fields := strings.Fields(line)
	var args []ddArg
	for _, f := range fields[1:] {
		k, v, eq := strings.Cut(f, "=")
		args = append(args, ddArg{k, v, eq})
	}
	return fields[0], args
}

// runScripts runs every testdata file matching glob as a subtest, each
// with a fresh handler from newHandler.
func runScripts(t *testing.T, glob string, newHandler func(t *testing.T) func(c *ddCase) string) {
	files, err := filepath.Glob(glob)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no scripts match %s", glob)
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			runScript(t, path, newHandler(t))
		})
	}
}

// runScript feeds each case of the script at path to do and compares its
// output with the expected one.
func runScript(t *testing.T, path string, do func(c *ddCase) string) {
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
		c := &ddCase{pos: fmt.Sprintf("%s:%d", path, i+1)}
		c.cmd, c.args = parseCommand(line)
		out.WriteString(line + "\n")
		i++
		var input []string
		for i < len(lines) && lines[i] != "----" {
			input = append(input, lines[i])
			out.WriteString(lines[i] + "\n")
			i++
		}
		if i == len(lines) {
			t.Fatalf("%s: no ---- after the command", c.pos)
		}
		out.WriteString("----\n")
		i++
		c.input = strings.Join(input, "\n")
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
			t.Fatalf("%s: output has a blank line:\n%s", c.pos, actual)
		}
		if *rewrite {
			out.WriteString(actual + "\n")
			continue
		}
		if want := strings.Join(expected, "\n"); actual != want {
			t.Errorf("%s: %s\nexpected:\n%s\ngot:\n%s", c.pos, line, want, actual)
		}
	}
	if *rewrite {
		if err := os.WriteFile(path, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
