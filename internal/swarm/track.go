package swarm

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/prefixrouter/prefixrouter/fleet"
)

// tracker times one event at a time: when each replica first publishes a
// snapshot in which the event's condition holds. Its observers run on the
// watchers' goroutines; the mutex is the harness's, not the router's.
type tracker struct {
	replicas int

	mu  sync.Mutex // guards cur and the fields of the events it points to
	cur *event
}

// event is one change being timed.
type event struct {
	id    string
	cond  func(*fleet.Endpoint) bool
	start time.Time
	call  time.Duration   // how long the registration call took (join, leave); set by the harness goroutine
	seen  []time.Duration // per replica, -1 until its snapshot satisfied cond
	left  int
	done  chan struct{} // closed when every replica has seen it
}

func newTracker(replicas int) *tracker { return &tracker{replicas: replicas} }

// begin starts timing an event now; cond says whether a snapshot's
// endpoint shows it.
func (t *tracker) begin(id string, cond func(*fleet.Endpoint) bool) *event {
	ev := &event{id: id, cond: cond, start: time.Now(), seen: make([]time.Duration, t.replicas), left: t.replicas, done: make(chan struct{})}
	for i := range ev.seen {
		ev.seen[i] = -1
	}
	t.mu.Lock()
	t.cur = ev
	t.mu.Unlock()
	return ev
}

// observer is replica i's snapshot callback.
func (t *tracker) observer(i int) func(*fleet.Snapshot) {
	return func(s *fleet.Snapshot) {
		now := time.Now()
		t.mu.Lock()
		defer t.mu.Unlock()
		ev := t.cur
		if ev == nil || ev.seen[i] >= 0 || !ev.cond(s.Endpoint(endpoint)) {
			return
		}
		ev.seen[i] = now.Sub(ev.start)
		if ev.left--; ev.left == 0 {
			close(ev.done)
		}
	}
}

// wait waits until every replica has seen ev, at most d.
func (t *tracker) wait(ctx context.Context, ev *event, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ev.done:
		return nil
	case <-timer.C:
		return fmt.Errorf("swarm: %s not seen by %d replicas after %v", ev.id, t.pending(ev), d)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// waitLeft waits until at most left replicas have not seen ev, at most d
// (StartWave: the replicas not started yet cannot see it).
func (t *tracker) waitLeft(ctx context.Context, ev *event, left int, d time.Duration) error {
	if left == 0 {
		return t.wait(ctx, ev, d)
	}
	deadline := time.Now().Add(d)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for t.pending(ev) > left {
		if time.Now().After(deadline) {
			return fmt.Errorf("swarm: %s not seen by %d replicas after %v", ev.id, t.pending(ev)-left, d)
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (t *tracker) pending(ev *event) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return ev.left
}

// times returns the replicas' delays, seen ones only, sorted.
func (t *tracker) times(ev *event) []time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []time.Duration
	for _, d := range ev.seen {
		if d >= 0 {
			out = append(out, d)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// present holds once id is listed, absent once it is not.
func present(id string) func(*fleet.Endpoint) bool {
	return func(ep *fleet.Endpoint) bool { return listed(ep, id) }
}

func absent(id string) func(*fleet.Endpoint) bool {
	return func(ep *fleet.Endpoint) bool { return !listed(ep, id) }
}

// listed reports whether ep lists id (instances are sorted by id).
func listed(ep *fleet.Endpoint, id string) bool {
	if ep == nil {
		return false
	}
	i := sort.Search(len(ep.Instances), func(i int) bool { return ep.Instances[i].ID >= id })
	return i < len(ep.Instances) && ep.Instances[i].ID == id
}
