package overload

import (
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prefixrouter/prefixrouter/engine"
	"github.com/sony/gobreaker/v2"
)

// TestServerErrorKeysRepeated is the "different requests" half of the rule
// as a pure function of (key, time) sequences.
func TestServerErrorKeysRepeated(t *testing.T) {
	const need, window = 3, 30 * time.Second
	t0 := time.Unix(1000, 0)
	type ev struct {
		key uint64
		at  time.Duration // after t0
	}
	for _, tc := range []struct {
		name string
		evs  []ev
		want []bool // repeated's answer after each
	}{
		{"one key again and again", []ev{{1, 0}, {1, 1}, {1, 2}, {1, 3}, {1, 4}, {1, 5}}, []bool{false, false, false, false, false, false}},
		{"three keys", []ev{{1, 0}, {2, 1}, {3, 2}, {4, 3}}, []bool{false, false, true, true}},
		{"a repeated key adds nothing", []ev{{1, 0}, {2, 1}, {1, 2}, {2, 3}, {3, 4}}, []bool{false, false, false, false, true}},
		{"spread wider than the window", []ev{{1, 0}, {2, 20 * time.Second}, {3, 30 * time.Second}}, []bool{false, false, false}},
		{"a key refreshed within the window", []ev{{1, 0}, {2, 20 * time.Second}, {1, 25 * time.Second}, {3, 40 * time.Second}}, []bool{false, false, false, true}},
		{"after a quiet window, again from zero", []ev{{1, 0}, {2, 1}, {3, 2}, {4, time.Minute}, {5, time.Minute + 1}}, []bool{false, false, true, false, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r serverErrorKeys
			for i, e := range tc.evs {
				if got := r.repeated(e.key, t0.Add(e.at), need, window); got != tc.want[i] {
					t.Fatalf("event %d (key %d at +%v): repeated = %v, want %v", i, e.key, e.at, got, tc.want[i])
				}
				if len(r.keys) > need {
					t.Fatalf("%d keys kept, at most %d", len(r.keys), need)
				}
			}
		})
	}
}

// TestServerErrorRule: a 500 counts at once when the engine's profile says
// it proves a fault; otherwise 500s to one routing key never open the
// breaker, and 500s to different keys do.
func TestServerErrorRule(t *testing.T) {
	fail := func(s *State, code int, key uint64) {
		t.Helper()
		d, ok := s.Acquire()
		if !ok {
			t.Fatalf("rejected before the breaker opened (status %d, key %d)", code, key)
		}
		d(UpstreamStatusFor(code, key))
	}
	t.Run("one key, unknown engine", func(t *testing.T) {
		s := NewState("a", BreakerOptions{ConsecutiveFailures: 2, OpenTimeout: time.Hour})
		for range 20 {
			fail(s, 500, 42)
		}
		if st := s.Status().Breaker; st != gobreaker.StateClosed {
			t.Fatalf("breaker %v after 20 × 500 to one key", st)
		}
	})
	t.Run("one key, engine whose 500 is a fault", func(t *testing.T) {
		s := NewState("a", BreakerOptions{ConsecutiveFailures: 2, OpenTimeout: time.Hour})
		s.SetServerErrors(engine.Fault500)
		fail(s, 500, 42)
		fail(s, 500, 42)
		if st := s.Status().Breaker; st != gobreaker.StateOpen {
			t.Fatalf("breaker %v after 2 × 500 proving a fault, want open", st)
		}
	})
	t.Run("different keys, unknown engine", func(t *testing.T) {
		s := NewState("a", BreakerOptions{ConsecutiveFailures: 2, OpenTimeout: time.Hour})
		for key := range uint64(DefaultServerErrorKeys) {
			fail(s, 500, key)
		}
		if st := s.Status().Breaker; st != gobreaker.StateClosed {
			t.Fatalf("breaker %v after %d keys: only the last one counted", st, DefaultServerErrorKeys)
		}
		fail(s, 500, 100)
		if st := s.Status().Breaker; st != gobreaker.StateOpen {
			t.Fatalf("breaker %v after two counted 500s, want open", st)
		}
	})
	t.Run("different keys, engine whose 500 is the client's", func(t *testing.T) {
		// llama.cpp: one client's malformed requests over many prompts
		// (the e2e test against a real llama-server opened its breaker).
		s := NewState("a", BreakerOptions{ConsecutiveFailures: 2, OpenTimeout: time.Hour})
		s.SetServerErrors(engine.Client500)
		for key := range uint64(4 * DefaultServerErrorKeys) {
			fail(s, 500, key)
		}
		if st := s.Status().Breaker; st != gobreaker.StateClosed {
			t.Fatalf("breaker %v after 500s to %d keys from an engine whose 500 is the client's", st, 4*DefaultServerErrorKeys)
		}
		fail(s, 502, 1)
		fail(s, 500, 1)
		fail(s, 503, 2)
		if st := s.Status().Breaker; st != gobreaker.StateOpen {
			t.Fatalf("breaker %v after 502, 500, 503: its 500s must not hide its failures", st)
		}
	})
	t.Run("ambiguous 500s neither count nor reset", func(t *testing.T) {
		// A client's 500s between an instance's real failures must not
		// hide them by counting as successes.
		s := NewState("a", BreakerOptions{ConsecutiveFailures: 2, OpenTimeout: time.Hour})
		fail(s, 502, 1)
		fail(s, 500, 1)
		fail(s, 502, 1)
		if st := s.Status().Breaker; st != gobreaker.StateOpen {
			t.Fatalf("breaker %v after 502, 500, 502, want open", st)
		}
	})
	t.Run("the window passes", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := NewState("a", BreakerOptions{ConsecutiveFailures: 1, OpenTimeout: time.Hour, ServerErrorKeys: 2, ServerErrorWindow: time.Second})
			fail(s, 500, 1)
			time.Sleep(time.Second)
			fail(s, 500, 2)
			if st := s.Status().Breaker; st != gobreaker.StateClosed {
				t.Fatalf("breaker %v after two keys a window apart", st)
			}
			fail(s, 500, 3)
			if st := s.Status().Breaker; st != gobreaker.StateOpen {
				t.Fatalf("breaker %v after two keys within the window, want open", st)
			}
		})
	})
}

