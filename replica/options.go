package replica

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/membership"
	"github.com/prefixrouter/prefixrouter/router"
)

// Defaults of Options, used where a field is zero.
const (
	DefaultListen          = "127.0.0.1:8080"
	DefaultAdminListen     = "127.0.0.1:9090"
	DefaultStartupTimeout  = 30 * time.Second
	DefaultShutdownTimeout = 30 * time.Second
	DefaultDrainDelay      = 5 * time.Second
	// DefaultVanishGrace is the vanish guard's grace `serve` starts with
	// (--vanish-grace); in Options the zero value means off (library users
	// and tests opt in). docs/operations.md weighs it.
	DefaultVanishGrace = 30 * time.Second
	// DefaultGCPercent is the GC target `serve` starts with (--gc-percent);
	// in Options the zero value leaves the runtime's. A router's live heap
	// is small (a few MB) and its garbage per request large (bodies,
	// headers), so Go's default of 100 collects dozens of times a second
	// under load: in the proxy benchmark, 400 cut the router's CPU per
	// request by about a quarter (docs/benchmarks.md, issue 9) for a heap
	// up to 5x the live one.
	DefaultGCPercent = 400
)

// Options configures one router replica. It is the root of the one options
// tree (replica ⊃ router ⊃ overload): `serve` binds its flags straight into
// it, withDefaults fills zero values and Validate checks every setting, here
// and in the sub-trees' own Validate. Settings first, dependencies last.
//
// The fleet comes from exactly one source: Static instances, an etcd Client
// given by the caller, or etcd reached through Etcd (dialled by Start, with an
// embedded etcd started first when EmbeddedEtcdDir is set).
type Options struct {
	// ID names the replica under routers/ (--replica-id). Empty means the
	// host name and a random suffix. Ignored with a static fleet.
	ID string
	// Listen and AdminListen are the data-plane and admin addresses
	// (--listen, --admin-listen); port 0 picks a free port (see
	// Replica.Addr). The admin listener serves /metrics, /readyz and
	// /healthz over HTTP/1.1 and the gRPC admin API (docs/admin-api.md) over
	// cleartext HTTP/2. Empty means DefaultListen and DefaultAdminListen.
	Listen, AdminListen string
	// ExtProcListen, when set, also serves Envoy's ext_proc protocol there
	// as a Gateway API Inference Extension endpoint picker, with gRPC
	// health (--ext-proc-listen; see docs/envoy.md). Empty means off.
	ExtProcListen string
	// ExtProc authenticates the ext_proc listener's peers (--ext-proc-token,
	// --ext-proc-tls-*; see ExtProcSecurity).
	ExtProc ExtProcSecurity
	// OTLPEndpoint, when set, turns tracing on: spans go to this OTLP/gRPC
	// collector (--otlp-endpoint; a URL, http:// meaning no TLS, or
	// host:port). Empty means the standard OTEL_EXPORTER_OTLP_ENDPOINT
	// environment, and off without it (see tracing.Options).
	OTLPEndpoint string
	// Static, when non-empty, is a fixed fleet for Router.DefaultEndpoint
	// (--static-instances); no etcd is used.
	Static []fleet.Instance
	// AllowedUpstreams are the CIDRs, IPs, host names and .domain suffixes
	// instance addresses may point at (--allowed-upstreams, see
	// fleet.ParseUpstreams). Records outside are ignored, logged and
	// counted; static instances outside are refused at start. Empty means
	// fleet.DefaultUpstreams: loopback and private ranges, not link-local.
	AllowedUpstreams []string
	// Resolver looks up the host names of instance addresses when a record
	// (or a static instance) is accepted: a name that leads to one of the
	// replica's own listeners, or to a link-local or metadata address, is
	// refused like the address itself (issue 19). Nil means the system's
	// resolver.
	Resolver fleet.Resolver
	// Routing is the routing config of a static fleet and, with etcd, of
	// every endpoint whose config key is not set (--strategy,
	// --prefix-length, --concurrency-threshold). Zero fields mean
	// fleet.DefaultRoutingConfig's.
	Routing fleet.RoutingConfig
	// RoutingFlags name the routing settings the operator gave explicitly,
	// by flag without dashes: strategy, prefix-length,
	// concurrency-threshold, hot-key-replication, tenant-cache-salt,
	// upstream-first-byte-timeout. `serve` lists those set on the command
	// line or in the environment. Each of them, and each of Routing and
	// Router.FirstByteTimeout that differs from its built-in default, is
	// reported (logged, and in the admin API's GetFleet) wherever an
	// endpoint's stored routing config replaces it (docs/operations.md).
	RoutingFlags []string
	// Etcd says how to reach etcd (--etcd-*); used when Static is empty and
	// Client is nil. Empty endpoints mean membership.DefaultClientURL, or
	// the embedded etcd's.
	Etcd membership.ClientOptions
	// EmbeddedEtcdDir, when set, starts a single-node etcd in this process
	// with its data there (--embedded-etcd), serving clients on
	// EmbeddedEtcdClientURL (empty: membership.DefaultClientURL).
	EmbeddedEtcdDir, EmbeddedEtcdClientURL string
	// EmbeddedEtcdTLS serves the embedded etcd's clients over TLS
	// (--embedded-etcd-cert, --embedded-etcd-key) and, with ClientCA,
	// refuses clients without a certificate from it
	// (--embedded-etcd-client-ca). This replica's own client then needs
	// --etcd-cacert (and --etcd-cert/--etcd-key with ClientCA), like any
	// other client. Empty means plaintext: for loopback only.
	EmbeddedEtcdTLS EmbeddedEtcdTLS
	// Membership is the etcd key layout (--etcd-prefix) and the lease TTL of
	// this replica's registration (--ttl; zero: membership.DefaultTTL).
	Membership membership.Options
	// Router is the data plane's options tree.
	Router router.Options
	// VanishGrace turns on the guard against the fleet vanishing when
	// agents lose etcd (--vanish-grace, DefaultVanishGrace in `serve`; see
	// membership.WatcherOptions): when more than half of an endpoint's
	// instances vanish within one TTL, none of them draining, they stay
	// routable this long. Zero means off.
	VanishGrace time.Duration
	// Admin secures the admin listener (--admin-token, --admin-tls-*).
	Admin AdminSecurity
	// Pprof serves Go's net/http/pprof under /debug/pprof/ on the admin
	// listener (--pprof), for CPU and allocation profiles of a running
	// replica (docs/benchmarks.md, issue 9). False means off: profiles show
	// the process's internals and cost CPU while they run, and the admin
	// token guards only the gRPC API.
	Pprof bool
	// GCPercent is Go's garbage-collection target for the whole process,
	// as GOGC (--gc-percent, DefaultGCPercent in `serve`): the heap may grow
	// to 1+GCPercent/100 times the live heap between collections; -1 turns
	// collection off. Run applies it, unless GOGC is set in the environment
	// (the operator's setting wins); Start, which harnesses run several of
	// in one process, does not. Zero means the runtime's own target; below
	// -1 is invalid.
	GCPercent int
	// Limits bound every client connection of both listeners (see Limits;
	// zero values mean the Default* limits).
	Limits Limits
	// RateInterval is how often the replica measures its request rate
	// and decides whether to write it into its record under routers/
	// (--rate-interval): the weights of the threshold's traffic share
	// (router.ShareTraffic). At most one write per interval per replica,
	// rarely one while traffic holds steady (router.RateReport). Zero
	// means DefaultRateInterval. Ignored with a static fleet.
	RateInterval time.Duration
	// StartupTimeout bounds the wait for the first fleet snapshot from etcd
	// (--startup-timeout); zero means DefaultStartupTimeout.
	StartupTimeout time.Duration
	// PopularityInterval is how often the replica publishes the prefixes
	// it sees as popular on endpoints with adaptive keys
	// (--popularity-interval, issue 21): with etcd under its own lease,
	// where every replica's watcher merges them into the snapshot; with a
	// static fleet into its own snapshot. Zero means
	// DefaultPopularityInterval; it must be within [100 ms, 1 min].
	PopularityInterval time.Duration
	// DrainDelay is how long Shutdown (Run, on SIGTERM) keeps serving with
	// /readyz answering 503 before it closes the listener (--drain-delay):
	// at least one readiness-probe period of whatever sends traffic here,
	// so that no client is sent to a closed port. Zero means
	// DefaultDrainDelay.
	DrainDelay time.Duration
	// ShutdownTimeout bounds Run's wait for requests in flight after its
	// context ends (--shutdown-timeout); zero means DefaultShutdownTimeout.
	ShutdownTimeout time.Duration

	// Dependencies (not settings).

	// Client reaches etcd; the replica does not close it. Tests and
	// harnesses pass one; nil means Start dials Etcd.
	Client *clientv3.Client
	// Logger; nil means slog.Default(). Also the router's and membership's
	// logger unless those are set.
	Logger *slog.Logger
	// Registry for metrics; nil means a new one with Go and process
	// collectors. Also the router's.
	Registry *prometheus.Registry
	// Clock is the fleet watcher's (membership.WatcherOptions.Clock): it
	// dates snapshots, paces progress requests and times the vanish
	// guard's grace. Nil means the real clock; tests pass a fake one to
	// move past the grace without waiting.
	Clock clockwork.Clock
}

