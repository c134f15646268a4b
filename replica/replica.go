// Package replica assembles one router replica: the data-plane router, its
// fleet source (a static fleet or an etcd watcher), its own registration under
// routers/, the data-plane listener, and the admin listener (metrics, probes
// and the gRPC admin API on one port). `prefixrouter serve`, the demo and the
// chaos suite all start replicas through it, so they run the same code.
package replica

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/net/netutil"

	"github.com/prefixrouter/prefixrouter/admin"
	"github.com/prefixrouter/prefixrouter/extproc"
	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/membership"
	"github.com/prefixrouter/prefixrouter/router"
	"github.com/prefixrouter/prefixrouter/tracing"
	"github.com/prefixrouter/prefixrouter/upstream"
)

// Version is reported in the replica's etcd record.
var Version = "dev"

// Replica is a running router replica.
type Replica struct {
	opts     Options
	log      *slog.Logger
	registry *prometheus.Registry
	router   *router.Router
	watcher  *membership.Watcher
	reg      *membership.Registration
	rates    *ratePublisher // nil for a static fleet
	data     *http.Server
	admin    *http.Server
	adminRPC *admin.Server
	epp      *extproc.Server   // nil unless ExtProcListen is set
	tracing  *tracing.Provider // nil unless tracing is on
	dataLn   net.Listener
	adminLn  net.Listener
	eppLn    net.Listener // nil unless ExtProcListen is set
	// stops undoes what Start started, one entry per part in the order it
	// started; a failed Start and Close both run it backwards.
	stops   []stop
	closeMu sync.Mutex
	closed  bool
	// stale writes the router's stale-adapter reports to etcd; nil for a
	// static fleet and until the watcher starts.
	stale atomic.Pointer[staleMarker]
	// allowed is where records may point, set once the listeners are
	// open (startFleet); the router's connections are checked against it
	// as they are dialled (dialCheck).
	allowed atomic.Pointer[fleet.Upstreams]
	// static probes a static fleet's instances; nil with etcd.
	static *staticProber
	// popular publishes the router's popular prefixes (issue 21).
	popular *popularityPublisher
	// keys holds the endpoints' session keys from etcd; nil with a static
	// fleet or --session-key-file.
	keys *sessionKeyring
}

// step is one part of Start. run starts the part and, for everything it
// leaves running, registers how to stop it (onStop) before it can fail.
type step struct {
	name string
	run  func(context.Context) error
}

// stop undoes one started part.
type stop struct {
	part string
	fn   func(context.Context) error
}

// steps lists Start's parts in the order they start. The order is also the
// reverse of Close's: tracing stops last so that the spans of the requests
// Close drains are flushed; the data plane stops first and the admin
// listener (metrics, /readyz) after it, so that a drain stays observable.
func (r *Replica) steps() []step {
	return []step{
		{"tracing", r.startTracing},
		{"embedded etcd", r.startEmbeddedEtcd},
		{"etcd client", r.dialEtcd},
		{"router", r.startRouter},
		{"listeners", r.listen},
		{"fleet", r.startFleet},
		{"registration", r.register},
		{"popularity", r.startPopularity},
		{"admin", r.startAdmin},
		{"ext_proc", r.startExtProc},
		{"data plane", r.serveData},
	}
}

// Start validates opts, starts a replica and returns once it listens and,
// with etcd, has its first snapshot (bounded by StartupTimeout and ctx).
// Invalid options give an error wrapping fleet.ErrInvalid. A failure stops
// every part already started, in reverse order, before Start returns.
func Start(ctx context.Context, opts Options) (*Replica, error) {
	return start(ctx, opts, "")
}

// errInjected is the failure tests inject after a step (start's failAfter).
var errInjected = errors.New("replica: failure injected by a test")

