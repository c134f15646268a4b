// Package localfleet runs a whole prefixrouter deployment inside one process:
// an embedded etcd, model-server instances (simulators or stub handlers
// registered by the real agent, or servers a test runs itself and the
// harness registers), and router replicas started through the replica
// package. It is the one in-process cluster harness (etcd's integration
// package is the model): the demo, the chaos suite, e2e and the replica
// tests drive it. Everything listens on loopback.
package localfleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"reflect"
	"strings"
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
	"github.com/prefixrouter/prefixrouter/upstream"
)

// Options describes the deployment. Zero values mean the documented defaults.
type Options struct {
	// Dir holds etcd's data; empty means a new temporary directory, removed
	// by Close.
	Dir string
	// Instances and Replicas: how many model servers (AddInstance) and
	// router replicas (AddReplica) Start starts. Zero starts none; tests
	// that build their fleet step by step add them later.
	Instances, Replicas int
	// Endpoint name (default "default").
	Endpoint string
	// Sim is the template of every simulated server; ID is set per instance
	// ("sim-0", "sim-1", ...).
	Sim sim.Options
	// Backend, when set, serves each instance AddInstance starts instead of
	// a simulator (Sim is then unused): a stub such as Stub for tests that
	// need a model server's HTTP surface but not its cost model. The agent
	// registers it as it does a simulator, so it must answer GET /health or
	// /ping, and it drains on /metrics: a handler without vLLM's request
	// gauges there holds a stopping agent for the whole DrainTimeout.
	Backend func(id string) http.Handler
	// FastEtcd shortens the embedded etcd's heartbeat and election
	// (membership.WithFastTicks): it elects itself sooner and its minimum
	// lease TTL drops from 2 s to 1 s, so that tests waiting for a lease to
	// expire wait the least. The demo and chaos keep etcd's defaults.
	FastEtcd bool
	// EtcdMembers is the size of the embedded etcd cluster (default 1):
	// with 3, every client (agents, replicas, the fleet's own) gets all
	// three client URLs, as docs/operations.md tells operators to, and
	// tests stop, kill and restart single members through Etcd.
	EtcdMembers int
	// Routing is written to etcd before the replicas start; the zero value
	// writes no config key (replicas then use the default config).
	Routing fleet.RoutingConfig
	// TTL of every lease (default 2 s: chaos scenarios wait for crashes to
	// expire). With FastEtcd, 1 s is the least etcd grants.
	TTL time.Duration
	// Replica is the template of every replica's options (zero values:
	// replica's and router's defaults, health checks off). The fleet sets
	// what makes a replica one of its own: ID, loopback listeners on free
	// ports, its etcd Client, Logger, Membership's TTL and Logger,
	// Router.DefaultEndpoint (Endpoint) and a Registry per replica.
	Replica replica.Options
	// DrainTimeout bounds an instance's graceful stop (default 10 s).
	DrainTimeout time.Duration
	// Agent is the template of every agent's placement settings
	// (PlaceAdapters, LoadPollInterval, SaturationWindow, ActiveWindow,
	// ScaleCooldown) and DrainGrace (tests shorten it); the rest of each
	// agent's options is set per instance.
	Agent agent.Options
	// Logger; nil discards.
	Logger *slog.Logger
}

// Fleet is a running deployment.
type Fleet struct {
	cfg     Options
	log     *slog.Logger
	tempDir string
	client  *clientv3.Client

	etcd *membership.EmbeddedCluster

	mu        sync.Mutex // guards instances, crashed, replicas, next, nextReplica
	instances []*Instance
	crashed   []*Instance // agents still stopping after CrashInstance
	replicas  []*fleetReplica
	next      int
	// nextReplica numbers replicas ("router-0", ...) so that an id is never
	// reused, even after StopReplica.
	nextReplica int
}

// fleetReplica is a replica with the etcd client the fleet dialled for it
// (one per replica, as separate processes would have).
type fleetReplica struct {
	*replica.Replica
	client    *clientv3.Client
	transport *upstream.Transport // nil when Options.Replica brought its own
}

