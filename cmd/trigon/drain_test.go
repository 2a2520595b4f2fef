package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
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

// streamEnd is how one request ended, as its client saw it.
type streamEnd struct {
	status int
	finish string // last finish_reason seen
	done   bool   // data: [DONE] arrived (streams)
	chunks int
	// maxGap is the longest wait between two chunks after the first: an
	// upper bound on one engine step as this machine ran it under this
	// load (a chunk per stream per step), plus the delivery's jitter.
	maxGap time.Duration
	err    error
}

// TestServeDrainOnSIGTERM runs `trigon serve` with the embedded default
// model on the CPU, starts 16 long streams and one non-streamed request,
// and sends SIGTERM. Every stream must end with a final chunk whose
// finish_reason is the expected one, then [DONE]; the non-streamed
// request gets its reply; a request sent while draining gets 503 in the
// OpenAI error shape; a client stalled in its body gets that 503 too,
// before the exit, and its connection is closed; the process exits 0
// within the timeout plus one step (and exitSlack), not before the timeout
// when streams are still running, and well before it when they have
// ended. The 30 s case is the default --shutdown-timeout, which is also
// the default body timeout: the stalled client must be answered by the
// drain, not by its body timeout at the deadline.
func TestServeDrainOnSIGTERM(t *testing.T) {
	cases := []drainCase{
		{name: "3s timeout, streams outlast it", timeout: 3 * time.Second, maxTokens: 1000, n: 1, want: "abort"},
		{name: "30s timeout, streams end first", timeout: 30 * time.Second, maxTokens: 24, n: 1, want: "length"},
		// The streams must still run at 30 s on a fast machine: one
		// thread, the longest outputs the default model's context holds,
		// and 3 choices to each stream (48 sequences a step, and the
		// non-streamed request's 3, under the default --max-seqs 64, so
		// that all start at once). The test logs how far they got.
		{name: "30s timeout, streams outlast it", timeout: 30 * time.Second, maxTokens: 1000, n: 3, threads: "1", want: "abort"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { testDrain(t, tc) })
	}
}

// drainCase is one run of TestServeDrainOnSIGTERM.
type drainCase struct {
	name      string
	timeout   time.Duration // --shutdown-timeout
	maxTokens int           // each choice's
	n         int           // choices to a request
	threads   string        // --threads; empty: all cores
	want      string        // every choice's finish_reason
}

// exitSlack is what the exit may take past the deadline besides the step
// in progress: finishGrace (the most the drain waits for net/http to end
// the responses, whose clients here all read) and a margin for the
// signal's delivery, 17 final writes over loopback, the process's exit and
// the test's wait on it, on a loaded 2-core machine.
const exitSlack = finishGrace + 300*time.Millisecond

