package admin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/auth"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/selector"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/prefixrouter/prefixrouter/admin/adminpb"
	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/overload"
	"github.com/prefixrouter/prefixrouter/router"
)

// SnapshotSource gives the fleet snapshot the router routes with now (nil
// before the first one). The router's Snapshot method satisfies it.
type SnapshotSource interface {
	Snapshot() *fleet.Snapshot
}

// StatusSource reports an instance's live status on this replica; ok is
// false when the replica keeps none for it (yet). The router's Status method
// satisfies it.
type StatusSource interface {
	Status(endpoint, id string) (st overload.Status, ok bool)
}

// ConfigStore reads and writes endpoints' routing configurations (etcd, via
// membership.GetConfig and membership.PutConfig). GetConfig returns the
// normalized configuration, or the defaults and set == false when none is
// stored. Errors wrapping fleet.ErrInvalidConfig are the caller's fault on
// PutConfig and a bad stored value on GetConfig.
type ConfigStore interface {
	GetConfig(ctx context.Context, endpoint string) (c fleet.RoutingConfig, set bool, err error)
	PutConfig(ctx context.Context, endpoint string, c fleet.RoutingConfig) error
}

// AdapterStore reads and writes endpoints' adapter catalogues (etcd, via
// membership.ListAdapters, PutAdapter and DeleteAdapter). Errors wrap
// fleet.ErrInvalid for invalid input and fleet.ErrAdapterNotFound for
// a delete of an adapter not catalogued.
type AdapterStore interface {
	ListAdapters(ctx context.Context, endpoint string) ([]fleet.Adapter, error)
	PutAdapter(ctx context.Context, endpoint string, a fleet.Adapter) error
	DeleteAdapter(ctx context.Context, endpoint, name string) error
}

// Explainer computes where a request would go with no load, without sending
// it: the router's routing sequence without admission (router.Explain).
// Its errors carry the sequence's class (router.ErrUnknownEndpoint,
// router.ErrInvalidRequest, lora.ErrUnknownModel, lora.ErrModelNotReady,
// fleet.ErrNoInstance), which ExplainRoute maps to gRPC codes.
type Explainer interface {
	Explain(ctx context.Context, req router.PickRequest) (router.Explanation, error)
}

var _ Explainer = (*router.Router)(nil)

// Options configure a Server. Snapshots and Ready are required.
type Options struct {
	// Snapshots gives the current fleet snapshot. Required.
	Snapshots SnapshotSource
	// Statuses adds each instance's live status to GetFleet; nil leaves it
	// out.
	Statuses StatusSource
	// Configs stores routing configurations; nil means the router runs
	// without etcd (static fleet): SetRoutingConfig answers Unavailable and
	// GetRoutingConfig answers from the snapshot.
	Configs ConfigStore
	// Adapters stores adapter catalogues; nil (a static fleet) makes the
	// adapter calls answer Unavailable.
	Adapters AdapterStore
	// Explainer serves ExplainRoute; nil makes it answer Unimplemented.
	Explainer Explainer
	// Overrides lists the settings given to this replica (its `serve`
	// flags) that an endpoint's routing config replaces, for GetFleet; nil
	// means none.
	Overrides func(cfg fleet.Resolved) []fleet.Override
	// Ready reports readiness for the gRPC health service: the router's
	// Ready, the rule /readyz applies too (router.Readiness). Required.
	Ready func() error
	// ReadyInterval is how often the health status is refreshed for Watch
	// streams (Check always evaluates Ready afresh). Zero means 1s.
	ReadyInterval time.Duration
	// Registry receives the gRPC server metrics (grpc_server_handled_total,
	// grpc_server_handling_seconds, ...). Nil means the metrics are kept
	// but not exported.
	Registry *prometheus.Registry
	// Logger logs every admin call and recovered panics. Nil discards.
	Logger *slog.Logger
	// Now is the clock for snapshot ages. Nil means time.Now.
	Now func() time.Time
	// Token, when set, is the bearer token (gRPC metadata "authorization:
	// Bearer <token>") every mutating call needs, and every read unless
	// OpenReads. Empty means no authentication: anyone who reaches the
	// port may change routing, so set it wherever the admin listener is not
	// loopback-only. The health service never needs it.
	Token string
	// OpenReads lets reads (GetFleet, GetRoutingConfig, ExplainRoute,
	// ListAdapters, reflection) through without the token.
	OpenReads bool
	// ServerOptions are appended to the grpc.Server's options (TLS
	// credentials, message sizes, ...).
	ServerOptions []grpc.ServerOption
}

