package membership

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// DefaultClientURL is where an embedded etcd serves clients unless told
// otherwise: etcd's own default, so that other tools find it.
const DefaultClientURL = "http://127.0.0.1:2379"

// embeddedStartTimeout bounds how long StartEmbedded waits for the member to
// become ready (elect itself and apply its first entries).
const embeddedStartTimeout = 30 * time.Second

// Embedded is a single-member etcd running inside this process. It is meant
// for the demo, a single-box deployment and tests; production uses a real
// etcd cluster.
type Embedded struct {
	etcd      *embed.Etcd
	closing   *atomic.Bool
	closeOnce sync.Once
	dir       string
	clientURL string
	peerAddr  string // host:port the member listens on for peers
	opts      embeddedOptions
}

// EmbeddedOption tunes StartEmbedded.
type EmbeddedOption func(*embeddedOptions)

type embeddedOptions struct {
	tickMs  uint
	electMs uint
	tls     *clientTLS
	member  *clusterMember // nil: a single member
}

// embeddedPeerURL binds an ephemeral loopback port so that several embedded
// members never clash; a single member never dials its peers.
const embeddedPeerURL = "http://127.0.0.1:0"

// clientTLS is the client-side TLS of an embedded member (WithClientTLS).
type clientTLS struct {
	certFile, keyFile, trustedCAFile string
	clientCertAuth                   bool
}

// WithFastTicks shortens etcd's heartbeat and election timeouts and hashes
// auth passwords at bcrypt's cheapest cost. Tests use it so that a member
// elects itself quickly, the minimum lease TTL (1.5 election timeouts,
// rounded up to whole seconds) drops to 1 s, and authenticating is cheap.
func WithFastTicks() EmbeddedOption {
	return func(o *embeddedOptions) { o.tickMs, o.electMs = 10, 100 }
}

// WithClientTLS serves clients over TLS with the PEM certificate certFile and
// its key keyFile, as etcd's --cert-file and --key-file do. trustedCAFile
// (--trusted-ca-file) is the CA that client certificates must chain to; with
// clientCertAuth (--client-cert-auth) a client without such a certificate is
// refused. The client URL must then be https:// (an http:// URL is switched
// to https://). Without this option clients are served in plain text.
func WithClientTLS(certFile, keyFile, trustedCAFile string, clientCertAuth bool) EmbeddedOption {
	return func(o *embeddedOptions) {
		o.tls = &clientTLS{certFile: certFile, keyFile: keyFile, trustedCAFile: trustedCAFile, clientCertAuth: clientCertAuth}
	}
}

// StartEmbedded starts a single-member etcd with its data in dir (created if
// missing; an existing data dir is reused, keeping its keys), serving clients
// on clientURL (DefaultClientURL when empty; a port of 0 picks a free port,
// see ClientURL). It returns once the member serves requests.
func StartEmbedded(dir, clientURL string, opts ...EmbeddedOption) (*Embedded, error) {
	var o embeddedOptions
	for _, opt := range opts {
		opt(&o)
	}
	e, err := launchEmbedded(dir, clientURL, o)
	if err != nil {
		return nil, err
	}
	if err := e.waitReady(); err != nil {
		return nil, err
	}
	return e, nil
}

