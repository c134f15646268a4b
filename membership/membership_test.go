package membership

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
)

// startEtcd is etcdtest.Start (which this package cannot import).
func startEtcd(t *testing.T) *Embedded {
	t.Helper()
	e, err := StartEmbedded(t.TempDir(), "http://127.0.0.1:0", WithFastTicks())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func newClient(t *testing.T, endpoints ...string) *clientv3.Client {
	t.Helper()
	cli, err := NewClient(ClientOptions{Endpoints: endpoints})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// recorder keeps every published snapshot.
type recorder struct {
	mu    sync.Mutex
	snaps []*fleet.Snapshot
}

func (r *recorder) add(s *fleet.Snapshot) {
	r.mu.Lock()
	r.snaps = append(r.snaps, s)
	r.mu.Unlock()
}

func (r *recorder) all() []*fleet.Snapshot {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*fleet.Snapshot(nil), r.snaps...)
}

func startWatcher(t *testing.T, cli *clientv3.Client, m *Metrics, rec *recorder) *Watcher {
	t.Helper()
	return startWatcherWith(t, cli, WatcherOptions{Options: Options{Logger: quiet, Metrics: m}, ProgressInterval: 50 * time.Millisecond}, rec)
}

// startWatcherWith starts a watcher with opts and waits for its first sync.
func startWatcherWith(t *testing.T, cli *clientv3.Client, opts WatcherOptions, rec *recorder) *Watcher {
	t.Helper()
	var fn func(*fleet.Snapshot)
	if rec != nil {
		fn = rec.add
	}
	w := StartWatcher(cli, opts, fn)
	t.Cleanup(func() { w.Close() })
	select {
	case <-w.Synced():
	case <-time.After(10 * time.Second):
		t.Fatal("watcher never synced")
	}
	return w
}

// watched starts etcd, a client and a watcher with fresh metrics: the
// setup of the tests that write records and read them back in snapshots.
func watched(t *testing.T) (*clientv3.Client, context.Context, *Metrics, *Watcher) {
	t.Helper()
	e := startEtcd(t)
	cli := newClient(t, e.ClientURL())
	m := NewMetrics(nil)
	return cli, testsupport.Context(t, 20*time.Second), m, startWatcher(t, cli, m, nil)
}

func has(w *Watcher, ep, id string) func() bool {
	return func() bool { _, ok := instanceOf(w.Snapshot(), ep, id); return ok }
}

func TestRegistrationLifecycle(t *testing.T) {
	e := startEtcd(t)
	cli := newClient(t, e.ClientURL())
	ctx := testsupport.Context(t, 20*time.Second)
	w := startWatcher(t, cli, nil, nil)

	reg, err := RegisterInstance(ctx, cli, "ep1", fleet.Instance{ID: "i-1", Addr: "http://127.0.0.1:9", Adapters: []string{"a"}}, Options{TTL: 2 * time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	took := testsupport.Eventually(t, time.Second, "registered instance visible", has(w, "ep1", "i-1"))
	t.Logf("register visible after %v", took)

	if err := reg.SetAdapters(ctx, []string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, time.Second, "adapter b visible", func() bool {
		in, _ := instanceOf(w.Snapshot(), "ep1", "i-1")
		return in.HasAdapter("b")
	})
	if err := reg.SetDraining(ctx, true); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, time.Second, "draining visible", func() bool {
		in, _ := instanceOf(w.Snapshot(), "ep1", "i-1")
		return in.Draining
	})
	in, _ := instanceOf(w.Snapshot(), "ep1", "i-1")
	if !in.HasAdapter("a") || in.RegisteredAt.IsZero() || in.Addr != "http://127.0.0.1:9" {
		t.Fatalf("record lost fields on update: %+v", in)
	}
	if err := reg.Update(ctx, func(in *fleet.Instance) { in.ID = "other" }); err == nil {
		t.Fatal("changing the id was accepted")
	}

	if err := reg.Close(ctx); err != nil {
		t.Fatal(err)
	}
	took = testsupport.Eventually(t, time.Second, "closed instance gone", func() bool { return !has(w, "ep1", "i-1")() })
	t.Logf("revoke visible after %v", took)
	if w.Snapshot().Endpoint("ep1") != nil {
		t.Fatal("endpoint without instances or config still in the snapshot")
	}
	if err := reg.SetDraining(ctx, false); !errors.Is(err, ErrClosed) {
		t.Fatalf("update after close: %v, want ErrClosed", err)
	}
}

func TestCrashedInstanceExpires(t *testing.T) {
	e := startEtcd(t)
	cli := newClient(t, e.ClientURL())
	ctx := testsupport.Context(t, 20*time.Second)
	w := startWatcher(t, cli, nil, nil)

	// The instance has its own client: closing it stops the keepalive
	// without revoking, as a crash would.
	icli := newClient(t, e.ClientURL())
	const ttl = time.Second
	reg, err := RegisterInstance(ctx, icli, "ep1", fleet.Instance{ID: "crash", Addr: "http://127.0.0.1:9"}, Options{TTL: ttl, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, time.Second, "instance visible", has(w, "ep1", "crash"))
	icli.Close()
	took := testsupport.Eventually(t, ttl+time.Second, "crashed instance expired", func() bool { return !has(w, "ep1", "crash")() })
	t.Logf("crash (TTL %v) detected after %v", ttl, took)
	start := time.Now()
	err = reg.Close(ctx) // the revoke fails on the closed client; it must still stop
	t.Logf("close after crash took %v: %v", time.Since(start), err)
}

func TestExternallyRevokedLeaseIsRestored(t *testing.T) {
	e := startEtcd(t)
	cli := newClient(t, e.ClientURL())
	ctx := testsupport.Context(t, 20*time.Second)
	m := NewMetrics(nil)
	const ttl = 2 * time.Second
	reg, err := RegisterInstance(ctx, newClient(t, e.ClientURL()), "ep1", fleet.Instance{ID: "i-1", Addr: "http://127.0.0.1:9"}, Options{TTL: ttl, Logger: quiet, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close(ctx)
	old := reg.LeaseID()
	if _, err := cli.Revoke(ctx, old); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	took := testsupport.Eventually(t, ttl, "record back under a new lease", func() bool {
		resp, err := cli.Get(ctx, reg.Key())
		return err == nil && len(resp.Kvs) == 1 && resp.Kvs[0].Lease != int64(old)
	})
	t.Logf("re-registered %v after the revoke", time.Since(revoked))
	_ = took
	if got := testsupport.Value(t, m.regrants); got < 1 {
		t.Fatalf("lease_regrants_total = %v, want >= 1", got)
	}
}

func TestReplicaCount(t *testing.T) {
	e := startEtcd(t)
	cli := newClient(t, e.ClientURL())
	ctx := testsupport.Context(t, 20*time.Second)
	w := startWatcher(t, cli, nil, nil)
	if got := w.Snapshot().Replicas; got != 1 {
		t.Fatalf("replicas with none registered = %d, want 1", got)
	}
	var regs []*Registration
	for i := range 3 {
		r, err := RegisterRouter(ctx, cli, fmt.Sprintf("r%d", i), RouterInfo{Addr: "http://127.0.0.1:8080", Version: "test"}, Options{TTL: 2 * time.Second, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		regs = append(regs, r)
	}
	testsupport.Eventually(t, time.Second, "3 replicas", func() bool { return w.Snapshot().Replicas == 3 })
	if err := regs[0].Close(ctx); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, time.Second, "2 replicas", func() bool { return w.Snapshot().Replicas == 2 })
	for _, r := range regs[1:] {
		r.Close(ctx)
	}
	testsupport.Eventually(t, time.Second, "back to 1", func() bool { return w.Snapshot().Replicas == 1 })
	resp, err := cli.Get(ctx, Layout{}.RouterKey("r1"))
	if err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("router key after close: %v %v", resp, err)
	}
}

func TestRoutingConfig(t *testing.T) {
	e := startEtcd(t)
	cli := newClient(t, e.ClientURL())
	ctx := testsupport.Context(t, 20*time.Second)
	m := NewMetrics(nil)
	w := startWatcher(t, cli, m, nil)
	l := Layout{}

	// Invalid configs are refused and not written.
	bad := fleet.RoutingConfig{RoutingStrategy: fleet.PrefixAware, PrefixAwareRoutingConfig: &fleet.PrefixAwareConfig{PrefixLength: 10}}
	if err := PutConfig(ctx, cli, l, "ep1", bad); !errors.Is(err, fleet.ErrInvalidConfig) {
		t.Fatalf("PutConfig(invalid) = %v, want ErrInvalidConfig", err)
	}
	c, set, err := GetConfig(ctx, cli, l, "ep1")
	if err != nil || set || c.RoutingStrategy != fleet.PrefixAware || resolved(c).PrefixLength != fleet.DefaultAdaptivePrefixLength {
		t.Fatalf("GetConfig of unset = %+v %v %v", c, set, err)
	}

	// A valid config reaches the snapshot; the endpoint exists without instances.
	good := fleet.RoutingConfig{RoutingStrategy: fleet.LeastOutstanding}
	if err := PutConfig(ctx, cli, l, "ep1", good); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, time.Second, "config in snapshot", func() bool {
		ep := w.Snapshot().Endpoint("ep1")
		return ep != nil && ep.Config.RoutingStrategy == fleet.LeastOutstanding
	})
	c, set, err = GetConfig(ctx, cli, l, "ep1")
	if err != nil || !set || c.RoutingStrategy != fleet.LeastOutstanding || resolved(c).ConcurrencyThreshold != fleet.DefaultConcurrencyThreshold {
		t.Fatalf("GetConfig = %+v %v %v", c, set, err)
	}

	// Bad values written behind our back are ignored: the previous config stays.
	for i, raw := range []string{`{not json`, `{"RoutingStrategy":"ROUND_ROBIN"}`, `{"RoutingStrategy":"PREFIX_AWARE","PrefixAwareRoutingConfig":{"ConcurrencyThreshold":99999}}`} {
		before := testsupport.Value(t, m.invalid.WithLabelValues("config"))
		if _, err := cli.Put(ctx, l.ConfigKey("ep1"), raw); err != nil {
			t.Fatal(err)
		}
		// A marker written after the bad value tells when the watcher has
		// applied it.
		marker := fmt.Sprintf("m%d", i)
		if _, err := cli.Put(ctx, l.InstanceKey("ep1", marker), fmt.Sprintf(`{"id":%q,"addr":"http://127.0.0.1:9"}`, marker)); err != nil {
			t.Fatal(err)
		}
		testsupport.Eventually(t, time.Second, "marker visible", has(w, "ep1", marker))
		if got := w.Snapshot().Endpoint("ep1").Config.RoutingStrategy; got != fleet.LeastOutstanding {
			t.Fatalf("%s: strategy = %s, want the previous LEAST_OUTSTANDING_REQUESTS", raw, got)
		}
		if after := testsupport.Value(t, m.invalid.WithLabelValues("config")); after != before+1 {
			t.Fatalf("%s: invalid config counter %v → %v", raw, before, after)
		}
		if _, _, err := GetConfig(ctx, cli, l, "ep1"); !errors.Is(err, fleet.ErrInvalidConfig) {
			t.Fatalf("GetConfig of a bad stored value = %v", err)
		}
	}

	// A valid change after bad ones applies.
	if err := PutConfig(ctx, cli, l, "ep1", fleet.RoutingConfig{RoutingStrategy: fleet.PrefixAware, PrefixAwareRoutingConfig: &fleet.PrefixAwareConfig{PrefixLength: 2048, ConcurrencyThreshold: 3}}); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, time.Second, "new config", func() bool {
		c := w.Snapshot().Endpoint("ep1").Config
		return c.RoutingStrategy == fleet.PrefixAware && resolved(c).PrefixLength == 2048 && resolved(c).ConcurrencyThreshold == 3
	})
}

func TestInvalidInstanceRecordsSkipped(t *testing.T) {
	e := startEtcd(t)
	cli := newClient(t, e.ClientURL())
	ctx := testsupport.Context(t, 20*time.Second)
	m := NewMetrics(nil)
	w := startWatcher(t, cli, m, nil)
	l := Layout{}
	records := map[string]string{
		"garbage":  `{"id":`,
		"noaddr":   `{"id":"noaddr"}`,
		"wrongid":  `{"id":"other","addr":"http://x"}`,
		"negative": `{"id":"negative","addr":"http://x","weight":-1}`,
	}
	for id, raw := range records {
		if _, err := cli.Put(ctx, l.InstanceKey("ep1", id), raw); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cli.Put(ctx, l.InstanceKey("ep1", "good"), `{"addr":"http://127.0.0.1:9"}`); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, time.Second, "good instance (id taken from the key)", has(w, "ep1", "good"))
	if n := len(w.Snapshot().Endpoint("ep1").Instances); n != 1 {
		t.Fatalf("instances = %d, want only the valid one", n)
	}
	if got := testsupport.Value(t, m.invalid.WithLabelValues("instance")); got != float64(len(records)) {
		t.Fatalf("invalid instance counter = %v, want %d", got, len(records))
	}
	// A valid record that turns invalid leaves the fleet.
	if _, err := cli.Put(ctx, l.InstanceKey("ep1", "good"), `{"id":"good"}`); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, time.Second, "invalidated instance gone", func() bool { return !has(w, "ep1", "good")() })
}

// TestCompactionRelists cuts the watcher's connection, changes and compacts
// the keyspace past its revision, and reconnects it: the resumed watch fails
// with ErrCompacted, and the watcher must list again and converge.
func TestCompactionRelists(t *testing.T) {
	e := startEtcd(t)
	admin := newClient(t, e.ClientURL())
	ctx := testsupport.Context(t, 20*time.Second)
	p := startProxy(t, e.Clients()[0])
	m := NewMetrics(nil)
	rec := &recorder{}
	w := startWatcher(t, newClient(t, p.url()), m, rec)
	l := Layout{}
	put := func(id string) {
		t.Helper()
		if _, err := admin.Put(ctx, l.InstanceKey("ep1", id), fmt.Sprintf(`{"id":%q,"addr":"http://127.0.0.1:9"}`, id)); err != nil {
			t.Fatal(err)
		}
	}
	put("a")
	if err := PutConfig(ctx, admin, l, "ep1", fleet.RoutingConfig{RoutingStrategy: fleet.Random}); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, time.Second, "a visible", has(w, "ep1", "a"))
	testsupport.Eventually(t, time.Second, "config visible", func() bool { return w.Snapshot().Endpoint("ep1").Config.RoutingStrategy == fleet.Random })
	behind := w.Snapshot().Revision

	p.setBlocked(true)
	put("b")
	if _, err := admin.Delete(ctx, l.InstanceKey("ep1", "a")); err != nil {
		t.Fatal(err)
	}
	// An invalid config during the gap: the relist must keep RANDOM.
	if _, err := admin.Put(ctx, l.ConfigKey("ep1"), `{"RoutingStrategy":"NOPE"}`); err != nil {
		t.Fatal(err)
	}
	resp, err := admin.Put(ctx, l.InstanceKey("ep1", "c"), `{"id":"c","addr":"http://127.0.0.1:9"}`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	if w.Snapshot().Revision != behind {
		t.Fatal("watcher moved while cut off")
	}
	p.setBlocked(false)

	took := testsupport.Eventually(t, 10*time.Second, "converged after compaction", func() bool {
		s := w.Snapshot()
		_, a := instanceOf(s, "ep1", "a")
		_, b := instanceOf(s, "ep1", "b")
		_, c := instanceOf(s, "ep1", "c")
		return !a && b && c
	})
	t.Logf("converged %v after reconnecting", took)
	if got := testsupport.Value(t, m.relists.WithLabelValues("compacted")); got < 1 {
		t.Fatalf("relists{compacted} = %v, want >= 1", got)
	}
	if got := w.Snapshot().Endpoint("ep1").Config.RoutingStrategy; got != fleet.Random {
		t.Fatalf("strategy after relist = %s, want the previous valid RANDOM", got)
	}
}

// TestEtcdDownKeepsLastSnapshot stops etcd (keeping its data), checks that
// the watcher publishes nothing while it is down and that its snapshot ages,
// and that changes made after etcd restarts reach it. The watcher's clock
// is fake: the test ages the snapshot by moving it, not by waiting.
func TestEtcdDownKeepsLastSnapshot(t *testing.T) {
	e := startEtcd(t)
	cli := newClient(t, e.ClientURL())
	ctx := testsupport.Context(t, 20*time.Second)
	m := NewMetrics(nil)
	rec := &recorder{}
	clock := testsupport.NewFakeClock()
	const progress = 50 * time.Millisecond
	w := startWatcherWith(t, cli, WatcherOptions{Options: Options{Logger: quiet, Metrics: m}, ProgressInterval: progress, Clock: clock}, rec)
	l := Layout{}
	reg, err := RegisterInstance(ctx, cli, "ep1", fleet.Instance{ID: "keep", Addr: "http://127.0.0.1:9"}, Options{TTL: 2 * time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close(ctx)
	testsupport.Eventually(t, time.Second, "instance visible", has(w, "ep1", "keep"))
	published := len(rec.all())
	if age := w.SnapshotAge(); age != 0 {
		t.Fatalf("snapshot age %v before the clock moved, want 0", age)
	}

	e.Close()
	down := clock.Now()
	// Each poll moves the clock one progress interval, which also sends a
	// progress request to the stopped etcd; none may count as a sync, so
	// the age grows past 1 s (20 intervals).
	testsupport.Eventually(t, 10*time.Second, "snapshot age grows", func() bool {
		clock.Advance(progress)
		return w.SnapshotAge() > time.Second
	})
	if n := len(rec.all()); n != published {
		t.Fatalf("%d snapshots published while etcd was down", n-published)
	}
	if !has(w, "ep1", "keep")() {
		t.Fatal("instance dropped while etcd was down")
	}
	if lastSync := m.lastSyncNs.Load(); lastSync > down.UnixNano() {
		t.Fatal("last sync advanced while etcd was down")
	}

	e2 := startAgain(t, e)
	other := newClient(t, e2.ClientURL())
	if _, err := other.Put(ctx, l.InstanceKey("ep1", "new"), `{"id":"new","addr":"http://127.0.0.1:9"}`); err != nil {
		t.Fatal(err)
	}
	if err := PutConfig(ctx, other, l, "ep1", fleet.RoutingConfig{RoutingStrategy: fleet.Random}); err != nil {
		t.Fatal(err)
	}
	took := testsupport.Eventually(t, 10*time.Second, "change made after restart visible", func() bool {
		s := w.Snapshot()
		_, n := instanceOf(s, "ep1", "new")
		_, k := instanceOf(s, "ep1", "keep")
		return n && k && s.Endpoint("ep1").Config.RoutingStrategy == fleet.Random
	})
	t.Logf("converged %v after the restart", took)
	// The clock stands still now: the syncs since the restart set the age
	// back to zero.
	testsupport.Eventually(t, 5*time.Second, "age fresh again", func() bool { return w.SnapshotAge() == 0 })
	for i, s := range rec.all() {
		if _, ok := instanceOf(s, "ep1", "keep"); !ok && i >= published-1 {
			t.Fatalf("snapshot %d lost the registered instance", i)
		}
	}
}

func startAgain(t *testing.T, e *Embedded) *Embedded {
	t.Helper()
	n, err := e.Restart()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

func TestWatcherCloseBeforeSync(t *testing.T) {
	// Nothing listens on this port: the watcher keeps retrying the list
	// and must still stop promptly.
	cli := newClient(t, "http://127.0.0.1:1")
	w := StartWatcher(cli, WatcherOptions{Options: Options{Logger: quiet}}, nil)
	done := make(chan struct{})
	go func() { w.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close blocked")
	}
	if w.Snapshot() != nil || w.SnapshotAge() != -1 {
		t.Fatal("snapshot published without etcd")
	}
}

func TestRegisterFailsClearly(t *testing.T) {
	e := startEtcd(t)
	cli := newClient(t, e.ClientURL())
	ctx := testsupport.Context(t, 20*time.Second)
	for _, tc := range []struct {
		name, ep string
		in       fleet.Instance
	}{
		{"no id", "ep", fleet.Instance{Addr: "http://x"}},
		{"slash id", "ep", fleet.Instance{ID: "a/b", Addr: "http://x"}},
		{"no addr", "ep", fleet.Instance{ID: "a"}},
		{"bad endpoint", "e p", fleet.Instance{ID: "a", Addr: "http://x"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if r, err := RegisterInstance(ctx, cli, tc.ep, tc.in, Options{}); err == nil {
				r.Close(ctx)
				t.Fatal("accepted")
			}
		})
	}
	// An unreachable etcd fails within the op timeout instead of hanging.
	dead := newClient(t, "http://127.0.0.1:1")
	sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if _, err := RegisterInstance(sctx, dead, "ep", fleet.Instance{ID: "a", Addr: "http://x"}, Options{TTL: time.Second}); err == nil {
		t.Fatal("registered against nothing")
	}
}

func TestInstanceJSONShape(t *testing.T) {
	// The wire shape of ARCHITECTURE.md's etcd layout v1.
	data, _ := json.Marshal(fleet.Instance{ID: "i", Addr: "http://x", Adapters: []string{"a"}})
	var m map[string]any
	_ = json.Unmarshal(data, &m)
	for _, k := range []string{"id", "addr", "adapters", "draining", "registeredAt"} {
		if _, ok := m[k]; !ok {
			t.Errorf("field %q missing in %s", k, data)
		}
	}
}

// TestDefaultConfigForUnsetEndpoints: an endpoint without a config key gets
// the watcher's DefaultConfig (serve's routing flags); a key, once written,
// wins over it.
func TestDefaultConfigForUnsetEndpoints(t *testing.T) {
	e := startEtcd(t)
	cli := newClient(t, e.Endpoints()...)
	ctx := testsupport.Context(t, 20*time.Second)
	def := fleet.RoutingConfig{RoutingStrategy: fleet.Random, PrefixAwareRoutingConfig: &fleet.PrefixAwareConfig{PrefixLength: 2048, ConcurrencyThreshold: 7}}
	w := StartWatcher(cli, WatcherOptions{DefaultConfig: def}, nil)
	t.Cleanup(func() { w.Close() })
	reg, err := RegisterInstance(ctx, cli, "ep", fleet.Instance{ID: "a", Addr: "http://127.0.0.1:1"}, Options{TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close(context.Background()) })
	testsupport.Eventually(t, 2*time.Second, "the default config on an endpoint with no key", func() bool {
		ep := w.Snapshot().Endpoint("ep")
		return ep != nil && ep.Config.RoutingStrategy == fleet.Random && ep.Resolved.PrefixLength == 2048 && ep.Resolved.ConcurrencyThreshold == 7
	})
	if err := PutConfig(ctx, cli, Layout{}, "ep", fleet.RoutingConfig{RoutingStrategy: fleet.LeastOutstanding}); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, 2*time.Second, "the stored config wins", func() bool {
		ep := w.Snapshot().Endpoint("ep")
		return ep != nil && ep.Config.RoutingStrategy == fleet.LeastOutstanding && ep.Resolved.PrefixLength == fleet.DefaultPrefixLength
	})
}

// TestReplicaRates: the rates replicas publish in their records reach the
// snapshot (-1 for a record without one, or one that does not parse, which
// still counts as a replica), and a change of router records alone keeps
// the endpoints of the last snapshot (the same values), so a router keeps
// its views of them.
func TestReplicaRates(t *testing.T) {
	cli, ctx, m, w := watched(t)
	l := Layout{}
	opts := Options{TTL: 2 * time.Second, Logger: quiet}
	rate := 12.5
	r0, err := RegisterRouter(ctx, cli, "r0", RouterInfo{Addr: "127.0.0.1:8080", Version: "test", Rate: &rate}, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer r0.Close(ctx)
	r1, err := RegisterRouter(ctx, cli, "r1", RouterInfo{Addr: "127.0.0.1:8081", Version: "old"}, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer r1.Close(ctx)
	for id, raw := range map[string]string{"garbage": `{"addr":`, "negative": `{"addr":"x","rate":-3}`, "huge": `{"addr":"x","rate":1e300}`} {
		if _, err := cli.Put(ctx, l.RouterKey(id), raw); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cli.Put(ctx, l.InstanceKey("ep1", "i1"), `{"addr":"http://127.0.0.1:9"}`); err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"r0": 12.5, "r1": -1, "garbage": -1, "negative": -1, "huge": -1}
	testsupport.Eventually(t, 5*time.Second, "every router record", func() bool {
		s := w.Snapshot()
		return s.Replicas == len(want) && s.Endpoint("ep1") != nil && fmt.Sprint(s.ReplicaRates) == fmt.Sprint(want)
	})
	if got := testsupport.Value(t, m.invalid.WithLabelValues("router")); got != 3 {
		t.Fatalf("invalid router records counted %v, want 3", got)
	}
	before := w.Snapshot()
	rate = 40
	data, _ := json.Marshal(RouterInfo{Addr: "127.0.0.1:8080", Version: "test", Rate: &rate})
	if err := r0.Put(ctx, data); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, 5*time.Second, "the new rate", func() bool { return w.Snapshot().ReplicaRates["r0"] == 40 })
	after := w.Snapshot()
	if after.Revision <= before.Revision || after.Endpoint("ep1") != before.Endpoint("ep1") {
		t.Fatalf("a rate change rebuilt the endpoints (revision %d → %d, endpoint %p → %p)", before.Revision, after.Revision, before.Endpoint("ep1"), after.Endpoint("ep1"))
	}
	if before.ReplicaRates["r0"] != 12.5 {
		t.Fatal("the rate change modified the previous snapshot")
	}
	if _, err := cli.Put(ctx, l.InstanceKey("ep1", "i2"), `{"addr":"http://127.0.0.1:9"}`); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, 5*time.Second, "the new instance", has(w, "ep1", "i2"))
	if s := w.Snapshot(); s.ReplicaRates["r0"] != 40 || s.Replicas != len(want) {
		t.Fatalf("a full rebuild lost the replicas: %d %v", s.Replicas, s.ReplicaRates)
	}
}