// Server is the admin gRPC server: the Admin service, the standard health
// service reflecting readiness, and server reflection. Stop or GracefulStop
// it to release its goroutines.
type Server struct {
	grpc   *grpc.Server
	health *health.Server
	svc    *service
	ready  func() error

	stopOnce sync.Once
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	// stopping is closed when a stop begins, to end health Watch streams.
	stopping chan struct{}
}

// NewServer builds the server and registers its metrics on o.Registry. It
// fails when o.Snapshots or o.Ready is nil or the metrics are already
// registered.
func NewServer(o Options) (*Server, error) {
	if o.Snapshots == nil {
		return nil, errors.New("admin: Options.Snapshots is required")
	}
	if o.Ready == nil {
		return nil, errors.New("admin: Options.Ready is required")
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.ReadyInterval <= 0 {
		o.ReadyInterval = time.Second
	}
	s := &Server{svc: &service{o: o}, ready: o.Ready, stopping: make(chan struct{})}

	metrics := grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram())
	if o.Registry != nil {
		if err := o.Registry.Register(metrics); err != nil {
			return nil, fmt.Errorf("admin: register metrics: %w", err)
		}
	}
	logger := interceptorLogger(o.Logger)
	// Health probes arrive every few seconds from load balancers, and
	// grpcurl opens a reflection stream per command: logging them would
	// drown the admin calls.
	notHealth := selector.MatchFunc(func(_ context.Context, c interceptors.CallMeta) bool {
		return c.Service != healthpb.Health_ServiceDesc.ServiceName && !strings.HasPrefix(c.Service, "grpc.reflection.")
	})
	rec := recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		o.Logger.ErrorContext(ctx, "admin: panic in handler", "panic", p, "stack", string(debug.Stack()))
		return status.Error(codes.Internal, "admin: internal error")
	})
	// Order: metrics outermost so that they count the code a recovered panic
	// (or a refused token) turns into; then the token check, so that a
	// refused call runs nothing; recovery innermost.
	unary := []grpc.UnaryServerInterceptor{metrics.UnaryServerInterceptor()}
	stream := []grpc.StreamServerInterceptor{metrics.StreamServerInterceptor()}
	if o.Token != "" {
		az := authorizer{token: []byte(o.Token), openReads: o.OpenReads}
		guarded := selector.MatchFunc(func(_ context.Context, c interceptors.CallMeta) bool { return !isHealth(c.FullMethod()) })
		unary = append(unary, selector.UnaryServerInterceptor(auth.UnaryServerInterceptor(az.authorize), guarded))
		stream = append(stream, selector.StreamServerInterceptor(auth.StreamServerInterceptor(az.authorize), guarded))
	}
	unary = append(unary,
		selector.UnaryServerInterceptor(logging.UnaryServerInterceptor(logger, logging.WithLogOnEvents(logging.FinishCall)), notHealth),
		recovery.UnaryServerInterceptor(rec))
	stream = append(stream,
		selector.StreamServerInterceptor(logging.StreamServerInterceptor(logger, logging.WithLogOnEvents(logging.FinishCall)), notHealth),
		recovery.StreamServerInterceptor(rec))
	opts := append([]grpc.ServerOption{grpc.ChainUnaryInterceptor(unary...), grpc.ChainStreamInterceptor(stream...)}, o.ServerOptions...)
	s.grpc = grpc.NewServer(opts...)
	adminpb.RegisterAdminServer(s.grpc, s.svc)
	s.health = health.NewServer()
	healthpb.RegisterHealthServer(s.grpc, &readyHealth{Server: s.health, s: s})
	reflection.Register(s.grpc)
	metrics.InitializeMetrics(s.grpc)

	s.updateHealth()
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.wg.Add(1)
	go s.watchReady(ctx, o.ReadyInterval)
	return s, nil
}

