// Package localfleet runs a whole prefixrouter deployment inside one process:
// an embedded etcd, simulated model servers registered by the real agent, and
// router replicas started through the replica package. The demo and the chaos
// suite drive it; everything listens on loopback.
package localfleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/prefixrouter/prefixrouter/agent"
	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/sim"
	"github.com/prefixrouter/prefixrouter/membership"
	"github.com/prefixrouter/prefixrouter/replica"
	"github.com/prefixrouter/prefixrouter/router"
)

// Options describes the deployment. Zero values mean the documented defaults.
type Options struct {
	// Dir holds etcd's data; empty means a new temporary directory, removed
	// by Close.
	Dir string
	// Instances and Replicas: how many simulated model servers and router
	// replicas to start (defaults 7 and 2).
	Instances, Replicas int
	// Endpoint name (default "default").
	Endpoint string
	// Sim is the template of every simulated server; ID is set per instance
	// ("sim-0", "sim-1", ...).
	Sim sim.Options
	// Routing is written to etcd before the replicas start.
	Routing fleet.RoutingConfig
	// TTL of every lease (default 2 s: chaos scenarios wait for crashes to
	// expire).
	TTL time.Duration
	// Router is every replica's router options (its DefaultEndpoint is set
	// to Endpoint; zero values mean router's defaults, health checks off).
	Router router.Options
	// DrainTimeout bounds an instance's graceful stop (default 10 s).
	DrainTimeout time.Duration
	// Logger; nil discards.
	Logger *slog.Logger
}

// Fleet is a running deployment.
type Fleet struct {
	cfg     Options
	log     *slog.Logger
	tempDir string
	client  *clientv3.Client

	mu        sync.Mutex // guards etcd, instances, crashed, replicas, next
	etcd      *membership.Embedded
	instances []*Instance
	crashed   []*Instance // agents still stopping after CrashInstance
	replicas  []*replica.Replica
	next      int
}

// Instance is one simulated model server with its agent.
type Instance struct {
	ID     string
	Sim    *sim.Server
	addr   string
	srv    *http.Server
	client *clientv3.Client
	cancel context.CancelFunc
	done   chan struct{}
	fault  atomic.Int32

	hangMu sync.Mutex    // guards unhang
	unhang chan struct{} // closed when FaultHang is cleared; nil when not hanging
}

// Fault is an injected misbehaviour of an instance's HTTP server.
type Fault int32

// Faults.
const (
	FaultNone  Fault = iota
	FaultError       // answer 500 to every inference request
	// FaultHang freezes the server as SIGSTOP or a deadlock would: inference
	// requests and /health block (the connection is accepted, nothing
	// answers) until the fault is cleared or the client goes away. The
	// agent keeps the lease, so the instance stays registered.
	FaultHang
)

// URL is the instance's base URL.
func (in *Instance) URL() string { return "http://" + in.addr }

// SetFault injects (or clears, with FaultNone) a fault. Clearing FaultHang
// releases the requests it holds.
func (in *Instance) SetFault(f Fault) {
	in.hangMu.Lock()
	defer in.hangMu.Unlock()
	if f == FaultHang && in.unhang == nil {
		in.unhang = make(chan struct{})
	} else if f != FaultHang && in.unhang != nil {
		close(in.unhang)
		in.unhang = nil
	}
	in.fault.Store(int32(f))
}

func (in *Instance) hang() <-chan struct{} {
	in.hangMu.Lock()
	defer in.hangMu.Unlock()
	return in.unhang
}

func (in *Instance) serveHTTP(w http.ResponseWriter, r *http.Request) {
	switch Fault(in.fault.Load()) {
	case FaultError:
		if r.Method == http.MethodPost {
			http.Error(w, `{"error":{"message":"injected fault","type":"server_error","code":500}}`, http.StatusInternalServerError)
			return
		}
	case FaultHang:
		if r.Method == http.MethodPost || r.URL.Path == "/health" {
			if ch := in.hang(); ch != nil {
				select {
				case <-ch:
				case <-r.Context().Done():
					return
				}
			}
		}
	}
	in.Sim.ServeHTTP(w, r)
}

