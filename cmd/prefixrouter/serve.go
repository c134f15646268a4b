package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/membership"
	"github.com/prefixrouter/prefixrouter/overload"
	"github.com/prefixrouter/prefixrouter/probe"
	"github.com/prefixrouter/prefixrouter/replica"
	"github.com/prefixrouter/prefixrouter/router"
)

// routingFlags are the --strategy/--prefix-length/--concurrency-threshold
// flags shared by serve and config set.
type routingFlags struct {
	strategy    string
	prefixLen   int
	concurrency int
}

func (r *routingFlags) register(c *cobra.Command) {
	f := c.Flags()
	f.StringVar(&r.strategy, "strategy", string(fleet.PrefixAware), "routing strategy: PREFIX_AWARE, LEAST_OUTSTANDING_REQUESTS or RANDOM")
	f.IntVar(&r.prefixLen, "prefix-length", fleet.DefaultPrefixLength, fmt.Sprintf("prefix that forms the routing key: bytes of the body on invoke paths, characters of message text on OpenAI paths (%d..%d)", fleet.MinPrefixLength, fleet.MaxPrefixLength))
	f.IntVar(&r.concurrency, "concurrency-threshold", fleet.DefaultConcurrencyThresh, fmt.Sprintf("in-flight requests an instance takes before new ones spill to the next candidate (%d..%d)", fleet.MinConcurrencyThreshold, fleet.MaxConcurrencyThreshold))
}

// config builds and validates the routing config (a usage error, exit 2).
func (r *routingFlags) config() (fleet.RoutingConfig, error) {
	c := fleet.RoutingConfig{
		RoutingStrategy: fleet.Strategy(strings.ToUpper(r.strategy)),
		PrefixAwareRoutingConfig: &fleet.PrefixAwareConfig{
			PrefixLength: r.prefixLen, ConcurrencyThreshold: r.concurrency,
		},
	}
	if r.prefixLen == 0 || r.concurrency == 0 {
		return c, usageErr("--prefix-length and --concurrency-threshold must not be 0")
	}
	if err := c.Validate(); err != nil {
		return c, usageErr("%w", err)
	}
	return c, nil
}