func testDrain(t *testing.T, tc drainCase) {
	timeout, want := tc.timeout, tc.want
	outlast := want == "abort" // the streams are still running at the deadline
	args := []string{runMainArg, "serve", "--port", "0", "--device", "cpu", "--shutdown-timeout", timeout.String()}
	if tc.threads != "" {
		args = append(args, "--threads", tc.threads)
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
			ends[i] = request(url, fmt.Sprintf("Once upon a time %d", i), tc.maxTokens, tc.n, stream, started)
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
	// Its reply, read as it comes: whether its headers reached the
	// handler before the drain (then the drain cuts the body's read
	// short) or after (then it is refused unread), it is the drain's 503.
	stalledc := make(chan stalledEnd, 1)
	go func() { stalledc <- readStalled(stalled, timeout+30*time.Second) }()

	sent := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// Once /health says so, the server is draining: a new request gets 503.
	waitHealth(t, url, http.StatusServiceUnavailable, 10*time.Second)
	checkRefused(t, url)

	var exitErr error
	var st stalledEnd
	exitedFirst := false
	select {
	case st = <-stalledc:
	case exitErr = <-exited:
		exitedFirst = true
		st = <-stalledc
	case <-time.After(timeout + 30*time.Second):
		t.Fatal("the server did not exit, nor answer the stalled client")
	}
	if !exitedFirst {
		select {
		case exitErr = <-exited:
		case <-time.After(timeout + 30*time.Second):
			t.Fatal("the server did not exit")
		}
	}
	elapsed := time.Since(sent)
	wg.Wait()
	if exitErr != nil {
		t.Errorf("exit: %v, want status 0", exitErr)
	}
	// The deadline plus one step, the longest this run's clients saw
	// between two chunks, plus exitSlack. When the streams end first, the
	// step is of no account: the bound only has to be under the deadline.
	var step time.Duration
	for _, e := range ends {
		step = max(step, e.maxGap)
	}
	minChunks := ends[0].chunks
	for _, e := range ends[:numStreams] {
		minChunks = min(minChunks, e.chunks)
	}
	t.Logf("exited %v after SIGTERM; longest step seen %v; the shortest stream had %d chunks of %d tokens at most",
		elapsed.Round(time.Millisecond), step.Round(time.Millisecond), minChunks, tc.maxTokens*tc.n)
	if limit := timeout + step + exitSlack; outlast && elapsed > limit {
		t.Errorf("exited %v after SIGTERM, want at most %v (the %v timeout, a %v step and %v)",
			elapsed.Round(time.Millisecond), limit.Round(time.Millisecond), timeout, step.Round(time.Millisecond), exitSlack)
	}
	if outlast && elapsed < timeout {
		t.Errorf("exited %v after SIGTERM, before the %v timeout, with streams running", elapsed.Round(time.Millisecond), timeout)
	}
	if !outlast && elapsed >= timeout {
		t.Errorf("exited %v after SIGTERM: the drain waited for the timeout although the streams had ended", elapsed.Round(time.Millisecond))
	}
	if st.err != nil || st.status != http.StatusServiceUnavailable || st.errType == "" || !st.closed {
		t.Errorf("the stalled client: status %d, error type %q, closed %v, err %v; want 503 in the OpenAI shape, then the connection closed",
			st.status, st.errType, st.closed, st.err)
	}
	// Streams running at the deadline keep the server up that long: the
	// stalled client must have had its answer before, not at the exit.
	if outlast && exitedFirst {
		t.Errorf("the stalled client was answered only after the server exited; want the 503 at the drain's start")
	}
	for i, e := range ends {
		stream := i < numStreams
		if e.err != nil || e.status != http.StatusOK || e.finish != want || (stream && !e.done) {
			t.Errorf("request %d (stream %v): status %d, finish_reason %q, [DONE] %v after %d chunks, err %v; want 200, %q and [DONE]",
				i, stream, e.status, e.finish, e.done, e.chunks, e.err, want)
		}
	}
}

// stalledEnd is what the stalled client read.
type stalledEnd struct {
	status  int
	errType string // the OpenAI error object's type
	closed  bool   // the connection closed after the reply
	err     error
}

// readStalled reads one reply on conn and then waits for the connection
// to close; within only keeps a broken server from hanging the test.
func readStalled(conn net.Conn, within time.Duration) stalledEnd {
	conn.SetReadDeadline(time.Now().Add(within))
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return stalledEnd{err: fmt.Errorf("reading the reply: %w", err)}
	}
	end := stalledEnd{status: resp.StatusCode}
	var er struct {
		Error *struct {
			Message string `json:"message"`
			Type    string `json:"type"`
		} `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&er); err != nil || er.Error == nil || er.Error.Message == "" {
		end.err = fmt.Errorf("the reply's body: %v (%+v)", err, er.Error)
		return end
	}
	end.errType = er.Error.Type
	resp.Body.Close()
	if n, err := io.Copy(io.Discard, br); n > 0 || err != nil && !errors.Is(err, syscall.ECONNRESET) {
		end.err = fmt.Errorf("after the reply: %d more bytes, %v", n, err)
		return end
	}
	end.closed = true
	return end
}

// request posts one completion of n choices; for a stream it reports on
// started after the first chunk, and reads to the end. Its finish is the
// choices' finish_reason when they all have the same one.
func request(url, prompt string, maxTokens, n int, stream bool, started chan<- struct{}) streamEnd {
	b, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": maxTokens, "n": n, "ignore_eos": true, "stream": stream})
	resp, err := http.Post(url+"/v1/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		return streamEnd{err: err}
	}
	defer resp.Body.Close()
	end := streamEnd{status: resp.StatusCode}
	if !stream {
		var r struct {
			Choices []struct {
				Index        int    `json:"index"`
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || len(r.Choices) != n {
			end.err = fmt.Errorf("reply: %v (%d choices, want %d)", err, len(r.Choices), n)
			return end
		}
		finishes := make([]string, n)
		for _, c := range r.Choices {
			if c.Index >= 0 && c.Index < n {
				finishes[c.Index] = c.FinishReason
			}
		}
		end.finish = sameFinish(finishes)
		return end
	}
	finishes := make([]string, n)
	var last time.Time
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
				Index        int     `json:"index"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			end.err = fmt.Errorf("chunk %q: %w", data, err)
			return end
		}
		for _, c := range ch.Choices {
			if c.FinishReason != nil && c.Index >= 0 && c.Index < n {
				finishes[c.Index] = *c.FinishReason
			}
		}
		now := time.Now()
		if end.chunks++; end.chunks == 1 {
			started <- struct{}{}
		} else {
			end.maxGap = max(end.maxGap, now.Sub(last))
		}
		last = now
	}
	end.finish = sameFinish(finishes)
	end.err = sc.Err()
	return end
}

// sameFinish is the finish_reason all choices share, or all of them
// listed when they differ or some are missing.
func sameFinish(finishes []string) string {
	for _, f := range finishes {
		if f != finishes[0] || f == "" {
			return fmt.Sprint(finishes)
		}
	}
	return finishes[0]
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