// Instance is one model server with what registers it: a simulator (or
// Options.Backend) with its agent, started by AddInstance, or a server the
// caller runs, registered by Register.
type Instance struct {
	ID string
	// Sim is the simulator; nil for a Backend stub or a registered server.
	Sim  *sim.Server
	addr string
	// srv is the HTTP server the fleet runs for the instance; nil for a
	// registered server.
	srv *http.Server
	// client is the instance's own etcd client: closing it is a crash.
	client *clientv3.Client
	// reg is the record Register holds; nil for an agent's instance.
	reg *membership.InstanceRegistration
	// cancel stops the agent; done is closed when it has stopped (at once
	// for a registered server, which has no agent).
	cancel context.CancelFunc
	done   chan struct{}
	fault  atomic.Int32

	hangMu sync.Mutex    // guards unhang
	unhang chan struct{} // closed when FaultHang is cleared; nil when not hanging

	handler http.Handler // the simulator or the Backend stub
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

// Registration is the record of an instance added by Register, through
// which a test changes its adapters or draining flag; nil for an instance
// whose agent holds the record.
func (in *Instance) Registration() *membership.InstanceRegistration { return in.reg }

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
	in.handler.ServeHTTP(w, r)
}

// Start starts etcd, the instances (each registered by its agent) and the
// replicas, and returns once every replica sees every instance.
func Start(ctx context.Context, cfg Options) (f *Fleet, err error) {
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
	var eopts []membership.EmbeddedOption
	if cfg.FastEtcd {
		eopts = append(eopts, membership.WithFastTicks())
	}
	if cfg.EtcdMembers == 0 {
		cfg.EtcdMembers = 1
		f.cfg.EtcdMembers = 1
	}
	e, err := membership.StartEmbeddedCluster(dir, cfg.EtcdMembers, eopts...)
	if err != nil {
		return nil, fmt.Errorf("localfleet: etcd: %w", err)
	}
	f.etcd = e
	if f.client, err = f.newClient(); err != nil {
		return nil, err
	}
	if !reflect.DeepEqual(cfg.Routing, fleet.RoutingConfig{}) {
		if err = membership.PutConfig(ctx, f.client, membership.Layout{}, cfg.Endpoint, cfg.Routing); err != nil {
			return nil, err
		}
	}
	for i := 0; i < cfg.Instances; i++ {
		if _, err = f.AddInstance(ctx); err != nil {
			return nil, err
		}
	}
	for i := 0; i < cfg.Replicas; i++ {
		if _, err = f.AddReplica(ctx); err != nil {
			return nil, err
		}
	}
	return f, f.WaitFor(ctx, func(s *fleet.Snapshot) bool {
		n := 0
		if ep := s.Endpoint(cfg.Endpoint); ep != nil {
			n = len(ep.Instances)
		}
		return n == cfg.Instances && s.Replicas == cfg.Replicas
	})
}

// AddReplica starts one more router replica with its own etcd client and
// returns once it has its first snapshot (other replicas count it once its
// record reaches them; WaitFor that if it matters).
func (f *Fleet) AddReplica(ctx context.Context) (*replica.Replica, error) {
	return f.AddReplicaWith(ctx, nil)
}

// AddReplicaWith is AddReplica with tune applied to the replica's options
// after the fleet's template (nil: none), for harnesses that compare
// replica settings on one fleet. The fleet still sets what makes the
// replica its own (see Options.Replica).
func (f *Fleet) AddReplicaWith(ctx context.Context, tune func(*replica.Options)) (*replica.Replica, error) {
	f.mu.Lock()
	id := fmt.Sprintf("router-%d", f.nextReplica)
	f.nextReplica++
	f.mu.Unlock()
	cli, err := f.newClient()
	if err != nil {
		return nil, err
	}
	cfg := f.cfg
	o := cfg.Replica
	if tune != nil {
		tune(&o)
	}
	o.ID, o.Listen, o.AdminListen = id, "127.0.0.1:0", "127.0.0.1:0"
	o.Client, o.Logger, o.Registry = cli, cfg.Logger, nil
	o.Membership.TTL, o.Membership.Logger = cfg.TTL, cfg.Logger
	o.Router.DefaultEndpoint = cfg.Endpoint
	// The fleet owns the transport it makes (as router would by default),
	// so that StopReplica can close its idle connections.
	var tr *upstream.Transport
	if o.Router.Transport == nil {
		tr = router.NewTransport(o.Router.UpstreamHeaderTimeout)
		o.Router.Transport = tr
	}
	rep, err := replica.Start(ctx, o)
	if err != nil {
		_ = cli.Close()
		return nil, err
	}
	f.mu.Lock()
	f.replicas = append(f.replicas, &fleetReplica{Replica: rep, client: cli, transport: tr})
	f.mu.Unlock()
	return rep, nil
}

