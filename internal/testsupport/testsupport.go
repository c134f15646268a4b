// Package testsupport is what the tests of every package share: a condition
// polled until a deadline, the goroutine leak check, a fake clock and a test
// context. One copy, imported by tests only (grpc-go's internal/grpctest is
// the model).
package testsupport

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"go.uber.org/goleak"
)

// pollInterval is how often Eventually re-checks its condition: short enough
// that the durations it returns are accurate to a few milliseconds, long
// enough not to starve the code under test on a small machine.
const pollInterval = 2 * time.Millisecond

// Eventually polls cond until it holds and returns how long that took. It
// fails the test if cond does not hold within the given time. Callers that
// assert a bound on the returned duration make within much longer than the
// bound, so that a slow run reports the time it measured rather than just
// "timeout".
//
// Inside a testing/synctest bubble the polling sleeps on the bubble's fake
// clock, so Eventually costs no real time there.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(pollInterval) // polling interval, not a wait for an event
	}
	return time.Since(start)
}

// VerifyNoLeaks runs the package's tests and then fails the run if any
// goroutine outlives them. Call it from TestMain:
//
//	func TestMain(m *testing.M) { testsupport.VerifyNoLeaks(m) }
func VerifyNoLeaks(m *testing.M, opts ...goleak.Option) {
	goleak.VerifyTestMain(m, opts...)
}

// Context returns a context that ends after timeout or when the test and its
// cleanups finish. Unlike t.Context it is still live while cleanups that were
// registered after it run, so they can use it to stop what the test started.
func Context(t testing.TB, timeout time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return ctx
}

// FakeClock is a clock that moves only when the test advances it. Code that
// reads time takes a clockwork.Clock (clockwork.NewRealClock() in
// production); tests pass a FakeClock.
type FakeClock = clockwork.FakeClock

// NewFakeClock returns a FakeClock set to a fixed, arbitrary instant, so that
// tests do not depend on the wall clock.
func NewFakeClock() *FakeClock {
	return clockwork.NewFakeClockAt(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
}

// EngineTestdata reads a file of engine/testdata (engine answers captured
// from, or built from the source of, real model servers; its README says
// which) from a test of a top-level package.
func EngineTestdata(t testing.TB, file string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "engine", "testdata", filepath.FromSlash(file)))
	if err != nil {
		t.Fatal(err)
	}
	return b
}