// Start starts etcd, the instances (each registered by its agent) and the
// replicas, and returns once every replica sees every instance.
func Start(ctx context.Context, cfg Options) (f *Fleet, err error) {
	if cfg.Instances == 0 {
		cfg.Instances = 7
	}
	if cfg.Replicas == 0 {
		cfg.Replicas = 2
	}
	if cfg.Endpoint == "" {
		cfg.Endpoint = "default"
	}
	if cfg.TTL == 0 {
		cfg.TTL = 2 * time.Second
	}
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	f = &Fleet{cfg: cfg, log: cfg.Logger}
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	dir := cfg.Dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "prefixrouter-etcd-"); err != nil {
			return nil, err
		}
		f.tempDir = dir
	}
	e, err := membership.StartEmbedded(dir, "http://127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("localfleet: etcd: %w", err)
	}
	f.etcd = e
	if f.client, err = f.newClient(); err != nil {
		return nil, err
	}
	if err = membership.PutConfig(ctx, f.client, membership.Layout{}, cfg.Endpoint, cfg.Routing); err != nil {
		return nil, err
	}
	for i := 0; i < cfg.Instances; i++ {
		if _, err = f.AddInstance(ctx); err != nil {
			return nil, err
		}
	}
	for i := 0; i < cfg.Replicas; i++ {
		ro := cfg.Router
		ro.DefaultEndpoint = cfg.Endpoint
		rep, err := replica.Start(ctx, replica.Options{
			ID: fmt.Sprintf("router-%d", i), Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0",
			Client: f.client, Logger: cfg.Logger,
			Membership: membership.Options{TTL: cfg.TTL, Logger: cfg.Logger},
			Router:     ro,
		})
		if err != nil {
			return nil, err
		}
		f.mu.Lock()
		f.replicas = append(f.replicas, rep)
		f.mu.Unlock()
	}
	return f, f.WaitFor(ctx, func(s *fleet.Snapshot) bool {
		ep := s.Endpoint(cfg.Endpoint)
		return ep != nil && len(ep.Instances) == cfg.Instances && s.Replicas == cfg.Replicas
	})
}

func (f *Fleet) newClient() (*clientv3.Client, error) {
	return membership.NewClient(membership.ClientOptions{Endpoints: f.Etcd().Endpoints()})
}

// Client is an etcd client of the fleet's etcd (owned by the fleet).
func (f *Fleet) Client() *clientv3.Client { return f.client }

// Etcd is the embedded etcd (a new value after RestartEtcd).
func (f *Fleet) Etcd() *membership.Embedded {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.etcd
}

// StopEtcd stops the embedded etcd, as an outage of the whole etcd cluster
// would: every client (agents, replicas, the fleet's own) loses it until
// RestartEtcd. Calls that need etcd (AddInstance, SetRouting) block or fail
// meanwhile.
func (f *Fleet) StopEtcd() error { return f.Etcd().Close() }

// RestartEtcd starts etcd again on the same data directory and client URL,
// so that every client reconnects by itself and the keys are intact (leases
// included: etcd renews them when its member becomes leader again).
func (f *Fleet) RestartEtcd() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, err := f.etcd.Restart()
	if err != nil {
		return fmt.Errorf("localfleet: restart etcd: %w", err)
	}
	f.etcd = e
	return nil
}

// Endpoint is the endpoint every instance serves.
func (f *Fleet) Endpoint() string { return f.cfg.Endpoint }