// usesEtcd reports whether the fleet comes from etcd.
func (o Options) usesEtcd() bool { return len(o.Static) == 0 }

// withDefaults returns o with every zero setting and nil dependency replaced
// by its documented default. The router's own defaults are filled by
// router.New.
func (o Options) withDefaults() Options {
	if o.Listen == "" {
		o.Listen = DefaultListen
	}
	if o.AdminListen == "" {
		o.AdminListen = DefaultAdminListen
	}
	if o.StartupTimeout == 0 {
		o.StartupTimeout = DefaultStartupTimeout
	}
	if o.PopularityInterval == 0 {
		o.PopularityInterval = DefaultPopularityInterval
	}
	o.Limits = o.Limits.withDefaults()
	if o.ShutdownTimeout == 0 {
		o.ShutdownTimeout = DefaultShutdownTimeout
	}
	if o.DrainDelay == 0 {
		o.DrainDelay = DefaultDrainDelay
	}
	if o.usesEtcd() && o.ID == "" {
		o.ID = defaultID()
	}
	if o.usesEtcd() {
		// The router finds its own record under routers/ by it.
		o.Router.ReplicaID = o.ID
	}
	if o.RateInterval == 0 {
		o.RateInterval = DefaultRateInterval
	}
	if o.EmbeddedEtcdDir != "" && o.EmbeddedEtcdClientURL == "" {
		o.EmbeddedEtcdClientURL = membership.DefaultClientURL
	}
	if o.usesEtcd() && len(o.Etcd.Endpoints) == 0 {
		o.Etcd.Endpoints = []string{membership.DefaultClientURL}
		if o.EmbeddedEtcdDir != "" {
			o.Etcd.Endpoints = []string{o.EmbeddedEtcdClientURL}
		}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Router.Logger == nil {
		o.Router.Logger = o.Logger
	}
	if o.Membership.Logger == nil {
		o.Membership.Logger = o.Logger
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
		o.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	if o.Router.Registry == nil {
		o.Router.Registry = o.Registry
	}
	return o
}

// Validate checks every setting of the tree, the router's included, without
// touching the network. Zero values are valid and mean the defaults. Every
// error wraps fleet.ErrInvalid; several are joined.
func (o Options) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("replica: %w: "+format, append([]any{fleet.ErrInvalid}, args...)...))
	}
	wrap := func(what string, err error) {
		if err != nil {
			if !errors.Is(err, fleet.ErrInvalid) {
				err = fmt.Errorf("%w: %w", fleet.ErrInvalid, err)
			}
			errs = append(errs, fmt.Errorf("replica: %s: %w", what, err))
		}
	}
	wrap("endpoint", fleet.ValidateName("endpoint name", o.Router.DefaultEndpoint))
	if o.ID != "" {
		wrap("replica id", fleet.ValidateName("replica id", o.ID))
	}
	wrap("routing config", o.Routing.Validate())
	if i := o.PopularityInterval; i != 0 && (i < 100*time.Millisecond || i > time.Minute) {
		bad("PopularityInterval (--popularity-interval) %v must be within [100ms, 1m]", i)
	}
	for _, f := range o.RoutingFlags {
		if !validRoutingFlag(f) {
			bad("RoutingFlags: %q is not a routing setting's flag", f)
		}
	}
	allowed, err := fleet.ParseUpstreams(o.AllowedUpstreams)
	wrap("allowed upstreams (--allowed-upstreams)", err)
	for i, in := range o.Static {
		err := in.Validate()
		if err == nil {
			err = allowed.Check(in.Addr)
		}
		wrap(fmt.Sprintf("static instance %d", i), err)
	}
	switch {
	case !o.usesEtcd() && (len(o.Etcd.Endpoints) > 0 || o.EmbeddedEtcdDir != ""):
		bad("a static fleet (--static-instances) excludes etcd endpoints (--etcd-endpoints) and an embedded etcd (--embedded-etcd)")
	case !o.usesEtcd() && o.Client != nil:
		bad("a static fleet excludes an etcd client")
	case o.EmbeddedEtcdDir != "" && o.Client != nil:
		bad("an embedded etcd excludes an etcd client")
	case o.EmbeddedEtcdDir != "" && len(o.Etcd.Endpoints) > 0 && !slices.Equal(o.Etcd.Endpoints, []string{cmp.Or(o.EmbeddedEtcdClientURL, membership.DefaultClientURL)}):
		bad("an embedded etcd (--embedded-etcd) excludes etcd endpoints (--etcd-endpoints)")
	case o.usesEtcd() && o.Client == nil:
		etcd := o.Etcd
		if len(etcd.Endpoints) == 0 {
			etcd.Endpoints = []string{membership.DefaultClientURL}
		}
		wrap("etcd", etcd.Validate())
	}
	if t := o.EmbeddedEtcdTLS; t != (EmbeddedEtcdTLS{}) {
		switch {
		case o.EmbeddedEtcdDir == "":
			bad("EmbeddedEtcdTLS (--embedded-etcd-cert, --embedded-etcd-key, --embedded-etcd-client-ca) needs --embedded-etcd")
		case t.Cert == "" || t.Key == "":
			bad("--embedded-etcd-cert and --embedded-etcd-key must be given together")
		case t.ClientCA != "" && o.Etcd.Cert == "":
			bad("--embedded-etcd-client-ca refuses clients without a certificate: give this replica's own with --etcd-cert and --etcd-key")
		}
	}
	if o.EmbeddedEtcdDir != "" && o.EmbeddedEtcdClientURL != "" {
		wrap("embedded etcd client URL", membership.ClientOptions{Endpoints: []string{o.EmbeddedEtcdClientURL}}.Validate())
	}
	if o.ExtProcListen != "" {
		if _, _, err := net.SplitHostPort(o.ExtProcListen); err != nil {
			bad("ExtProcListen (--ext-proc-listen) %q is not host:port: %v", o.ExtProcListen, err)
		}
	}
	if e := o.OTLPEndpoint; e != "" {
		if strings.Contains(e, "://") {
			if u, err := url.Parse(e); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				bad("OTLPEndpoint (--otlp-endpoint) %q is not an http:// or https:// URL", e)
			}
		} else if _, _, err := net.SplitHostPort(e); err != nil {
			bad("OTLPEndpoint (--otlp-endpoint) %q is neither a URL nor host:port: %v", e, err)
		}
	}
	if o.Membership.TTL < 0 {
		bad("Membership.TTL (--ttl) %v is negative", o.Membership.TTL)
	}
	fleet.NonNegative(bad,
		fleet.Duration{Name: "StartupTimeout (--startup-timeout)", Value: o.StartupTimeout},
		fleet.Duration{Name: "ShutdownTimeout (--shutdown-timeout)", Value: o.ShutdownTimeout},
		fleet.Duration{Name: "DrainDelay (--drain-delay)", Value: o.DrainDelay},
		fleet.Duration{Name: "VanishGrace (--vanish-grace)", Value: o.VanishGrace},
		fleet.Duration{Name: "RateInterval (--rate-interval)", Value: o.RateInterval},
	)
	if o.GCPercent < -1 {
		bad("GCPercent (--gc-percent) %d must be -1 (off), 0 (the runtime's) or positive", o.GCPercent)
	}
	o.Limits.validate(bad)
	o.Admin.validate(bad)
	o.ExtProc.validate(bad)
	if o.ExtProc != (ExtProcSecurity{}) && o.ExtProcListen == "" {
		bad("ExtProc (--ext-proc-token, --ext-proc-tls-*) needs --ext-proc-listen")
	}
	if err := o.Router.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// defaultID is the replica id when none is given: the host name and a random
// suffix, so that two replicas on one host do not collide.
func defaultID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "router"
	}
	var b [3]byte
	_, _ = rand.Read(b[:])
	return host + "-" + hex.EncodeToString(b[:])
}

// EmbeddedEtcdTLS is the client-side TLS of an embedded etcd: PEM files.
type EmbeddedEtcdTLS struct {
	Cert, Key string
	// ClientCA turns on client-certificate authentication.
	ClientCA string
}
