package api
import ("testing";"net/http";"net/http/httptest";"net";"fmt";"time";"io";"bufio")
func TestDbgSlow(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		err := rc.SetReadDeadline(time.Now().Add(100*time.Millisecond))
		t.Logf("set: %v", err)
		b, err := io.ReadAll(r.Body)
		t.Logf("read %q err %v", b, err)
		err = rc.SetReadDeadline(time.Time{})
		t.Logf("reset: %v", err)
		w.WriteHeader(408)
		_, err = w.Write([]byte("x"))
		t.Logf("write: %v", err)
	}))
	defer ts.Close()
	conn, _ := net.Dial("tcp", ts.Listener.Addr().String())
	fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\":")
	conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	t.Logf("resp %v err %v", resp, err)
}
