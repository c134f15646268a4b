// Package router is the data plane: it parses requests, extracts routing keys,
// picks an instance by the endpoint's strategy, and proxies (streaming) with
// retries, error shapes and metrics.
package router

import (
	"cmp"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/hotkey"
	"github.com/prefixrouter/prefixrouter/lora"
	"github.com/prefixrouter/prefixrouter/overload"
	"github.com/prefixrouter/prefixrouter/probe"
	"github.com/prefixrouter/prefixrouter/upstream"
)

// Headers the router reads and sets.
const (
	HeaderTenant      = "X-Amzn-Sagemaker-Prefix-Aware-Id" // canonical form of X-Amzn-SageMaker-Prefix-Aware-Id
	HeaderTargetModel = "X-Amzn-Sagemaker-Target-Model"    // canonical form of X-Amzn-SageMaker-Target-Model
	HeaderInstance    = "X-Prefixrouter-Instance"          // response: the instance that answered
	HeaderDecision    = "X-Prefixrouter-Decision"          // response: how it was chosen
	HeaderError       = "X-Prefixrouter-Error"             // response: short code of a router-made error
)

// Router is an http.Handler routing requests over the current fleet snapshot.
type Router struct {
	opts    Options
	log     *slog.Logger
	rand    func(int) int
	balance int64        // BalanceFactor in thousandths; 0 = off
	handler http.Handler // the routes, instrumented when tracing is on
	proxy   *proxy
	salter  *salter
	// sessions seals and opens stateful session ids (session.go).
	sessions sessionKeys
	// arena lends the buffers of bodies read whole before the pick
	// (heldbody.go).
	arena   *bodyArena
	metrics *metrics
	load    *probe.Prober // nil unless LoadPollInterval > 0
	health  *probe.Prober // nil unless HealthCheckInterval > 0
	rate    rateMeter     // this replica's request rate (ShareTraffic)

	modelLists   modelsCache          // GET /v1/models answers (models.go)
	view         atomic.Pointer[view] // nil until the first Update
	shuttingDown atomic.Bool          // set by Drain: readiness fails, routing goes on
	waiting      atomic.Int64         // requests in waitLoaded

	mu        sync.Mutex                   // guards trackers, moves, hot and published; serializes Update
	trackers  map[string]*overload.Tracker // by endpoint; owned by Update
	moves     map[string]*movement         // by endpoint; owned by Update
	hot       map[string]sketch            // by endpoint that counts popularity; owned by Update
	published map[string]*published        // by endpoint: its last Popularity
}

// adaptiveHalfLife is the sketch's half-life for adaptive keys, in
// requests of one replica: a prefix that takes over (a new workload whose
// deeper prefixes nobody counted yet) reaches its share in about this
// many, during which it routes on fewer instances than it needs.
const adaptiveHalfLife = 1024

// sketch is an endpoint's popularity estimate and the keys it counts.
type sketch struct {
	s         *hotkey.Sketch
	adaptive  bool // depths of adaptive keys, or fixed-length keys
	prefixLen int
}

// view is everything a request needs, published as one immutable value.
type view struct {
	snap      *fleet.Snapshot
	rates     replicaRates // the snapshot's replica rates, for ShareTraffic
	endpoints map[string]*endpointView
	ready     bool // at least one non-draining instance
	draining  int  // draining instances, for Readiness
	// next is closed when the next view replaces this one: requests
	// waiting for an adapter wake up on it.
	next chan struct{}
}

type endpointView struct {
	ep        *fleet.Endpoint
	table     *lora.Table
	instances map[string]*instanceView          // by instance id, draining included
	byPtr     map[*fleet.Instance]*instanceView // by lora's instance pointers (into ep.Instances)
	// From the endpoint's resolved routing config (fleet.Resolved).
	strategy  fleet.Strategy
	prefixLen int
	threshold int
	salt      bool // TenantCacheSalt
	// firstByte is the endpoint's first-byte timeout: its config's, else
	// Options.FirstByteTimeout; zero means off.
	firstByte time.Duration
	// variants and cumWeight: the ProductionVariants split, weights
	// cumulated in order; nil without one.
	variants  []string
	cumWeight []float64
	// setStates caches, per model set (*lora.Set), the states of its
	// instances in set order ([]*overload.State), so that the balance bound
	// sums loads without a map lookup per instance. Filled on first use;
	// the table's sets live exactly as long as this view.
	setStates sync.Map
	// hot estimates key popularity when the endpoint is PREFIX_AWARE with
	// adaptive keys or HotKeyReplication on; nil otherwise. It outlives
	// views while the keys stay the same (Update carries it over), so
	// estimates survive membership changes.
	hot *hotkey.Sketch
	// orders caches hot keys' ring orders for this view (see hotOrder);
	// nil unless the endpoint replicates hot fixed-length keys.
	orders *hotOrders
	// pop is the agreed popularity and its placement when the endpoint
	// is PREFIX_AWARE with adaptive keys (popular.go); nil otherwise.
	pop *popView
}

