package overload

import (
	"errors"
	"testing"
	"time"

	"github.com/sony/gobreaker/v2"
)

// TestStatus checks that Status reports every part of the state it copies:
// in flight, external load (and unknown as -1), breaker and health.
func TestStatus(t *testing.T) {
	s := NewState("i-a", BreakerOptions{ConsecutiveFailures: 1, OpenTimeout: time.Hour})
	want := Status{ID: "i-a", InFlight: 0, ExternalLoad: -1, Breaker: gobreaker.StateClosed, Healthy: true}
	if got := s.Status(); got != want {
		t.Fatalf("fresh: %+v, want %+v", got, want)
	}

	held, ok := s.Acquire()
	if !ok {
		t.Fatal("not admitted")
	}
	failed, ok := s.Acquire()
	if !ok {
		t.Fatal("second request not admitted")
	}
	failed(errors.New("connection reset")) // one failure opens it
	s.SetExternalLoad(7)
	s.ObserveProbe(false, 1)
	want = Status{ID: "i-a", InFlight: 1, ExternalLoad: 7, Breaker: gobreaker.StateOpen, Healthy: false}
	if got := s.Status(); got != want {
		t.Fatalf("loaded, open, down: %+v, want %+v", got, want)
	}

	held(nil)
	s.SetExternalLoad(-3)
	s.ObserveProbe(true, 1)
	want = Status{ID: "i-a", InFlight: 0, ExternalLoad: -1, Breaker: gobreaker.StateOpen, Healthy: true}
	if got := s.Status(); got != want {
		t.Fatalf("released, unknown load, up: %+v, want %+v", got, want)
	}
}
