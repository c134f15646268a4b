// Package replica assembles one router replica: the data-plane router, its
// fleet source (a static fleet or an etcd watcher), its own registration under
// routers/, the data-plane listener, and the admin listener (metrics, probes
// and the gRPC admin API on one port). `prefixrouter serve`, the demo and the
// chaos suite all start replicas through it, so they run the same code.
package replica

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/prefixrouter/prefixrouter/admin"
	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/lora"
	"github.com/prefixrouter/prefixrouter/membership"
	"github.com/prefixrouter/prefixrouter/overload"
	"github.com/prefixrouter/prefixrouter/router"
)

// Version is reported in the replica's etcd record.
var Version = "dev"

// Config configures a replica. Exactly one fleet source must be set: Static
// instances, or an etcd Client.
type Config struct {
	// ID names the replica under routers/; required with etcd.
	ID string
	// Listen and AdminListen are the data-plane and admin addresses; port 0
	// picks a free port (see Replica.Addr). The admin listener serves
	// /metrics, /readyz and /healthz over HTTP/1.1 and the gRPC admin API
	// (docs/admin-api.md) over cleartext HTTP/2.
	Listen, AdminListen string
	// Endpoint is the default endpoint of /invocations and /v1/*.
	Endpoint string
	// Static, when non-empty, is a fixed fleet for Endpoint with routing
	// config Routing; no etcd is used. With etcd, Routing is the config of
	// every endpoint whose config key is not set.
	Static  []fleet.Instance
	Routing fleet.RoutingConfig
	// Client reaches etcd; the replica does not close it.
	Client *clientv3.Client
	// Membership carries the etcd layout, lease TTL and logger.
	Membership membership.Options
	// MaxBodyBytes, Breaker, LoadPollInterval: see router.Options.
	MaxBodyBytes     int64
	Breaker          overload.BreakerSettings
	LoadPollInterval time.Duration
	// BalanceFactor bounds each instance's load to this multiple of its
	// set's average under PREFIX_AWARE (0: off); see router.Options.
	BalanceFactor float64
	// StaleAfter: see router.Options (it only shapes the /readyz message).
	StaleAfter time.Duration
	// Logger; nil means slog.Default().
	Logger *slog.Logger
	// Registry for metrics; nil means a new one with Go and process collectors.
	Registry *prometheus.Registry
	// Transport for upstream requests; nil means router.NewTransport with
	// UpstreamHeaderTimeout.
	Transport http.RoundTripper
	// UpstreamHeaderTimeout bounds the wait for an instance's response
	// headers (0: no bound). A timeout counts against the instance's
	// breaker; the client gets the router's error answer.
	UpstreamHeaderTimeout time.Duration
	// HealthCheckInterval, HealthCheckPath and HealthCheckTimeout configure
	// active health checks; see router.Options (interval 0: off).
	HealthCheckInterval time.Duration
	HealthCheckPath     string
	HealthCheckTimeout  time.Duration
}

// Replica is a running router replica.
type Replica struct {
	cfg      Config
	log      *slog.Logger
	registry *prometheus.Registry
	router   *router.Router
	watcher  *membership.Watcher
	reg      *membership.Registration
	data     *http.Server
	admin    *http.Server
	adminRPC *admin.Server
	dataLn   net.Listener
	adminLn  net.Listener
	wg       sync.WaitGroup
	closeMu  sync.Mutex
	closed   bool
}

