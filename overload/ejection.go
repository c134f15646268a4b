package overload

import (
	"sync"
	"sync/atomic"
)

// ejection caps the share of one endpoint's instances that breakers and
// health checks hold out of rotation at once, as Envoy's outlier detection
// caps ejections (max_ejection_percent): a breaker does not open while the
// cap is reached. Health checks are not vetoed (a probe's verdict is a
// fact), so they can take more instances out than the cap allows; then the
// endpoint panics, as Envoy does below its healthy panic threshold: picks
// ignore health marks and open breakers until enough instances are back.
//
// The panic decision is made here, on each change of an instance's breaker
// or health or of the endpoint's membership, and published as one atomic
// bool: picks read it without a lock.
type ejection struct {
	percent int

	// mu guards size, out and the ejected, counted and member fields of
	// every State of the endpoint. It is taken on state changes only
	// (a breaker that would open or closes, a health mark that flips, a
	// membership sync), in breakers' callbacks after the breaker's own
	// mutex; nothing holds it while taking a breaker's.
	mu   sync.Mutex
	size int // instances of the endpoint
	out  int // of those, ejected by their breaker or marked down

	panic atomic.Bool // out > limitLocked()
}

// limitLocked is how many instances may be out: percent of size, rounded
// down.
func (e *ejection) limitLocked() int { return e.size * e.percent / 100 }

// mayEject is asked before s's closed breaker opens: it may if s is out
// already (marked down), is no longer a member of the endpoint, or the
// endpoint has room under the cap. (A half-open breaker whose probe fails
// reopens without asking: it never stopped counting as out.)
func (e *ejection) mayEject(s *State) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if s.member && !s.counted && e.out >= e.limitLocked() {
		return false
	}
	s.ejected = true
	e.recountLocked(s)
	return true
}

// changed recounts s after its breaker closed (restored true) or its
// health mark flipped.
func (e *ejection) changed(s *State, restored bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if restored {
		s.ejected = false
	}
	e.recountLocked(s)
}

// sync makes the states of next the endpoint's members; those of prev that
// are not in next leave it.
func (e *ejection) sync(prev, next map[string]*State) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for id, s := range prev {
		if next[id] != s {
			s.member = false
			e.recountLocked(s)
		}
	}
	for _, s := range next {
		s.member = true
		e.recountLocked(s)
	}
	e.size = len(next)
	e.panic.Store(e.out > e.limitLocked())
}

// recountLocked counts s as out when it is a member that is ejected or
// marked down, and updates the panic decision.
func (e *ejection) recountLocked(s *State) {
	want := s.member && (s.ejected || s.down.Load())
	switch {
	case want && !s.counted:
		e.out++
	case !want && s.counted:
		e.out--
	}
	s.counted = want
	e.panic.Store(e.out > e.limitLocked())
}