// trackerOf returns a tracker of n instances i0..i(n-1) and their states.
func trackerOf(n int, o BreakerOptions) (*Tracker, []*State) {
	tr := NewTracker(o)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("i%d", i)
	}
	m := tr.Sync(ids)
	states := make([]*State, n)
	for i, id := range ids {
		states[i] = m[id]
	}
	return tr, states
}

// failOnce reports one counted failure to s, if it admits a request.
func failOnce(s *State) {
	if d, ok := s.Acquire(); ok {
		d(UpstreamStatus(503))
	}
}

func openCount(states []*State) int {
	n := 0
	for _, s := range states {
		if s.Status().Breaker != gobreaker.StateClosed {
			n++
		}
	}
	return n
}

// TestEjectionCap: breakers of an endpoint open on at most
// MaxEjectionPercent of its instances (rounded down); a breaker that would
// open past the cap stays closed, and opens once another one closes.
func TestEjectionCap(t *testing.T) {
	for _, tc := range []struct {
		n, percent, want int
	}{
		{1, 0, 0}, {2, 0, 1}, {3, 0, 1}, {4, 0, 2}, {10, 0, 5}, {10, 10, 1}, {9, 10, 0}, {4, 100, 4},
	} {
		t.Run(fmt.Sprintf("%d instances at %d%%", tc.n, tc.percent), func(t *testing.T) {
			_, states := trackerOf(tc.n, BreakerOptions{ConsecutiveFailures: 1, OpenTimeout: time.Hour, MaxEjectionPercent: tc.percent})
			for range 3 {
				for _, s := range states {
					failOnce(s)
				}
			}
			if got := openCount(states); got != tc.want {
				t.Fatalf("%d breakers open, want %d", got, tc.want)
			}
			for _, s := range states {
				if s.Panicking() {
					t.Fatal("breakers alone made the endpoint panic")
				}
			}
		})
	}
	t.Run("room again once one closes", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			_, s := trackerOf(2, BreakerOptions{ConsecutiveFailures: 1, OpenTimeout: time.Second})
			failOnce(s[0])
			failOnce(s[1])
			if s[0].Status().Breaker != gobreaker.StateOpen || s[1].Status().Breaker != gobreaker.StateClosed {
				t.Fatalf("breakers %v, %v; want open, closed (cap 1 of 2)", s[0].Status().Breaker, s[1].Status().Breaker)
			}
			time.Sleep(time.Second + time.Nanosecond)
			probe, ok := s[0].Acquire()
			if !ok {
				t.Fatal("half-open breaker refused its probe")
			}
			probe(nil)
			failOnce(s[1])
			if s[0].Status().Breaker != gobreaker.StateClosed || s[1].Status().Breaker != gobreaker.StateOpen {
				t.Fatalf("breakers %v, %v; want closed, open", s[0].Status().Breaker, s[1].Status().Breaker)
			}
		})
	})
}