// Start starts a replica and returns once it listens and, with etcd, has its
// first snapshot (or ctx ends).
func Start(ctx context.Context, cfg Config) (*Replica, error) {
	if (len(cfg.Static) == 0) == (cfg.Client == nil) {
		return nil, errors.New("replica: exactly one of a static fleet or an etcd client is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
		cfg.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	if err := cfg.Routing.Validate(); err != nil {
		return nil, err
	}
	if cfg.UpstreamHeaderTimeout < 0 {
		return nil, fmt.Errorf("replica: negative upstream header timeout %v", cfg.UpstreamHeaderTimeout)
	}
	if cfg.Transport == nil {
		cfg.Transport = router.NewTransport(cfg.UpstreamHeaderTimeout)
	}
	r := &Replica{cfg: cfg, log: cfg.Logger, registry: cfg.Registry}
	// The watcher starts after the router (it feeds it), so readiness
	// reads its age through r; nil for a static fleet, which has no age.
	var snapshotAge func() time.Duration
	if cfg.Client != nil {
		snapshotAge = func() time.Duration { return r.watcher.SnapshotAge() }
	}
	var err error
	r.router, err = router.New(router.Options{
		DefaultEndpoint:  cfg.Endpoint,
		MaxBodyBytes:     cfg.MaxBodyBytes,
		Registry:         cfg.Registry,
		Logger:           cfg.Logger,
		Transport:        cfg.Transport,
		Breaker:          cfg.Breaker,
		LoadPollInterval: cfg.LoadPollInterval,
		BalanceFactor:    cfg.BalanceFactor,
		StaleAfter:       cfg.StaleAfter,
		SnapshotAge:      snapshotAge,

		HealthCheckInterval: cfg.HealthCheckInterval,
		HealthCheckPath:     cfg.HealthCheckPath,
		HealthCheckTimeout:  cfg.HealthCheckTimeout,
	})
	if err != nil {
		return nil, err
	}
	if r.dataLn, err = net.Listen("tcp", cfg.Listen); err != nil {
		r.router.Close()
		return nil, fmt.Errorf("replica: listen %s: %w", cfg.Listen, err)
	}
	if r.adminLn, err = net.Listen("tcp", cfg.AdminListen); err != nil {
		r.dataLn.Close()
		r.router.Close()
		return nil, fmt.Errorf("replica: admin listen %s: %w", cfg.AdminListen, err)
	}

	if len(cfg.Static) > 0 {
		r.router.Update(fleet.NewSnapshot([]fleet.Endpoint{{Name: cfg.Endpoint, Config: cfg.Routing, Instances: cfg.Static}}, 0, 1, time.Now()))
	} else {
		mopts := cfg.Membership
		if mopts.Logger == nil {
			mopts.Logger = cfg.Logger
		}
		if mopts.Metrics == nil {
			mopts.Metrics = membership.NewMetrics(cfg.Registry)
		}
		// Routing is the default of endpoints with no config key in etcd.
		r.watcher = membership.StartWatcher(cfg.Client, membership.WatcherOptions{Options: mopts, DefaultConfig: cfg.Routing}, r.router.Update)
		select {
		case <-r.watcher.Synced():
		case <-ctx.Done():
			r.closeParts()
			return nil, fmt.Errorf("replica: waiting for the first fleet snapshot: %w", ctx.Err())
		}
		r.reg, err = membership.RegisterRouter(ctx, cfg.Client, cfg.ID, membership.RouterInfo{Addr: r.dataLn.Addr().String(), Version: Version}, mopts)
		if err != nil {
			r.closeParts()
			return nil, fmt.Errorf("replica: registering under routers/: %w", err)
		}
	}

	aopts := admin.Options{
		Snapshots: r.router,
		Statuses:  r.router,
		Explainer: explainer{r.router},
		Ready:     r.router.Ready,
		Registry:  cfg.Registry,
		Logger:    cfg.Logger,
	}
	if cfg.Client != nil {
		aopts.Configs = configStore{cli: cfg.Client, layout: cfg.Membership.Layout}
	}
	if r.adminRPC, err = admin.NewServer(aopts); err != nil {
		if r.reg != nil {
			_ = r.reg.Close(ctx)
		}
		r.closeParts()
		return nil, err
	}

	r.data = &http.Server{Handler: r.router, ReadHeaderTimeout: 30 * time.Second, ErrorLog: slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn)}
	adminMux := http.NewServeMux()
	adminMux.Handle("GET /metrics", promhttp.HandlerFor(cfg.Registry, promhttp.HandlerOpts{Registry: cfg.Registry}))
	adminMux.HandleFunc("GET /readyz", r.router.ServeReadyz)
	adminMux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	// One port for both: gRPC clients speak HTTP/2 with prior knowledge
	// (h2c), curl and Prometheus HTTP/1.1.
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	grpcSrv := r.adminRPC.GRPC()
	r.admin = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if req.ProtoMajor == 2 && strings.HasPrefix(req.Header.Get("Content-Type"), "application/grpc") {
				grpcSrv.ServeHTTP(w, req)
				return
			}
			adminMux.ServeHTTP(w, req)
		}),
		Protocols:         &protos,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn),
	}
	r.serve(r.data, r.dataLn)
	r.serve(r.admin, r.adminLn)
	r.log.Info("router replica serving", "id", cfg.ID, "addr", r.Addr(), "admin", r.AdminAddr(), "endpoint", cfg.Endpoint, "etcd", cfg.Client != nil)
	return r, nil
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