// StopReplica stops a replica gracefully (deregistering it, waiting for its
// requests until ctx ends) and closes its etcd client.
func (f *Fleet) StopReplica(ctx context.Context, r *replica.Replica) error {
	f.mu.Lock()
	var fr *fleetReplica
	for i, x := range f.replicas {
		if x.Replica == r {
			fr = x
			f.replicas = append(f.replicas[:i], f.replicas[i+1:]...)
			break
		}
	}
	f.mu.Unlock()
	if fr == nil {
		return fmt.Errorf("localfleet: replica %s is not running in this fleet", r.Addr())
	}
	err := fr.Close(ctx)
	_ = fr.client.Close()
	if fr.transport != nil {
		fr.transport.CloseIdleConnections()
	}
	return err
}

func (f *Fleet) newClient() (*clientv3.Client, error) {
	return membership.NewClient(membership.ClientOptions{Endpoints: f.etcd.Endpoints()})
}

// Client is an etcd client of the fleet's etcd (owned by the fleet).
func (f *Fleet) Client() *clientv3.Client { return f.client }

// Etcd is the embedded etcd cluster (one member unless
// Options.EtcdMembers), through which tests stop, kill and restart members.
func (f *Fleet) Etcd() *membership.EmbeddedCluster { return f.etcd }

// StopEtcd stops every etcd member, as an outage of the whole etcd cluster
// would: every client (agents, replicas, the fleet's own) loses it until
// RestartEtcd. Calls that need etcd (AddInstance, SetRouting) block or fail
// meanwhile.
func (f *Fleet) StopEtcd() error {
	var errs []error
	for i := range f.etcd.Size() {
		errs = append(errs, f.etcd.Stop(i))
	}
	return errors.Join(errs...)
}

// RestartEtcd starts every stopped etcd member again on its data directory
// and client URL, so that every client reconnects by itself and the keys
// are intact (leases included: etcd renews them when a member becomes
// leader).
func (f *Fleet) RestartEtcd() error {
	if err := f.etcd.Restart(f.etcd.All()...); err != nil {
		return fmt.Errorf("localfleet: %w", err)
	}
	return nil
}

// Endpoint is the endpoint every instance serves.
func (f *Fleet) Endpoint() string { return f.cfg.Endpoint }

