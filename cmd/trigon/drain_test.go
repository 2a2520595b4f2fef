package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// runMainArg, as the first argument of the test binary, makes it run the
// trigon command instead of the tests (TestMain): the drain test drives
// the real binary's signal handling in a child process.
const runMainArg = "trigon-main"

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == runMainArg {
		os.Args = append([]string{"trigon"}, os.Args[2:]...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

var drainLong = flag.Bool("drain-long", false, "also run the drain test with a 30 s timeout over streams that outlast it (about 35 s)")

// streamEnd is how one request ended, as its client saw it.
type streamEnd struct {
	status int
	finish string // last finish_reason seen
	done   bool   // data: [DONE] arrived (streams)
	chunks int
	err    error
}

// TestServeDrainOnSIGTERM runs `trigon serve` with the embedded default
// model on the CPU, starts 16 long streams and one non-streamed request,
// and sends SIGTERM. Every stream must end with a final chunk whose
// finish_reason is the expected one, then [DONE]; the non-streamed
// request gets its reply; a request sent while draining gets 503 in the
// OpenAI error shape; a client stalled in its body holds up nothing; the
// process exits 0 within the timeout plus the step in progress (with
// slack for a loaded machine), not before the timeout when streams are
// still running, and well before it when they have ended.
func TestServeDrainOnSIGTERM(t *testing.T) {
	cases := []struct {
		name      string
		timeout   time.Duration
		maxTokens int
		threads   string
		want      string
		long      bool
	}{
		{name: "3s timeout, streams outlast it", timeout: 3 * time.Second, maxTokens: 1000, want: "abort"},
		{name: "30s timeout, streams end first", timeout: 30 * time.Second, maxTokens: 24, want: "length"},
		{name: "30s timeout, streams outlast it", timeout: 30 * time.Second, maxTokens: 1000, threads: "1", want: "abort", long: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.long && !*drainLong {
				t.Skip("runs over 30 s; enable with -drain-long")
			}
			testDrain(t, tc.timeout, tc.maxTokens, tc.threads, tc.want)
		})
	}
}

func testDrain(t *testing.T, timeout time.Duration, maxTokens int, threads, want string) {
	outlast := want == "abort" // the streams are still running at the deadline
	args := []string{runMainArg, "serve", "--port", "0", "--device", "cpu", "--shutdown-timeout", timeout.String()}
	if threads != "" {
		args = append(args, "--threads", threads)
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "XDG_CACHE_HOME="+t.TempDir()) // the default model is extracted there
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	var logMu sync.Mutex
	var logBuf strings.Builder
	addrc := make(chan string, 1)
	go func() {
		addrRE := regexp.MustCompile(`addr=(http://\S+)`)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			logMu.Lock()
			logBuf.WriteString(sc.Text() + "\n")
			logMu.Unlock()
			if m := addrRE.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case addrc <- m[1]:
				default:
				}
			}
		}
		exited <- cmd.Wait()
	}()
	defer func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			logMu.Lock()
			t.Logf("server log:\n%s", logBuf.String())
			logMu.Unlock()
		}
	}()
	var url string
	select {
	case url = <-addrc:
	case <-time.After(30 * time.Second):
		t.Fatal("the server never said where it listens")
	}
	waitHealth(t, url, http.StatusOK, 30*time.Second)

	const numStreams = 16
	ends := make([]streamEnd, numStreams+1)
	started := make(chan struct{}, numStreams+1)
	var wg sync.WaitGroup
	for i := range numStreams + 1 {
		stream := i < numStreams
		wg.Add(1)
		go func() {
			defer wg.Done()
			ends[i] = request(url, fmt.Sprintf("Once upon a time %d", i), maxTokens, stream, started)
		}()
	}
	for range numStreams {
		select {
		case <-started:
		case <-time.After(60 * time.Second):
			t.Fatal("streams did not start")
		}
	}

	// A client stalled in the middle of its body: it must hold up neither
	// the drain nor the exit.
	stalled, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()
	fmt.Fprintf(stalled, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\":")

	sent := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// Once /health says so, the server is draining: a new request gets 503.
	waitHealth(t, url, http.StatusServiceUnavailable, 10*time.Second)
	checkRefused(t, url)

	var exitErr error
	select {
	case exitErr = <-exited:
	case <-time.After(timeout + 30*time.Second):
		t.Fatal("the server did not exit")
	}
	elapsed := time.Since(sent)
	wg.Wait()
	if exitErr != nil {
		t.Errorf("exit: %v, want status 0", exitErr)
	}
	// The bound is the timeout plus the step in progress and the final
	// writes; the slack covers a loaded CI machine.
	if limit := timeout + time.Second; elapsed > limit {
		t.Errorf("exited %v after SIGTERM, want at most %v", elapsed.Round(time.Millisecond), limit)
	}
	if outlast && elapsed < timeout {
		t.Errorf("exited %v after SIGTERM, before the %v timeout, with streams running", elapsed.Round(time.Millisecond), timeout)
	}
	if !outlast && elapsed >= timeout {
		t.Errorf("exited %v after SIGTERM: the drain waited for the timeout although the streams had ended", elapsed.Round(time.Millisecond))
	}
	// The stalled request's headers may have reached its handler before
	// the drain began (then nothing is written: the connection is just
	// closed) or after it (then it gets the drain's 503 before its body is
	// read, and the connection is closed after it).
	stalled.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got, err := io.ReadAll(stalled); err != nil && !errors.Is(err, syscall.ECONNRESET) ||
		len(got) > 0 && !bytes.HasPrefix(got, []byte("HTTP/1.1 503 ")) {
		t.Errorf("the stalled client's connection after the exit: read %q, %v; want it closed, after at most a 503", got, err)
	}
	for i, e := range ends {
		stream := i < numStreams
		if e.err != nil || e.status != http.StatusOK || e.finish != want || (stream && !e.done) {
			t.Errorf("request %d (stream %v): status %d, finish_reason %q, [DONE] %v after %d chunks, err %v; want 200, %q and [DONE]",
				i, stream, e.status, e.finish, e.done, e.chunks, e.err, want)
		}
	}
}