// start is Start; when failAfter names a step, start fails right after that
// step succeeded, so that tests see each step's stops unwound.
func start(ctx context.Context, opts Options, failAfter string) (*Replica, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	r := &Replica{opts: opts, log: opts.Logger, registry: opts.Registry}
	startCtx, cancel := context.WithTimeout(ctx, opts.StartupTimeout)
	defer cancel()
	for _, s := range r.steps() {
		err := s.run(startCtx)
		if err == nil && s.name == failAfter {
			err = fmt.Errorf("%w after step %q", errInjected, s.name)
		}
		if err != nil {
			// Stopping must not be cut short by the context that
			// made starting fail.
			stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opts.ShutdownTimeout)
			defer cancel()
			if uerr := r.unwind(stopCtx); uerr != nil {
				r.log.Warn("replica: stopping the parts started before the failure", "err", uerr)
			}
			return nil, err
		}
	}
	if r.opts.Admin.Token == "" && !isLoopback(r.adminLn.Addr()) {
		r.log.Warn("the admin listener is not loopback-only and has no --admin-token: anyone who reaches it can change routing", "admin", r.AdminAddr())
	}
	r.log.Info("router replica serving", "id", r.opts.ID, "addr", r.Addr(), "admin", r.AdminAddr(), "ext_proc", r.ExtProcAddr(), "endpoint", r.opts.Router.DefaultEndpoint, "etcd", r.opts.Client != nil, "tracing", r.tracing != nil)
	return r, nil
}

// onStop registers how to stop a part that has just started.
func (r *Replica) onStop(part string, fn func(context.Context) error) {
	r.stops = append(r.stops, stop{part: part, fn: fn})
}

