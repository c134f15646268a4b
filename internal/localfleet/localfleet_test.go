package localfleet_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/localfleet"
	"github.com/prefixrouter/prefixrouter/internal/sim"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/router"
)

// start starts a fleet with the test's defaults (fast etcd, a fast
// simulator) and closes it when the test ends.
func start(t *testing.T, cfg localfleet.Options) *localfleet.Fleet {
	t.Helper()
	cfg.FastEtcd = true
	cfg.Agent.DrainGrace = 10 * time.Millisecond
	if cfg.Sim.TimeScale == 0 {
		cfg.Sim.TimeScale = 100
	}
	f, err := localfleet.Start(testsupport.Context(t, 30*time.Second), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	return f
}

// invoke sends a TGI-shaped request to base's /invocations and returns the
// status, the instance header and the body.
func invoke(t *testing.T, client *http.Client, base, prompt string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	body := fmt.Sprintf(`{"inputs":%q,"parameters":{"max_new_tokens":2}}`, prompt)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/invocations", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get(router.HeaderInstance), string(b)
}

func newClient(t *testing.T) *http.Client {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// TestStartServesThroughEveryReplica: Start returns with every replica
// counting every instance and replica, and each replica routes a request
// to one of the instances.
func TestStartServesThroughEveryReplica(t *testing.T) {
	f := start(t, localfleet.Options{Instances: 3, Replicas: 2, Routing: fleet.DefaultRoutingConfig()})
	ids := f.IDs()
	if want := []string{"sim-0", "sim-1", "sim-2"}; !slices.Equal(ids, want) {
		t.Fatalf("instances %v, want %v", ids, want)
	}
	if n := len(f.Replicas()); n != 2 || len(f.RouterURLs()) != 2 {
		t.Fatalf("%d replicas, want 2", n)
	}
	client := newClient(t)
	for _, r := range f.Replicas() {
		s := r.Router().Snapshot()
		if s == nil || s.Replicas != 2 || len(s.Endpoint("default").Instances) != 3 {
			t.Fatalf("replica %s snapshot %+v", r.Addr(), s)
		}
		code, inst, body := invoke(t, client, r.URL(), "hello")
		if code != http.StatusOK || !slices.Contains(ids, inst) {
			t.Fatalf("through %s: status %d from %q: %s", r.Addr(), code, inst, body)
		}
	}
}

// TestReplicasAgree: every replica makes the same choice for the same
// request, over enough keys to reach every instance.
func TestReplicasAgree(t *testing.T) {
	f := start(t, localfleet.Options{Instances: 3, Replicas: 3, Routing: fleet.DefaultRoutingConfig()})
	reps := f.Replicas()
	seen := map[string]bool{}
	for i := range 200 {
		var first string
		for j, r := range reps {
			req := httptest.NewRequest(http.MethodPost, "/invocations", strings.NewReader(fmt.Sprintf(`{"inputs":"prompt %d"}`, i)))
			id, err := r.Router().Choose(f.Endpoint(), req)
			if err != nil {
				t.Fatal(err)
			}
			if j == 0 {
				first = id
			} else if id != first {
				t.Fatalf("key %d: replica 0 chose %s, replica %d chose %s", i, first, j, id)
			}
		}
		seen[first] = true
	}
	if len(seen) != 3 {
		t.Fatalf("200 keys reached only %v", seen)
	}
}

// TestInstanceLifecycle adds an instance, stops one gracefully and crashes
// another, and checks that every replica follows. The crash is seen only
// when etcd expires the lease: etcd's own clock, so the test waits in real
// time, with the least TTL the fast test member grants (1 s).
func TestInstanceLifecycle(t *testing.T) {
	const ttl = time.Second
	f := start(t, localfleet.Options{Instances: 2, Replicas: 2, TTL: ttl})
	ctx := testsupport.Context(t, 30*time.Second)
	added, err := f.AddInstance(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if added.ID != "sim-2" || f.Instance("sim-2") != added {
		t.Fatalf("added %s", added.ID)
	}
	if err := f.WaitFor(ctx, f.HasInstances("sim-0", "sim-1", "sim-2")); err != nil {
		t.Fatal(err)
	}

	f.StopInstance(f.Instance("sim-0"))
	if err := f.WaitFor(ctx, f.HasInstances("sim-1", "sim-2")); err != nil {
		t.Fatal(err)
	}
	if f.Instance("sim-0") != nil {
		t.Fatal("stopped instance still listed by the fleet")
	}

	crashed := f.Instance("sim-1")
	began := time.Now()
	f.CrashInstance(crashed)
	if err := f.WaitFor(ctx, f.HasInstances("sim-2")); err != nil {
		t.Fatal(err)
	}
	// A lease expires no sooner than 2/3 TTL after the last keepalive:
	// faster means the crash revoked it.
	if took := time.Since(began); took < ttl/3 {
		t.Fatalf("crashed instance gone after %v: revoked, not expired", took)
	}
	if _, err := http.Get(crashed.URL() + "/health"); err == nil {
		t.Fatal("crashed instance still answers")
	}
}

// TestReplicaAddStop: a replica added later counts every replica and is
// counted by the others; a stopped one deregisters.
func TestReplicaAddStop(t *testing.T) {
	f := start(t, localfleet.Options{Instances: 1, Replicas: 1})
	ctx := testsupport.Context(t, 30*time.Second)
	r, err := f.AddReplica(ctx)
	if err != nil {
		t.Fatal(err)
	}
	replicas := func(n int) func(*fleet.Snapshot) bool {
		return func(s *fleet.Snapshot) bool { return s.Replicas == n }
	}
	if err := f.WaitFor(ctx, replicas(2)); err != nil {
		t.Fatal(err)
	}
	if err := f.StopReplica(ctx, r); err != nil {
		t.Fatal(err)
	}
	if err := f.WaitFor(ctx, replicas(1)); err != nil {
		t.Fatal(err)
	}
	if n := len(f.Replicas()); n != 1 {
		t.Fatalf("%d replicas after StopReplica, want 1", n)
	}
	if err := f.StopReplica(ctx, r); err == nil {
		t.Fatal("stopping a stopped replica: want an error")
	}
}

// TestEtcdRestart: while etcd is down the replicas keep routing on their
// last snapshot; after a restart a new instance reaches them.
func TestEtcdRestart(t *testing.T) {
	f := start(t, localfleet.Options{Instances: 2, Replicas: 2})
	ctx := testsupport.Context(t, 30*time.Second)
	client := newClient(t)
	if err := f.StopEtcd(); err != nil {
		t.Fatal(err)
	}
	for _, r := range f.Replicas() {
		if code, inst, body := invoke(t, client, r.URL(), "during the outage"); code != http.StatusOK || inst == "" {
			t.Fatalf("through %s with etcd down: %d from %q: %s", r.Addr(), code, inst, body)
		}
		if s := r.Router().Snapshot(); len(s.Endpoint("default").Instances) != 2 {
			t.Fatalf("replica %s lost instances with etcd down", r.Addr())
		}
	}
	if err := f.RestartEtcd(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.AddInstance(ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.WaitFor(ctx, f.HasInstances("sim-0", "sim-1", "sim-2")); err != nil {
		t.Fatal(err)
	}
}

// TestStubBackends: with Config.Backend the agents register stub servers
// instead of simulators.
func TestStubBackends(t *testing.T) {
	f := start(t, localfleet.Options{Instances: 2, Replicas: 1, Backend: localfleet.Stub})
	if ids := f.IDs(); !slices.Equal(ids, []string{"stub-0", "stub-1"}) {
		t.Fatalf("instances %v", ids)
	}
	for _, in := range f.Instances() {
		if in.Sim != nil {
			t.Fatalf("%s runs a simulator", in.ID)
		}
	}
	code, inst, body := invoke(t, newClient(t), f.Replicas()[0].URL(), "hello")
	if code != http.StatusOK || body != fmt.Sprintf("{\"id\":%q}\n", inst) {
		t.Fatalf("status %d from %q: %s", code, inst, body)
	}
}

// TestRegister: a server the test runs, registered by the fleet, reaches
// the replicas; its record changes through Registration; StopInstance
// revokes it.
func TestRegister(t *testing.T) {
	f := start(t, localfleet.Options{Replicas: 2})
	ctx := testsupport.Context(t, 30*time.Second)
	srv := httptest.NewServer(localfleet.Stub("mine"))
	defer srv.Close()
	in, err := f.Register(ctx, fleet.Instance{ID: "mine", Addr: srv.URL}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if in.URL() != srv.URL || in.Sim != nil {
		t.Fatalf("registered instance at %s", in.URL())
	}
	if err := f.WaitFor(ctx, f.HasInstances("mine")); err != nil {
		t.Fatal(err)
	}
	if err := in.Registration().SetAdapters(ctx, []string{"lora-a"}); err != nil {
		t.Fatal(err)
	}
	if err := f.WaitFor(ctx, func(s *fleet.Snapshot) bool {
		ins := s.Endpoint(f.Endpoint()).Instances
		return len(ins) == 1 && ins[0].HasAdapter("lora-a")
	}); err != nil {
		t.Fatal(err)
	}
	f.StopInstance(in)
	if err := f.WaitFor(ctx, f.HasInstances()); err != nil {
		t.Fatal(err)
	}
}

// TestFaults: an injected error answers 500; a hang holds requests until it
// is cleared.
func TestFaults(t *testing.T) {
	f := start(t, localfleet.Options{Instances: 1})
	in := f.Instances()[0]
	client := newClient(t)
	in.SetFault(localfleet.FaultError)
	if code, _, _ := invoke(t, client, in.URL(), "x"); code != http.StatusInternalServerError {
		t.Fatalf("FaultError: status %d, want 500", code)
	}
	in.SetFault(localfleet.FaultHang)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, in.URL()+"/health", nil)
	if resp, err := client.Do(req); !errors.Is(err, context.DeadlineExceeded) {
		if resp != nil {
			resp.Body.Close()
		}
		t.Fatalf("FaultHang: /health answered (%v), want it held", err)
	}
	in.SetFault(localfleet.FaultNone)
	if code, _, body := invoke(t, client, in.URL(), "x"); code != http.StatusOK {
		t.Fatalf("cleared: status %d: %s", code, body)
	}
}

// TestCloseLeavesNoGoroutine: Close stops everything the fleet started.
func TestCloseLeavesNoGoroutine(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	f, err := localfleet.Start(testsupport.Context(t, 30*time.Second), localfleet.Options{
		Instances: 2, Replicas: 2, FastEtcd: true, Sim: sim.Options{TimeScale: 100},
	})
	if err != nil {
		t.Fatal(err)
	}
	client := newClient(t)
	if code, _, body := invoke(t, client, f.Replicas()[0].URL(), "hello"); code != http.StatusOK {
		t.Fatalf("status %d: %s", code, body)
	}
	ctx := testsupport.Context(t, 30*time.Second)
	if _, err := f.AddReplica(ctx); err != nil {
		t.Fatal(err)
	}
	f.CrashInstance(f.Instances()[0])
	f.Close()
	client.CloseIdleConnections()
	goleak.VerifyNone(t, ignore)
}