// Serve accepts connections on l until Stop or GracefulStop; it returns nil
// after a stop, like grpc.Server.Serve.
func (s *Server) Serve(l net.Listener) error {
	if err := s.grpc.Serve(l); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// GRPC returns the underlying grpc.Server, for callers that multiplex it with
// HTTP on one port (it is an http.Handler for HTTP/2 requests).
func (s *Server) GRPC() *grpc.Server { return s.grpc }

// GracefulStop marks the health service NOT_SERVING (health Watch streams
// receive it and then end), stops accepting, and waits for pending calls to
// finish. To bound the wait, call Stop from another goroutine after a timeout.
func (s *Server) GracefulStop() {
	s.stopReady()
	s.grpc.GracefulStop()
}

// Drain marks the health service NOT_SERVING and ends health Watch streams
// (with UNAVAILABLE, after they received NOT_SERVING) without closing any
// connection. It is for servers multiplexed through GRPC().ServeHTTP: there
// GracefulStop cannot wait for pending calls (a ServeHTTP transport's drain
// cancels them), so the HTTP server's Shutdown waits for them instead, and a
// Watch would hold that Shutdown until its deadline. Call GracefulStop or
// Stop afterwards to release the server's goroutines.
func (s *Server) Drain() { s.stopReady() }

// Stop closes every connection and listener at once.
func (s *Server) Stop() {
	s.stopReady()
	s.grpc.Stop()
}

func (s *Server) stopReady() {
	s.stopOnce.Do(func() {
		s.cancel()
		s.wg.Wait()
		close(s.stopping)
		// Shutdown sets NOT_SERVING and ignores later updates, so that
		// watchers see the replica go away before the connection closes.
		s.health.Shutdown()
	})
}

// watchReady refreshes the health status so that Watch streams see
// readiness change.
func (s *Server) watchReady(ctx context.Context, every time.Duration) {
	defer s.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.updateHealth()
		}
	}
}

// updateHealth sets the overall ("") and the Admin service's status from Ready.
func (s *Server) updateHealth() {
	st := healthpb.HealthCheckResponse_SERVING
	if s.ready() != nil {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	s.health.SetServingStatus("", st)
	s.health.SetServingStatus(adminpb.Admin_ServiceDesc.ServiceName, st)
}

var _ healthpb.HealthServer = (*readyHealth)(nil)

// readyHealth evaluates readiness on every Check, so that a probe never sees
// a status up to ReadyInterval old.
type readyHealth struct {
	*health.Server
	s *Server
}

func (h *readyHealth) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	h.s.updateHealth()
	return h.Server.Check(ctx, req)
}

// Watch ends the stream once the client knows the server is stopping: a
// Watch otherwise lasts until the client hangs up, and GracefulStop would
// wait for it forever.
func (h *readyHealth) Watch(req *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	ws := &watchStream{Health_WatchServer: stream, ctx: ctx, cancel: cancel, stopping: h.s.stopping}
	ws.last.Store(-1)
	go func() {
		select {
		case <-h.s.stopping:
			// A client that was not told SERVING last learns nothing
			// new from Shutdown's NOT_SERVING (Watch skips repeats).
			if healthpb.HealthCheckResponse_ServingStatus(ws.last.Load()) != healthpb.HealthCheckResponse_SERVING {
				cancel()
			}
		case <-ctx.Done():
		}
	}()
	err := h.Server.Watch(req, ws)
	if stream.Context().Err() == nil && ctx.Err() != nil {
		return status.Error(codes.Unavailable, "admin: server stopping")
	}
	return err
}

// watchStream cancels its context after sending a non-SERVING status once
// the server is stopping.
type watchStream struct {
	healthpb.Health_WatchServer
	ctx      context.Context
	cancel   context.CancelFunc
	stopping <-chan struct{}
	last     atomic.Int32 // last status sent (or being sent), -1 before the first
}

func (w *watchStream) Context() context.Context { return w.ctx }

func (w *watchStream) Send(m *healthpb.HealthCheckResponse) error {
	// Record the status before sending it: Send can return after the
	// client has already read the message and stopped the server, and the
	// stop must then know the client was told SERVING (or it ends the
	// stream before Shutdown's NOT_SERVING goes out).
	w.last.Store(int32(m.GetStatus()))
	err := w.Health_WatchServer.Send(m)
	select {
	case <-w.stopping:
		if m.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			w.cancel()
		}
	default:
	}
	return err
}

// interceptorLogger adapts slog to the middleware's logger.
func interceptorLogger(l *slog.Logger) logging.Logger {
	return logging.LoggerFunc(func(ctx context.Context, lvl logging.Level, msg string, fields ...any) {
		l.Log(ctx, slog.Level(lvl), msg, fields...)
	})
}