// unwind stops every started part, last started first, and empties the
// stack; it joins their errors.
func (r *Replica) unwind(ctx context.Context) error {
	var errs []error
	for i := len(r.stops) - 1; i >= 0; i-- {
		if err := r.stops[i].fn(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	r.stops = nil
	return errors.Join(errs...)
}

// closeQuietly adapts a Close whose error nobody acts on (a listener the
// server closed already, say).
func closeQuietly(c interface{ Close() error }) func(context.Context) error {
	return func(context.Context) error {
		_ = c.Close()
		return nil
	}
}

func (r *Replica) startTracing(ctx context.Context) error {
	var err error
	if r.tracing, err = tracing.Start(ctx, tracing.Options{Endpoint: r.opts.OTLPEndpoint, InstanceID: r.opts.ID}); err != nil {
		return err
	}
	r.onStop("tracing", r.tracing.Close)
	if r.opts.Router.TracerProvider == nil {
		r.opts.Router.TracerProvider = r.tracing.TracerProvider()
	}
	return nil
}

// startEmbeddedEtcd starts the embedded etcd if asked; the replica's client
// then reaches it.
func (r *Replica) startEmbeddedEtcd(context.Context) error {
	if !r.opts.usesEtcd() || r.opts.EmbeddedEtcdDir == "" {
		return nil
	}
	var eopts []membership.EmbeddedOption
	if t := r.opts.EmbeddedEtcdTLS; t.Cert != "" {
		eopts = append(eopts, membership.WithClientTLS(t.Cert, t.Key, t.ClientCA, t.ClientCA != ""))
	}
	emb, err := membership.StartEmbedded(r.opts.EmbeddedEtcdDir, r.opts.EmbeddedEtcdClientURL, eopts...)
	if err != nil {
		return fmt.Errorf("replica: starting embedded etcd: %w", err)
	}
	r.onStop("embedded etcd", closeQuietly(emb))
	r.log.Info("embedded etcd serving", "client_url", emb.ClientURL(), "dir", r.opts.EmbeddedEtcdDir)
	r.opts.Etcd.Endpoints = emb.Endpoints()
	return nil
}

// dialEtcd dials etcd unless the caller gave a client (which stays the
// caller's to close).
func (r *Replica) dialEtcd(context.Context) error {
	if !r.opts.usesEtcd() || r.opts.Client != nil {
		return nil
	}
	cli, err := membership.NewClient(r.opts.Etcd)
	if err != nil {
		return fmt.Errorf("replica: connecting to etcd %v: %w", r.opts.Etcd.Endpoints, err)
	}
	r.onStop("etcd client", closeQuietly(cli))
	r.opts.Client = cli
	if !r.opts.Etcd.TLS() && r.opts.Etcd.Username == "" {
		return nil
	}
	// Credentials are checked now, so that wrong ones fail start with
	// their own message rather than as a missing first snapshot.
	ctx, cancel := context.WithTimeout(context.Background(), cmp.Or(r.opts.Etcd.DialTimeout, membership.DefaultDialTimeout))
	defer cancel()
	if _, err := cli.Get(ctx, r.opts.Membership.Layout.Root(), clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
		return fmt.Errorf("replica: etcd %v refused this replica's credentials or did not answer (check --etcd-cacert, --etcd-cert, --etcd-key, --etcd-username): %w", r.opts.Etcd.Endpoints, err)
	}
	return nil
}

func (r *Replica) startRouter(context.Context) error {
	opts := &r.opts.Router
	if r.opts.usesEtcd() {
		// The watcher starts after the router (it feeds it), so
		// readiness reads its age through r; nil for a static fleet,
		// which has no age.
		opts.SnapshotAge = func() time.Duration { return r.watcher.SnapshotAge() }
		if opts.OnStale == nil {
			opts.OnStale = func(endpoint, instance, adapter string) {
				if m := r.stale.Load(); m != nil {
					m.report(endpoint, instance, adapter)
				}
			}
		}
	}
	if r.opts.usesEtcd() && len(opts.SessionKey) == 0 && opts.SessionKeys == nil {
		k := startSessionKeyring(r.opts.Client, r.opts.Membership.Layout, r.log)
		r.onStop("session keyring", func(context.Context) error {
			k.Close()
			return nil
		})
		r.keys = k
		opts.SessionKeys = k.key
	}
	if opts.DialCheck == nil {
		opts.DialCheck = r.dialCheck
	}
	var err error
	if r.router, err = router.New(*opts); err != nil {
		return err
	}
	r.onStop("router", closeQuietly(r.router))
	return nil
}

// listen opens the listeners; the servers that later serve on them close
// them too, so closing them again here is harmless.
func (r *Replica) listen(context.Context) error {
	var err error
	if r.dataLn, err = net.Listen("tcp", r.opts.Listen); err != nil {
		return fmt.Errorf("replica: listen %s: %w", r.opts.Listen, err)
	}
	r.onStop("data listener", closeQuietly(r.dataLn))
	if r.adminLn, err = net.Listen("tcp", r.opts.AdminListen); err != nil {
		return fmt.Errorf("replica: admin listen %s: %w", r.opts.AdminListen, err)
	}
	r.onStop("admin listener", closeQuietly(r.adminLn))
	if r.opts.ExtProcListen == "" {
		return nil
	}
	if r.eppLn, err = net.Listen("tcp", r.opts.ExtProcListen); err != nil {
		return fmt.Errorf("replica: ext_proc listen %s: %w", r.opts.ExtProcListen, err)
	}
	r.onStop("ext_proc listener", closeQuietly(r.eppLn))
	return nil
}

// dialCheck judges the address of a connection to an instance as it is
// dialled: a record's host name may lead, after its record was accepted,
// to one of the replica's own listeners or to a metadata address (issue
// 19); the connection is then refused, and the request fails over as on
// a dial error. Before the listeners are open nothing is refused.
func (r *Replica) dialCheck(ap netip.AddrPort) error {
	if u := r.allowed.Load(); u != nil {
		return u.CheckDial(ap)
	}
	return nil
}

// startFleet gives the router its fleet: the static one at once, or etcd's
// through a watcher, waiting for its first snapshot. Instances at one of the
// replica's own listeners are refused (issue 19): a static one fails start,
// a record is ignored and counted.
func (r *Replica) startFleet(ctx context.Context) error {
	opts := r.opts
	// Validate parsed the list already.
	allowed, _ := fleet.ParseUpstreams(opts.AllowedUpstreams)
	self, err := selfListeners(r.dataLn, r.adminLn, r.eppLn)
	if err != nil {
		return err
	}
	resolve := opts.Resolver
	if resolve == nil {
		resolve = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	allowed = allowed.WithSelf(self).WithResolver(resolve)
	r.allowed.Store(&allowed)
	if !opts.usesEtcd() {
		for i, in := range opts.Static {
			if err := allowed.Check(in.Addr); err != nil {
				return fmt.Errorf("replica: %w: static instance %d: %w", fleet.ErrInvalid, i, err)
			}
		}
		ep := fleet.Endpoint{Name: opts.Router.DefaultEndpoint, Config: opts.Routing, Instances: opts.Static}
		r.router.Update(fleet.NewSnapshot([]fleet.Endpoint{ep}, 0, 1, time.Now()))
		tr := opts.Router.Transport
		if tr == nil {
			// Its own connections, none kept between rounds 30 s apart.
			own := http.DefaultTransport.(*http.Transport).Clone()
			own.DisableKeepAlives = true
			own.DialContext = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, Control: upstream.CheckAddr(r.dialCheck)}).DialContext
			tr = own
		}
		if r.static, err = startStaticProber(ep, tr, opts.Clock, r.log, r.router.Update); err != nil {
			return err
		}
		r.onStop("static prober", func(context.Context) error {
			r.static.Close()
			return nil
		})
		return nil
	}
	m := startStaleMarker(opts.Client, opts.Membership.Layout, r.log)
	r.stale.Store(m)
	r.onStop("stale marker", func(context.Context) error {
		m.Close()
		return nil
	})
	if r.opts.Membership.Metrics == nil {
		r.opts.Membership.Metrics = membership.NewMetrics(opts.Registry)
	}
	// Routing is the default of endpoints with no config key in etcd.
	wopts := membership.WatcherOptions{Options: r.opts.Membership, DefaultConfig: opts.Routing, Upstreams: allowed, VanishGrace: opts.VanishGrace, Clock: opts.Clock}
	if r.keys != nil {
		wopts.OnSessionKeys = r.keys.setWatched
	}
	r.watcher = membership.StartWatcher(opts.Client, wopts, r.publishTo(newOverrideLog(opts, r.log)))
	r.onStop("watcher", closeQuietly(r.watcher))
	select {
	case <-r.watcher.Synced():
	case <-ctx.Done():
		return fmt.Errorf("replica: no fleet snapshot from etcd %v within the startup timeout %v (is etcd reachable?): %w", opts.Etcd.Endpoints, opts.StartupTimeout, ctx.Err())
	}
	if r.keys != nil {
		// The first snapshot's endpoints get their session keys before
		// the replica serves: a session opened meanwhile would be sealed
		// with a key the other replicas do not have.
		r.keys.ensure(ctx, r.watcher.Snapshot(), map[string]bool{})
	}
	return nil
}

// publishTo is the watcher's snapshot callback: the router routes with
// each snapshot, ol reports the operator settings it overrides, and the
// session keyring creates the keys of new endpoints.
func (r *Replica) publishTo(ol *overrideLog) func(*fleet.Snapshot) {
	return func(s *fleet.Snapshot) {
		r.router.Update(s)
		ol.snapshot(s)
		if r.keys != nil {
			r.keys.check(s)
		}
	}
}

// register writes this replica's record under routers/, bound to its lease.
func (r *Replica) register(ctx context.Context) error {
	if !r.opts.usesEtcd() {
		return nil
	}
	info := membership.RouterInfo{Addr: r.dataLn.Addr().String(), Version: Version}
	zero := 0.0
	withRate := info
	withRate.Rate = &zero // no traffic yet
	reg, err := membership.RegisterRouter(ctx, r.opts.Client, r.opts.ID, withRate, r.opts.Membership)
	if err != nil {
		return fmt.Errorf("replica: registering under routers/: %w", err)
	}
	r.reg = reg
	r.rates = startRatePublisher(reg, r.router, info, r.opts.RateInterval, r.log)
	// Close deregisters early, while requests still drain; this stop is
	// then a no-op (Registration.Close runs once).
	r.onStop("registration", func(ctx context.Context) error { return r.deregister(ctx) })
	return nil
}

// startPopularity starts publishing the router's popular prefixes: with
// etcd under the registration's lease, with a static fleet into the
// snapshots the static prober publishes.
func (r *Replica) startPopularity(context.Context) error {
	p := &popularityPublisher{rt: r.router, interval: r.opts.PopularityInterval, log: r.log}
	if r.reg != nil {
		p.cli, p.layout, p.id, p.lease = r.opts.Client, r.opts.Membership.Layout, r.opts.ID, r.reg.LeaseID
	} else {
		p.static = r.static
	}
	p.start()
	r.popular = p
	r.onStop("popularity", func(context.Context) error {
		p.Close()
		return nil
	})
	return nil
}

// deregister stops publishing the request rate and revokes the replica's
// lease once; later calls return nil.
func (r *Replica) deregister(ctx context.Context) error {
	if r.reg == nil {
		return nil
	}
	r.rates.Close()
	reg := r.reg
	r.reg, r.rates = nil, nil
	return reg.Close(ctx)
}

// startAdmin serves the admin listener: /metrics, probes and the gRPC admin
// API on one port.
func (r *Replica) startAdmin(context.Context) error {
	opts := r.opts
	adminTLS, err := opts.Admin.tlsConfig()
	if err != nil {
		return err
	}
	aopts := admin.Options{
		Token:     opts.Admin.Token,
		OpenReads: opts.Admin.OpenReads,
		Snapshots: r.router,
		Statuses:  r.router,
		Explainer: r.router,
		Overrides: opts.overrides,
		Ready:     r.router.Ready,
		Registry:  opts.Registry,
		Logger:    opts.Logger,
	}
	if opts.Client != nil {
		aopts.Configs = configStore{cli: opts.Client, layout: opts.Membership.Layout}
		aopts.Adapters = configStore{cli: opts.Client, layout: opts.Membership.Layout}
	}
	if r.adminRPC, err = admin.NewServer(aopts); err != nil {
		return err
	}
	// One port for both: gRPC clients speak HTTP/2 (with prior knowledge
	// in plaintext, by ALPN over TLS), curl and Prometheus HTTP/1.1.
	var protos http.Protocols
	protos.SetHTTP1(true)
	if adminTLS != nil {
		protos.SetHTTP2(true)
	} else {
		protos.SetUnencryptedHTTP2(true)
	}
	lim := opts.Limits
	r.admin = &http.Server{
		Handler:           lim.guard(r.adminHandler()),
		Protocols:         &protos,
		TLSConfig:         adminTLS,
		ReadHeaderTimeout: lim.ReadHeaderTimeout,
		IdleTimeout:       lim.IdleTimeout,
		MaxHeaderBytes:    lim.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(opts.Logger.Handler(), slog.LevelWarn),
	}
	ln := netutil.LimitListener(r.adminLn, lim.MaxConns)
	if adminTLS != nil {
		ln = tls.NewListener(ln, adminTLS)
	}
	stopped := r.serve(r.admin, ln)
	r.onStop("admin", func(ctx context.Context) error {
		r.stopAdmin(ctx)
		<-stopped
		return nil
	})
	return nil
}

// adminHandler routes gRPC calls to the admin API and the rest to the HTTP
// endpoints.
func (r *Replica) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(r.opts.Registry, promhttp.HandlerOpts{Registry: r.opts.Registry}))
	mux.HandleFunc("GET /readyz", r.router.ServeReadyz)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	if r.opts.Pprof {
		handlePprof(mux)
	}
	grpcSrv := r.adminRPC.GRPC()
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.ProtoMajor == 2 && strings.HasPrefix(req.Header.Get("Content-Type"), "application/grpc") {
			grpcSrv.ServeHTTP(w, req)
			return
		}
		mux.ServeHTTP(w, req)
	})
}