type instanceView struct {
	inst     *fleet.Instance
	target   *url.URL // parsed Addr; nil if it does not parse (never picked)
	hostPort string   // target's host:port, what a proxy connects to (see Pick)
	state    *overload.State
}

// New returns a router with no fleet: it answers 503 until Update.
func New(opts Options) (*Router, error) { return newRouter(opts, clockwork.NewRealClock()) }

// newRouter is New with the clock that paces health checks and load polls
// (tests pass a fake one).
func newRouter(opts Options, clock clockwork.Clock) (*Router, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	r := &Router{opts: opts, log: opts.Logger, rand: opts.Rand, balance: int64(math.Round(opts.BalanceFactor * 1000)), trackers: map[string]*overload.Tracker{}, published: map[string]*published{}}
	m, err := newMetrics(opts.Registry, r)
	if err != nil {
		return nil, fmt.Errorf("router: register metrics: %w", err)
	}
	r.metrics = m
	r.salter = newSalter(opts.CacheSaltKey)
	r.sessions = newSessionKeys(opts.SessionKey, opts.SessionKeys)
	r.arena = newBodyArena(opts.BodyBufferBytes, heldNeed(opts.MaxBodyBytes, opts.MaxBodyBytes), opts.BodyBufferWait)
	tr := opts.Transport
	// Probes and the load poller use tr itself: they are not traced.
	var upstream http.RoundTripper
	r.handler, upstream = instrument(opts.TracerProvider, withAPIKeys(newAPIKeys(opts.APIKeys), r.routes()), tr)
	r.proxy = newProxy(r, upstreamGuard{next: upstream, idle: opts.UpstreamIdleTimeout})
	if err := r.startProbes(tr, clock); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// startProbes starts the load poller and the health checker that opts ask
// for, with rounds paced by clock.
func (r *Router) startProbes(tr http.RoundTripper, clock clockwork.Clock) error {
	client := probe.NewClient(tr)
	var err error
	if r.opts.LoadPollInterval > 0 {
		r.load, err = probe.StartLoad(probe.Options{Interval: r.opts.LoadPollInterval, Clock: clock},
			probe.Load{Client: client, Logger: r.log}, r.loadTargets)
		if err != nil {
			return err
		}
	}
	if r.opts.HealthCheckInterval > 0 {
		r.health, err = probe.StartHealth(probe.Options{Interval: r.opts.HealthCheckInterval, Timeout: r.opts.HealthCheckTimeout, Clock: clock},
			probe.Health{Client: client, Logger: r.log}, r.healthTargets)
	}
	return err
}

// NewTransport returns the shared upstream transport (package upstream):
// pooled keep-alive HTTP/1.1 connections sized for LLM concurrency
// (hundreds of long requests per instance), a short dial timeout so dead
// instances fail fast and are retried elsewhere. responseHeaderTimeout
// bounds the wait for a response's headers (zero: none, since a
// non-streamed generation sends headers only at its end).
func NewTransport(responseHeaderTimeout time.Duration) *upstream.Transport {
	return upstream.New(upstream.Options{ResponseHeaderTimeout: responseHeaderTimeout})
}

// Close stops the load poller and the health checker, if any.
func (r *Router) Close() error {
	if r.load != nil {
		r.load.Close()
	}
	if r.health != nil {
		r.health.Close()
	}
	return nil
}

// Update publishes a new fleet snapshot (one atomic swap). Instances that stay
// keep their in-flight counts and breakers; instances that left are dropped.
// A nil snapshot is ignored: routing continues on the last good one.
func (r *Router) Update(s *fleet.Snapshot) {
	if s == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	rates := newReplicaRates(s, r.opts.ReplicaID)
	if old := r.view.Load(); old != nil && sameEndpoints(old.snap, s) {
		// Only the replicas changed (a rate published): the endpoint
		// views, their rings and their sketches stay.
		v := &view{snap: s, rates: rates, endpoints: old.endpoints, ready: old.ready, draining: old.draining, next: make(chan struct{})}
		r.view.Store(v)
		close(old.next)
		return
	}
	v := &view{snap: s, rates: rates, endpoints: make(map[string]*endpointView, len(s.Endpoints)), next: make(chan struct{})}
	trackers := make(map[string]*overload.Tracker, len(s.Endpoints))
	moves := make(map[string]*movement, len(s.Endpoints))
	hot := make(map[string]sketch)
	for name, ep := range s.Endpoints {
		tr := r.trackers[name]
		if tr == nil {
			tr = overload.NewTracker(r.opts.Breaker)
		}
		trackers[name] = tr
		ids := make([]string, len(ep.Instances))
		for i := range ep.Instances {
			ids[i] = ep.Instances[i].ID
		}
		states := tr.Sync(ids)
		cfg := ep.Resolved
		ev := &endpointView{
			ep:        ep,
			table:     lora.New(ep, r.opts.RingOptions...),
			instances: make(map[string]*instanceView, len(ep.Instances)),
			byPtr:     make(map[*fleet.Instance]*instanceView, len(ep.Instances)),
			strategy:  cfg.Strategy,
			prefixLen: cfg.PrefixLength,
			threshold: cfg.ConcurrencyThreshold,
			salt:      cfg.TenantCacheSalt,
			firstByte: cmp.Or(cfg.FirstByteTimeout, r.opts.FirstByteTimeout),
		}
		total := 0.0
		for _, pv := range cfg.Variants {
			total += pv.InitialVariantWeight
			ev.variants = append(ev.variants, pv.VariantName)
			ev.cumWeight = append(ev.cumWeight, total)
		}
		adaptive := cfg.Strategy == fleet.PrefixAware && !cfg.FixedLengthKeys
		if adaptive || (cfg.Strategy == fleet.PrefixAware && cfg.HotKeyReplication) {
			// The estimate outlives snapshots while the keys it counts stay
			// the same; other keys start a new one.
			sk := r.hot[name]
			if sk.s == nil || sk.adaptive != adaptive || sk.prefixLen != cfg.PrefixLength {
				o := hotkey.Options{Threshold: r.opts.HotKeyThreshold}
				if adaptive {
					// Replicas route on the agreed view: one standard error
					// keeps k from flapping and reacts within about a hundred
					// requests of a replica, and a shorter memory follows a
					// new prefix (docs/balance.md).
					o.Evidence, o.HalfLife = 1, adaptiveHalfLife
				}
				// Options were validated in New.
				sk.s, _ = hotkey.New(o)
				sk.adaptive, sk.prefixLen = adaptive, cfg.PrefixLength
			}
			ev.hot = sk.s
			hot[name] = sk
			if !adaptive {
				ev.orders = new(hotOrders)
			}
		}
		for i := range ep.Instances {
			in := &ep.Instances[i]
			u, err := url.Parse(in.Addr)
			if err != nil || u.Scheme == "" || u.Host == "" {
				r.log.Warn("router: instance addr is not a base URL; it will not be picked", "endpoint", name, "instance", in.ID, "addr", in.Addr)
				u = nil
			}
			iv := &instanceView{inst: in, target: u, state: states[in.ID]}
			iv.state.SetServerErrors(serverErrors(in)) // the breaker rule's input (issue 20)
			if u != nil {
				iv.hostPort = hostPort(u)
			}
			ev.instances[in.ID] = iv
			ev.byPtr[in] = iv
			if in.Draining {
				v.draining++
			} else {
				v.ready = true
			}
		}
		if adaptive {
			ev.pop = newPopView(ev, ep.Popular, ep.Served)
		}
		r.metrics.initSeries(name, ev, r.view.Load())
		v.endpoints[name] = ev
		mv, moved, ok := measureMovement(r.moves[name], ev.table)
		moves[name] = mv
		if ok {
			r.metrics.keysMoved.WithLabelValues(name).Observe(moved)
		}
	}
	r.trackers = trackers
	r.moves = moves
	r.hot = hot
	if old := r.view.Swap(v); old != nil {
		close(old.next) // wakes the requests waiting for an adapter
	}
}

// sameEndpoints reports whether b holds the very endpoint values of a, as
// fleet.Snapshot.WithReplicas builds it.
func sameEndpoints(a, b *fleet.Snapshot) bool {
	if len(a.Endpoints) != len(b.Endpoints) {
		return false
	}
	for name, ep := range a.Endpoints {
		if b.Endpoints[name] != ep {
			return false
		}
	}
	return true
}

// Snapshot returns the snapshot in use, or nil before the first Update.
func (r *Router) Snapshot() *fleet.Snapshot {
	if v := r.view.Load(); v != nil {
		return v.snap
	}
	return nil
}

func (r *Router) loadTargets() []probe.Target { return r.targets(r.opts.LoadMetricsPath) }

func (r *Router) healthTargets() []probe.Target { return r.targets(r.opts.HealthCheckPath) }

// targets returns path on every pickable, non-draining instance of the view.
func (r *Router) targets(path string) []probe.Target {
	v := r.view.Load()
	if v == nil {
		return nil
	}
	var out []probe.Target
	for _, ev := range v.endpoints {
		for _, iv := range ev.instances {
			if iv.target == nil || iv.inst.Draining {
				continue
			}
			u := *iv.target
			u.Path = joinPath(u.Path, path)
			out = append(out, probe.Target{URL: u.String(), Instance: iv.state, Engine: iv.inst.Engine})
		}
	}
	return out
}

// ServeHTTP routes one request.
func (r *Router) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.handler.ServeHTTP(w, req)
}
