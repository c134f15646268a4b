package probe

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/internal/testsupport"
)

// waitRound blocks until the prober driven by fc has finished its round and
// waits for the next (its timer is the clock's only waiter).
func waitRound(t *testing.T, fc *testsupport.FakeClock) {
	t.Helper()
	if err := fc.BlockUntilContext(testsupport.Context(t, 10*time.Second), 1); err != nil {
		t.Fatalf("round not finished: %v", err)
	}
}

// nextRound advances fc by one interval and waits for the round it starts.
func nextRound(t *testing.T, fc *testsupport.FakeClock, interval time.Duration) {
	t.Helper()
	fc.Advance(interval)
	waitRound(t, fc)
}

func TestStartValidates(t *testing.T) {
	targets := func() []int { return nil }
	probe := func(context.Context, int) (int, error) { return 0, nil }
	observe := func(int, int, error) {}
	for _, tc := range []struct {
		name string
		o    Options
		nils bool
	}{
		{"zero interval", Options{}, false},
		{"negative interval", Options{Interval: -time.Second}, false},
		{"negative timeout", Options{Interval: time.Second, Timeout: -1}, false},
		{"negative concurrency", Options{Interval: time.Second, Concurrency: -1}, false},
		{"no callbacks", Options{Interval: time.Second}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p *Prober
			var err error
			if tc.nils {
				p, err = Start[int, int](tc.o, nil, nil, nil)
			} else {
				p, err = Start(tc.o, targets, probe, observe)
			}
			if err == nil {
				p.Close()
				t.Fatal("accepted")
			}
		})
	}
}

// TestProberRounds: a round at Start, then one per Interval of the clock
// and none in between; each round asks for the targets once and observes
// every outcome.
func TestProberRounds(t *testing.T) {
	fc := testsupport.NewFakeClock()
	var asked atomic.Int64
	var seen atomic.Int64
	outcomes := make(chan int, 10)
	p, err := Start(Options{Interval: time.Minute, Clock: fc},
		func() []int { asked.Add(1); return []int{1, 2, 3} },
		func(_ context.Context, n int) (int, error) { return 10 * n, nil },
		func(n, r int, err error) {
			if err != nil || r != 10*n {
				t.Errorf("observed %d, %d, %v", n, r, err)
			}
			seen.Add(1)
			outcomes <- n
		})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	waitRound(t, fc)
	if asked.Load() != 1 || seen.Load() != 3 {
		t.Fatalf("after the first round: targets asked %d times, %d outcomes", asked.Load(), seen.Load())
	}
	fc.Advance(time.Minute - time.Second)
	waitRound(t, fc)
	if asked.Load() != 1 || seen.Load() != 3 {
		t.Fatalf("a round before the interval passed: targets asked %d times, %d outcomes", asked.Load(), seen.Load())
	}
	fc.Advance(time.Second)
	waitRound(t, fc)
	nextRound(t, fc, time.Minute)
	if asked.Load() != 3 || seen.Load() != 9 {
		t.Fatalf("after three rounds: targets asked %d times, %d outcomes", asked.Load(), seen.Load())
	}
}

// TestProberOverrun: a round that outlasts the interval is followed by the
// next one at once, not an interval later.
func TestProberOverrun(t *testing.T) {
	fc := testsupport.NewFakeClock()
	var rounds atomic.Int64
	p, err := Start(Options{Interval: time.Minute, Clock: fc},
		func() []int { return []int{int(rounds.Add(1))} },
		func(_ context.Context, n int) (int, error) {
			if n == 1 {
				fc.Advance(90 * time.Second) // the first round takes 1.5 intervals
			}
			return n, nil
		},
		func(int, int, error) {})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	waitRound(t, fc)
	if n := rounds.Load(); n != 2 {
		t.Fatalf("%d rounds, want 2: the second starts right after the overrun", n)
	}
	nextRound(t, fc, time.Minute)
	if n := rounds.Load(); n != 3 {
		t.Fatalf("%d rounds, want 3", n)
	}
}

// TestRoundConcurrency: at most Concurrency probes are in flight at once.
func TestRoundConcurrency(t *testing.T) {
	var inFlight, most atomic.Int64
	started := make(chan struct{}, 6)
	release := make(chan struct{})
	var observed atomic.Int64
	r, err := newRounds(Options{Interval: time.Hour, Concurrency: 2},
		func() []int { return []int{1, 2, 3, 4, 5, 6} },
		func(_ context.Context, n int) (int, error) {
			cur := inFlight.Add(1)
			for {
				m := most.Load()
				if cur <= m || most.CompareAndSwap(m, cur) {
					break
				}
			}
			started <- struct{}{}
			<-release
			inFlight.Add(-1)
			return n, nil
		},
		func(int, int, error) { observed.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { r.round(context.Background()); close(done) }()
	<-started
	<-started
	for range 6 {
		release <- struct{}{}
	}
	<-done
	if most.Load() != 2 || observed.Load() != 6 {
		t.Fatalf("at most %d probes in flight (want 2), %d observed (want 6)", most.Load(), observed.Load())
	}
}

// TestRoundTimeout: each probe's context ends after Timeout and the
// timeout is the probe's outcome.
func TestRoundTimeout(t *testing.T) {
	var got error
	r, err := newRounds(Options{Interval: time.Hour, Timeout: 20 * time.Millisecond},
		func() []int { return []int{1} },
		func(ctx context.Context, _ int) (int, error) {
			if d, ok := ctx.Deadline(); !ok || time.Until(d) > 20*time.Millisecond {
				t.Errorf("probe deadline %v (set %v), want within 20ms", d, ok)
			}
			<-ctx.Done()
			return 0, ctx.Err()
		},
		func(_, _ int, err error) { got = err })
	if err != nil {
		t.Fatal(err)
	}
	r.round(context.Background())
	if !errors.Is(got, context.DeadlineExceeded) {
		t.Fatalf("observed %v, want the deadline", got)
	}
}

// TestCloseCancelsProbes: Close ends a probe in flight, does not report it
// and returns once the prober's goroutines are gone (TestMain checks).
func TestCloseCancelsProbes(t *testing.T) {
	started := make(chan struct{})
	var observed atomic.Int64
	p, err := Start(Options{Interval: time.Hour, Timeout: time.Hour, Clock: testsupport.NewFakeClock()},
		func() []int { return []int{1} },
		func(ctx context.Context, _ int) (int, error) {
			close(started)
			<-ctx.Done()
			return 0, ctx.Err()
		},
		func(int, int, error) { observed.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	<-started
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if n := observed.Load(); n != 0 {
		t.Fatalf("%d outcomes of cancelled probes observed", n)
	}
}
