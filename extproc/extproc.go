// Package extproc serves Envoy's external processing protocol
// (envoy.service.ext_proc.v3.ExternalProcessor) as an endpoint picker of the
// Gateway API Inference Extension (its endpoint-picker protocol v1; see
// docs/envoy.md): Envoy asks which instance should serve each request, and
// the answer is the router's own pick.
package extproc

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
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
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

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

// Picker is the view of the data plane the server needs: where a request
// goes, and the bounded buffers its body waits in until then (issue 19);
// *router.Router implements it.
type Picker interface {
	Pick(router.PickRequest) (*router.Picked, error)
	HoldBody(ctx context.Context, path string, declared int64) *router.HeldBody
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
	// Token, when set, is the secret a peer presents in the gRPC metadata
	// "authorization: Bearer <token>" (Envoy's grpc_service
	// initial_metadata) to be served (--ext-proc-token); a stream without
	// it is refused, UNAUTHENTICATED. Empty means no token is asked for.
	Token string
	// TLS, when set, serves the listener over TLS (--ext-proc-tls-cert,
	// --ext-proc-tls-key); with client certificates required and verified
	// (--ext-proc-client-ca), a peer with one is authenticated. Nil means
	// cleartext HTTP/2.
	TLS *tls.Config
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
	o.ReadyInterval = cmp.Or(o.ReadyInterval, DefaultReadyInterval)
	o.MaxCandidates = cmp.Or(o.MaxCandidates, DefaultMaxCandidates)
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
		grpc:   grpc.NewServer(serverOptions(opts)...),
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

// serverOptions are the gRPC server's: WaitForHandlers, so that Stop
// returns only once every Process call has returned (every in-flight slot
// is released by then); fixed flow-control windows; and TLS when set.
func serverOptions(opts Options) []grpc.ServerOption {
	o := []grpc.ServerOption{grpc.WaitForHandlers(true),
		// Fixed windows (which turn off gRPC's BDP estimation, whose
		// windows grow to 16 MiB a stream): a stream whose body waits
		// for room in the router's body buffer has at most streamWindow
		// bytes buffered, and a proxy's connection at most connWindow
		// (issue 19: 64 streams of 6 MiB bodies took +1 GiB RSS in the
		// transport's buffers).
		grpc.InitialWindowSize(streamWindow), grpc.InitialConnWindowSize(connWindow)}
	if opts.TLS != nil {
		tc := opts.TLS.Clone()
		tc.NextProtos = []string{"h2"}
		o = append(o, grpc.Creds(credentials.NewTLS(tc)))
	}
	return o
}

// Flow-control windows of the ext_proc server (serverOptions).
const (
	streamWindow = 256 << 10
	connWindow   = 4 << 20
)

// Peers and their outcome reports (issue 19: the ext_proc port had no
// authentication, and 17 forged "served with :status 500" reports opened
// every breaker). A stream's response status and served-endpoint report
// move the instance's breaker and in-flight slot only when its peer is
// authenticated: by a verified client certificate (mTLS) or the token.
// When a token or client certificates are required, other peers are
// refused; when neither is configured, every peer is served but none is
// authenticated: picks work, outcomes release the slot without judging the
// instance (its health checks and the HTTP data plane still do).

// authRequired reports whether unauthenticated peers are refused.
func (s *Server) authRequired() bool {
	return s.opts.Token != "" || (s.opts.TLS != nil && s.opts.TLS.ClientAuth == tls.RequireAndVerifyClientCert)
}

// authenticated reports whether the peer of ctx presented a verified client
// certificate or the token.
func (s *Server) authenticated(ctx context.Context) bool {
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.VerifiedChains) > 0 {
			return true
		}
	}
	if s.opts.Token == "" {
		return false
	}
	want := sha256.Sum256([]byte("Bearer " + s.opts.Token))
	for _, v := range metadata.ValueFromIncomingContext(ctx, "authorization") {
		got := sha256.Sum256([]byte(v))
		if subtle.ConstantTimeCompare(got[:], want[:]) == 1 {
			return true
		}
	}
	return false
}

// processor adapts the Server to the generated service interface.
type processor struct{ s *Server }

func (p processor) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	trusted := p.s.authenticated(srv.Context())
	if !trusted && p.s.authRequired() {
		return status.Error(codes.Unauthenticated, "extproc: this endpoint picker requires a client certificate or the token (authorization: Bearer)")
	}
	st := &stream{s: p.s, srv: srv, header: http.Header{}, trusted: trusted}
	defer st.finish()
	return st.run()
}
