package main

import (
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/prefixrouter/prefixrouter/membership"
	"github.com/prefixrouter/prefixrouter/overload"
	"github.com/prefixrouter/prefixrouter/probe"
	"github.com/prefixrouter/prefixrouter/replica"
	"github.com/prefixrouter/prefixrouter/router"
)

func newServeCmd() *cobra.Command {
	var (
		opts     replica.Options
		static   staticValue
		logLevel slog.Level
	)
	c := &cobra.Command{
		Use:   "serve",
		Short: "Run a router replica",
		Long: `serve runs one router replica. Requests on the data plane (--listen) are routed to the
instances of an endpoint; /metrics, /readyz and /healthz are on the admin listener.

The fleet comes from one of:
  --static-instances id=url,...   a fixed fleet, no etcd (routing config from the flags)
  --etcd-endpoints URL,...        an etcd cluster the instances register in (the default,
                                  http://127.0.0.1:2379); routing config per endpoint from
                                  etcd ('prefixrouter config set'), live; the routing flags
                                  apply to endpoints with no config in etcd
  --embedded-etcd DIR             start a single-node etcd in this process, serving clients
                                  on --embedded-etcd-client-url so that 'register' and other
                                  replicas can join (local use and demos)

With etcd, each replica registers itself under routers/ so every replica knows how many
share the fleet, and keeps routing on its last good snapshot while etcd is unreachable.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// The etcd endpoints' flag default is for the help text; left
			// unset, the options tree picks etcd's default or the embedded
			// etcd's URL, and a static fleet excludes it.
			if !cmd.Flags().Changed("etcd-endpoints") {
				opts.Etcd.Endpoints = nil
			}
			opts.Static = static
			// Given routing settings are reported where a stored
			// routing config replaces them.
			for _, name := range replica.RoutingFlagNames() {
				if cmd.Flags().Changed(name) {
					opts.RoutingFlags = append(opts.RoutingFlags, name)
				}
			}
			opts.Logger = newLogger(logLevel)
			return replica.Run(cmd.Context(), opts)
		},
	}
	f := c.Flags()
	r := &opts.Router
	f.StringVar(&opts.Listen, "listen", replica.DefaultListen, "data-plane address")
	f.StringVar(&opts.AdminListen, "admin-listen", replica.DefaultAdminListen, "admin address: /metrics, /readyz, /healthz and the gRPC admin API (same port)")
	f.StringVar(&opts.ExtProcListen, "ext-proc-listen", "", "also serve Envoy's ext_proc protocol here as a Gateway API Inference Extension endpoint picker, with gRPC health (see docs/envoy.md; empty: off)")
	f.StringVar(&opts.ExtProc.Token, "ext-proc-token", "", "token ext_proc peers (Envoy) send as gRPC metadata 'authorization: Bearer <token>'; streams without it are refused (prefer $PREFIXROUTER_EXT_PROC_TOKEN; empty: none asked for, and then no peer's outcome reports reach the circuit breakers unless it has a client certificate)")
	f.StringVar(&opts.ExtProc.TLSCert, "ext-proc-tls-cert", "", "PEM certificate the ext_proc listener serves TLS with (with --ext-proc-tls-key)")
	f.StringVar(&opts.ExtProc.TLSKey, "ext-proc-tls-key", "", "PEM key of --ext-proc-tls-cert")
	f.StringVar(&opts.ExtProc.ClientCA, "ext-proc-client-ca", "", "PEM CA bundle ext_proc peers' client certificates must chain to (mTLS; needs --ext-proc-tls-cert)")
	f.StringVar(&opts.OTLPEndpoint, "otlp-endpoint", "", "send OpenTelemetry traces to this OTLP/gRPC collector (http://host:4317 without TLS, https:// or host:port with); empty: the standard OTEL_EXPORTER_OTLP_ENDPOINT, else off")
	f.StringVar(&r.DefaultEndpoint, "endpoint", "default", "default endpoint, served on /invocations and /v1/*")
	f.StringVar(&opts.ID, "replica-id", "", "this replica's id under routers/ (default: hostname and a random suffix)")
	f.Var(&static, "static-instances", "fixed fleet without etcd: id=url,id=url,...; an entry may declare its LoRA adapters: id=url;adapters=a+b")
	f.StringSliceVar(&opts.AllowedUpstreams, "allowed-upstreams", nil, "CIDRs, IPs, host names and .domain suffixes instance addresses may point at; records outside are ignored, logged and counted (empty: loopback and private ranges 10/8, 172.16/12, 192.168/16, fc00::/7 and localhost; never link-local unless listed)")
	f.StringVar(&opts.EmbeddedEtcdDir, "embedded-etcd", "", "start an embedded single-node etcd with its data in DIR")
	f.StringVar(&opts.EmbeddedEtcdTLS.Cert, "embedded-etcd-cert", "", "PEM certificate the embedded etcd serves clients with (TLS; its client URL becomes https://)")
	f.StringVar(&opts.EmbeddedEtcdTLS.Key, "embedded-etcd-key", "", "PEM key of --embedded-etcd-cert")
	f.StringVar(&opts.EmbeddedEtcdTLS.ClientCA, "embedded-etcd-client-ca", "", "PEM CA the embedded etcd's clients must present a certificate from (client-cert auth); this replica's own goes in --etcd-cert/--etcd-key")
	f.StringVar(&opts.EmbeddedEtcdClientURL, "embedded-etcd-client-url", membership.DefaultClientURL, "client URL the embedded etcd serves on")
	f.DurationVar(&r.FirstByteTimeout, "upstream-first-byte-timeout", 0, "cut a streamed call (the event-stream path, or an OpenAI body with \"stream\": true) whose instance sends no byte of its response body within this long, counting against its circuit breaker: catches instances whose health check answers while generations hang; non-streamed calls are not cut (their first byte comes when the whole generation is done; --max-stream-duration bounds them); the default of endpoints whose routing config sets no FirstByteTimeoutInMilliseconds (0: off)")
	f.Var(apiKeysFile(&r.APIKeys), "api-keys-file", "require a data-plane API key: FILE lists the keys, one per line (or sha256:<hex digest> of one); clients send Authorization: Bearer <key>, or X-Prefixrouter-Api-Key where Authorization is SigV4's; read once at start (empty: no key asked for)")
	f.Var(sessionKeyFile(&r.SessionKey), "session-key-file", "key (the file's content, at least 32 bytes) that signs and encrypts the stateful session ids this replica issues; every replica of the endpoint needs the same one (empty: with etcd, the endpoint's key in etcd, created by the first replica that needs it; without, a random key: sessions then work through this replica only)")
	f.BoolVar(&r.HideInstanceID, "hide-instance-id", false, "leave X-Prefixrouter-Instance out of responses and instance ids out of error messages")
	f.StringVar(&r.CacheSaltKey, "cache-salt-key", "", "secret key of the tenant cache salt (--tenant-cache-salt), the same on every replica, at least 16 bytes; empty: a built-in key, which keeps tenants apart but lets whoever knows a tenant id compute its salt")
	f.Int64Var(&r.MaxBodyBytes, "max-body-bytes", router.DefaultMaxBodyBytes, "largest request body accepted (413 beyond)")
	f.Int64Var(&r.BodyBufferBytes, "body-buffer-bytes", 0, "memory, for the whole replica, of the bodies held whole before routing (OpenAI bodies whose model or prompt_cache_key is not in their first 64 KiB, on the data plane and ext_proc; a hot key's bodies); a body that finds it taken waits --body-buffer-wait, then gets 503 (0: 32 MiB, or --max-body-bytes + 50 if more)")
	f.DurationVar(&r.BodyBufferWait, "body-buffer-wait", 0, "how long a body waits for room in --body-buffer-bytes before its 503 (0: 10s)")
	f.Uint32Var(&r.Breaker.ConsecutiveFailures, "breaker-failures", overload.DefaultConsecutiveFailures, "consecutive upstream failures that open an instance's circuit breaker")
	f.DurationVar(&r.Breaker.OpenTimeout, "breaker-open-timeout", overload.DefaultOpenTimeout, "how long an open breaker waits before letting a probe through")
	f.IntVar(&r.Breaker.MaxEjectionPercent, "max-ejection-percent", overload.DefaultMaxEjectionPercent, "largest share of an endpoint's instances that breakers and health checks take out of rotation at once, rounded down (1..100; 100: no cap): no breaker opens past it, and beyond it through health marks the endpoint panics and routes to every instance")
	f.DurationVar(&r.LoadPollInterval, "load-poll-interval", 0, "poll each instance's /metrics this often (its engine's running and waiting requests: vllm:num_requests_*, sglang:num_running_reqs/num_queue_reqs, llamacpp:requests_processing/deferred) and, while the last scrape succeeded, admit a request only if the instance's reported load stays within the concurrency threshold, on top of this replica's --threshold-share (0: off)")
	f.StringVar((*string)(&r.ThresholdShare), "threshold-share", string(router.ShareTraffic), "how this replica divides each instance's concurrency threshold T with the other replicas: traffic (ceil(T x its request rate / all replicas' rates), the rates each replica publishes in its record under routers/), replicas (ceil(T/R) of R registered replicas) or none (T; with --load-poll-interval the polled load is the only coordination); see docs/concurrency.md")
	f.DurationVar(&opts.RateInterval, "rate-interval", replica.DefaultRateInterval, "how often this replica measures its request rate and decides whether to write it into its record under routers/ (when it moved by more than a fifth, beyond noise; at most one write per interval)")
	f.Float64Var(&r.HotKeyThreshold, "hot-key-threshold", 0, "with --hot-key-replication (or the endpoint's HotKeyReplication): a key gets a second instance once it alone carries more than this multiple of one instance's fair share (0: 0.5; else up to 16)")
	f.Float64Var(&r.BalanceFactor, "balance-factor", 0, "PREFIX_AWARE: no instance takes more than this multiple of its set's average in-flight load; beyond it the request spills to the next candidate in ring order (bounded-load consistent hashing, like HAProxy's hash-balance-factor; 0: off, else 1..10)")
	f.DurationVar(&r.UpstreamIdleTimeout, "upstream-idle-timeout", router.DefaultUpstreamIdleTimeout, "cut an answer whose instance sends nothing for this long between its bytes (after its headers, while the router waits to read), counting against its circuit breaker; Envoy's stream_idle_timeout default (0: off)")
	f.DurationVar(&r.UpstreamHeaderTimeout, "upstream-header-timeout", 0, "give up on an instance that sends no response headers within this long; counts against its circuit breaker for streamed calls only (a non-streamed generation sends its headers only when it is done, so allow for the longest one; 0: wait indefinitely)")
	f.DurationVar(&r.HealthCheckInterval, "health-check-interval", router.DefaultHealthCheckInterval, "probe each instance's --health-check-path this often; an instance that fails 2 probes in a row (connection error, timeout or status >= 500; a 404 counts as healthy) is skipped until a probe succeeds, unless no instance of the set is healthy (0: off)")
	f.StringVar(&r.HealthCheckPath, "health-check-path", probe.DefaultHealthPath, "path of the active health check")
	f.DurationVar(&r.AdapterWait, "adapter-wait", router.DefaultAdapterWait, "how long a request for a catalogued adapter not yet loaded waits for it (ModelNotReadyException beyond)")
	f.IntVar(&r.AdapterWaitQueue, "adapter-wait-queue", router.DefaultAdapterWaitQueue, "requests that may wait for adapters at once (ModelNotReadyException beyond)")
	f.DurationVar(&r.HealthCheckTimeout, "health-check-timeout", probe.DefaultHealthTimeout, "how long a health probe may take before it counts as failed")
	a := &opts.Admin
	f.StringVar(&a.Token, "admin-token", "", "bearer token the admin API's mutating gRPC calls need, and reads too unless --admin-open-reads (prefer $PREFIXROUTER_ADMIN_TOKEN to a flag; empty: no authentication)")
	f.BoolVar(&a.OpenReads, "admin-open-reads", false, "with --admin-token, let gRPC reads (GetFleet, GetRoutingConfig, ExplainRoute, ListAdapters) through without it")
	f.StringVar(&a.TLSCert, "admin-tls-cert", "", "PEM certificate the admin port serves TLS with (with --admin-tls-key)")
	f.StringVar(&a.TLSKey, "admin-tls-key", "", "PEM key of --admin-tls-cert")
	f.StringVar(&a.ClientCA, "admin-client-ca", "", "PEM CA bundle admin clients' certificates must chain to (mTLS; needs --admin-tls-cert)")
	f.BoolVar(&opts.Pprof, "pprof", false, "serve Go's profiles (net/http/pprof) under /debug/pprof/ on the admin listener; keep that listener private")
	l := &opts.Limits
	f.DurationVar(&l.ReadHeaderTimeout, "read-header-timeout", replica.DefaultReadHeaderTimeout, "close a connection that has not sent a request's headers within this long")
	f.DurationVar(&l.BodyReadTimeout, "body-read-timeout", replica.DefaultBodyReadTimeout, "answer 400 and close a connection that has not sent a request's body within this long after its headers")
	f.DurationVar(&l.IdleTimeout, "idle-timeout", replica.DefaultIdleTimeout, "close a keep-alive connection idle this long")
	f.IntVar(&l.MaxHeaderBytes, "max-header-bytes", replica.DefaultMaxHeaderBytes, "largest request header block accepted (431 beyond)")
	f.IntVar(&l.MaxHeaderCount, "max-header-count", replica.DefaultMaxHeaderCount, "most header fields a request may carry (431 beyond; Envoy's default)")
	f.IntVar(&l.MaxConns, "max-connections", replica.DefaultMaxConns, "open connections per listener; beyond, new ones wait in the accept queue")
	f.DurationVar(&l.WriteIdleTimeout, "write-idle-timeout", replica.DefaultWriteIdleTimeout, "abort a response (and release its instance slot) when the client has read nothing for this long")
	f.DurationVar(&l.MaxStreamDuration, "max-stream-duration", replica.DefaultMaxStreamDuration, "end any request, streamed or not, this long after it started")
	f.DurationVar(&opts.StartupTimeout, "startup-timeout", replica.DefaultStartupTimeout, "how long to wait for the first fleet snapshot from etcd before giving up")
	f.DurationVar(&opts.PopularityInterval, "popularity-interval", replica.DefaultPopularityInterval, "how often this replica publishes the prefixes it sees as popular (adaptive keys, the PREFIX_AWARE default): every replica routes on the merged view (100ms..1m)")
	f.DurationVar(&opts.Membership.TTL, "ttl", membership.DefaultTTL, "lease TTL of this replica's registration")
	f.DurationVar(&opts.VanishGrace, "vanish-grace", replica.DefaultVanishGrace, "when more than half of an endpoint's instances (at least two, none draining) vanish from etcd within one TTL (agents lost etcd, model servers likely fine), keep routing to them this long, health checks and breakers still judging them; prefixrouter_membership_vanish_guard_held_instances says so (0: off)")
	f.DurationVar(&opts.DrainDelay, "drain-delay", replica.DefaultDrainDelay, "on SIGTERM, how long /readyz answers 503 while requests are still served before the listener closes (at least one readiness-probe period)")
	f.DurationVar(&opts.ShutdownTimeout, "shutdown-timeout", replica.DefaultShutdownTimeout, "on SIGTERM, how long to wait for requests in flight")
	bindLogLevel(f, &logLevel, slog.LevelInfo, "log level")
	f.IntVar(&opts.GCPercent, "gc-percent", replica.DefaultGCPercent, "Go's garbage-collection target for this process, as GOGC (the heap may grow to 1+N/100 times the live heap between collections; -1: off; 0: Go's own); GOGC in the environment wins")
	bindEtcd(f, &opts.Etcd, &opts.Membership.Layout)
	bindRouting(f, &opts.Routing)
	return c
}
