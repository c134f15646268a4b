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
)

// Version is reported in the replica's etcd record.
var Version = "dev"

// Replica is a running router replica.
type Replica struct {
	opts     Options
	emb      *membership.Embedded // nil unless this replica started it
	ownCli   *clientv3.Client     // the etcd client this replica dialled, if any
	log      *slog.Logger
	registry *prometheus.Registry
	router   *router.Router
	watcher  *membership.Watcher
	reg      *membership.Registration
	data     *http.Server
	admin    *http.Server
	adminRPC *admin.Server
	epp      *extproc.Server   // nil unless ExtProcListen is set
	tracing  *tracing.Provider // nil unless tracing is on
	dataLn   net.Listener
	adminLn  net.Listener
	eppLn    net.Listener // nil unless ExtProcListen is set
	wg       sync.WaitGroup
	closeMu  sync.Mutex
	closed   bool
	// stale writes the router's stale-adapter reports to etcd; nil for a
	// static fleet and until the watcher starts.
	stale atomic.Pointer[staleMarker]
	// popular publishes the router's popular prefixes; nil until the
	// replica serves.
	popular *popularityPublisher
}

// Start validates opts, starts a replica and returns once it listens and,
// with etcd, has its first snapshot (bounded by StartupTimeout and ctx).
// Invalid options give an error wrapping fleet.ErrInvalid.
func Start(ctx context.Context, opts Options) (*Replica, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	r := &Replica{opts: opts, log: opts.Logger, registry: opts.Registry}
	var err error
	if opts.usesEtcd() {
		if err := r.connect(); err != nil {
			return nil, err
		}
		opts = r.opts // the client and endpoints connect settled
	}
	if r.tracing, err = tracing.Start(ctx, tracing.Options{Endpoint: opts.OTLPEndpoint, InstanceID: opts.ID}); err != nil {
		r.closeEtcd()
		return nil, err
	}
	started := false
	defer func() {
		if !started {
			_ = r.tracing.Close(ctx)
		}
	}()
	if opts.Router.TracerProvider == nil {
		opts.Router.TracerProvider = r.tracing.TracerProvider()
	}
	// The watcher starts after the router (it feeds it), so readiness
	// reads its age through r; nil for a static fleet, which has no age.
	if opts.usesEtcd() {
		opts.Router.SnapshotAge = func() time.Duration { return r.watcher.SnapshotAge() }
	}
	if opts.usesEtcd() && opts.Router.OnStale == nil {
		opts.Router.OnStale = func(endpoint, instance, adapter string) {
			if m := r.stale.Load(); m != nil {
				m.report(endpoint, instance, adapter)
			}
		}
	}
	r.router, err = router.New(opts.Router)
	if err != nil {
		r.closeEtcd()
		return nil, err
	}
	if r.dataLn, err = net.Listen("tcp", opts.Listen); err != nil {
		r.router.Close()
		r.closeEtcd()
		return nil, fmt.Errorf("replica: listen %s: %w", opts.Listen, err)
	}
	if r.adminLn, err = net.Listen("tcp", opts.AdminListen); err != nil {
		r.dataLn.Close()
		r.router.Close()
		r.closeEtcd()
		return nil, fmt.Errorf("replica: admin listen %s: %w", opts.AdminListen, err)
	}
	if opts.ExtProcListen != "" {
		if r.eppLn, err = net.Listen("tcp", opts.ExtProcListen); err != nil {
			r.dataLn.Close()
			r.adminLn.Close()
			r.router.Close()
			r.closeEtcd()
			return nil, fmt.Errorf("replica: ext_proc listen %s: %w", opts.ExtProcListen, err)
		}
	}

	if !opts.usesEtcd() {
		r.router.Update(fleet.NewSnapshot([]fleet.Endpoint{staticEndpoint(opts)}, 0, 1, time.Now()))
	} else {
		mopts := opts.Membership
		if mopts.Metrics == nil {
			mopts.Metrics = membership.NewMetrics(opts.Registry)
		}
		// Routing is the default of endpoints with no config key in etcd.
		// Validate parsed the list already.
		allowed, _ := fleet.ParseUpstreams(opts.AllowedUpstreams)
		r.stale.Store(startStaleMarker(opts.Client, opts.Membership.Layout, r.log))
		r.watcher = membership.StartWatcher(opts.Client, membership.WatcherOptions{Options: mopts, DefaultConfig: opts.Routing, Upstreams: allowed, VanishGrace: opts.VanishGrace, Clock: opts.Clock}, r.router.Update)
		startCtx, cancel := context.WithTimeout(ctx, opts.StartupTimeout)
		defer cancel()
		select {
		case <-r.watcher.Synced():
		case <-startCtx.Done():
			r.closeParts()
			return nil, fmt.Errorf("replica: no fleet snapshot from etcd %v within the startup timeout %v (is etcd reachable?): %w", opts.Etcd.Endpoints, opts.StartupTimeout, startCtx.Err())
		}
		r.reg, err = membership.RegisterRouter(startCtx, opts.Client, opts.ID, membership.RouterInfo{Addr: r.dataLn.Addr().String(), Version: Version}, mopts)
		if err != nil {
			r.closeParts()
			return nil, fmt.Errorf("replica: registering under routers/: %w", err)
		}
	}

	adminTLS, err := opts.Admin.tlsConfig()
	if err != nil {
		if r.reg != nil {
			_ = r.reg.Close(ctx)
		}
		r.closeParts()
		return nil, err
	}
	aopts := admin.Options{
		Token:     opts.Admin.Token,
		OpenReads: opts.Admin.OpenReads,
		Snapshots: r.router,
		Statuses:  r.router,
		Explainer: r.router,
		Ready:     r.router.Ready,
		Registry:  opts.Registry,
		Logger:    opts.Logger,
	}
	if opts.Client != nil {
		aopts.Configs = configStore{cli: opts.Client, layout: opts.Membership.Layout}
		aopts.Adapters = configStore{cli: opts.Client, layout: opts.Membership.Layout}
	}
	if r.adminRPC, err = admin.NewServer(aopts); err != nil {
		if r.reg != nil {
			_ = r.reg.Close(ctx)
		}
		r.closeParts()
		return nil, err
	}

	lim := opts.Limits
	r.data = &http.Server{
		Handler:           lim.guard(r.router),
		ReadHeaderTimeout: lim.ReadHeaderTimeout,
		IdleTimeout:       lim.IdleTimeout,
		MaxHeaderBytes:    lim.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(opts.Logger.Handler(), slog.LevelWarn),
	}
	adminMux := http.NewServeMux()
	adminMux.Handle("GET /metrics", promhttp.HandlerFor(opts.Registry, promhttp.HandlerOpts{Registry: opts.Registry}))
	adminMux.HandleFunc("GET /readyz", r.router.ServeReadyz)
	adminMux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	if opts.Pprof {
		handlePprof(adminMux)
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
	grpcSrv := r.adminRPC.GRPC()
	r.admin = &http.Server{
		Handler: lim.guard(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if req.ProtoMajor == 2 && strings.HasPrefix(req.Header.Get("Content-Type"), "application/grpc") {
				grpcSrv.ServeHTTP(w, req)
				return
			}
			adminMux.ServeHTTP(w, req)
		})),
		Protocols:         &protos,
		TLSConfig:         adminTLS,
		ReadHeaderTimeout: lim.ReadHeaderTimeout,
		IdleTimeout:       lim.IdleTimeout,
		MaxHeaderBytes:    lim.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(opts.Logger.Handler(), slog.LevelWarn),
	}
	if r.eppLn != nil {
		r.epp, err = extproc.Start(r.eppLn, extproc.Options{Picker: r.router, Ready: r.router.Ready, TracerProvider: opts.Router.TracerProvider, Logger: opts.Logger})
		if err != nil {
			if r.reg != nil {
				_ = r.reg.Close(ctx)
			}
			r.closeParts()
			return nil, err
		}
	}
	r.popular = &popularityPublisher{rt: r.router, interval: opts.PopularityInterval, log: r.log}
	if r.reg != nil {
		r.popular.cli, r.popular.layout, r.popular.id, r.popular.lease = opts.Client, opts.Membership.Layout, opts.ID, r.reg.LeaseID
	} else {
		ep := staticEndpoint(opts)
		r.popular.static = &ep
	}
	r.popular.start()
	r.serve(r.data, netutil.LimitListener(r.dataLn, lim.MaxConns))
	adminLn := netutil.LimitListener(r.adminLn, lim.MaxConns)
	if adminTLS != nil {
		adminLn = tls.NewListener(adminLn, r.admin.TLSConfig)
	}
	r.serve(r.admin, adminLn)
	if opts.Admin.Token == "" && !isLoopback(r.adminLn.Addr()) {
		r.log.Warn("the admin listener is not loopback-only and has no --admin-token: anyone who reaches it can change routing", "admin", r.AdminAddr())
	}
	r.log.Info("router replica serving", "id", opts.ID, "addr", r.Addr(), "admin", r.AdminAddr(), "ext_proc", r.ExtProcAddr(), "endpoint", opts.Router.DefaultEndpoint, "etcd", opts.Client != nil, "tracing", r.tracing != nil)
	started = true
	return r, nil
}