// startExtProc serves Envoy's ext_proc endpoint picker when asked.
func (r *Replica) startExtProc(context.Context) error {
	if r.eppLn == nil {
		return nil
	}
	sec := r.opts.ExtProc
	tc, err := sec.config("ext_proc", "h2")
	if err != nil {
		return err
	}
	r.epp, err = extproc.Start(r.eppLn, extproc.Options{Picker: r.router, Ready: r.router.Ready, TracerProvider: r.opts.Router.TracerProvider, Logger: r.opts.Logger, Token: sec.Token, TLS: tc})
	if err != nil {
		return err
	}
	r.onStop("ext_proc", r.epp.Close)
	if sec.Token == "" && sec.ClientCA == "" {
		r.log.Warn("the ext_proc listener authenticates no peer (no --ext-proc-token or --ext-proc-client-ca): it serves picks, but its peers' outcome reports do not reach the circuit breakers", "ext_proc", r.eppLn.Addr().String())
	}
	return nil
}

// serveData serves the data plane: the last step, so that no request
// arrives before everything it needs runs.
func (r *Replica) serveData(context.Context) error {
	lim := r.opts.Limits
	r.data = &http.Server{
		Handler:     lim.guard(framed(r.router)),
		ConnContext: framingContext,
		// "OPTIONS *" goes to the router like every request.
		DisableGeneralOptionsHandler: true,
		ReadHeaderTimeout:            lim.ReadHeaderTimeout,
		IdleTimeout:                  lim.IdleTimeout,
		MaxHeaderBytes:               lim.MaxHeaderBytes,
		ErrorLog:                     slog.NewLogLogger(r.opts.Logger.Handler(), slog.LevelWarn),
	}
	// Go accepts a head of MaxHeaderBytes plus 4 KiB.
	stopped := r.serve(r.data, framingListener{Listener: netutil.LimitListener(r.dataLn, lim.MaxConns), maxHead: lim.MaxHeaderBytes + 8<<10})
	r.onStop("data plane", func(ctx context.Context) error {
		var err error
		if err = r.data.Shutdown(ctx); err != nil {
			err = fmt.Errorf("replica: draining requests: %w", err)
			_ = r.data.Close()
		}
		<-stopped
		return err
	})
	return nil
}

