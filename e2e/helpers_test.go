package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/localfleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/membership"
	"github.com/prefixrouter/prefixrouter/replica"
	"github.com/prefixrouter/prefixrouter/router"
)

// ep is the endpoint every test routes to.
const ep = "chat"

// quiet drops the warnings that the tests provoke on purpose (etcd down,
// invalid configs); assertions report what matters.
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// within fails the test if elapsed exceeds bound.
func within(t testing.TB, what string, elapsed, bound time.Duration) {
	t.Helper()
	t.Logf("%s after %v (bound %v)", what, elapsed.Round(time.Millisecond), bound)
	if elapsed > bound {
		t.Errorf("%s after %v, want within %v", what, elapsed.Round(time.Millisecond), bound)
	}
}

// backend is a model-server instance: it answers the data-plane paths with
// its id, holds each request for Hold, counts requests and its peak
// concurrency, and exports its in-flight count as vLLM's gauges on /metrics.
type backend struct {
	id  string
	srv *httptest.Server

	hold     atomic.Int64 // nanoseconds each request is held
	inFlight atomic.Int64
	peak     atomic.Int64
	served   atomic.Int64
}

func newBackend(t testing.TB, id string) *backend {
	t.Helper()
	b := &backend{id: id}
	b.srv = httptest.NewServer(b)
	t.Cleanup(b.srv.Close)
	return b
}

func (b *backend) URL() string { return b.srv.URL }

func (b *backend) instance(adapters ...string) fleet.Instance {
	return fleet.Instance{ID: b.id, Addr: b.srv.URL, Adapters: adapters}
}

func (b *backend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/metrics":
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprintf(w, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running %d\n# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0\n", b.inFlight.Load())
		return
	case "/health", "/ping":
		_, _ = io.WriteString(w, "ok\n")
		return
	}
	n := b.inFlight.Add(1)
	defer b.inFlight.Add(-1)
	for p := b.peak.Load(); n > p && !b.peak.CompareAndSwap(p, n); p = b.peak.Load() {
	}
	b.served.Add(1)
	_, _ = io.Copy(io.Discard, r.Body)
	if d := time.Duration(b.hold.Load()); d > 0 {
		// Service time of the simulated generation.
		tm := time.NewTimer(d)
		select {
		case <-tm.C:
		case <-r.Context().Done():
			tm.Stop()
		}
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, "{\"instance\":%q}\n", b.id)
}

// markdownTable renders the tables of docs/: the header, its rule, a line
// per row.
func markdownTable(header []string, rows [][]string) string {
	var sb strings.Builder
	line := func(cells []string) { fmt.Fprintf(&sb, "| %s |\n", strings.Join(cells, " | ")) }
	line(header)
	rule := make([]string, len(header))
	for i := range rule {
		rule[i] = "---"
	}
	line(rule)
	for _, r := range rows {
		line(r)
	}
	return sb.String()
}

// decisions counts PREFIX_AWARE's decisions from X-Prefixrouter-Decision.
type decisions struct{ affinity, spill, fallback atomic.Int64 }

func (d *decisions) count(decision string) {
	switch decision {
	case router.DecisionAffinity:
		d.affinity.Add(1)
	case router.DecisionSpill:
		d.spill.Add(1)
	case router.DecisionFallback:
		d.fallback.Add(1)
	}
}

// reset zeroes the counters between load runs (nothing in flight).
func (b *backend) reset() {
	b.peak.Store(0)
	b.served.Store(0)
}

// cluster is the e2e view of one localfleet: its embedded etcd and router
// replicas, instances that the tests serve themselves (backend) and register
// through the fleet, and the HTTP client the tests use.
type cluster struct {
	t        testing.TB
	f        *localfleet.Fleet
	cli      *clientv3.Client // the fleet's etcd client, for the tests' own reads and writes
	opts     membership.Options
	replicas []*replica.Replica
	http     *http.Client
}

// newCluster starts etcd (no instance, no replica) with lease TTL ttl (0:
// membership.DefaultTTL) and an HTTP client; tune adjusts the fleet's
// config (replica settings). The caller adds replicas and instances.
func newCluster(t testing.TB, ttl time.Duration, tune ...func(*localfleet.Options)) *cluster {
	t.Helper()
	if ttl == 0 {
		ttl = membership.DefaultTTL
	}
	cfg := localfleet.Options{Endpoint: ep, TTL: ttl, FastEtcd: true, Logger: quiet}
	for _, fn := range tune {
		fn(&cfg)
	}
	f, err := localfleet.Start(testsupport.Context(t, 20*time.Second), cfg)
	if err != nil {
		t.Fatalf("start the fleet: %v", err)
	}
	// Registered before everything else, so it runs last: replicas and
	// registrations still reach etcd when they close.
	t.Cleanup(f.Close)
	c := &cluster{t: t, f: f, cli: f.Client(), opts: membership.Options{TTL: ttl, Logger: quiet}}
	tr := &http.Transport{MaxIdleConnsPerHost: 512, Proxy: nil}
	t.Cleanup(tr.CloseIdleConnections)
	c.http = &http.Client{Transport: tr, Timeout: 30 * time.Second}
	return c
}

