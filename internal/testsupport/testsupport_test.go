package testsupport

import (
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// fatalRecorder is a testing.TB whose Fatalf records the failure and stops
// the calling goroutine, as the real one does, so that a test can check that
// Eventually fails when it should.
type fatalRecorder struct {
	testing.TB
	failed atomic.Bool
}

func (f *fatalRecorder) Helper() {}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.failed.Store(true)
	panic(errStop)
}

var errStop = errors.New("stop")

// runRecorded runs fn with a recorder and reports whether it called Fatalf.
func runRecorded(t *testing.T, fn func(tb testing.TB)) bool {
	rec := &fatalRecorder{TB: t}
	func() {
		defer func() {
			if r := recover(); r != nil && r != errStop {
				panic(r)
			}
		}()
		fn(rec)
	}()
	return rec.failed.Load()
}

func TestEventuallyReturnsWhenTrue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ready := make(chan struct{})
		go func() {
			time.Sleep(300 * time.Millisecond)
			close(ready)
		}()
		var took time.Duration
		failed := runRecorded(t, func(tb testing.TB) {
			took = Eventually(tb, time.Second, "ready", func() bool {
				select {
				case <-ready:
					return true
				default:
					return false
				}
			})
		})
		if failed {
			t.Fatal("Eventually failed although the condition held before the deadline")
		}
		// The bubble's clock is exact: the condition turns true at 300 ms and
		// the poll that sees it comes at most one interval later.
		if took < 300*time.Millisecond || took > 300*time.Millisecond+pollInterval {
			t.Fatalf("took %v, want 300ms to 300ms+%v", took, pollInterval)
		}
	})
}

func TestEventuallyFailsAtDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		failed := runRecorded(t, func(tb testing.TB) {
			Eventually(tb, 500*time.Millisecond, "never", func() bool { return false })
		})
		if !failed {
			t.Fatal("Eventually did not fail on a condition that never holds")
		}
		if d := time.Since(start); d < 500*time.Millisecond || d > 500*time.Millisecond+pollInterval {
			t.Fatalf("failed after %v, want 500ms", d)
		}
	})
}

func TestContextEndsAtTimeoutAndLivesThroughLaterCleanups(t *testing.T) {
	t.Run("timeout", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ctx := Context(t, time.Second)
			start := time.Now()
			<-ctx.Done()
			if d := time.Since(start); d != time.Second {
				t.Fatalf("done after %v, want 1s", d)
			}
		})
	})
	t.Run("cleanup", func(t *testing.T) {
		var errInCleanup error
		t.Run("inner", func(t *testing.T) {
			ctx := Context(t, time.Minute)
			t.Cleanup(func() { errInCleanup = ctx.Err() })
		})
		if errInCleanup != nil {
			t.Fatalf("context ended before a later cleanup ran: %v", errInCleanup)
		}
	})
}

func TestFakeClockMovesOnlyWhenAdvanced(t *testing.T) {
	c := NewFakeClock()
	t0 := c.Now()
	timer := c.NewTimer(time.Minute)
	select {
	case <-timer.Chan():
		t.Fatal("timer fired before the clock moved")
	default:
	}
	c.Advance(time.Minute)
	select {
	case now := <-timer.Chan():
		if got := now.Sub(t0); got != time.Minute {
			t.Fatalf("fired at +%v, want +1m", got)
		}
	case <-time.After(time.Second):
		t.Fatal("timer did not fire after the clock moved past it")
	}
}