// staticEndpoint is a static fleet's one endpoint.
func staticEndpoint(opts Options) fleet.Endpoint {
	return fleet.Endpoint{Name: opts.Router.DefaultEndpoint, Config: opts.Routing, Instances: opts.Static}
}

// connect starts the embedded etcd if asked and dials etcd unless the caller
// gave a client; the replica closes what it started.
func (r *Replica) connect() error {
	if r.opts.EmbeddedEtcdDir != "" {
		var eopts []membership.EmbeddedOption
		if t := r.opts.EmbeddedEtcdTLS; t.Cert != "" {
			eopts = append(eopts, membership.WithClientTLS(t.Cert, t.Key, t.ClientCA, t.ClientCA != ""))
		}
		emb, err := membership.StartEmbedded(r.opts.EmbeddedEtcdDir, r.opts.EmbeddedEtcdClientURL, eopts...)
		if err != nil {
			return fmt.Errorf("replica: starting embedded etcd: %w", err)
		}
		r.emb = emb
		r.log.Info("embedded etcd serving", "client_url", emb.ClientURL(), "dir", r.opts.EmbeddedEtcdDir)
		r.opts.Etcd.Endpoints = emb.Endpoints()
	}
	if r.opts.Client == nil {
		cli, err := membership.NewClient(r.opts.Etcd)
		if err != nil {
			r.closeEtcd()
			return fmt.Errorf("replica: connecting to etcd %v: %w", r.opts.Etcd.Endpoints, err)
		}
		r.ownCli, r.opts.Client = cli, cli
		if r.opts.Etcd.TLS() || r.opts.Etcd.Username != "" {
			// Credentials are checked now, so that wrong ones fail
			// start with their own message rather than as a missing
			// first snapshot.
			ctx, cancel := context.WithTimeout(context.Background(), cmp.Or(r.opts.Etcd.DialTimeout, membership.DefaultDialTimeout))
			_, err := cli.Get(ctx, r.opts.Membership.Layout.Root(), clientv3.WithPrefix(), clientv3.WithCountOnly())
			cancel()
			if err != nil {
				r.closeEtcd()
				return fmt.Errorf("replica: etcd %v refused this replica's credentials or did not answer (check --etcd-cacert, --etcd-cert, --etcd-key, --etcd-username): %w", r.opts.Etcd.Endpoints, err)
			}
		}
	}
	return nil
}

