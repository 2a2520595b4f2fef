package cuda

import (
	"errors"
	"testing"
	"time"
)

// TestCallSpin checks callSpin's hand-off without a GPU: a thread that
// runs tasks as the CUDA thread does (Backend.run) returns each result to
// the poller that asked, in order, including a task slower than spinWait
// (the poller then sleeps between polls), and a plain call and a queued
// op interleaved with them still reach the reply channel and Sync's
// deferred error.
func TestCallSpin(t *testing.T) {
	b := &Backend{name: "cuda-test", tasks: make(chan task), reply: make(chan error)}
	done := make(chan struct{})
	go func() {
		for tk := range b.tasks {
			b.run(tk)
		}
		close(done)
	}()
	defer func() { close(b.tasks); <-done }()

	errA := errors.New("a")
	ran := 0
	if err := b.callSpin(func() error { ran++; return errA }); err != errA {
		t.Fatalf("callSpin returned %v, want %v", err, errA)
	}
	start := time.Now()
	if err := b.callSpin(func() error { ran++; time.Sleep(spinWait + 10*time.Millisecond); return nil }); err != nil {
		t.Fatalf("slow callSpin: %v", err)
	}
	if d := time.Since(start); d < spinWait {
		t.Fatalf("slow callSpin returned after %v, before its task ended", d)
	}
	errB := errors.New("b")
	if err := b.call(func() error { ran++; return errB }); err != errB {
		t.Fatalf("call returned %v, want %v", err, errB)
	}
	errC := errors.New("c")
	if err := b.post(func() error { ran++; return errC }); err != nil {
		t.Fatal(err)
	}
	if err := b.callSpin(func() error { ran++; return nil }); err != nil {
		t.Fatalf("callSpin after a failed queued op: %v (the op's error is Sync's)", err)
	}
	if err := b.call(func() error { return b.deferred }); err != errC {
		t.Fatalf("deferred error %v, want %v", err, errC)
	}
	if ran != 5 {
		t.Fatalf("%d tasks ran, want 5", ran)
	}
	b.hostCapturing = true
	if err := b.callSpin(func() error { return nil }); err != errCapturing {
		t.Fatalf("callSpin while capturing: %v, want errCapturing", err)
	}
}
