package api

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"testing"
)

// TestProfileRoutes: with ProfileDir, /start_profile and /stop_profile
// write a CPU profile and an execution trace, refuse a second start and a
// stop with nothing running, and start again afterwards; without it the
// routes do not exist.
func TestProfileRoutes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "profiles")
	e := newEnv(t, func(o *Options) { o.ProfileDir = dir })
	if rec := e.do(t, "POST", "/stop_profile", ""); rec.Code != http.StatusConflict {
		t.Errorf("stop with nothing running: %d %s, want 409", rec.Code, rec.Body)
	}
	for round := range 2 {
		if rec := e.do(t, "POST", "/start_profile", ""); rec.Code != http.StatusOK {
			t.Fatalf("round %d: start: %d %s", round, rec.Code, rec.Body)
		}
		if rec := e.do(t, "POST", "/start_profile", ""); rec.Code != http.StatusConflict {
			t.Errorf("round %d: second start: %d %s, want 409", round, rec.Code, rec.Body)
		}
		e.do(t, "POST", "/v1/completions", `{"model":"`+testModel+`","prompt":"hello","max_tokens":4}`)
		rec := e.do(t, "POST", "/stop_profile", "")
		if rec.Code != http.StatusOK {
			t.Fatalf("round %d: stop: %d %s", round, rec.Code, rec.Body)
		}
		var files profileFiles
		if err := json.Unmarshal(rec.Body.Bytes(), &files); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{files.CPUProfile, files.Trace} {
			st, err := os.Stat(f)
			if err != nil || st.Size() == 0 || filepath.Dir(f) != dir {
				t.Errorf("round %d: profile file %q: %v (size %d), want a non-empty file in %s", round, f, err, sizeOf(st), dir)
			}
		}
	}
	if rec := e.do(t, "GET", "/start_profile", ""); rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("GET /start_profile: %d, want 405", rec.Code)
	}
	plain := newEnv(t, nil)
	if rec := plain.do(t, "POST", "/start_profile", ""); rec.Code != http.StatusNotFound {
		t.Errorf("start without ProfileDir: %d %s, want 404", rec.Code, rec.Body)
	}
}

func sizeOf(st os.FileInfo) int64 {
	if st == nil {
		return 0
	}
	return st.Size()
}