// Run starts a replica, serves until ctx ends, then closes it within
// ShutdownTimeout: the life of `prefixrouter serve`.
func Run(ctx context.Context, opts Options) error {
	r, err := Start(ctx, opts)
	if err != nil {
		return err
	}
	setGCPercent(opts.GCPercent)
	<-ctx.Done()
	closeCtx, cancel := context.WithTimeout(context.Background(), r.opts.DrainDelay+r.opts.ShutdownTimeout)
	defer cancel()
	return r.Shutdown(closeCtx)
}

// setGCPercent applies Options.GCPercent unless it is zero or GOGC is set in
// the environment, which the runtime has applied already.
func setGCPercent(p int) {
	if _, ok := os.LookupEnv("GOGC"); ok || p == 0 {
		return
	}
	debug.SetGCPercent(p)
}

// Shutdown stops the replica in the order load balancers need (issue 12):
// /readyz turns 503 at once while requests are still served, for DrainDelay
// (at least one probe period, so probers stop sending here); then Close
// deregisters, stops accepting and drains requests in flight. ctx bounds
// the whole.
func (r *Replica) Shutdown(ctx context.Context) error {
	r.router.Drain()
	r.log.Info("shutting down: not ready; serving until load balancers notice", "drain_delay", r.opts.DrainDelay)
	select {
	case <-time.After(r.opts.DrainDelay):
	case <-ctx.Done():
	}
	r.log.Info("shutting down: deregistering and draining requests in flight", "timeout", r.opts.ShutdownTimeout)
	return r.Close(ctx)
}

