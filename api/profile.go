package api

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"runtime/trace"
	"sync"
	"time"
)

// profiler serves POST /start_profile and /stop_profile (vLLM's routes,
// there for its torch profiler; Options.ProfileDir): between the two the
// whole process records a Go CPU profile (go tool pprof) and an execution
// trace (go tool trace), which show where the host's time goes under real
// traffic: the step loop, the HTTP handlers, the waits on the device.
// One profile runs at a time.
type profiler struct {
	dir string

	mu         sync.Mutex
	running    bool
	cpu, trace *os.File
}

// profileFiles is /stop_profile's reply: the files written.
type profileFiles struct {
	CPUProfile string `json:"cpu_profile"`
	Trace      string `json:"trace"`
}

func (p *profiler) start(w http.ResponseWriter, _ *http.Request) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.running {
		writeError(w, &Error{Status: http.StatusConflict, Type: typeInvalidRequest, Message: "a profile is already running: POST /stop_profile first"})
		return
	}
	if err := p.open(); err != nil {
		writeError(w, &Error{Status: http.StatusInternalServerError, Type: typeServer, Message: err.Error()})
		return
	}
	p.running = true
	writeJSON(w, http.StatusOK, map[string]string{"status": "profiling", "dir": p.dir})
}

// open creates the two files and starts both recorders, undoing what it
// did on a failure.
func (p *profiler) open() (err error) {
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	stamp := time.Now().UTC().Format("20060102-150405.000")
	if p.cpu, err = os.Create(filepath.Join(p.dir, "cpu-"+stamp+".pprof")); err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	if p.trace, err = os.Create(filepath.Join(p.dir, "trace-"+stamp+".out")); err != nil {
		p.cpu.Close()
		return fmt.Errorf("profile: %w", err)
	}
	if err = pprof.StartCPUProfile(p.cpu); err != nil {
		p.cpu.Close()
		p.trace.Close()
		return fmt.Errorf("profile: CPU profile: %w", err)
	}
	if err = trace.Start(p.trace); err != nil {
		pprof.StopCPUProfile()
		p.cpu.Close()
		p.trace.Close()
		return fmt.Errorf("profile: execution trace: %w", err)
	}
	return nil
}

func (p *profiler) stop(w http.ResponseWriter, _ *http.Request) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.running {
		writeError(w, &Error{Status: http.StatusConflict, Type: typeInvalidRequest, Message: "no profile is running: POST /start_profile first"})
		return
	}
	trace.Stop()
	pprof.StopCPUProfile()
	p.running = false
	files := profileFiles{CPUProfile: p.cpu.Name(), Trace: p.trace.Name()}
	errCPU, errTrace := p.cpu.Close(), p.trace.Close()
	if err := firstErr(errCPU, errTrace); err != nil {
		writeError(w, &Error{Status: http.StatusInternalServerError, Type: typeServer, Message: fmt.Sprintf("profile: %v", err)})
		return
	}
	writeJSON(w, http.StatusOK, files)
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
