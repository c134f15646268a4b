package router

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/hotkey"
	"github.com/prefixrouter/prefixrouter/overload"
	"github.com/prefixrouter/prefixrouter/probe"
	"github.com/prefixrouter/prefixrouter/ring"
	"github.com/prefixrouter/prefixrouter/upstream"
)

// DefaultMaxBodyBytes is SageMaker's InvokeEndpoint payload limit.
const DefaultMaxBodyBytes = 6 << 20

// DefaultHealthCheckInterval is the probe period `serve` starts with; in
// Options the zero value means health checks are off (library users and
// tests opt in).
const DefaultHealthCheckInterval = 2 * time.Second

// MinCacheSaltKeyBytes is the shortest CacheSaltKey accepted.
const MinCacheSaltKeyBytes = 16

// MaxRetries is how many times a request is re-sent to another instance after
// a dial error (the upstream provably received nothing).
const MaxRetries = 2

// Options configures a Router: the settings (each bound to one `serve` flag)
// first, then the dependencies. The zero value of every setting is
// documented; withDefaults fills them and Validate checks them, in this file
// only. Adding a setting means: the field, its flag, its check, its test.
type Options struct {
	// DefaultEndpoint serves /invocations and /v1/* (--endpoint). Required.
	DefaultEndpoint string
	// MaxBodyBytes bounds request bodies, 413 beyond (--max-body-bytes).
	// Zero means DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// BodyBufferBytes bounds the memory of the bodies held whole before
	// the pick: OpenAI bodies whose key is not within their first 64 KiB
	// (model or prompt_cache_key after the messages, or no
	// prompt_cache_key), on either front end, and a hot key's bodies (its
	// spread hash reads their end): one budget for the whole router
	// (--body-buffer-bytes; heldbody.go). A body that finds it taken waits
	// for room up to 10 s, then gets 503. Zero means
	// DefaultBodyBufferBytes, or the largest body's buffer when that is
	// more; otherwise it must hold that buffer: MaxBodyBytes (its default
	// when zero) plus 50 bytes (an EOF read and a tenant's cache salt).
	BodyBufferBytes int64
	// BodyBufferWait bounds a body's wait for room in the body buffer,
	// after which it gets 503 body_buffer_full (--body-buffer-wait). Zero
	// means DefaultBodyBufferWait (10 s).
	BodyBufferWait time.Duration
	// BalanceFactor > 0 bounds PREFIX_AWARE loads (consistent hashing with
	// bounded loads, as HAProxy's hash-balance-factor): a candidate is
	// admitted only if its load is below
	// ceil(BalanceFactor × (total load of the model's set + 1) / set size),
	// otherwise the request spills to the next candidate (--balance-factor).
	// Zero means off; otherwise it must be in [1, 10] and is used to 0.001.
	// It does not apply to endpoints with HotKeyReplication on, which
	// balance by replicating hot keys instead. See docs/balance.md.
	BalanceFactor float64
	// HotKeyThreshold tunes popularity-aware replication, for endpoints
	// whose routing config turns it on (HotKeyReplication): a key gets
	// k = ceil(share × n / HotKeyThreshold) of its set's n instances, so
	// it gets a second one once it alone carries more than HotKeyThreshold
	// times one instance's fair share (--hot-key-threshold; docs/balance.md).
	// Zero means hotkey.DefaultThreshold (0.5); otherwise it must be in (0, 16].
	HotKeyThreshold float64
	// UpstreamHeaderTimeout bounds the wait for an instance's response
	// headers when Transport is nil (--upstream-header-timeout). A timeout
	// counts against the instance's breaker on a streamed call only: a
	// non-streamed generation sends its headers when it is done, so its
	// timeout is the client's max_tokens, not the instance (issue 19).
	// Zero means no bound.
	UpstreamHeaderTimeout time.Duration
	// UpstreamIdleTimeout bounds the silence between an answer's bytes
	// (--upstream-idle-timeout, DefaultUpstreamIdleTimeout in `serve`):
	// when an instance sends nothing for this long while the proxy waits
	// for its next bytes, the answer is cut (a stream ends with an error)
	// and the call counts against the instance's breaker. A client that
	// stops reading does not trip it (--write-idle-timeout covers that).
	// Zero means off.
	UpstreamIdleTimeout time.Duration
	// HideInstanceID leaves X-Prefixrouter-Instance out of responses and
	// instance ids out of error messages (--hide-instance-id), for
	// deployments whose clients must not learn the fleet's layout. False
	// (the default) shows them.
	HideInstanceID bool
	// FirstByteTimeout bounds the wait for the first byte of a streamed
	// answer's body (--upstream-first-byte-timeout; the event-stream path,
	// or an OpenAI body with "stream": true): beyond it the call is cut and
	// counts against the instance's breaker, so an instance whose health
	// check answers while its generations hang is taken out. Non-streamed
	// calls are not cut by it: their first byte comes when the whole
	// generation is done, whose length the client's max_tokens decides
	// (issue 19); --max-stream-duration and the client's deadline bound
	// them. It is the default of the endpoints whose routing config sets no
	// FirstByteTimeoutInMilliseconds (which wins, and changes live with the
	// config). Zero means off.
	FirstByteTimeout time.Duration
	// APIKeys turns on data-plane API keys: every request but the probes'
	// must present one of these (Authorization: Bearer, or HeaderAPIKey),
	// else 401. Each entry is "sha256:" and the hex SHA-256 digest of a key,
	// as ParseAPIKeys returns them (--api-keys-file reads them once, at
	// start). Empty (the default) means no key is asked for: a gateway in
	// front authenticates clients.
	APIKeys []string
	// Breaker configures every instance's circuit breaker (--breaker-*).
	Breaker overload.BreakerOptions
	// LoadPollInterval > 0 starts a poller that scrapes each instance's
	// LoadMetricsPath every interval; while the last scrape succeeded, a
	// request is admitted only if the instance's reported load stays within
	// the threshold, on top of this replica's share (see probe.Load and
	// overload.Limit; --load-poll-interval). Zero means off.
	LoadPollInterval time.Duration
	// ThresholdShare is how this replica divides each instance's
	// ConcurrencyThreshold with the other replicas (--threshold-share; see
	// Share and docs/concurrency.md). Empty means ShareTraffic.
	ThresholdShare Share
	// ReplicaID is this replica's id under routers/, by which
	// ShareTraffic finds its own record; replica.Start sets it to its ID
	// (--replica-id). Empty means ShareTraffic falls back to
	// ShareReplicas.
	ReplicaID string
	// LoadMetricsPath is the path polled on each instance; empty means
	// "/metrics".
	LoadMetricsPath string
	// HealthCheckInterval > 0 starts active health checks
	// (--health-check-interval): every interval, each instance's
	// HealthCheckPath is fetched (see probe.Health; any status
	// below 500 is healthy, so a 404 is) and an instance that fails
	// probe.DefaultUnhealthyThreshold probes in a row is skipped by every
	// strategy until a probe succeeds. If no instance of a model's set is
	// healthy, health is ignored for it (fail open: a broken health endpoint
	// must not take the fleet down). Explain and Choose's ring primary do
	// not depend on it. Zero means off.
	HealthCheckInterval time.Duration
	// HealthCheckPath is the path probed (--health-check-path); it must
	// start with "/". Empty means probe.DefaultHealthPath.
	HealthCheckPath string
	// HealthCheckTimeout bounds each probe (--health-check-timeout); zero
	// means probe.DefaultHealthTimeout.
	HealthCheckTimeout time.Duration
	// CacheSaltKey keys the hash that turns a tenant id into vLLM's
	// cache_salt on endpoints whose routing config has TenantCacheSalt
	// (--cache-salt-key). Every replica must have the same key, or a
	// tenant's cache splits by replica. Empty means a built-in key: tenants
	// stay apart, but a client that knows another tenant's id could compute
	// its salt; otherwise at least MinCacheSaltKeyBytes.
	CacheSaltKey string
	// SessionKey authenticates and encrypts the stateful session ids the
	// router issues (session.go; --session-key-file). Every replica of an
	// endpoint must have the same key, or a session opened through one is
	// refused by the others. Empty means SessionKeys, and for an endpoint
	// it has no key for, a random key made at start: sessions then work
	// through this replica only. Otherwise at least MinSessionKeyBytes.
	SessionKey []byte
	// SessionKeys gives an endpoint's session key, which wins over
	// SessionKey (the replica reads them from etcd, under the endpoint;
	// membership.ParseSessionKey). It must not block: it runs on the
	// request path. Nil, or an empty answer, means SessionKey.
	SessionKeys func(endpoint string) []byte
	// StaleAfter is the snapshot age past which Readiness notes the snapshot
	// as stale. It stays ready regardless (static stability: a replica
	// routing on its last good snapshot beats no replica), so this only
	// shapes the message. Zero means DefaultStaleAfter.
	StaleAfter time.Duration
	// AdapterWait bounds how long a request for a catalogued adapter that
	// no instance reports loaded yet waits for the first member to report
	// it (--adapter-wait), and how long a request refused with "adapter
	// not found" by the only member waits for a reload. Beyond it the
	// request gets ModelNotReadyException. Zero means
	// DefaultAdapterWait.
	AdapterWait time.Duration
	// AdapterWaitQueue bounds the requests waiting for adapters at once on
	// this replica (--adapter-wait-queue); one more is refused at once with
	// ModelNotReadyException. Zero means DefaultAdapterWaitQueue.
	AdapterWaitQueue int

	// Dependencies (not settings).

	// Registry receives the metrics; nil means a private registry (metrics
	// are kept but not exported).
	Registry *prometheus.Registry
	// Logger; nil means slog.Default().
	Logger *slog.Logger
	// TracerProvider, if set, turns tracing on: a span per request with the
	// routing attributes (Attr*), and W3C trace context (traceparent) sent
	// upstream with a client span per try. Nil (default) means off, at no
	// cost on the request path.
	TracerProvider trace.TracerProvider
	// Transport sends upstream requests; nil means
	// NewTransport(UpstreamHeaderTimeout), with DialCheck.
	Transport http.RoundTripper
	// DialCheck, when set, judges the address of every connection the
	// default Transport opens (after name resolution): an error refuses
	// it (issue 19: a record's host name may lead back to the router, or
	// to a metadata address, after its record was accepted). Nil means
	// none.
	DialCheck func(netip.AddrPort) error
	// Rand returns a uniform int in [0, n); it must be safe for concurrent
	// use. Nil means math/rand/v2.IntN.
	Rand func(n int) int
	// SnapshotAge reports the time since the fleet source last heard from
	// etcd (membership.Watcher.SnapshotAge), for Readiness. Nil means a
	// static fleet: no age.
	SnapshotAge func() time.Duration
	// RingOptions are passed to ring.New (tests inject the hash).
	RingOptions []ring.Option
	// OnStale is told, off the request path's critical section (it must
	// not block), that an instance answered "adapter not found" for an
	// adapter its record lists; the replica writes a stale mark to etcd so
	// that the instance's agent re-polls at once. Nil means nobody is told.
	OnStale func(endpoint, instance, adapter string)
}

