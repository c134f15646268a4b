package replica_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/localfleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/membership"
	"github.com/prefixrouter/prefixrouter/replica"
	"github.com/prefixrouter/prefixrouter/router"
)

// The vanish guard (serve --vanish-grace, on by default): the evidence
// behind the default, and that scale-downs still move traffic.

// vanishFleet starts etcd (1 s leases) and one replica with the given
// grace, fast health checks (three failures take 60 ms) and the watcher's
// clock (nil: the real one), as serve runs them.
func vanishFleet(t *testing.T, grace time.Duration, backend func(string) http.Handler, clock clockwork.Clock) (*localfleet.Fleet, *replica.Replica) {
	t.Helper()
	ctx := testsupport.Context(t, 30*time.Second)
	f, err := localfleet.Start(ctx, localfleet.Options{Endpoint: "chat", FastEtcd: true, TTL: time.Second, Backend: backend, DrainTimeout: 5 * time.Second,
		Replica: replica.Options{VanishGrace: grace, Clock: clock, Router: router.Options{HealthCheckInterval: 20 * time.Millisecond, HealthCheckTimeout: 50 * time.Millisecond}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	rep, err := f.AddReplica(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return f, rep
}

// addInstances adds n instances (servers and agents) to f and returns every
// instance once the fleet's replicas see them all.
func addInstances(t *testing.T, f *localfleet.Fleet, n int) []*localfleet.Instance {
	t.Helper()
	for range n {
		if _, err := f.AddInstance(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.WaitFor(t.Context(), f.HasInstances(f.IDs()...)); err != nil {
		t.Fatal(err)
	}
	return f.Instances()
}

// keysGone waits until etcd holds no instance key of the endpoint and the
// replica's snapshot has caught up with the deletions.
func keysGone(t *testing.T, f *localfleet.Fleet, rep *replica.Replica) {
	t.Helper()
	var rev int64
	testsupport.Eventually(t, 10*time.Second, "instance leases expired", func() bool {
		resp, err := f.Client().Get(t.Context(), membership.Layout{}.InstancesPrefix("chat"), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		rev = resp.Header.Revision
		return resp.Count == 0
	})
	testsupport.Eventually(t, 10*time.Second, "replica caught up", func() bool {
		s := rep.Router().Snapshot()
		return s != nil && s.Revision >= rev
	})
}

// send posts n requests with distinct keys and returns how many failed and
// which instances answered.
func send(t *testing.T, rep *replica.Replica, n int, tag string) (failed int, by map[string]int) {
	t.Helper()
	by = map[string]int{}
	for i := range n {
		resp, err := http.Post(rep.URL()+"/invocations", "application/json", strings.NewReader(fmt.Sprintf("%s prompt %d %s", tag, i, strings.Repeat("x", 64))))
		if err != nil {
			failed++
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			failed++
			continue
		}
		by[resp.Header.Get(router.HeaderInstance)]++
	}
	return failed, by
}

func heldGauge(t *testing.T, rep *replica.Replica) float64 {
	return testsupport.Sum(t, rep.Registry(), "prefixrouter_membership_vanish_guard_held_instances", map[string]string{"endpoint": "chat"})
}

// TestVanishGuardAgentsLoseEtcd is the case the guard exists for: every
// agent loses etcd (a partition, an etcd overload) while the model servers
// are fine, so every lease expires. Without the guard the endpoint empties
// and every request fails; with the default grace every request is served
// by the instance it was routed to before.
func TestVanishGuardAgentsLoseEtcd(t *testing.T) {
	const n = 40
	for _, tc := range []struct {
		name       string
		grace      time.Duration
		wantFailed int
	}{{"guard off", 0, n}, {"default grace", replica.DefaultVanishGrace, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			f, rep := vanishFleet(t, tc.grace, nil, nil)
			ctx := t.Context()
			var ids []string
			for i := range 4 {
				id := fmt.Sprintf("i-%d", i)
				srv := httptest.NewServer(localfleet.Stub(id))
				t.Cleanup(srv.Close)
				if _, err := f.Register(ctx, fleet.Instance{ID: id, Addr: srv.URL}, 0); err != nil {
					t.Fatal(err)
				}
				ids = append(ids, id)
			}
			if err := f.WaitFor(ctx, f.HasInstances(ids...)); err != nil {
				t.Fatal(err)
			}
			if failed, _ := send(t, rep, n, "before"); failed != 0 {
				t.Fatalf("%d of %d failed before the partition", failed, n)
			}
			// The agents lose etcd: their clients go, the servers stay.
			for _, in := range f.Instances() {
				f.CrashInstance(in)
			}
			keysGone(t, f, rep)
			failed, by := send(t, rep, n, "after")
			t.Logf("%s: %d of %d requests failed once every lease expired; served by %v", tc.name, failed, n, by)
			if failed != tc.wantFailed {
				t.Fatalf("%d of %d failed, want %d", failed, n, tc.wantFailed)
			}
			if want := map[bool]float64{true: 4, false: 0}[tc.grace > 0]; heldGauge(t, rep) != want {
				t.Fatalf("held gauge %v, want %v", heldGauge(t, rep), want)
			}
		})
	}
}

// TestVanishGuardMassCrashMovesAfterGrace: three of four model servers
// crash (servers and agents). The guard holds them for its grace, during
// which health checks mark them down (beyond the ejection cap: the
// endpoint panics, and a refused connection is re-sent across the set), so
// no request fails once their leases expired; after the grace they leave the snapshot and every
// key is on the survivor. The leases expire on etcd's clock (1 s, real);
// the grace runs on the watcher's fake clock, which the test moves past it.
func TestVanishGuardMassCrashMovesAfterGrace(t *testing.T) {
	const grace = replica.DefaultVanishGrace
	clock := testsupport.NewFakeClock()
	f, rep := vanishFleet(t, grace, localfleet.Stub, clock)
	ctx := t.Context()
	ins := addInstances(t, f, 4)
	survivor := ins[3].ID
	for _, in := range ins[:3] {
		f.CrashInstance(in)
	}
	keysGone3 := func() bool {
		resp, err := f.Client().Get(ctx, membership.Layout{}.InstancesPrefix("chat"), clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && resp.Count == 1
	}
	testsupport.Eventually(t, 10*time.Second, "crashed leases expired", keysGone3)
	// The watcher sets the gauge just before it publishes the snapshot
	// that holds them: wait for both.
	testsupport.Eventually(t, 10*time.Second, "guard holding three, all four in the router's snapshot", func() bool {
		return heldGauge(t, rep) == 3 && len(rep.Router().Snapshot().Endpoint("chat").Instances) == 4
	})
	// Health checks (20 ms) have marked the dead ones by now.
	testsupport.Eventually(t, 5*time.Second, "crashed instances unhealthy", func() bool {
		for _, in := range ins[:3] {
			if st, ok := rep.Router().Status("chat", in.ID); !ok || st.Healthy {
				return false
			}
		}
		return true
	})
	failed, by := send(t, rep, 40, "held")
	if failed != 0 || by[survivor] != 40 {
		t.Fatalf("while held: %d failed, served by %v; want 0 failed, all on %s", failed, by, survivor)
	}
	// Still held just before the grace ends.
	clock.Advance(grace - time.Second)
	if n := len(rep.Router().Snapshot().Endpoint("chat").Instances); n != 4 || heldGauge(t, rep) != 3 {
		t.Fatalf("%d instances, held gauge %v before the grace ended; want 4 and 3", n, heldGauge(t, rep))
	}
	// After the grace the crashed instances leave (the watcher's progress
	// tick prunes) and the metric says so.
	clock.Advance(time.Second)
	testsupport.Eventually(t, 10*time.Second, "held instances released after the grace", func() bool {
		clock.Advance(100 * time.Millisecond) // the progress ticker's next tick
		return f.HasInstances(survivor)(rep.Router().Snapshot()) && heldGauge(t, rep) == 0
	})
}

// TestVanishGuardIgnoresGracefulScaleDown: a deliberate scale-down of three
// of four instances through their agents (drain, then revoke) is never
// held: draining instances left on purpose, and traffic moves at once.
func TestVanishGuardIgnoresGracefulScaleDown(t *testing.T) {
	f, rep := vanishFleet(t, replica.DefaultVanishGrace, localfleet.Stub, nil)
	ctx := t.Context()
	ins := addInstances(t, f, 4)
	done := make(chan struct{})
	for _, in := range ins[:3] {
		go func() { f.StopInstance(in); done <- struct{}{} }()
	}
	for range 3 {
		<-done
	}
	if err := f.WaitFor(ctx, f.HasInstances(ins[3].ID)); err != nil {
		t.Fatal(err)
	}
	if g := heldGauge(t, rep); g != 0 {
		t.Fatalf("held gauge %v after a graceful scale-down, want 0", g)
	}
	if failed, by := send(t, rep, 20, "scaled"); failed != 0 || by[ins[3].ID] != 20 {
		t.Fatalf("after the scale-down: %d failed, served by %v", failed, by)
	}
}
