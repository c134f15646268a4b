package membership

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// DefaultDialTimeout bounds the first connection (and the authentication
// that needs it) when ClientOptions.DialTimeout is zero.
const DefaultDialTimeout = 5 * time.Second

// reconnectMaxDelay caps gRPC's reconnect backoff (120 s by default) so that
// watchers and keepalives resume within seconds after an etcd outage. A
// registration must get through within a TTL of the restart to resume its
// lease (etcd extends leases by one TTL when a member becomes leader): at
// most 1.2 s with gRPC's ±20 % jitter, under the shortest TTL the docs
// suggest (2 s). At 2 s (2.4 s) agents lost their records after a restart.
const reconnectMaxDelay = time.Second

// keepaliveTime and keepaliveTimeout are the gRPC keepalive of the
// connection to each etcd member: after keepaliveTime without a byte from a
// member the client pings it, and closes the connection if no answer comes
// within keepaliveTimeout. Without them a member that stops answering
// without closing its connections (a firewall dropping packets, a hung
// host) holds the watch and lease-keepalive streams that run on it forever:
// the watcher never sees another change, and leases whose keepalives go to
// it expire (TestEtcdMemberPartitioned in e2e). Closing the connection
// fails those streams, and etcd's client reopens them on another member.
// 10 s is gRPC's least (grpc-go raises shorter times to it); etcd accepts
// pings every 5 s (its --grpc-keepalive-min-time), while streams are open.
const (
	keepaliveTime    = 10 * time.Second
	keepaliveTimeout = 3 * time.Second
)

// ClientOptions says how to reach and authenticate to etcd. Only Endpoints is
// required.
type ClientOptions struct {
	// Endpoints are client URLs of the etcd members, e.g.
	// http://10.0.0.1:2379. A bare host:port is accepted as etcd's own
	// client accepts it.
	Endpoints []string
	// CACert is a PEM file of the CA(s) that signed the etcd server
	// certificates. Empty means the system roots when TLS is in use.
	CACert string
	// Cert and Key are a PEM client certificate and its key, for etcd's
	// --client-cert-auth. Both or neither.
	Cert, Key string
	// Username and Password authenticate with etcd's auth (RBAC). Both or
	// neither.
	Username, Password string
	// DialTimeout bounds connecting and authenticating; zero means
	// DefaultDialTimeout.
	DialTimeout time.Duration
}

// TLS reports whether the configuration uses TLS: any certificate flag or
// an https:// endpoint.
func (c ClientOptions) TLS() bool {
	if c.CACert != "" || c.Cert != "" || c.Key != "" {
		return true
	}
	for _, ep := range c.Endpoints {
		if strings.HasPrefix(ep, "https://") || strings.HasPrefix(ep, "unixs://") {
			return true
		}
	}
	return false
}

// Validate checks the configuration without touching the network.
func (c ClientOptions) Validate() error {
	if len(c.Endpoints) == 0 {
		return errors.New("membership: no etcd endpoints given")
	}
	for _, ep := range c.Endpoints {
		if strings.TrimSpace(ep) == "" {
			return errors.New("membership: empty etcd endpoint")
		}
		if strings.Contains(ep, "://") {
			u, err := url.Parse(ep)
			if err != nil || u.Host == "" {
				return fmt.Errorf("membership: etcd endpoint %q is not a URL like http://127.0.0.1:2379", ep)
			}
			switch u.Scheme {
			case "http", "https", "unix", "unixs":
			default:
				return fmt.Errorf("membership: etcd endpoint %q: scheme %q is not http or https", ep, u.Scheme)
			}
		}
	}
	if (c.Cert == "") != (c.Key == "") {
		return errors.New("membership: --etcd-cert and --etcd-key must be given together")
	}
	if (c.Username == "") != (c.Password == "") {
		return errors.New("membership: --etcd-username and --etcd-password must be given together")
	}
	if c.DialTimeout < 0 {
		return fmt.Errorf("membership: --etcd-dial-timeout %v is negative", c.DialTimeout)
	}
	return nil
}

// tlsConfig builds the client TLS configuration, or nil when TLS is off.
func (c ClientOptions) tlsConfig() (*tls.Config, error) {
	if !c.TLS() {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.CACert != "" {
		pem, err := os.ReadFile(c.CACert)
		if err != nil {
			return nil, fmt.Errorf("membership: read etcd CA certificate: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("membership: etcd CA file %s holds no PEM certificate", c.CACert)
		}
		tc.RootCAs = pool
	}
	if c.Cert != "" {
		pair, err := tls.LoadX509KeyPair(c.Cert, c.Key)
		if err != nil {
			return nil, fmt.Errorf("membership: load etcd client certificate %s / key %s: %w", c.Cert, c.Key, err)
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	return tc, nil
}

// NewClient validates cfg, loads its certificates and returns an etcd
// client. Connecting is lazy unless Username is set (etcd authenticates at
// once, within DialTimeout), so an unreachable etcd surfaces on first use;
// membership's watcher and registrations retry until it comes back. The
// caller closes the client.
func NewClient(cfg ClientOptions) (*clientv3.Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	tc, err := cfg.tlsConfig()
	if err != nil {
		return nil, err
	}
	timeout := cfg.DialTimeout
	if timeout <= 0 {
		timeout = DefaultDialTimeout
	}
	bo := backoff.DefaultConfig
	bo.BaseDelay = 100 * time.Millisecond
	bo.MaxDelay = reconnectMaxDelay
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:            cfg.Endpoints,
		TLS:                  tc,
		Username:             cfg.Username,
		Password:             cfg.Password,
		DialTimeout:          timeout,
		DialKeepAliveTime:    keepaliveTime,
		DialKeepAliveTimeout: keepaliveTimeout,
		// Our own slog lines report what matters; the client's zap logger
		// would repeat every retry.
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{Backoff: bo, MinConnectTimeout: timeout})},
	})
	if err != nil {
		return nil, fmt.Errorf("membership: connect to etcd %s: %w", strings.Join(cfg.Endpoints, ","), err)
	}
	return cli, nil
}