// AddInstance starts one more simulated server and its agent, and returns
// once the agent has registered it (not waiting for the replicas to see it).
func (f *Fleet) AddInstance(ctx context.Context) (*Instance, error) {
	f.mu.Lock()
	id := fmt.Sprintf("sim-%d", f.next)
	f.next++
	f.mu.Unlock()
	sc := f.cfg.Sim
	sc.ID = id
	if sc.Logger == nil {
		sc.Logger = f.log
	}
	s, err := sim.New(sc)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		s.Close()
		return nil, err
	}
	in := &Instance{ID: id, Sim: s, addr: ln.Addr().String(), done: make(chan struct{})}
	in.srv = &http.Server{Handler: http.HandlerFunc(in.serveHTTP), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = in.srv.Serve(ln) }()
	// Each agent has its own etcd client, so that a crash can stop its
	// keepalives without revoking the lease.
	if in.client, err = f.newClient(); err != nil {
		_ = in.srv.Close()
		s.Close()
		return nil, err
	}
	actx, cancel := context.WithCancel(context.Background())
	in.cancel = cancel
	go func() {
		defer close(in.done)
		err := agent.Run(actx, agent.Options{
			Client: in.client, Options: membership.Options{TTL: f.cfg.TTL, Logger: f.log},
			Endpoint: f.cfg.Endpoint, Instance: fleet.Instance{ID: id, Addr: in.URL()},
			DiscoverAdapters: true, DrainTimeout: f.cfg.DrainTimeout,
			HealthInterval: 20 * time.Millisecond, PollInterval: time.Second,
		})
		if err != nil {
			f.log.Error("localfleet: agent failed", "instance", id, "err", err)
		}
	}()
	if err := f.waitRegistered(ctx, in); err != nil {
		in.cancel()
		<-in.done
		in.stopServer()
		return nil, err
	}
	f.mu.Lock()
	f.instances = append(f.instances, in)
	f.mu.Unlock()
	return in, nil
}

// waitRegistered polls etcd until the agent has written the instance's key.
func (f *Fleet) waitRegistered(ctx context.Context, in *Instance) error {
	key := membership.Layout{}.InstanceKey(f.cfg.Endpoint, in.ID)
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		resp, err := f.client.Get(ctx, key, clientv3.WithCountOnly())
		if err == nil && resp.Count > 0 {
			return nil
		}
		select {
		case <-in.done:
			return fmt.Errorf("localfleet: agent of %s stopped before registering", in.ID)
		case <-ctx.Done():
			return fmt.Errorf("localfleet: %s not registered: %w", in.ID, ctx.Err())
		case <-t.C:
		}
	}
}

func (in *Instance) stopServer() {
	_ = in.srv.Close()
	in.Sim.Close()
	_ = in.client.Close()
}

// Instances returns the running instances.
func (f *Fleet) Instances() []*Instance {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*Instance(nil), f.instances...)
}

// Instance returns the running instance with the id, or nil.
func (f *Fleet) Instance(id string) *Instance {
	for _, in := range f.Instances() {
		if in.ID == id {
			return in
		}
	}
	return nil
}

func (f *Fleet) remove(in *Instance) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, x := range f.instances {
		if x == in {
			f.instances = append(f.instances[:i], f.instances[i+1:]...)
			return
		}
	}
}

// StopInstance stops an instance gracefully, as a SIGTERM to its agent
// would: draining, waiting for its requests, revoking; then the server stops.
func (f *Fleet) StopInstance(in *Instance) {
	in.SetFault(FaultNone) // a frozen server would not drain either; do not wait on it
	f.remove(in)
	in.cancel()
	<-in.done
	// Let requests still being answered finish before closing the server.
	sctx, cancel := context.WithTimeout(context.Background(), f.cfg.DrainTimeout)
	defer cancel()
	_ = in.srv.Shutdown(sctx)
	in.stopServer()
}

// CrashInstance kills an instance without any goodbye: its server closes
// every connection at once and its agent's etcd client goes away without
// revoking the lease, so routers learn of it only when the lease expires.
func (f *Fleet) CrashInstance(in *Instance) {
	f.remove(in)
	_ = in.client.Close() // keepalives stop; the lease is not revoked
	_ = in.srv.Close()    // connections reset; new ones refused
	in.Sim.Close()
	// The agent, told to stop with its client gone, can write nothing, but
	// its drain may wait out DrainTimeout (its draining flag cannot be
	// written): Close waits for it, so that a crash returns at once, as a
	// killed process would.
	in.cancel()
	f.mu.Lock()
	f.crashed = append(f.crashed, in)
	f.mu.Unlock()
}

