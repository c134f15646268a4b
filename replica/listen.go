package replica

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/prefixrouter/prefixrouter/fleet"
)

// Defaults of the listener limits (issue 12): every connection is bounded in
// how long it may take to send a request, idle between requests, stall a
// response, and hold a stream; the number of connections is capped.
const (
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultBodyReadTimeout   = 60 * time.Second
	DefaultIdleTimeout       = 120 * time.Second
	DefaultMaxHeaderBytes    = 64 << 10
	DefaultMaxHeaderCount    = 100
	DefaultMaxConns          = 8192
	DefaultWriteIdleTimeout  = 60 * time.Second
	DefaultMaxStreamDuration = 30 * time.Minute
)

// Limits bound what one client connection may hold. Both listeners (data
// plane and admin) apply them. Zero values mean the defaults above.
type Limits struct {
	// ReadHeaderTimeout bounds reading a request's headers
	// (--read-header-timeout).
	ReadHeaderTimeout time.Duration
	// BodyReadTimeout bounds reading a request's body, from the end of its
	// headers (--body-read-timeout): a client that declares 6 MiB and sends
	// nothing is cut off then. Unlike http.Server's ReadTimeout it is
	// lifted once the body is read, so it never cuts a long response.
	BodyReadTimeout time.Duration
	// IdleTimeout closes a keep-alive connection that sends no new request
	// for this long (--idle-timeout).
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's header block (--max-header-bytes).
	MaxHeaderBytes int
	// MaxHeaderCount bounds a request's header fields (--max-header-count):
	// one more is answered 431 (issue 19: 10,006 fields were accepted and
	// forwarded). The default is Envoy's max_headers_count, 100; HAProxy's
	// is 101.
	MaxHeaderCount int
	// MaxConns caps the open connections of a listener (--max-connections);
	// beyond it new connections wait in the kernel's accept queue.
	MaxConns int
	// WriteIdleTimeout aborts a response whose client has read nothing for
	// this long (--write-idle-timeout): a stream to a client that stopped
	// reading releases its instance slot.
	WriteIdleTimeout time.Duration
	// MaxStreamDuration ends any request, streamed or not, this long after
	// it started (--max-stream-duration); the upstream call is cancelled.
	MaxStreamDuration time.Duration
}

func (l Limits) withDefaults() Limits {
	def := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&l.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	def(&l.BodyReadTimeout, DefaultBodyReadTimeout)
	def(&l.IdleTimeout, DefaultIdleTimeout)
	def(&l.WriteIdleTimeout, DefaultWriteIdleTimeout)
	def(&l.MaxStreamDuration, DefaultMaxStreamDuration)
	if l.MaxHeaderBytes == 0 {
		l.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if l.MaxHeaderCount == 0 {
		l.MaxHeaderCount = DefaultMaxHeaderCount
	}
	if l.MaxConns == 0 {
		l.MaxConns = DefaultMaxConns
	}
	return l
}

// validate appends one error per negative setting.
func (l Limits) validate(bad func(format string, args ...any)) {
	fleet.NonNegative(bad,
		fleet.Duration{Name: "Limits.ReadHeaderTimeout (--read-header-timeout)", Value: l.ReadHeaderTimeout},
		fleet.Duration{Name: "Limits.BodyReadTimeout (--body-read-timeout)", Value: l.BodyReadTimeout},
		fleet.Duration{Name: "Limits.IdleTimeout (--idle-timeout)", Value: l.IdleTimeout},
		fleet.Duration{Name: "Limits.WriteIdleTimeout (--write-idle-timeout)", Value: l.WriteIdleTimeout},
		fleet.Duration{Name: "Limits.MaxStreamDuration (--max-stream-duration)", Value: l.MaxStreamDuration},
	)
	if l.MaxHeaderBytes < 0 {
		bad("Limits.MaxHeaderBytes (--max-header-bytes) %d is negative", l.MaxHeaderBytes)
	}
	if l.MaxHeaderCount < 0 {
		bad("Limits.MaxHeaderCount (--max-header-count) %d is negative", l.MaxHeaderCount)
	}
	if l.MaxConns < 0 {
		bad("Limits.MaxConns (--max-connections) %d is negative", l.MaxConns)
	}
}

// guard applies the per-request limits around next: the header count, the
// body deadline, the stream's end, and the write-idle deadline.
func (l Limits) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if n := headerCount(req.Header); n > l.MaxHeaderCount {
			w.Header().Set("Connection", "close")
			refuse(w, http.StatusRequestHeaderFieldsTooLarge, "too_many_headers", fmt.Sprintf("the request has %d header fields, more than the limit of %d", n, l.MaxHeaderCount))
			return
		}
		rc := http.NewResponseController(w)
		now := time.Now()
		ctx, cancel := context.WithDeadline(req.Context(), now.Add(l.MaxStreamDuration))
		defer cancel()
		// A copy: net/http judges the request it read (its body's type
		// among others) after the handler. With its own body replaced,
		// it read up to 256 KiB of a body the handler had refused, so a
		// declared 50 MB that never came got its 413 only at the body
		// deadline (issue 19).
		req = req.WithContext(ctx)
		if req.Body != nil && req.Body != http.NoBody {
			// Errors mean the writer cannot set deadlines (HTTP/2 over
			// h2c streams can); then the server's own timeouts apply.
			if rc.SetReadDeadline(now.Add(l.BodyReadTimeout)) == nil {
				req.Body = &deadlineBody{ReadCloser: req.Body, rc: rc}
			}
		}
		gw := &guardWriter{ResponseWriter: w, rc: rc, idle: l.WriteIdleTimeout}
		gw.extend(now)
		next.ServeHTTP(gw, req)
	})
}