// stopEtcd stops etcd, as an outage of the whole etcd cluster would.
func (c *cluster) stopEtcd() {
	c.t.Helper()
	if err := c.f.StopEtcd(); err != nil {
		c.t.Fatalf("stop etcd: %v", err)
	}
}

// restartEtcd stops etcd (if running) and starts it again on the same data
// and URL.
func (c *cluster) restartEtcd() {
	c.t.Helper()
	if err := c.f.RestartEtcd(); err != nil {
		c.t.Fatal(err)
	}
}

// startReplicas starts n replicas, each with its own etcd client, and
// waits until each counts all replicas started so far in its snapshot.
func (c *cluster) startReplicas(n int) {
	c.t.Helper()
	for i := 0; i < n; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		r, err := c.f.AddReplica(ctx)
		cancel()
		if err != nil {
			c.t.Fatalf("start replica: %v", err)
		}
		c.t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := c.f.StopReplica(ctx, r); err != nil {
				c.t.Errorf("close replica %s: %v", r.Addr(), err)
			}
		})
		c.replicas = append(c.replicas, r)
	}
	want := len(c.replicas)
	testsupport.Eventually(c.t, 20*time.Second, "every replica counts every replica", func() bool {
		for _, r := range c.replicas {
			if s := r.Router().Snapshot(); s == nil || s.Replicas != want {
				return false
			}
		}
		return true
	})
}

// register registers in (served by the test) through the fleet, with its
// own etcd client, and closes the registration when the test ends (a no-op
// if the test closed it).
func (c *cluster) register(in fleet.Instance) *membership.InstanceRegistration {
	c.t.Helper()
	return c.registerInstance(in, 0).Registration()
}

// registerInstance is register with a lease of ttl (0: the cluster's),
// returning the fleet's instance, for tests that crash it.
func (c *cluster) registerInstance(in fleet.Instance, ttl time.Duration) *localfleet.Instance {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	x, err := c.f.Register(ctx, in, ttl)
	if err != nil {
		c.t.Fatalf("register %s: %v", in.ID, err)
	}
	c.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = x.Registration().Close(ctx)
	})
	return x
}

// lookup returns the instance's record in the replica's snapshot.
func lookup(r *replica.Replica, id string) (fleet.Instance, bool) {
	e := r.Router().Snapshot().Endpoint(ep)
	if e == nil {
		return fleet.Instance{}, false
	}
	for _, in := range e.Instances {
		if in.ID == id {
			return in, true
		}
	}
	return fleet.Instance{}, false
}

// everyReplica reports whether cond holds on every replica.
func (c *cluster) everyReplica(cond func(*replica.Replica) bool) bool {
	for _, r := range c.replicas {
		if !cond(r) {
			return false
		}
	}
	return true
}

// hasInstances reports whether every replica's snapshot holds exactly ids
// (draining or not).
func (c *cluster) hasInstances(ids ...string) bool {
	return c.everyReplica(func(r *replica.Replica) bool {
		e := r.Router().Snapshot().Endpoint(ep)
		if e == nil || len(e.Instances) != len(ids) {
			return len(ids) == 0 && (e == nil || len(e.Instances) == 0)
		}
		for _, id := range ids {
			if _, ok := lookup(r, id); !ok {
				return false
			}
		}
		return true
	})
}

// seenRevision reports whether every replica's snapshot reflects etcd
// revision rev or later.
func (c *cluster) seenRevision(rev int64) bool {
	return c.everyReplica(func(r *replica.Replica) bool { return r.Router().Snapshot().Revision >= rev })
}

// answer is what one data-plane request came back with.
type answer struct {
	status   int
	instance string
	decision string
	err      error
}

func (a answer) ok() bool { return a.err == nil && a.status == http.StatusOK }

func (a answer) String() string {
	if a.err != nil {
		return a.err.Error()
	}
	return fmt.Sprintf("%d from %q (%s)", a.status, a.instance, a.decision)
}