// request posts one completion; for a stream it reports on started after
// the first chunk, and reads to the end.
func request(url, prompt string, maxTokens int, stream bool, started chan<- struct{}) streamEnd {
	b, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": maxTokens, "ignore_eos": true, "stream": stream})
	resp, err := http.Post(url+"/v1/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		return streamEnd{err: err}
	}
	defer resp.Body.Close()
	end := streamEnd{status: resp.StatusCode}
	if !stream {
		var r struct {
			Choices []struct {
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || len(r.Choices) != 1 {
			end.err = fmt.Errorf("reply: %v (%d choices)", err, len(r.Choices))
			return end
		}
		end.finish = r.Choices[0].FinishReason
		return end
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if end.done {
			end.err = fmt.Errorf("data after [DONE]: %q", data)
			return end
		}
		if data == "[DONE]" {
			end.done = true
			continue
		}
		var ch struct {
			Choices []struct {
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			end.err = fmt.Errorf("chunk %q: %w", data, err)
			return end
		}
		for _, c := range ch.Choices {
			if c.FinishReason != nil {
				end.finish = *c.FinishReason
			}
		}
		if end.chunks++; end.chunks == 1 {
			started <- struct{}{}
		}
	}
	end.err = sc.Err()
	return end
}

func waitHealth(t *testing.T, url string, want int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		resp, err := http.Get(url + "/health")
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == want {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/health did not answer %d within %v (last: %v)", want, within, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// checkRefused sends a request to a draining server: 503, OpenAI's error
// shape.
func checkRefused(t *testing.T, url string) {
	t.Helper()
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"hi","max_tokens":4}`))
	if err != nil {
		t.Errorf("request while draining: %v, want a 503 reply", err)
		return
	}
	defer resp.Body.Close()
	var er struct {
		Error *struct {
			Message string `json:"message"`
			Type    string `json:"type"`
		} `json:"error"`
	}
	err = json.NewDecoder(resp.Body).Decode(&er)
	if resp.StatusCode != http.StatusServiceUnavailable || err != nil || er.Error == nil || er.Error.Message == "" || er.Error.Type == "" {
		t.Errorf("request while draining: status %d, body %+v (%v); want 503 with an OpenAI error object", resp.StatusCode, er.Error, err)
	}
}