// serve serves srv on ln in a goroutine; the returned channel closes when
// it has returned.
func (r *Replica) serve(srv *http.Server, ln net.Listener) <-chan struct{} {
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			r.log.Error("http server stopped", "addr", ln.Addr().String(), "err", err)
		}
	}()
	return stopped
}

// isLoopback reports whether a listener's address is a loopback one.
func isLoopback(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}

// Addr is the data-plane address (host:port).
func (r *Replica) Addr() string { return r.dataLn.Addr().String() }

// AdminAddr is the admin address (host:port): metrics, probes and the gRPC
// admin API.
func (r *Replica) AdminAddr() string { return r.adminLn.Addr().String() }

// ExtProcAddr is the endpoint picker's address (host:port), empty when
// ExtProcListen is not set.
func (r *Replica) ExtProcAddr() string {
	if r.eppLn == nil {
		return ""
	}
	return r.eppLn.Addr().String()
}

// URL is the data plane's base URL.
func (r *Replica) URL() string { return "http://" + r.Addr() }

// ID is the replica's id under routers/ ("" for a static fleet).
func (r *Replica) ID() string { return r.opts.ID }

// Router is the replica's data plane.
func (r *Replica) Router() *router.Router { return r.router }

// Registry is the replica's metrics registry.
func (r *Replica) Registry() *prometheus.Registry { return r.registry }