// closeEtcd closes the client and the embedded etcd this replica started.
func (r *Replica) closeEtcd() {
	if r.ownCli != nil {
		_ = r.ownCli.Close()
	}
	if r.emb != nil {
		_ = r.emb.Close()
	}
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

func (r *Replica) serve(srv *http.Server, ln net.Listener) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			r.log.Error("http server stopped", "addr", ln.Addr().String(), "err", err)
		}
	}()
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
	r.router.Drain()
	var errs []error
	if r.epp != nil {
		// Envoy's health checks steer new streams to other replicas
		// while this one deregisters and drains.
		r.epp.Drain()
	}
	if r.popular != nil {
		r.popular.Close() // before the lease goes: no write under a revoked one
	}
	if r.reg != nil {
		if err := r.reg.Close(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if err := r.data.Shutdown(ctx); err != nil {
		errs = append(errs, fmt.Errorf("replica: draining requests: %w", err))
		_ = r.data.Close()
	}
	if r.epp != nil {
		if err := r.epp.Close(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	r.stopAdmin(ctx)
	r.wg.Wait()
	r.closeParts()
	// Last: the spans of the requests just drained are flushed too.
	if err := r.tracing.Close(ctx); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (r *Replica) closeParts() {
	if r.watcher != nil {
		_ = r.watcher.Close()
	}
	_ = r.router.Close()
	if m := r.stale.Load(); m != nil {
		m.Close()
	}
	if r.data == nil {
		_ = r.dataLn.Close()
		_ = r.adminLn.Close()
	}
	if r.epp == nil && r.eppLn != nil {
		_ = r.eppLn.Close()
	}
	r.closeEtcd()
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
