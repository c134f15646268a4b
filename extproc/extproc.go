// Package extproc serves Envoy's external processing protocol
// (envoy.service.ext_proc.v3.ExternalProcessor) as an endpoint picker of the
// Gateway API Inference Extension (its endpoint-picker protocol v1; see
// docs/envoy.md): Envoy asks which instance should serve each request, and
// the answer is the router's own pick.
package extproc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/jonboulle/clockwork"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/prefixrouter/prefixrouter/router"
)

// Names of the gRPC health services, as GIE's protocol defines them.
const (
	HealthLiveness  = "liveness"
	HealthReadiness = "readiness"
	// HealthExtProc is the ext_proc service's own name; it reports readiness.
	HealthExtProc = "envoy.service.ext_proc.v3.ExternalProcessor"
)

// Defaults of Options.
const (
	DefaultMaxCandidates = 4
	DefaultReadyInterval = time.Second
)

// Picker is the one-method view of the data plane the server needs;
// *router.Router implements it.
type Picker interface {
	Pick(router.PickRequest) (*router.Picked, error)
}

var _ Picker = (*router.Router)(nil)

// Options configures a Server. Zero values mean the documented defaults.
type Options struct {
	// Picker chooses instances. Required.
	Picker Picker
	// Ready reports readiness for the readiness and ext_proc health
	// services (the router's Ready); nil means always ready.
	Ready func() error
	// ReadyInterval is how often Ready is consulted; zero means
	// DefaultReadyInterval.
	ReadyInterval time.Duration
	// MaxCandidates bounds the endpoints listed in
	// x-gateway-destination-endpoint (the admitted one, then fallbacks in
	// the key's ring order); zero means DefaultMaxCandidates.
	MaxCandidates int
	// TracerProvider, if set, records a span per picked request (parent:
	// the traceparent Envoy forwards) with the router's attributes; nil
	// means off.
	TracerProvider trace.TracerProvider
	// Clock drives the readiness refresh; nil means the real clock.
	Clock clockwork.Clock
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

func (o *Options) withDefaults() error {
	if o.Picker == nil {
		return errors.New("extproc: Options.Picker is required")
	}
	if o.ReadyInterval < 0 || o.MaxCandidates < 0 {
		return fmt.Errorf("extproc: ReadyInterval %v and MaxCandidates %d must not be negative", o.ReadyInterval, o.MaxCandidates)
	}
	if o.ReadyInterval == 0 {
		o.ReadyInterval = DefaultReadyInterval
	}
	if o.MaxCandidates == 0 {
		o.MaxCandidates = DefaultMaxCandidates
	}
	if o.Clock == nil {
		o.Clock = clockwork.NewRealClock()
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return nil
}

// Server is a running endpoint picker: the ext_proc service and gRPC health
// on one listener.
type Server struct {
	opts   Options
	log    *slog.Logger
	tracer trace.Tracer // nil when tracing is off
	grpc   *grpc.Server
	health *health.Server
	ln     net.Listener

	stop chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

// Start serves the endpoint picker on ln until Close.
func Start(ln net.Listener, opts Options) (*Server, error) {
	if err := opts.withDefaults(); err != nil {
		return nil, err
	}
	s := &Server{
		opts: opts, log: opts.Logger, ln: ln, stop: make(chan struct{}),
		// WaitForHandlers: Stop returns only once every Process call has
		// returned, so every in-flight slot is released by then.
		grpc:   grpc.NewServer(grpc.WaitForHandlers(true)),
		health: health.NewServer(),
	}
	if opts.TracerProvider != nil {
		s.tracer = opts.TracerProvider.Tracer("github.com/prefixrouter/prefixrouter/extproc")
	}
	extprocv3.RegisterExternalProcessorServer(s.grpc, processor{s})
	healthpb.RegisterHealthServer(s.grpc, s.health)
	s.health.SetServingStatus(HealthLiveness, healthpb.HealthCheckResponse_SERVING)
	s.refreshReady()
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		s.readyLoop()
	}()
	go func() {
		defer s.wg.Done()
		if err := s.grpc.Serve(ln); err != nil {
			s.log.Error("extproc: server stopped", "addr", ln.Addr().String(), "err", err)
		}
	}()
	return s, nil
}

// Addr is the listener's address.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Drain turns every health service NOT_SERVING for good, so that Envoy's
// health checks steer new requests to other replicas; streams keep being
// served.
func (s *Server) Drain() { s.health.Shutdown() }

// Close drains, waits up to ctx's deadline for the streams in flight to end,
// then cuts the rest; every slot they held is released before it returns.
func (s *Server) Close(ctx context.Context) error {
	var err error
	s.once.Do(func() {
		s.Drain()
		close(s.stop)
		stopped := make(chan struct{})
		go func() {
			s.grpc.GracefulStop()
			close(stopped)
		}()
		select {
		case <-stopped:
		case <-ctx.Done():
			err = fmt.Errorf("extproc: draining streams: %w", ctx.Err())
			s.grpc.Stop()
			<-stopped
		}
		s.wg.Wait()
	})
	return err
}

// readyLoop refreshes readiness every ReadyInterval until Close.
func (s *Server) readyLoop() {
	t := s.opts.Clock.NewTicker(s.opts.ReadyInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.Chan():
			s.refreshReady()
		}
	}
}

// refreshReady publishes Ready's verdict on the readiness, ext_proc and
// overall ("") health services.
func (s *Server) refreshReady() {
	st := healthpb.HealthCheckResponse_SERVING
	if s.opts.Ready != nil {
		if err := s.opts.Ready(); err != nil {
			st = healthpb.HealthCheckResponse_NOT_SERVING
		}
	}
	for _, name := range []string{"", HealthReadiness, HealthExtProc} {
		s.health.SetServingStatus(name, st)
	}
}

// processor adapts the Server to the generated service interface.
type processor struct{ s *Server }

func (p processor) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	st := &stream{s: p.s, srv: srv, header: http.Header{}}
	defer st.finish()
	return st.run()
}