// launchEmbedded starts a member and returns without waiting for it to be
// ready: the members of a cluster become ready only together, once a
// quorum of them runs.
func launchEmbedded(dir, clientURL string, o embeddedOptions) (*Embedded, error) {
	if clientURL == "" {
		clientURL = DefaultClientURL
	}
	if dir == "" {
		return nil, errors.New("membership: embedded etcd needs a data directory")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("membership: embedded etcd data dir: %w", err)
	}
	cu, err := url.Parse(clientURL)
	if err != nil || cu.Host == "" {
		return nil, fmt.Errorf("membership: embedded etcd client URL %q: want e.g. http://127.0.0.1:2379", clientURL)
	}
	if o.tls != nil {
		if o.tls.certFile == "" || o.tls.keyFile == "" {
			return nil, errors.New("membership: embedded etcd client TLS needs a certificate and a key")
		}
		if o.tls.clientCertAuth && o.tls.trustedCAFile == "" {
			return nil, errors.New("membership: embedded etcd client certificate auth needs a trusted CA file")
		}
		if cu.Scheme == "http" {
			cu.Scheme = "https"
		}
		if cu.Scheme != "https" {
			return nil, fmt.Errorf("membership: embedded etcd client URL %q: TLS wants https://", clientURL)
		}
	}
	pu, err := url.Parse(embeddedPeerURL)
	if err != nil {
		return nil, fmt.Errorf("membership: embedded etcd peer URL: %w", err)
	}
	cfg := embed.NewConfig()
	cfg.Name = "prefixrouter"
	cfg.Dir = dir
	cfg.ListenClientUrls = []url.URL{*cu}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	cfg.ListenPeerUrls = []url.URL{*pu}
	cfg.AdvertisePeerUrls = []url.URL{*pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	if m := o.member; m != nil {
		// A member of an EmbeddedCluster: peers and clients reach it
		// through its bridges. On a restart the data dir already holds
		// the membership and etcd ignores the initial cluster.
		cfg.Name = m.name
		cfg.AdvertisePeerUrls = []url.URL{m.peerURL}
		cfg.AdvertiseClientUrls = []url.URL{m.clientURL}
		cfg.InitialCluster = m.initialCluster
		cfg.InitialClusterToken = m.token
	}
	closing := new(atomic.Bool)
	// Errors only, so that the embedding process stays quiet.
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.New(&quietCore{
		Core:    zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.Lock(os.Stderr), zapcore.ErrorLevel),
		closing: closing,
	}))
	// The HTTP/JSON gateway is not used by anything here.
	cfg.EnableGRPCGateway = false
	if o.tickMs > 0 {
		cfg.TickMs, cfg.ElectionMs = o.tickMs, o.electMs
		// Passwords hash at the cheapest cost too: at etcd's default a
		// user's authentication takes seconds under the race detector.
		cfg.BcryptCost = 4 // bcrypt.MinCost
	}
	if o.tls != nil {
		cfg.ClientAutoTLS = false
		cfg.ClientTLSInfo.CertFile = o.tls.certFile
		cfg.ClientTLSInfo.KeyFile = o.tls.keyFile
		cfg.ClientTLSInfo.TrustedCAFile = o.tls.trustedCAFile
		cfg.ClientTLSInfo.ClientCertAuth = o.tls.clientCertAuth
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("membership: start embedded etcd: %w", err)
	}
	// With port 0 the listener chose the port: report the real address.
	actual := *cu
	if len(e.Clients) > 0 {
		actual.Host = e.Clients[0].Addr().String()
	}
	em := &Embedded{etcd: e, closing: closing, dir: dir, clientURL: actual.String(), opts: o}
	if len(e.Peers) > 0 {
		em.peerAddr = e.Peers[0].Addr().String()
	}
	return em, nil
}

// waitReady waits until the member serves requests (it has a leader and has
// applied its first entries); on failure it stops the member.
func (e *Embedded) waitReady() error {
	select {
	case <-e.etcd.Server.ReadyNotify():
		return nil
	case err := <-e.etcd.Err():
		e.Close()
		return fmt.Errorf("membership: embedded etcd failed: %w", err)
	case <-time.After(embeddedStartTimeout):
		e.etcd.Server.Stop()
		e.Close()
		return fmt.Errorf("membership: embedded etcd not ready after %v", embeddedStartTimeout)
	}
}

// ClientURL returns the URL clients reach the member at, with the real port.
func (e *Embedded) ClientURL() string { return e.clientURL }

// Endpoints returns ClientURL as a list, the shape ClientOptions wants.
func (e *Embedded) Endpoints() []string { return []string{e.clientURL} }

// Clients returns the host:port addresses the member listens on for clients.
func (e *Embedded) Clients() []string {
	out := make([]string, 0, len(e.etcd.Clients))
	for _, l := range e.etcd.Clients {
		out = append(out, l.Addr().String())
	}
	return out
}

// Dir returns the data directory.
func (e *Embedded) Dir() string { return e.dir }

// Restart starts a new member on the same data directory, client URL and
// options as e, which must have been closed. Tests use it to bring etcd back
// after an outage with its keys intact.
func (e *Embedded) Restart() (*Embedded, error) {
	o := e.opts
	opts := []EmbeddedOption{func(x *embeddedOptions) { *x = o }}
	return StartEmbedded(e.dir, e.clientURL, opts...)
}

// Close stops the member and waits until it has stopped. It is safe to call
// more than once.
func (e *Embedded) Close() error {
	e.closeOnce.Do(func() {
		e.closing.Store(true)
		e.etcd.Close()
	})
	return nil
}

// quietCore drops the errors etcd logs while it shuts down on purpose
// ("server closed", "use of closed network connection") and one benign
// error of a fresh single member, so that the embedding process logs only
// what an operator should act on.
type quietCore struct {
	zapcore.Core
	closing *atomic.Bool
}

func (c *quietCore) With(f []zapcore.Field) zapcore.Core {
	return &quietCore{Core: c.Core.With(f), closing: c.closing}
}

func (c *quietCore) Check(ent zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.closing.Load() || ent.Message == "failed to update storage version" {
		return ce
	}
	if c.Enabled(ent.Level) {
		return ce.AddCore(ent, c)
	}
	return ce
}