// invoke sends body to the replica's invoke path for ep; model, when set,
// names an adapter.
func invoke(ctx context.Context, client *http.Client, base string, body []byte, model string) answer {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/endpoints/"+ep+"/invocations", bytes.NewReader(body))
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	if model != "" {
		req.Header.Set("X-Amzn-SageMaker-Target-Model", model)
	}
	resp, err := client.Do(req)
	if err != nil {
		return answer{err: err}
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return answer{status: resp.StatusCode, instance: resp.Header.Get(router.HeaderInstance), decision: resp.Header.Get(router.HeaderDecision), err: err}
}

func (c *cluster) invoke(r *replica.Replica, body []byte, model string) answer {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return invoke(ctx, c.http, r.URL(), body, model)
}

// choose is the replica's no-load choice for body (and model).
func choose(t testing.TB, r *router.Router, body []byte, model string) string {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "/endpoints/"+ep+"/invocations", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if model != "" {
		req.Header.Set("X-Amzn-SageMaker-Target-Model", model)
	}
	id, err := r.Choose(ep, req)
	if err != nil {
		return "error: " + err.Error()
	}
	return id
}

// predictor is a standalone router over a fixed fleet: it tells, before
// any replica knows the fleet, where a request will go once they do (the
// choice depends on the fleet only; STYLE.md rule 3).
func predict(t testing.TB, insts []fleet.Instance, body []byte, model string) string {
	t.Helper()
	rt, err := router.New(router.Options{DefaultEndpoint: ep, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	rt.Update(fleet.NewSnapshot([]fleet.Endpoint{{Name: ep, Config: fleet.DefaultRoutingConfig(), Instances: insts}}, 0, 1, time.Now()))
	return choose(t, rt, body, model)
}

// bodyFor returns a body whose primary in the fleet insts is want.
func bodyFor(t testing.TB, insts []fleet.Instance, want string, model string) []byte {
	t.Helper()
	for i := 0; i < 10000; i++ {
		b := []byte(fmt.Sprintf("prompt %d: you are a helpful assistant", i))
		if predict(t, insts, b, model) == want {
			return b
		}
	}
	t.Fatalf("no body with primary %s", want)
	return nil
}

// loadLoop sends requests through the replicas from several goroutines
// until stopped or bounded out (count and time), and tallies the answers.
type loadLoop struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup

	ok, failed atomic.Int64
	mu         sync.Mutex // guards firstErrs
	firstErrs  []string
}

// startLoad runs workers goroutines, each sending up to maxPerWorker
// requests for at most maxTime, cycling over bodies and replicas.
func (c *cluster) startLoad(workers, maxPerWorker int, maxTime time.Duration, bodies [][]byte) *loadLoop {
	ctx, cancel := context.WithTimeout(context.Background(), maxTime)
	l := &loadLoop{cancel: cancel}
	reps := append([]*replica.Replica(nil), c.replicas...)
	for w := 0; w < workers; w++ {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := 0; i < maxPerWorker && ctx.Err() == nil; i++ {
				r := reps[(w+i)%len(reps)]
				body := bodies[(w*7+i)%len(bodies)]
				rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
				a := invoke(rctx, c.http, r.URL(), body, "")
				rcancel()
				if a.ok() {
					l.ok.Add(1)
					continue
				}
				l.failed.Add(1)
				l.mu.Lock()
				if len(l.firstErrs) < 5 {
					l.firstErrs = append(l.firstErrs, a.String())
				}
				l.mu.Unlock()
			}
		}()
	}
	return l
}

// stop ends the loop and waits for its workers.
func (l *loadLoop) stop() (ok, failed int64, errs []string) {
	l.cancel()
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ok.Load(), l.failed.Load(), l.firstErrs
}

// bodies returns n distinct request bodies.
func bodies(n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = []byte(fmt.Sprintf("conversation %d: system prompt and the user's question", i))
	}
	return out
}

// leaderOf waits until the running members have a leader and returns it.
func leaderOf(t *testing.T, e *membership.EmbeddedCluster) int {
	t.Helper()
	i := -1
	testsupport.Eventually(t, 10*time.Second, "an etcd leader", func() bool { i = e.Leader(); return i >= 0 })
	return i
}

// fleetMonitor checks every replica's snapshot every few milliseconds while
// it runs: each must hold the ids it watches (nothing lost) and no id
// twice (nothing duplicated).
type fleetMonitor struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when its goroutine has returned

	mu         sync.Mutex // guards checks and violations
	checks     int
	violations []string
}

