package subprocess

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// TestStop: a process that honours SIGTERM ends at once, also when it was
// stopped (SIGSTOP: a hung engine's test that ends early); one that
// ignores it is killed after the grace; an exited one is left alone.
func TestStop(t *testing.T) {
	for _, tc := range []struct {
		name   string
		script string
		grace  time.Duration
		stop   bool // SIGSTOP it first
	}{
		{"honours SIGTERM", "sleep 30", 10 * time.Second, false},
		{"stopped", "sleep 30", 10 * time.Second, true},
		// sh ignores the signal and waits for its sleep (which outlives
		// the kill by at most 3 s).
		{"ignores SIGTERM", "trap '' TERM; sleep 3; true", 100 * time.Millisecond, false},
	} {
		p, err := Start(exec.Command("sh", "-c", tc.script))
		if err != nil {
			t.Skipf("no sh: %v", err)
		}
		if tc.stop {
			if err := p.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
		}
		start := time.Now()
		p.Stop(tc.grace)
		select {
		case <-p.Exited():
		default:
			t.Fatalf("%s: not exited after Stop", tc.name)
		}
		if d := time.Since(start); d > 2*time.Second || p.Err() == nil || p.Pid() <= 0 {
			t.Fatalf("%s: stopped after %v, exit %v", tc.name, d, p.Err())
		}
	}
	p, err := Start(exec.Command("true"))
	if err != nil {
		t.Skipf("no true: %v", err)
	}
	<-p.Exited()
	if err := p.Signal(syscall.SIGKILL); !errors.Is(err, os.ErrProcessDone) {
		t.Fatalf("signal to an exited process: %v", err)
	}
	p.Stop(time.Second)
	if p.Err() != nil {
		t.Fatalf("true exited with %v", p.Err())
	}
}
