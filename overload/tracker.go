package overload

import (
	"sync"
	"sync/atomic"
)

// Tracker holds the State of every instance of one endpoint. Requests read it
// without a lock (one atomic load of an immutable map); Sync rebuilds the map
// under a mutex when the fleet changes, carrying over the State of instances
// that stay so their in-flight counts and breakers survive snapshots. Its
// states share the endpoint's ejection cap (BreakerOptions.MaxEjectionPercent).
type Tracker struct {
	settings BreakerOptions
	ej       *ejection // the endpoint's ejection cap, shared by its states

	mu     sync.Mutex                        // serializes Sync
	states atomic.Pointer[map[string]*State] // immutable once published
}

// NewTracker returns an empty tracker whose instances get breakers with the
// given settings.
func NewTracker(s BreakerOptions) *Tracker {
	s = s.withDefaults()
	t := &Tracker{settings: s, ej: &ejection{percent: s.MaxEjectionPercent}}
	m := map[string]*State{}
	t.states.Store(&m)
	return t
}

// Sync publishes a new map holding exactly the given instance ids: existing
// states are kept, new ids get a fresh State, absent ids are dropped (their
// in-flight requests still release into the dropped State, harmlessly). It
// returns the published map, which callers must not modify.
func (t *Tracker) Sync(ids []string) map[string]*State {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := *t.states.Load()
	m := make(map[string]*State, len(ids))
	for _, id := range ids {
		if st, ok := old[id]; ok {
			m[id] = st
		} else {
			m[id] = newState(id, t.settings, t.ej)
		}
	}
	t.ej.sync(old, m)
	t.states.Store(&m)
	return m
}

// Get returns the state of the instance, or nil.
func (t *Tracker) Get(id string) *State { return (*t.states.Load())[id] }