func (c *cluster) monitor(ids ...string) *fleetMonitor {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	m := &fleetMonitor{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(m.done)
		t := time.NewTicker(2 * time.Millisecond)
		defer t.Stop()
		for {
			for _, r := range c.replicas {
				m.check(r, ids)
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return m
}

func (m *fleetMonitor) check(r *replica.Replica, ids []string) {
	seen := map[string]int{}
	if e := r.Router().Snapshot().Endpoint(ep); e != nil {
		for _, in := range e.Instances {
			seen[in.ID]++
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.checks++
	if len(m.violations) >= 5 {
		return
	}
	for _, id := range ids {
		if seen[id] != 1 {
			m.violations = append(m.violations, fmt.Sprintf("%s: %s listed %d times at %s", r.ID(), id, seen[id], time.Now().Format("15:04:05.000")))
		}
	}
}

// stop ends the monitor and returns what it saw.
func (m *fleetMonitor) stop() (checks int, violations []string) {
	m.cancel()
	<-m.done
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.checks, m.violations
}

// leases returns the registrations' current leases.
func leases(regs []*membership.InstanceRegistration) []clientv3.LeaseID {
	out := make([]clientv3.LeaseID, len(regs))
	for i, r := range regs {
		out[i] = r.LeaseID()
	}
	return out
}

// regrants is the sum over the replicas of
// prefixrouter_membership_lease_regrants_total: leases of their own router
// records granted anew because the old one was lost.
func (c *cluster) regrants(t *testing.T) float64 {
	total := 0.0
	for _, r := range c.replicas {
		total += testsupport.Sum(t, r.Registry(), "prefixrouter_membership_lease_regrants_total", nil)
	}
	return total
}

// revisions returns each replica's snapshot revision.
func (c *cluster) revisions() []int64 {
	out := make([]int64, len(c.replicas))
	for i, r := range c.replicas {
		out[i] = r.Router().Snapshot().Revision
	}
	return out
}

// readyEverywhere reports whether every replica answers /readyz with 200.
func (c *cluster) readyEverywhere(t *testing.T) bool {
	t.Helper()
	for _, r := range c.replicas {
		resp, err := c.http.Get(r.URL() + "/readyz")
		if err != nil {
			t.Logf("readyz of %s: %v", r.ID(), err)
			return false
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Logf("readyz of %s: %d", r.ID(), resp.StatusCode)
			return false
		}
	}
	return true
}

// fault watches the fleet through one failure: a monitor of the replicas'
// snapshots, a load loop, and what the registrations, the replicas' router
// leases and their revisions were before it. end checks them together.
type fault struct {
	c        *cluster
	regs     []*membership.InstanceRegistration
	before   []clientv3.LeaseID
	revs     []int64
	regrants float64
	mon      *fleetMonitor
	load     *loadLoop
}

// watchFault starts watching: ids must stay on every replica, regs keep
// their leases.
func (c *cluster) watchFault(t *testing.T, regs []*membership.InstanceRegistration, ids ...string) *fault {
	t.Helper()
	f := &fault{c: c, regs: regs, before: leases(regs), revs: c.revisions(), regrants: c.regrants(t), mon: c.monitor(ids...)}
	f.load = c.startLoad(4, 1<<20, 3*time.Minute, bodies(64))
	t.Cleanup(func() { f.mon.stop(); f.load.stop() })
	return f
}

// end stops the monitor and the load and checks: no failed request, no
// instance missing or doubled, the same leases, no router lease re-granted
// and, with moved, every replica past its revision from before.
func (f *fault) end(t *testing.T, what string, moved bool) {
	t.Helper()
	checks, violations := f.mon.stop()
	ok, failed, errs := f.load.stop()
	t.Logf("%s: %d requests ok, %d failed; %d snapshot checks", what, ok, failed, checks)
	if failed != 0 || ok == 0 {
		t.Errorf("%d requests ok, %d failed (first: %v); want none failed", ok, failed, errs)
	}
	if len(violations) > 0 {
		t.Errorf("an instance vanished or doubled on a replica: %v", violations)
	}
	if after := leases(f.regs); !slices.Equal(after, f.before) {
		t.Errorf("leases %v became %v: registrations lost theirs", f.before, after)
	}
	if n := f.c.regrants(t) - f.regrants; n != 0 {
		t.Errorf("the replicas re-granted %v router leases", n)
	}
	for i, rev := range f.c.revisions() {
		if moved && rev <= f.revs[i] {
			t.Errorf("replica %d at revision %d, %d before", i, rev, f.revs[i])
		}
	}
}
