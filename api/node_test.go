package api

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestOpenAINodeClient serves the fake model on 127.0.0.1 and runs the
// official OpenAI Node SDK against it (testdata/openai-client/client.mjs),
// then checks the texts the SDK parsed against the independent greedy
// reference. It needs node and `npm ci` run in testdata/openai-client.
func TestOpenAINodeClient(t *testing.T) {
	if testing.Short() {
		t.Skip("starts node; skipped in -short")
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node not found in PATH; install Node.js to run the OpenAI SDK test")
	}
	dir, _ := filepath.Abs(filepath.Join("testdata", "openai-client"))
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "openai", "package.json")); err != nil {
		t.Skipf("the openai npm package is not installed: run `npm ci` in %s", dir)
	}
	const key = "sk-node-test-key"
	e := newEnv(t, func(o *Options) { o.APIKey = key })
	ts := httptest.NewServer(e.srv.Handler())
	defer ts.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "client.mjs", ts.URL+"/v1")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "OPENAI_API_KEY="+key, "TRIGON_MODEL="+testModel)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node client failed: %v\nstderr:\n%s\nstdout:\n%s", err, stderr.String(), out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var res struct {
		Completion struct {
			Text   string `json:"text"`
			Finish string `json:"finish"`
			Usage  tUsage `json:"usage"`
		} `json:"completion"`
		Chat struct {
			Text   string `json:"text"`
			Finish string `json:"finish"`
			Usage  tUsage `json:"usage"`
		} `json:"chat"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		t.Fatalf("client output %q: %v", out, err)
	}
	cp := promptIDs(e.tok, "the cat sat")
	want, n, finish := greedyRef(e.tok, cp, 6, nil)
	if res.Completion.Text != want || res.Completion.Finish != finish || res.Completion.Usage.CompletionTokens != n ||
		res.Completion.Usage.PromptTokens != len(cp) {
		t.Errorf("completion via SDK %+v, want %q %s %d tokens", res.Completion, want, finish, n)
	}
	chp := chatIDs(e.tok, []ChatMessage{{Role: "system", Content: "be brief"}, {Role: "user", Content: "dog ran far"}})
	want, n, finish = greedyRef(e.tok, chp, 8, nil)
	if res.Chat.Text != want || res.Chat.Finish != finish || res.Chat.Usage.CompletionTokens != n {
		t.Errorf("chat via SDK %+v, want %q %s %d tokens", res.Chat, want, finish, n)
	}
}