// Defaults of the adapter wait.
const (
	// DefaultAdapterWait covers a vLLM adapter load from local disk (a
	// few seconds) with room to spare.
	DefaultAdapterWait = 30 * time.Second
	// DefaultAdapterWaitQueue bounds the goroutines parked in the wait.
	DefaultAdapterWaitQueue = 1024
)

// withDefaults returns o with every zero setting and nil dependency replaced
// by its documented default.
func (o Options) withDefaults() Options {
	if o.MaxBodyBytes == 0 {
		o.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if o.BodyBufferWait == 0 {
		o.BodyBufferWait = DefaultBodyBufferWait
	}
	if o.BodyBufferBytes == 0 {
		o.BodyBufferBytes = max(DefaultBodyBufferBytes, int64(heldNeed(o.MaxBodyBytes, o.MaxBodyBytes)))
	}
	if o.LoadMetricsPath == "" {
		o.LoadMetricsPath = "/metrics"
	}
	if o.HealthCheckPath == "" {
		o.HealthCheckPath = probe.DefaultHealthPath
	}
	if o.HealthCheckTimeout == 0 {
		o.HealthCheckTimeout = probe.DefaultHealthTimeout
	}
	o.StaleAfter = cmp.Or(o.StaleAfter, DefaultStaleAfter)
	o.AdapterWait = cmp.Or(o.AdapterWait, DefaultAdapterWait)
	o.AdapterWaitQueue = cmp.Or(o.AdapterWaitQueue, DefaultAdapterWaitQueue)
	o.ThresholdShare = cmp.Or(o.ThresholdShare, ShareTraffic)
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Transport == nil {
		uo := upstream.Options{ResponseHeaderTimeout: o.UpstreamHeaderTimeout}
		if o.DialCheck != nil {
			uo.Control = upstream.CheckAddr(o.DialCheck)
		}
		o.Transport = upstream.New(uo)
	}
	if o.Rand == nil {
		o.Rand = rand.IntN
	}
	return o
}

// Validate checks every setting; zero values are valid and mean the
// defaults. Its errors wrap fleet.ErrInvalid.
func (o Options) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("router: %w: "+format, append([]any{fleet.ErrInvalid}, args...)...))
	}
	if o.DefaultEndpoint == "" {
		bad("DefaultEndpoint (--endpoint) is required")
	}
	if o.MaxBodyBytes < 0 {
		bad("MaxBodyBytes (--max-body-bytes) %d is negative", o.MaxBodyBytes)
	}
	if maxBody := cmp.Or(o.MaxBodyBytes, DefaultMaxBodyBytes); o.BodyBufferBytes != 0 && o.BodyBufferBytes < int64(heldNeed(maxBody, maxBody)) {
		bad("BodyBufferBytes (--body-buffer-bytes) %d must hold the largest body, %d bytes (--max-body-bytes), and 50 more", o.BodyBufferBytes, maxBody)
	}
	if o.BodyBufferWait < 0 {
		bad("BodyBufferWait (--body-buffer-wait) %v is negative", o.BodyBufferWait)
	}
	if f := o.BalanceFactor; !(f == 0 || (f >= 1 && f <= 10)) {
		bad("BalanceFactor (--balance-factor) %v must be 0 (off) or in [1, 10]", f)
	}
	if err := (hotkey.Options{Threshold: o.HotKeyThreshold}).Validate(); err != nil {
		bad("HotKeyThreshold (--hot-key-threshold) %v must be 0 (default) or in (0, 16]", o.HotKeyThreshold)
	}
	fleet.NonNegative(bad,
		fleet.Duration{Name: "UpstreamHeaderTimeout (--upstream-header-timeout)", Value: o.UpstreamHeaderTimeout},
		fleet.Duration{Name: "FirstByteTimeout (--upstream-first-byte-timeout)", Value: o.FirstByteTimeout},
		fleet.Duration{Name: "UpstreamIdleTimeout (--upstream-idle-timeout)", Value: o.UpstreamIdleTimeout},
		fleet.Duration{Name: "LoadPollInterval (--load-poll-interval)", Value: o.LoadPollInterval},
		fleet.Duration{Name: "HealthCheckInterval (--health-check-interval)", Value: o.HealthCheckInterval},
		fleet.Duration{Name: "HealthCheckTimeout (--health-check-timeout)", Value: o.HealthCheckTimeout},
		fleet.Duration{Name: "StaleAfter", Value: o.StaleAfter},
		fleet.Duration{Name: "AdapterWait (--adapter-wait)", Value: o.AdapterWait},
	)
	switch o.ThresholdShare {
	case "", ShareTraffic, ShareReplicas, ShareNone:
	default:
		bad("ThresholdShare (--threshold-share) %q must be %s, %s or %s", o.ThresholdShare, ShareTraffic, ShareReplicas, ShareNone)
	}
	if o.AdapterWaitQueue < 0 {
		bad("AdapterWaitQueue (--adapter-wait-queue) %d is negative", o.AdapterWaitQueue)
	}
	if o.LoadMetricsPath != "" && !strings.HasPrefix(o.LoadMetricsPath, "/") {
		bad("LoadMetricsPath %q must start with /", o.LoadMetricsPath)
	}
	if o.HealthCheckPath != "" && !strings.HasPrefix(o.HealthCheckPath, "/") {
		bad("HealthCheckPath (--health-check-path) %q must start with /", o.HealthCheckPath)
	}
	if n := len(o.SessionKey); n > 0 && n < MinSessionKeyBytes {
		bad("SessionKey (--session-key-file) has %d bytes, want at least %d", n, MinSessionKeyBytes)
	}
	if n := len(o.CacheSaltKey); n > 0 && n < MinCacheSaltKeyBytes {
		bad("CacheSaltKey (--cache-salt-key) has %d bytes, want at least %d", n, MinCacheSaltKeyBytes)
	}
	for i, e := range o.APIKeys {
		if _, err := parseDigest(e); err != nil {
			bad("APIKeys (--api-keys-file) entry %d: %v", i, err)
		}
	}
	if err := o.Breaker.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
