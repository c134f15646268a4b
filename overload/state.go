// Package overload tracks each instance's load and health: atomic in-flight
// counts, the per-replica share of the concurrency threshold, and one circuit
// breaker per instance.
package overload

import (
	"errors"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/prefixrouter/prefixrouter/engine"
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
// per-instance mutex (Allow and its done callback, a few nanoseconds), and
// on the rare outcomes that change state: a server error to judge
// (serverErrors' mutex), a breaker that would open or closes and a health
// mark that flips (the endpoint's ejection mutex).
type State struct {
	id      string
	breaker *gobreaker.TwoStepCircuitBreaker[struct{}]

	inFlight atomic.Int64
	// sent counts the requests admitted (Sent).
	sent atomic.Uint64
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

	// opts are the breaker's settings, defaults applied (ServerErrorKeys
	// and ServerErrorWindow are read by judge).
	opts BreakerOptions
	// serverErrorMeans is the engine profile's word on a 500 from this
	// instance (SetServerErrors, an engine.Server500); engine.Unclear500
	// (unknown engines) leaves server errors to serverErrors.
	serverErrorMeans atomic.Int32
	serverErrors     serverErrorKeys

	// ej is the ejection cap of the instance's endpoint; nil for a State
	// made by NewState, which has none. ejected (its breaker opened and
	// has not closed since), counted (it counts in ej.out) and member (it
	// is in the endpoint's current map) are guarded by ej.mu.
	ej      *ejection
	ejected bool
	counted bool
	member  bool
}

// NewState returns the state of a fresh instance with a closed breaker, on
// its own: no ejection cap applies (Tracker's states share their
// endpoint's).
func NewState(id string, s BreakerOptions) *State { return newState(id, s, nil) }

func newState(id string, s BreakerOptions, ej *ejection) *State {
	s = s.withDefaults()
	st := &State{id: id, timeout: s.OpenTimeout, opts: s, ej: ej}
	st.external.Store(-1)
	st.breaker = newBreaker(id, s, st.mayTrip, st.onBreakerChange)
	return st
}

// mayTrip is the ejection cap's word before the breaker opens.
func (s *State) mayTrip() bool { return s.ej == nil || s.ej.mayEject(s) }

func (s *State) onBreakerChange(from, to gobreaker.State) {
	if to == gobreaker.StateOpen {
		s.openUntil.Store(time.Now().Add(s.timeout).UnixNano())
	}
	s.brState.Store(int32(to))
	if to == gobreaker.StateClosed && s.ej != nil {
		s.ej.changed(s, true)
	}
}

// SetServerErrors records what the instance's engine profile says an HTTP
// 500 (or another unnamed 5xx) from it proves (see the rule in
// outcome.go): engine.Fault500, each counts; engine.Client500, none does;
// engine.Unclear500, until it is called too (an engine of no known profile
// can neither prove a fault with a 500 nor be trusted never to fail with
// one), a 500 counts once 500s repeat across ServerErrorKeys routing keys
// within ServerErrorWindow.
func (s *State) SetServerErrors(v engine.Server500) { s.serverErrorMeans.Store(int32(v)) }

// judge turns an outcome into what the breaker records: nil for a
// success, errUnjudged to ignore it, the failure itself otherwise.
func (s *State) judge(err error) error {
	switch Classify(err) {
	case Served:
		return nil
	case Unjudged:
		return errUnjudged
	case ServerError:
		switch engine.Server500(s.serverErrorMeans.Load()) {
		case engine.Fault500:
			return err
		case engine.Client500:
			return errUnjudged
		}
		var se *StatusError
		errors.As(err, &se)
		if s.serverErrors.repeated(se.Key, time.Now(), s.opts.ServerErrorKeys, s.opts.ServerErrorWindow) {
			return err
		}
		return errUnjudged
	}
	return err
}

// ID returns the instance id.
func (s *State) ID() string { return s.id }

// Sent returns the number of requests admitted to the instance so far: a
// router replica publishes where its requests went from its deltas
// (issue 21's served shares).
func (s *State) Sent() uint64 { return s.sent.Load() }

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

// Open reports whether the breaker is open and still within its timeout,
// without taking the breaker's lock. A breaker whose timeout has passed
// reports false: the next Allow half-opens it.
func (s *State) Open() bool {
	return gobreaker.State(s.brState.Load()) == gobreaker.StateOpen && time.Now().UnixNano() < s.openUntil.Load()
}

// Healthy reports whether active health checks consider the instance up
// (always true when it is not probed).
func (s *State) Healthy() bool { return !s.down.Load() }

// Panicking reports whether the instance's endpoint has more instances out
// of rotation (open breakers, health marks) than its ejection cap allows:
// picks then ignore both, as Envoy routes to every host below its healthy
// panic threshold. Decided when an instance's state changes; one atomic
// load here.
func (s *State) Panicking() bool { return s.ej != nil && s.ej.panic.Load() }

// Ejected reports whether picks pass the instance over for its breaker:
// Open, and the endpoint not panicking.
func (s *State) Ejected() bool { return s.Open() && !s.Panicking() }

// MarkedDown reports whether picks pass the instance over for its health:
// marked down by health checks, and the endpoint not panicking.
func (s *State) MarkedDown() bool { return s.down.Load() && !s.Panicking() }

// ObserveProbe records the outcome of one health probe: the instance is
// marked down after threshold consecutive failures (threshold < 1 means 1)
// and up after one success. It reports whether Healthy changed. Probes of one
// instance are expected to be serialized (one checker).
func (s *State) ObserveProbe(ok bool, threshold int) (changed bool) {
	if ok {
		s.healthFails.Store(0)
		changed = s.down.Swap(false)
	} else if int(s.healthFails.Add(1)) >= max(threshold, 1) {
		changed = !s.down.Swap(true)
	}
	if changed && s.ej != nil {
		s.ej.changed(s, false)
	}
	return changed
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
	return !s.Ejected() && s.hasRoom(s.inFlight.Load()+1, l)
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
	if s.Ejected() {
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
	if s.Ejected() {
		return nil, false
	}
	s.inFlight.Add(1)
	return s.allow()
}

// allow asks the breaker, with the in-flight slot already reserved. While
// the endpoint panics, a breaker that refuses is passed: the request goes
// through without it, and its outcome is not recorded.
func (s *State) allow() (Done, bool) {
	bdone, err := s.breaker.Allow()
	if err != nil {
		if !s.Panicking() {
			s.inFlight.Add(-1)
			return nil, false
		}
		bdone = nil
	}
	s.sent.Add(1)
	t := &ticket{s: s, bdone: bdone}
	return t.finish, true
}

type ticket struct {
	s     *State
	bdone func(error) // nil when admitted past the breaker (panic)
	over  atomic.Bool
}

func (t *ticket) finish(err error) {
	if t.over.Swap(true) {
		return
	}
	// The breaker first: once the slot is released, the outcome is in.
	if t.bdone != nil {
		t.bdone(t.s.judge(err))
	}
	t.s.inFlight.Add(-1)
}