// Watcher is the replica's etcd watcher, nil for a static fleet.
func (r *Replica) Watcher() *membership.Watcher { return r.watcher }

// Close stops the replica: it deregisters (revoking its lease), stops taking
// requests, waits up to the context's deadline for requests in flight (streams
// included), and stops every goroutine it started.
func (r *Replica) Close(ctx context.Context) error {
	r.closeMu.Lock()
	defer r.closeMu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	// Not ready, and deregistered, before anything stops: load balancers
	// and Envoy's health checks steer new requests elsewhere while the
	// stops below drain those in flight.
	r.router.Drain()
	if r.epp != nil {
		r.epp.Drain()
	}
	if r.popular != nil {
		r.popular.Close() // before the lease goes: no write under a revoked one
	}
	return errors.Join(r.deregister(ctx), r.unwind(ctx))
}

// stopAdmin stops the admin listener. Health turns NOT_SERVING and Watch
// streams end first; the HTTP server's Shutdown then sends HTTP/2 GOAWAY and
// waits (up to ctx) for admin calls in flight, which GracefulStop cannot do
// for calls served through ServeHTTP. GracefulStop, then bounded by ctx too,
// only releases the gRPC server's own goroutines.
func (r *Replica) stopAdmin(ctx context.Context) {
	r.adminRPC.Drain()
	if err := r.admin.Shutdown(ctx); err != nil {
		_ = r.admin.Close()
	}
	stopped := make(chan struct{})
	go func() {
		r.adminRPC.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-ctx.Done():
		r.adminRPC.Stop()
		<-stopped
	}
}

// configStore reads and writes routing configs and adapter catalogues in etcd; every replica
// (this one included) applies a write through its watcher.
type configStore struct {
	cli    *clientv3.Client
	layout membership.Layout
}

func (c configStore) GetConfig(ctx context.Context, endpoint string) (fleet.RoutingConfig, bool, error) {
	return membership.GetConfig(ctx, c.cli, c.layout, endpoint)
}

func (c configStore) ListAdapters(ctx context.Context, endpoint string) ([]fleet.Adapter, error) {
	return membership.ListAdapters(ctx, c.cli, c.layout, endpoint)
}

func (c configStore) PutAdapter(ctx context.Context, endpoint string, a fleet.Adapter) error {
	return membership.PutAdapter(ctx, c.cli, c.layout, endpoint, a)
}

func (c configStore) DeleteAdapter(ctx context.Context, endpoint, name string) error {
	return membership.DeleteAdapter(ctx, c.cli, c.layout, endpoint, name)
}

func (c configStore) PutConfig(ctx context.Context, endpoint string, rc fleet.RoutingConfig) error {
	return membership.PutConfig(ctx, c.cli, c.layout, endpoint, rc)
}