// headerCount counts a request's header fields (a repeated name counts each
// time; Host is not among them).
func headerCount(h http.Header) int {
	n := 0
	for _, vs := range h {
		n += len(vs)
	}
	return n
}

// deadlineBody lifts the read deadline once the body is read to its end, so
// that the server's background read (which notices a client hanging up)
// never times out and cancels a long response.
type deadlineBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	done bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if errors.Is(err, io.EOF) && !b.done {
		b.done = true
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

// guardWriter moves the connection's write deadline forward on every write
// and flush, so that only a client that reads nothing for WriteIdleTimeout
// makes a write fail (the proxy then aborts the stream and releases the
// instance's slot). The deadline is moved at most every idle/8, not on every
// write.
type guardWriter struct {
	http.ResponseWriter
	rc       *http.ResponseController
	idle     time.Duration
	extended atomic.Int64 // unix nanoseconds of the last move
}

func (g *guardWriter) extend(now time.Time) {
	if now.UnixNano()-g.extended.Load() < int64(g.idle/8) {
		return
	}
	g.extended.Store(now.UnixNano())
	_ = g.rc.SetWriteDeadline(now.Add(g.idle))
}

func (g *guardWriter) Write(p []byte) (int, error) {
	g.extend(time.Now())
	return g.ResponseWriter.Write(p)
}

func (g *guardWriter) WriteHeader(code int) {
	g.extend(time.Now())
	g.ResponseWriter.WriteHeader(code)
}

// Flush flushes through the ResponseController, which reports no error to
// http.Flusher callers; a failed flush shows on the next Write.
func (g *guardWriter) Flush() {
	g.extend(time.Now())
	_ = g.rc.Flush()
}

// FlushError is what http.ResponseController calls when asked to flush.
func (g *guardWriter) FlushError() error {
	g.extend(time.Now())
	return g.rc.Flush()
}

// Unwrap gives http.ResponseController the underlying writer.
func (g *guardWriter) Unwrap() http.ResponseWriter { return g.ResponseWriter }

// AdminSecurity secures the admin listener: TLS (and mTLS) for the port,
// a bearer token for gRPC calls. The zero value is plaintext without
// authentication, fit only for a loopback listener.
type AdminSecurity struct {
	// Token is the bearer token mutating gRPC calls need, and reads too
	// unless OpenReads (--admin-token; prefer $PREFIXROUTER_ADMIN_TOKEN).
	// Empty means no authentication.
	Token string
	// OpenReads lets gRPC reads through without the token
	// (--admin-open-reads).
	OpenReads bool
	// ListenerTLS is the port's TLS (--admin-tls-cert, --admin-tls-key,
	// --admin-client-ca), served to HTTP/1.1 and HTTP/2 by ALPN; without
	// it the port is plaintext (h2c). With ClientCA, a client without such
	// a certificate is refused in the handshake.
	ListenerTLS
}

func (a AdminSecurity) validate(bad func(format string, args ...any)) {
	a.ListenerTLS.validate(bad, "Admin", "admin")
	if a.OpenReads && a.Token == "" {
		bad("Admin.OpenReads (--admin-open-reads) only means something with --admin-token")
	}
}

// tlsConfig loads the admin port's TLS configuration, nil without TLS.
func (a AdminSecurity) tlsConfig() (*tls.Config, error) {
	return a.config("admin", "h2", "http/1.1")
}

// ListenerTLS is the TLS a listener serves, the same for the admin and the
// ext_proc listener: the zero value is plaintext.
type ListenerTLS struct {
	// TLSCert and TLSKey are the PEM certificate and key the listener
	// serves TLS with. Both or neither.
	TLSCert, TLSKey string
	// ClientCA, with TLS, is a PEM bundle of the CAs client certificates
	// must chain to: mTLS.
	ClientCA string
}

// validate reports a key without its certificate (or the reverse) and a
// client CA without TLS; field and flag name the listener as the options
// tree (Admin) and its flags (--admin-...) do.
func (l ListenerTLS) validate(bad func(format string, args ...any), field, flag string) {
	if (l.TLSCert == "") != (l.TLSKey == "") {
		bad("%s.TLSCert (--%s-tls-cert) and %s.TLSKey (--%s-tls-key) must be given together", field, flag, field, flag)
	}
	if l.ClientCA != "" && l.TLSCert == "" {
		bad("%s.ClientCA (--%s-client-ca) needs --%s-tls-cert and --%s-tls-key", field, flag, flag, flag)
	}
}

// config loads the listener's TLS configuration from its PEM files, nil
// without a certificate; with ClientCA, client certificates from it are
// required and verified (mTLS). what names the listener in errors.
func (l ListenerTLS) config(what string, protos ...string) (*tls.Config, error) {
	cert, key, clientCA := l.TLSCert, l.TLSKey, l.ClientCA
	if cert == "" {
		return nil, nil
	}
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		return nil, fmt.Errorf("replica: %s TLS certificate %s / key %s: %w", what, cert, key, err)
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{pair}, NextProtos: protos}
	if clientCA != "" {
		pem, err := os.ReadFile(clientCA)
		if err != nil {
			return nil, fmt.Errorf("replica: %s client CA: %w", what, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("replica: %s client CA %s holds no PEM certificate", what, clientCA)
		}
		tc.ClientCAs = pool
		tc.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return tc, nil
}

// ExtProcSecurity authenticates the ext_proc listener's peers (issue 19):
// only an authenticated peer's outcome reports (response status, the
// endpoint that served) reach the instances' breakers and slots. With a
// token or client certificates required, other peers are refused; with
// neither (the zero value), every peer is served picks but none is
// authenticated, so no report counts.
type ExtProcSecurity struct {
	// Token is the secret a peer sends as gRPC metadata "authorization:
	// Bearer <token>" (--ext-proc-token; prefer
	// $PREFIXROUTER_EXT_PROC_TOKEN to a flag). Empty means none.
	Token string
	// ListenerTLS is the listener's TLS (--ext-proc-tls-cert,
	// --ext-proc-tls-key); with ClientCA (--ext-proc-client-ca), mTLS.
	ListenerTLS
}

func (e ExtProcSecurity) validate(bad func(format string, args ...any)) {
	e.ListenerTLS.validate(bad, "ExtProc", "ext-proc")
}