// TestEjectionPanic: health marks count against the cap too; more of them
// than it allows make the endpoint panic (picks ignore health marks and
// open breakers), and fewer end the panic.
func TestEjectionPanic(t *testing.T) {
	_, s := trackerOf(4, BreakerOptions{ConsecutiveFailures: 1, OpenTimeout: time.Hour})
	failOnce(s[0]) // one breaker open: 1 of 4 out
	s[1].ObserveProbe(false, 1)
	if s[0].Panicking() || !s[0].Ejected() || !s[1].MarkedDown() {
		t.Fatalf("2 of 4 out: panicking %v, ejected %v, marked down %v", s[0].Panicking(), s[0].Ejected(), s[1].MarkedDown())
	}
	failOnce(s[2])
	if s[2].Status().Breaker != gobreaker.StateClosed {
		t.Fatal("a breaker opened with 2 of 4 out already (one by health)")
	}
	s[2].ObserveProbe(false, 1) // 3 of 4 out: beyond the cap
	for i, st := range s {
		if !st.Panicking() || st.Ejected() || st.MarkedDown() {
			t.Fatalf("instance %d with 3 of 4 out: panicking %v, ejected %v, marked down %v", i, st.Panicking(), st.Ejected(), st.MarkedDown())
		}
	}
	d, ok := s[0].Acquire()
	if !ok {
		t.Fatal("panic routing: an open breaker refused")
	}
	d(UpstreamStatus(503)) // not recorded: the request went past the breaker
	if s[0].Status().Breaker != gobreaker.StateOpen || s[0].InFlight() != 0 {
		t.Fatalf("after a request past the open breaker: %v, %d in flight", s[0].Status().Breaker, s[0].InFlight())
	}
	s[2].ObserveProbe(true, 1) // back to 2 of 4
	if s[0].Panicking() || !s[0].Ejected() {
		t.Fatal("panic did not end with 2 of 4 out")
	}
	if _, ok := s[0].Acquire(); ok {
		t.Fatal("open breaker admitted after the panic ended")
	}
}

// TestEjectionFollowsMembership: the cap follows the endpoint's size, and
// instances that leave stop counting.
func TestEjectionFollowsMembership(t *testing.T) {
	tr, s := trackerOf(4, BreakerOptions{ConsecutiveFailures: 1, OpenTimeout: time.Hour})
	s[0].ObserveProbe(false, 1)
	s[1].ObserveProbe(false, 1)
	if s[2].Panicking() {
		t.Fatal("2 of 4 down: panic")
	}
	m := tr.Sync([]string{"i0", "i1", "i2"}) // cap 1 of 3: 2 down is beyond it
	if !m["i2"].Panicking() {
		t.Fatal("2 of 3 down after a shrink: no panic")
	}
	m = tr.Sync([]string{"i1", "i2", "i3"}) // i0, down, leaves
	if m["i2"].Panicking() {
		t.Fatal("1 of 3 down: panic")
	}
	failOnce(m["i2"])
	if m["i2"].Status().Breaker != gobreaker.StateClosed {
		t.Fatal("a breaker opened past the cap (1 of 3 out already)")
	}
	m = tr.Sync([]string{"i1", "i2", "i3", "i4", "i5"}) // cap 2 of 5
	failOnce(m["i2"])
	if m["i2"].Status().Breaker != gobreaker.StateOpen {
		t.Fatal("no breaker opened with room under the grown cap")
	}
}

// TestEjectionCapConcurrent: failures, successes and health flips from many
// goroutines never open more breakers than the cap, and the count of
// instances out always matches their states.
func TestEjectionCapConcurrent(t *testing.T) {
	tr, s := trackerOf(8, BreakerOptions{ConsecutiveFailures: 1, OpenTimeout: time.Hour})
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 200 {
				st := s[(g+i)%len(s)]
				switch i % 5 {
				case 0:
					st.ObserveProbe(i%2 == 0, 1)
				default:
					if d, ok := st.Acquire(); ok {
						d(UpstreamStatus(503))
					}
				}
			}
		})
	}
	wg.Wait()
	if n := openCount(s); n > 4 && !s[0].Panicking() {
		t.Fatalf("%d of 8 breakers open without panic, cap 4", n)
	}
	tr.ej.mu.Lock()
	defer tr.ej.mu.Unlock()
	out := 0
	for _, st := range s {
		if st.counted != (st.ejected || st.down.Load()) {
			t.Fatalf("%s: counted %v, ejected %v, down %v", st.id, st.counted, st.ejected, st.down.Load())
		}
		if st.counted {
			out++
		}
	}
	if out != tr.ej.out || tr.ej.panic.Load() != (out > 4) {
		t.Fatalf("out %d, counted %d, panic %v", tr.ej.out, out, tr.ej.panic.Load())
	}
}