func newServeCmd() *cobra.Command {
	var (
		listen, adminListen string
		endpoint, replicaID string
		static              string
		embeddedDir         string
		embeddedURL         string
		maxBody             int64
		breaker             overload.BreakerSettings
		loadPoll            time.Duration
		balance             float64
		headerTimeout       time.Duration
		healthInterval      time.Duration
		healthPath          string
		healthTimeout       time.Duration
		startTimeout        time.Duration
		ttl                 time.Duration
		shutdown            time.Duration
		logLevel            string
		ef                  etcdFlags
		rf                  routingFlags
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
			logger, err := newLogger(logLevel)
			if err != nil {
				return err
			}
			routing, err := rf.config()
			if err != nil {
				return err
			}
			if err := membership.ValidateName("endpoint", endpoint); err != nil {
				return usageErr("--endpoint: %w", err)
			}
			if headerTimeout < 0 {
				return usageErr("--upstream-header-timeout must not be negative")
			}
			if healthInterval < 0 || healthTimeout < 0 {
				return usageErr("--health-check-interval and --health-check-timeout must not be negative")
			}
			if !strings.HasPrefix(healthPath, "/") {
				return usageErr("--health-check-path %q must start with /", healthPath)
			}
			if err := breaker.Validate(); err != nil {
				return usageErr("%w", err)
			}
			cfg := replica.Config{
				ID: replicaID, Listen: listen, AdminListen: adminListen, Endpoint: endpoint,
				Routing: routing, MaxBodyBytes: maxBody, Breaker: breaker, LoadPollInterval: loadPoll, BalanceFactor: balance,
				UpstreamHeaderTimeout: headerTimeout,
				HealthCheckInterval:   healthInterval,
				HealthCheckPath:       healthPath,
				HealthCheckTimeout:    healthTimeout,
				Logger:                logger,
				Membership:            membership.Options{Layout: ef.layout(), TTL: ttl, Logger: logger},
			}
			ctx := cmd.Context()
			switch {
			case static != "" && (embeddedDir != "" || cmd.Flags().Changed("etcd-endpoints")):
				return usageErr("--static-instances excludes --etcd-endpoints and --embedded-etcd")
			case static != "":
				if cfg.Static, err = router.ParseStaticInstances(static); err != nil {
					return usageErr("--static-instances: %w", err)
				}
				if len(cfg.Static) == 0 {
					return usageErr("--static-instances lists no instance")
				}
			default:
				if cfg.ID == "" {
					cfg.ID = defaultReplicaID()
				}
				if err := membership.ValidateName("replica id", cfg.ID); err != nil {
					return usageErr("--replica-id: %w", err)
				}
				if embeddedDir != "" {
					if cmd.Flags().Changed("etcd-endpoints") {
						return usageErr("--embedded-etcd excludes --etcd-endpoints")
					}
					emb, err := membership.StartEmbedded(embeddedDir, embeddedURL)
					if err != nil {
						return fmt.Errorf("starting embedded etcd: %w", err)
					}
					defer emb.Close()
					logger.Info("embedded etcd serving", "client_url", emb.ClientURL(), "dir", embeddedDir)
					ef.endpoints = emb.Endpoints()
				}
				cli, err := ef.client()
				if err != nil {
					return err
				}
				defer cli.Close()
				cfg.Client = cli
			}
			startCtx, cancel := context.WithTimeout(ctx, startTimeout)
			rep, err := replica.Start(startCtx, cfg)
			cancel()
			if err != nil {
				if cfg.Client != nil && errors.Is(err, context.DeadlineExceeded) {
					return fmt.Errorf("no fleet snapshot from etcd %v within --startup-timeout %v (is etcd reachable?): %w", ef.endpoints, startTimeout, err)
				}
				return err
			}
			<-ctx.Done()
			logger.Info("shutting down: deregistering and draining requests in flight", "timeout", shutdown)
			closeCtx, cancel := context.WithTimeout(context.Background(), shutdown)
			defer cancel()
			return rep.Close(closeCtx)
		},
	}
	f := c.Flags()
	f.StringVar(&listen, "listen", "127.0.0.1:8080", "data-plane address")
	f.StringVar(&adminListen, "admin-listen", "127.0.0.1:9090", "admin address: /metrics, /readyz, /healthz and the gRPC admin API (same port)")
	f.StringVar(&endpoint, "endpoint", "default", "default endpoint, served on /invocations and /v1/*")
	f.StringVar(&replicaID, "replica-id", "", "this replica's id under routers/ (default: hostname and a random suffix)")
	f.StringVar(&static, "static-instances", "", "fixed fleet without etcd: id=url,id=url,...")
	f.StringVar(&embeddedDir, "embedded-etcd", "", "start an embedded single-node etcd with its data in DIR")
	f.StringVar(&embeddedURL, "embedded-etcd-client-url", membership.DefaultClientURL, "client URL the embedded etcd serves on")
	f.Int64Var(&maxBody, "max-body-bytes", router.DefaultMaxBodyBytes, "largest request body accepted (413 beyond)")
	f.Uint32Var(&breaker.ConsecutiveFailures, "breaker-failures", overload.DefaultConsecutiveFailures, "consecutive upstream failures that open an instance's circuit breaker")
	f.DurationVar(&breaker.OpenTimeout, "breaker-open-timeout", overload.DefaultOpenTimeout, "how long an open breaker waits before letting a probe through")
	f.DurationVar(&loadPoll, "load-poll-interval", 0, "poll each instance's /metrics (vllm:num_requests_running+waiting) this often and count load from other replicas against the concurrency threshold (0: off)")
	f.Float64Var(&balance, "balance-factor", 0, "PREFIX_AWARE: no instance takes more than this multiple of its set's average in-flight load; beyond it the request spills to the next candidate in ring order (bounded-load consistent hashing, like HAProxy's hash-balance-factor; 0: off, else 1..10)")
	f.DurationVar(&headerTimeout, "upstream-header-timeout", 0, "give up on an instance that sends no response headers within this long; counts against its circuit breaker (0: wait indefinitely; a non-streamed generation sends its headers only when it is done, so allow for the longest one)")
	f.DurationVar(&healthInterval, "health-check-interval", 2*time.Second, "probe each instance's --health-check-path this often; an instance that fails 2 probes in a row (connection error, timeout or status >= 500; a 404 counts as healthy) is skipped until a probe succeeds, unless no instance of the set is healthy (0: off)")
	f.StringVar(&healthPath, "health-check-path", probe.DefaultHealthPath, "path of the active health check")
	f.DurationVar(&healthTimeout, "health-check-timeout", probe.DefaultHealthTimeout, "how long a health probe may take before it counts as failed")
	f.DurationVar(&startTimeout, "startup-timeout", 30*time.Second, "how long to wait for the first fleet snapshot from etcd before giving up")
	f.DurationVar(&ttl, "ttl", membership.DefaultTTL, "lease TTL of this replica's registration")
	f.DurationVar(&shutdown, "shutdown-timeout", 30*time.Second, "on SIGTERM, how long to wait for requests in flight")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	ef.register(f)
	rf.register(c)
	return c
}

func defaultReplicaID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "router"
	}
	var b [3]byte
	_, _ = rand.Read(b[:])
	return host + "-" + hex.EncodeToString(b[:])
}

func newLogger(level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, usageErr("--log-level: %w", err)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l})), nil
}