// AddInstance starts one more simulated server ("sim-N"; with
// Options.Backend a stub, "stub-N") and its agent, and returns once the agent
// has registered it (not waiting for the replicas to see it).
func (f *Fleet) AddInstance(ctx context.Context) (*Instance, error) {
	kind := "sim"
	if f.cfg.Backend != nil {
		kind = "stub"
	}
	f.mu.Lock()
	id := fmt.Sprintf("%s-%d", kind, f.next)
	f.next++
	f.mu.Unlock()
	in := &Instance{ID: id, done: make(chan struct{})}
	if f.cfg.Backend != nil {
		in.handler = f.cfg.Backend(id)
	} else {
		sc := f.cfg.Sim
		sc.ID = id
		if sc.Logger == nil {
			sc.Logger = f.log
		}
		s, err := sim.New(sc)
		if err != nil {
			return nil, err
		}
		in.Sim, in.handler = s, s
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		in.closeSim()
		return nil, err
	}
	in.addr = ln.Addr().String()
	in.srv = &http.Server{Handler: http.HandlerFunc(in.serveHTTP), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = in.srv.Serve(ln) }()
	// Each agent has its own etcd client, so that a crash can stop its
	// keepalives without revoking the lease.
	if in.client, err = f.newClient(); err != nil {
		_ = in.srv.Close()
		in.closeSim()
		return nil, err
	}
	actx, cancel := context.WithCancel(context.Background())
	in.cancel = cancel
	go func() {
		defer close(in.done)
		err := agent.Run(actx, agent.Options{
			Client: in.client, Options: membership.Options{TTL: f.cfg.TTL, Logger: f.log},
			Endpoint: f.cfg.Endpoint, Instance: fleet.Instance{ID: id, Addr: in.URL()},
			DiscoverAdapters: f.cfg.Backend == nil, DrainTimeout: f.cfg.DrainTimeout, DrainGrace: f.cfg.Agent.DrainGrace,
			HealthInterval: 20 * time.Millisecond, PollInterval: time.Second,
			PlaceAdapters: f.cfg.Agent.PlaceAdapters, LoadPollInterval: f.cfg.Agent.LoadPollInterval,
			SaturationWindow: f.cfg.Agent.SaturationWindow, ActiveWindow: f.cfg.Agent.ActiveWindow, ScaleCooldown: f.cfg.Agent.ScaleCooldown,
		})
		if err != nil {
			f.log.Error("localfleet: agent failed", "instance", id, "err", err)
		}
	}()
	if err := f.waitRegistered(ctx, in); err != nil {
		in.cancel()
		<-in.done
		in.stop(ctx)
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

// Register registers an instance the caller serves at in.Addr (a test's
// own stub server) under the fleet's endpoint, with its own etcd client, a
// lease of ttl (zero: the fleet's TTL) and no agent: Instance.Registration changes the record,
// StopInstance revokes it and CrashInstance drops the client so that the
// lease expires. It returns once the record is written (not waiting for the
// replicas to see it).
func (f *Fleet) Register(ctx context.Context, in fleet.Instance, ttl time.Duration) (*Instance, error) {
	if ttl == 0 {
		ttl = f.cfg.TTL
	}
	cli, err := f.newClient()
	if err != nil {
		return nil, err
	}
	reg, err := membership.RegisterInstance(ctx, cli, f.cfg.Endpoint, in, membership.Options{TTL: ttl, Logger: f.log})
	if err != nil {
		_ = cli.Close()
		return nil, err
	}
	addr := strings.TrimPrefix(strings.TrimPrefix(in.Addr, "http://"), "https://")
	x := &Instance{ID: in.ID, addr: addr, client: cli, reg: reg, cancel: func() {}, done: make(chan struct{})}
	close(x.done) // no agent to wait for
	f.mu.Lock()
	f.instances = append(f.instances, x)
	f.mu.Unlock()
	return x, nil
}

func (in *Instance) closeSim() {
	if in.Sim != nil {
		in.Sim.Close()
	}
}

// stop ends what the fleet runs for the instance once its agent (if any)
// has stopped: the record of a registered server is revoked (a no-op after
// a crash or if the test closed it), then the server and the client close.
func (in *Instance) stop(ctx context.Context) {
	if in.reg != nil {
		_ = in.reg.Close(ctx)
	}
	if in.srv != nil {
		_ = in.srv.Close()
	}
	in.closeSim()
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
// A registered server's record is revoked (the caller stops the server).
func (f *Fleet) StopInstance(in *Instance) {
	in.SetFault(FaultNone) // a frozen server would not drain either; do not wait on it
	f.remove(in)
	in.cancel()
	<-in.done
	// Let requests still being answered finish before closing the server.
	sctx, cancel := context.WithTimeout(context.Background(), f.cfg.DrainTimeout)
	defer cancel()
	if in.srv != nil {
		_ = in.srv.Shutdown(sctx)
	}
	in.stop(sctx)
}

// CrashInstance kills an instance without any goodbye: its server closes
// every connection at once and its agent's etcd client goes away without
// revoking the lease, so routers learn of it only when the lease expires.
func (f *Fleet) CrashInstance(in *Instance) {
	f.remove(in)
	_ = in.client.Close() // keepalives stop; the lease is not revoked
	if in.srv != nil {
		_ = in.srv.Close() // connections reset; new ones refused
	}
	in.closeSim()
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
	out := make([]*replica.Replica, len(f.replicas))
	for i, r := range f.replicas {
		out[i] = r.Replica
	}
	return out
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
			ep.Resolved.PrefixLength == want.PrefixAwareRoutingConfig.PrefixLength &&
			ep.Resolved.ConcurrencyThreshold == want.PrefixAwareRoutingConfig.ConcurrencyThreshold &&
			ep.Config.FirstByteTimeoutInMilliseconds == want.FirstByteTimeoutInMilliseconds
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

// HasInstances is a WaitFor condition: the endpoint lists exactly these ids
// (none: no instance, or no endpoint at all), none of them draining.
func (f *Fleet) HasInstances(ids ...string) func(*fleet.Snapshot) bool {
	return func(s *fleet.Snapshot) bool {
		ep := s.Endpoint(f.cfg.Endpoint)
		if ep == nil {
			return len(ids) == 0
		}
		if len(ep.Instances) != len(ids) {
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
		if err := f.StopReplica(ctx, r); err != nil {
			f.log.Warn("localfleet: closing replica", "err", err)
		}
	}
	// Every agent drains at once, as in a fleet shut down as a whole.
	running := f.Instances()
	for _, in := range running {
		in.SetFault(FaultNone)
		f.remove(in)
		in.cancel()
	}
	for _, in := range running {
		<-in.done
		in.stop(ctx)
	}
	f.mu.Lock()
	crashed := f.crashed
	f.crashed = nil
	f.mu.Unlock()
	for _, in := range crashed {
		<-in.done
		if in.reg != nil {
			// Its client is gone: this only releases the registration.
			_ = in.reg.Close(ctx)
		}
	}
	if f.client != nil {
		_ = f.client.Close()
	}
	if f.etcd != nil {
		_ = f.etcd.Close()
	}
	if f.tempDir != "" {
		_ = os.RemoveAll(f.tempDir)
	}
}
