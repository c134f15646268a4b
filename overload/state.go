// Package overload tracks each instance's load and health: atomic in-flight
// counts, the per-replica share of the concurrency threshold, and one circuit
// breaker per instance.
package overload

import (
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"
)

// Done reports the outcome of an admitted request and releases its in-flight
// slot. The proxy calls it exactly once when the response (or the stream)
// has ended; later calls are ignored. Pass nil for success,
// UpstreamStatus(code) for an upstream status, the transport error otherwise,
// or an error wrapping context.Canceled / ErrClientGone when the client went
// away.
type Done func(err error)

// State is one instance's load and breaker. All methods are safe for
// concurrent use and lock-free except where gobreaker takes its own
// per-instance mutex (Allow and its done callback, a few nanoseconds).
type State struct {
	id      string
	breaker *gobreaker.TwoStepCircuitBreaker[struct{}]

	inFlight atomic.Int64
	// external is the instance's load from other sources (other router
	// replicas, direct clients), as estimated by load polls (probe.Load);
	// -1 means unknown, in which case admission holds this replica to
	// its share of the threshold alone.
	external atomic.Int64
	// brState mirrors the breaker's state and openUntil the time (unix ns)
	// at which an open breaker half-opens, so that Open needs no lock.
	// openUntil is read from time.Now, not an injected clock, because it
	// must agree with gobreaker, which reads time.Now itself; tests move
	// both through the open timeout inside a testing/synctest bubble.
	brState   atomic.Int32
	openUntil atomic.Int64
	timeout   time.Duration
	// down is set by active health checks (probe.Health) after enough
	// consecutive failed probes; healthFails counts them. The zero value is
	// healthy, so instances that are never probed are never marked down.
	down        atomic.Bool
	healthFails atomic.Int32
}

// NewState returns the state of a fresh instance with a closed breaker.
func NewState(id string, s BreakerOptions) *State {
	s = s.withDefaults()
	st := &State{id: id, timeout: s.OpenTimeout}
	st.external.Store(-1)
	st.breaker = newBreaker(id, s, st.onBreakerChange)
	return st
}

func (s *State) onBreakerChange(_, to gobreaker.State) {
	if to == gobreaker.StateOpen {
		s.openUntil.Store(time.Now().Add(s.timeout).UnixNano())
	}
	s.brState.Store(int32(to))
}

// ID returns the instance id.
func (s *State) ID() string { return s.id }

// InFlight returns the number of requests this replica has in flight on the
// instance.
func (s *State) InFlight() int64 { return s.inFlight.Load() }

// ExternalLoad returns the load from other sources last set by
// SetExternalLoad, or -1 if unknown.
func (s *State) ExternalLoad() int64 { return s.external.Load() }

// SetExternalLoad records the instance's load from other sources (requests
// this replica did not send); a negative n means unknown, which leaves
// admission to this replica's share of the threshold alone.
func (s *State) SetExternalLoad(n int64) {
	if n < 0 {
		n = -1
	}
	s.external.Store(n)
}

// Load is what least-loaded choices compare: own in-flight plus the known
// external load.
func (s *State) Load() int64 {
	n := s.inFlight.Load()
	if e := s.external.Load(); e > 0 {
		n += e
	}
	return n
}

// Open reports whether the breaker is open and still within its timeout, so
// that pickers can skip the instance without taking the breaker's lock. A
// breaker whose timeout has passed reports false: the next Allow half-opens it.
func (s *State) Open() bool {
	return gobreaker.State(s.brState.Load()) == gobreaker.StateOpen && time.Now().UnixNano() < s.openUntil.Load()
}

// Healthy reports whether active health checks consider the instance up
// (always true when it is not probed).
func (s *State) Healthy() bool { return !s.down.Load() }

// ObserveProbe records the outcome of one health probe: the instance is
// marked down after threshold consecutive failures (threshold < 1 means 1)
// and up after one success. It reports whether Healthy changed. Probes of one
// instance are expected to be serialized (one checker).
func (s *State) ObserveProbe(ok bool, threshold int) (changed bool) {
	if ok {
		s.healthFails.Store(0)
		return s.down.Swap(false)
	}
	if int(s.healthFails.Add(1)) < max(threshold, 1) {
		return false
	}
	return !s.down.Swap(true)
}

// ReplicaShare returns a replica's share of a per-instance threshold t when r
// router replicas route independently: max(1, ceil(t/r)). Each replica only
// sees its own in-flight requests, so the fleet-wide load an instance can
// reach before every replica spills is r*ceil(t/r) ≤ t+r−1: at most r−1 above
// the configured threshold, and exactly t when r divides t.
func ReplicaShare(t, r int) int {
	if r < 1 {
		r = 1
	}
	if t < 1 {
		return 1
	}
	return max(1, (t+r-1)/r)
}

// hasRoom reports whether an instance with n requests in flight from this
// replica (this one included) stays within the limit: n within the share,
// and, when the instance told its fleet-wide load (a load poll), that load
// within the whole threshold. The share still applies then: a scrape is up
// to one poll interval old, and every replica compares with the same stale
// figure, so a burst between two scrapes is held to the shares' sum.
func (s *State) hasRoom(n int64, l Limit) bool {
	if n > int64(max(l.Share, 1)) {
		return false
	}
	e := s.external.Load()
	return e < 0 || n+e <= int64(l.Threshold)
}

// HasRoom reports whether one more request would stay within the limit. It
// does not reserve anything; use TryAcquire to admit.
func (s *State) HasRoom(l Limit) bool {
	return !s.Open() && s.hasRoom(s.inFlight.Load()+1, l)
}

// TryAcquire admits one request if the instance has room under the limit
// and its breaker lets it through, reserving the in-flight slot at once so
// that concurrent picks cannot overshoot. ok is false if it was not admitted.
func (s *State) TryAcquire(l Limit) (done Done, ok bool) {
	return s.TryAcquireBounded(l, 0)
}

// TryAcquireBounded is TryAcquire with a second, balance bound (consistent
// hashing with bounded loads): the instance's load before this request, own
// in-flight plus the known external load as in Load, must also be below
// bound. bound ≤ 0 means no balance bound. The slot is reserved before the
// checks, so concurrent picks cannot both take the instance's last place
// under either bound; the bound itself is computed by the caller from a
// racy sum and is therefore soft.
func (s *State) TryAcquireBounded(l Limit, bound int64) (done Done, ok bool) {
	if s.Open() {
		return nil, false
	}
	n := s.inFlight.Add(1)
	if !s.hasRoom(n, l) || (bound > 0 && n-1+max(s.external.Load(), 0) >= bound) {
		s.inFlight.Add(-1)
		return nil, false
	}
	return s.allow()
}

// Acquire admits one request regardless of the threshold, if the breaker lets
// it through (fallback and the non-prefix strategies).
func (s *State) Acquire() (done Done, ok bool) {
	if s.Open() {
		return nil, false
	}
	s.inFlight.Add(1)
	return s.allow()
}

// allow asks the breaker, with the in-flight slot already reserved.
func (s *State) allow() (Done, bool) {
	bdone, err := s.breaker.Allow()
	if err != nil {
		s.inFlight.Add(-1)
		return nil, false
	}
	t := &ticket{s: s, bdone: bdone}
	return t.finish, true
}

type ticket struct {
	s     *State
	bdone func(error)
	over  atomic.Bool
}

func (t *ticket) finish(err error) {
	if t.over.Swap(true) {
		return
	}
	t.s.inFlight.Add(-1)
	t.bdone(err)
}