// Replicas returns the running router replicas.
func (f *Fleet) Replicas() []*replica.Replica {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*replica.Replica(nil), f.replicas...)
}

// RouterURLs are the replicas' base URLs.
func (f *Fleet) RouterURLs() []string {
	var out []string
	for _, r := range f.Replicas() {
		out = append(out, r.URL())
	}
	return out
}

// InstanceURLs are the instances' base URLs.
func (f *Fleet) InstanceURLs() []string {
	var out []string
	for _, in := range f.Instances() {
		out = append(out, in.URL())
	}
	return out
}

// MetricsURLs are the instances' /metrics URLs.
func (f *Fleet) MetricsURLs() []string {
	out := f.InstanceURLs()
	for i := range out {
		out[i] += "/metrics"
	}
	return out
}

// SetRouting writes the endpoint's routing config to etcd and waits until
// every replica applies it.
func (f *Fleet) SetRouting(ctx context.Context, rc fleet.RoutingConfig) error {
	if err := membership.PutConfig(ctx, f.client, membership.Layout{}, f.cfg.Endpoint, rc); err != nil {
		return err
	}
	want := rc.WithDefaults()
	return f.WaitFor(ctx, func(s *fleet.Snapshot) bool {
		ep := s.Endpoint(f.cfg.Endpoint)
		return ep != nil && ep.Config.RoutingStrategy == want.RoutingStrategy &&
			ep.Config.PrefixLength() == want.PrefixLength() &&
			ep.Config.ConcurrencyThreshold() == want.ConcurrencyThreshold()
	})
}

// WaitFor polls until every replica's current snapshot satisfies ok, or ctx
// ends.
func (f *Fleet) WaitFor(ctx context.Context, ok func(*fleet.Snapshot) bool) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		all := true
		for _, r := range f.Replicas() {
			if s := r.Router().Snapshot(); s == nil || !ok(s) {
				all = false
				break
			}
		}
		if all {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("localfleet: replicas did not converge: %w", ctx.Err())
		case <-t.C:
		}
	}
}

// HasInstances is a WaitFor condition: the endpoint lists exactly these ids.
func (f *Fleet) HasInstances(ids ...string) func(*fleet.Snapshot) bool {
	return func(s *fleet.Snapshot) bool {
		ep := s.Endpoint(f.cfg.Endpoint)
		if ep == nil || len(ep.Instances) != len(ids) {
			return false
		}
		want := map[string]bool{}
		for _, id := range ids {
			want[id] = true
		}
		for _, in := range ep.Instances {
			if !want[in.ID] || in.Draining {
				return false
			}
		}
		return true
	}
}

// IDs returns the running instances' ids.
func (f *Fleet) IDs() []string {
	var ids []string
	for _, in := range f.Instances() {
		ids = append(ids, in.ID)
	}
	return ids
}

// Close stops everything and waits for it.
func (f *Fleet) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for _, r := range f.Replicas() {
		if err := r.Close(ctx); err != nil {
			f.log.Warn("localfleet: closing replica", "err", err)
		}
	}
	for _, in := range f.Instances() {
		in.SetFault(FaultNone)
		f.remove(in)
		in.cancel()
		<-in.done
		in.stopServer()
	}
	f.mu.Lock()
	crashed := f.crashed
	f.crashed = nil
	f.mu.Unlock()
	for _, in := range crashed {
		<-in.done
	}
	if f.client != nil {
		_ = f.client.Close()
	}
	if e := f.Etcd(); e != nil {
		if err := e.Close(); err != nil && !errors.Is(err, context.Canceled) {
			f.log.Warn("localfleet: closing etcd", "err", err)
		}
	}
	if f.tempDir != "" {
		_ = os.RemoveAll(f.tempDir)
	}
}