// Addr is the data-plane address (host:port).
func (r *Replica) Addr() string { return r.dataLn.Addr().String() }

// AdminAddr is the admin address (host:port): metrics, probes and the gRPC
// admin API.
func (r *Replica) AdminAddr() string { return r.adminLn.Addr().String() }

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
	var errs []error
	if r.reg != nil {
		if err := r.reg.Close(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if err := r.data.Shutdown(ctx); err != nil {
		errs = append(errs, fmt.Errorf("replica: draining requests: %w", err))
		_ = r.data.Close()
	}
	r.stopAdmin(ctx)
	r.wg.Wait()
	r.closeParts()
	return errors.Join(errs...)
}

func (r *Replica) closeParts() {
	if r.watcher != nil {
		_ = r.watcher.Close()
	}
	_ = r.router.Close()
	if r.data == nil {
		_ = r.dataLn.Close()
		_ = r.adminLn.Close()
	}
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

// configStore reads and writes routing configs in etcd; every replica
// (this one included) applies a write through its watcher.
type configStore struct {
	cli    *clientv3.Client
	layout membership.Layout
}

func (c configStore) GetConfig(ctx context.Context, endpoint string) (fleet.RoutingConfig, bool, error) {
	return membership.GetConfig(ctx, c.cli, c.layout, endpoint)
}

func (c configStore) PutConfig(ctx context.Context, endpoint string, rc fleet.RoutingConfig) error {
	return membership.PutConfig(ctx, c.cli, c.layout, endpoint, rc)
}

// explainer serves ExplainRoute from the router, classifying its errors into
// the admin API's.
type explainer struct{ r *router.Router }

func (e explainer) Explain(ctx context.Context, endpoint, path string, header http.Header, body []byte) (admin.Explanation, error) {
	if err := ctx.Err(); err != nil {
		return admin.Explanation{}, err
	}
	ex, err := e.r.Explain(endpoint, path, header, body)
	if err != nil {
		return admin.Explanation{}, classifyExplainError(err)
	}
	return admin.Explanation{
		Strategy: ex.Strategy, Instance: ex.Instance, Candidates: ex.Candidates, Key: ex.Key,
		Model: ex.Model, Tenant: ex.Tenant, PrefixLength: ex.PrefixLength,
	}, nil
}

func classifyExplainError(err error) error {
	var kind error
	switch {
	case errors.Is(err, router.ErrUnknownEndpoint), errors.Is(err, lora.ErrUnknownModel):
		kind = admin.ErrNotFound
	case errors.Is(err, router.ErrInvalidRequest):
		kind = admin.ErrInvalidRequest
	case errors.Is(err, router.ErrNoInstance), errors.Is(err, lora.ErrNoInstance):
		kind = admin.ErrNoInstance
	default:
		return err
	}
	return &classifiedError{err: err, kind: kind}
}

// classifiedError keeps the router's message and adds the admin sentinel
// for errors.Is.
type classifiedError struct{ err, kind error }

func (e *classifiedError) Error() string   { return e.err.Error() }
func (e *classifiedError) Unwrap() []error { return []error{e.kind, e.err} }
