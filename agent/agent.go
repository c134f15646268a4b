// Package agent is the sidecar beside a model server: it registers the
// server in etcd once it is healthy, keeps its LoRA adapter list current and,
// on shutdown, drains it before deregistering.
package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/jonboulle/clockwork"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/prefixrouter/prefixrouter/engine"
	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/membership"
	"github.com/prefixrouter/prefixrouter/probe"
)

// Defaults of Options's zero values.
const (
	DefaultPollInterval      = 10 * time.Second
	DefaultHealthInterval    = 500 * time.Millisecond
	DefaultDrainTimeout      = 30 * time.Second
	DefaultDrainGrace        = time.Second
	DefaultDrainPollInterval = 250 * time.Millisecond
	DefaultRequestTimeout    = 5 * time.Second
	// EtcdCallTimeout bounds each etcd call of the drain (the draining
	// flag, the revoke), so that an unreachable etcd costs the shutdown at
	// most about this much beyond DrainTimeout.
	EtcdCallTimeout = time.Second
	// ModelLabel is the Labels key that carries the base model's id.
	ModelLabel = "model"
)

// DefaultHealthPaths are tried in order: vLLM and TGI answer /health,
// SageMaker containers /ping.
var DefaultHealthPaths = []string{"/health", "/ping"}

// Options configures Run. Client, Endpoint, Instance.ID and Instance.Addr
// are required; every other zero value means its default.
type Options struct {
	// Client reaches etcd (membership.NewClient). Run does not close it.
	Client *clientv3.Client
	// Options carry the layout (--etcd-prefix), the lease TTL (--ttl), the
	// logger and metrics.
	Options membership.Options
	// Endpoint is the endpoint the instance serves.
	Endpoint string
	// Instance is the record to register. Its Adapters are static
	// (--adapters) and are kept alongside discovered ones.
	Instance fleet.Instance
	// Engine names the model server's engine (engine.VLLM, engine.SGLang,
	// engine.LlamaCpp, engine.TGI; --engine); empty means detect it once the
	// server is healthy, from its /metrics families, its /v1/models owned_by
	// and its Server header (engine.Detect), falling back to
	// engine.Generic (vLLM's ways) when nothing matches. The profile decides
	// the gauges the drain and placement read, how adapters are listed and
	// loaded, and the record's "engine".
	Engine string
	// DiscoverAdapters polls ModelsPath every PollInterval and registers
	// the adapters it lists (entries whose parent is set); the base model
	// (parent null) goes into Labels["model"].
	DiscoverAdapters bool
	// HealthPaths are probed in order until one answers 2xx.
	HealthPaths []string
	// ModelsPath; zero means /v1/models.
	ModelsPath string
	// MetricsPath; zero means /metrics.
	MetricsPath string
	// BusyMetrics, when set, are summed over all their series to decide
	// that the server is idle; zero means the engine's running and waiting
	// gauges (probe.Metrics.EngineLoad).
	BusyMetrics []string
	// PollInterval of adapter discovery.
	PollInterval time.Duration
	// HealthInterval between health probes while waiting for the server.
	HealthInterval time.Duration
	// DrainTimeout bounds the wait for in-flight requests on shutdown. The
	// whole drain takes at most DrainTimeout plus EtcdCallTimeout (the
	// revoke), even when etcd is unreachable.
	DrainTimeout time.Duration
	// DrainGrace is the least time between marking the instance draining
	// and revoking it, so that requests routed just before the routers saw
	// the flag arrive while the server is still watched.
	DrainGrace time.Duration
	// DrainPollInterval between scrapes of MetricsPath while draining.
	DrainPollInterval time.Duration
	// HTTPClient talks to the model server; nil means a client with
	// DefaultRequestTimeout.
	HTTPClient *http.Client

	// PlaceAdapters makes the agent load the catalogued adapters that
	// lora.Place assigns to its instance and unload the others, publish
	// the instance's load state and write growth and shrink decisions (see
	// placement.go and docs/adapters.md). Off, the agent never loads or
	// unloads anything.
	PlaceAdapters bool
	// LoadPath and UnloadPath are the engine's runtime LoRA endpoints;
	// zero means the engine profile's (vLLM: /v1/load_lora_adapter and
	// /v1/unload_lora_adapter; SGLang: /load_lora_adapter and
	// /unload_lora_adapter). An engine that loads adapters only at start
	// (llama-server) gets no placement.
	LoadPath, UnloadPath string
	// LoadPollInterval is how often placement scrapes MetricsPath for the
	// load and the adapters in use, and retries failed loads; zero means
	// DefaultLoadPollInterval.
	LoadPollInterval time.Duration
	// SaturationWindow is how long the load must stay at or above the
	// endpoint's concurrency threshold before the instance is published
	// Saturated (and below half of it before Saturated is cleared); zero
	// means DefaultSaturationWindow.
	SaturationWindow time.Duration
	// ActiveWindow is how long an adapter seen in use stays in
	// ActiveAdapters, and how long an adapter no longer assigned here is
	// kept as a spare copy in a free slot (placement.go, spares); zero
	// means DefaultActiveWindow.
	ActiveWindow time.Duration
	// ScaleCooldown is the least time between two size changes of one
	// adapter's set; zero means lora.DefaultScaleCooldown.
	ScaleCooldown time.Duration
	// Clock paces placement and dates its decisions; nil means the real
	// clock.
	Clock clockwork.Clock
}

// Validate reports negative durations and an unknown Engine; zero values
// mean the defaults.
func (c Options) Validate() error {
	if _, known := engine.Lookup(c.Engine); !known {
		return fmt.Errorf("%w: agent: unknown engine %q (want one of %s, or none to detect it)", fleet.ErrInvalid, c.Engine, strings.Join(engineNames(), ", "))
	}
	for name, d := range map[string]time.Duration{
		"poll interval": c.PollInterval, "health interval": c.HealthInterval, "drain timeout": c.DrainTimeout,
		"drain grace": c.DrainGrace, "drain poll interval": c.DrainPollInterval, "load poll interval": c.LoadPollInterval,
		"saturation window": c.SaturationWindow, "active window": c.ActiveWindow, "scale cooldown": c.ScaleCooldown,
	} {
		if d < 0 {
			return fmt.Errorf("%w: agent: %s %v is negative", fleet.ErrInvalid, name, d)
		}
	}
	return nil
}

func (c *Options) withDefaults() {
	if len(c.HealthPaths) == 0 {
		c.HealthPaths = DefaultHealthPaths
	}
	if c.ModelsPath == "" {
		c.ModelsPath = "/v1/models"
	}
	if c.MetricsPath == "" {
		c.MetricsPath = "/metrics"
	}
	if c.PollInterval <= 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.HealthInterval <= 0 {
		c.HealthInterval = DefaultHealthInterval
	}
	if c.DrainTimeout <= 0 {
		c.DrainTimeout = DefaultDrainTimeout
	}
	if c.DrainGrace <= 0 {
		c.DrainGrace = DefaultDrainGrace
	}
	if c.DrainPollInterval <= 0 {
		c.DrainPollInterval = DefaultDrainPollInterval
	}
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{Timeout: DefaultRequestTimeout}
	}
	if c.LoadPollInterval <= 0 {
		c.LoadPollInterval = DefaultLoadPollInterval
	}
	if c.SaturationWindow <= 0 {
		c.SaturationWindow = DefaultSaturationWindow
	}
	if c.ActiveWindow <= 0 {
		c.ActiveWindow = DefaultActiveWindow
	}
	if c.Clock == nil {
		c.Clock = clockwork.NewRealClock()
	}
	if c.Options.Logger == nil {
		c.Options.Logger = slog.Default()
	}
}

// Run waits until the model server is healthy, registers it and keeps the
// registration (and, with DiscoverAdapters, its adapter list) current until
// ctx is cancelled (the caller cancels it on SIGTERM/SIGINT). It then marks
// the instance draining, waits until the server reports no running or
// waiting requests or DrainTimeout passes, revokes the registration and
// returns nil. If ctx ends before the server was healthy, nothing was
// registered and Run returns nil. It returns an error only when the
// configuration is invalid or the first registration fails.
func Run(ctx context.Context, cfg Options) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	cfg.withDefaults()
	if cfg.Client == nil {
		return errors.New("agent: no etcd client")
	}
	if err := fleet.ValidateName("endpoint name", cfg.Endpoint); err != nil {
		return err
	}
	if err := cfg.Instance.Validate(); err != nil {
		return err
	}
	a := &agent{cfg: cfg, log: cfg.Options.Logger.With("endpoint", cfg.Endpoint, "instance", cfg.Instance.ID)}
	return a.run(ctx)
}

type agent struct {
	cfg Options
	log *slog.Logger
	// profile is the server's engine, set once it is healthy.
	profile engine.Profile
	// warnedLoad: the unknown-load warning was logged (once per drain).
	warnedLoad bool
}

func (a *agent) run(ctx context.Context) error {
	if !a.waitHealthy(ctx) {
		a.log.Info("agent: stopped before the model server was healthy; nothing registered")
		return nil
	}
	a.setProfile(a.detect(ctx))
	in := a.cfg.Instance
	in.Engine = a.profile.Name
	static := slices.Clone(in.Adapters)
	// An engine that selects adapters by position must have each one's:
	// read its list whether or not discovery is on (llama-server applies
	// the adapters it loaded at start to every request that names none).
	indexed := a.profile.Adapters.List == engine.ListIndexed
	if a.cfg.DiscoverAdapters || indexed {
		l, err := a.list(ctx)
		switch {
		case err != nil && indexed:
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("agent: %s's adapter list (%s): %w", a.profile.Name, a.profile.Adapters.ListPath, err)
		case err != nil:
			a.log.Warn("agent: adapter discovery failed; registering the static adapters", "err", err)
		default:
			if indexed {
				for _, name := range static {
					if _, ok := l.index[name]; !ok {
						return fmt.Errorf("%w: agent: adapter %q (--adapters) is not one %s loaded at start (%s lists %v)", fleet.ErrInvalid, name, a.profile.Name, a.profile.Adapters.ListPath, l.Adapters)
					}
				}
			}
			applyModels(&in, static, l)
		}
	}
	reg, err := membership.RegisterInstance(ctx, a.cfg.Client, a.cfg.Endpoint, in, a.cfg.Options)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("agent: register: %w", err)
	}
	a.log.Info("agent: registered", "key", reg.Key(), "adapters", in.Adapters)

	var discovery *probe.Prober
	if a.cfg.DiscoverAdapters {
		if discovery, err = a.startDiscovery(ctx, reg, static); err != nil {
			a.drain(reg)
			return fmt.Errorf("agent: adapter discovery: %w", err)
		}
	}
	var placer *placer
	switch {
	case a.cfg.PlaceAdapters && !a.profile.Adapters.RuntimeLoading():
		a.log.Info("agent: the engine loads adapters only at start; no adapter placement on this instance", "engine", a.profile.Name)
	case a.cfg.PlaceAdapters:
		placer = a.startPlacer(reg, static)
	}
	<-ctx.Done()
	if placer != nil {
		placer.Close() // before the drain: no load or unload after it
	}
	if discovery != nil {
		discovery.Close() // before the drain: no adapter update after it
	}
	a.drain(reg)
	return nil
}

// startDiscovery polls the model list every PollInterval and writes the
// adapters it lists (with the static ones) and the base model into the
// registration when they change. ctx bounds the writes.
func (a *agent) startDiscovery(ctx context.Context, reg *membership.InstanceRegistration, static []string) (*probe.Prober, error) {
	models := a.url(a.cfg.ModelsPath)
	return probe.Start(probe.Options{Interval: a.cfg.PollInterval},
		func() []string { return []string{models} },
		func(ctx context.Context, _ string) (listing, error) {
			return a.list(ctx)
		},
		func(_ string, l listing, err error) {
			if err != nil {
				a.log.Warn("agent: adapter discovery failed; keeping the registered list", "err", err)
				return
			}
			a.writeModels(ctx, reg, static, l)
		})
}

// writeModels writes the adapters l lists (with the static ones) and the
// base model into the registration when they changed. Discovery and
// placement both call it; the registration serializes the writes.
func (a *agent) writeModels(ctx context.Context, reg *membership.InstanceRegistration, static []string, l listing) {
	cur := reg.Instance()
	next := cur
	applyModels(&next, static, l)
	if slices.Equal(cur.Adapters, next.Adapters) && cur.Labels[ModelLabel] == next.Labels[ModelLabel] && maps.Equal(cur.AdapterIndex, next.AdapterIndex) {
		return
	}
	uctx, cancel := context.WithTimeout(ctx, DefaultRequestTimeout)
	err := reg.Update(uctx, func(in *fleet.Instance) {
		in.Adapters, in.Labels, in.AdapterIndex = next.Adapters, next.Labels, next.AdapterIndex
	})
	cancel()
	if err != nil {
		// The registration keeps retrying the new record.
		a.log.Warn("agent: adapter update not yet written", "err", err)
		return
	}
	a.log.Info("agent: adapters changed", "adapters", next.Adapters)
}

// waitHealthy probes the health paths until one answers 2xx; false if ctx
// ended first.
func (a *agent) waitHealthy(ctx context.Context) bool {
	t := time.NewTicker(a.cfg.HealthInterval)
	defer t.Stop()
	for {
		for _, p := range a.cfg.HealthPaths {
			if a.get(ctx, p) == nil {
				return true
			}
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}

// get fetches path and returns an error unless it answered 2xx; the body is
// discarded.
func (a *agent) get(ctx context.Context, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.url(path), nil)
	if err != nil {
		return err
	}
	resp, err := a.cfg.HTTPClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("agent: GET %s: %s", path, resp.Status)
	}
	return nil
}

// url is path on the model server.
func (a *agent) url(path string) string { return strings.TrimRight(a.cfg.Instance.Addr, "/") + path }

// applyModels sets in's adapters to the union of static and listed ones
// (sorted), their positions for an engine that selects adapters by
// position, and its model label to the base model.
func applyModels(in *fleet.Instance, static []string, l listing) {
	m := l.Models
	set := append(slices.Clone(static), m.Adapters...)
	slices.Sort(set)
	in.Adapters = slices.Compact(set)
	in.AdapterIndex = l.index
	if m.Base != "" {
		labels := make(map[string]string, len(in.Labels)+1)
		for k, v := range in.Labels {
			labels[k] = v
		}
		labels[ModelLabel] = m.Base
		in.Labels = labels
	}
}

// drain marks the instance draining, waits for the server to finish its
// requests (or DrainTimeout) and revokes the registration. Each etcd call
// has its own short deadline: with etcd unreachable, waiting for the flag
// would only eat into the wait for requests (the registration keeps
// writing the flag in the background anyway), and the revoke would
// stretch the shutdown past DrainTimeout.
func (a *agent) drain(reg *membership.InstanceRegistration) {
	start := time.Now()
	deadline := start.Add(a.cfg.DrainTimeout)
	dctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	a.log.Info("agent: draining", "timeout", a.cfg.DrainTimeout)
	fctx, fcancel := context.WithTimeout(dctx, EtcdCallTimeout)
	err := reg.SetDraining(fctx, true)
	fcancel()
	if err != nil {
		a.log.Warn("agent: draining flag not written", "err", err)
	}
	t := time.NewTicker(a.cfg.DrainPollInterval)
	defer t.Stop()
wait:
	for !a.idle(dctx, start) {
		select {
		case <-dctx.Done():
			a.log.Warn("agent: drain timeout; deregistering with requests possibly in flight", "timeout", a.cfg.DrainTimeout)
			break wait
		case <-t.C:
		}
	}
	// What is left of the drain, but at least EtcdCallTimeout (a revoke
	// after a drain timeout still gets its chance) and at most
	// DefaultRequestTimeout.
	rctx, rcancel := context.WithTimeout(context.Background(), min(max(time.Until(deadline), EtcdCallTimeout), DefaultRequestTimeout))
	defer rcancel()
	if err := reg.Close(rctx); err != nil {
		a.log.Warn("agent: revoke failed; the record expires with its lease", "err", err)
		return
	}
	a.log.Info("agent: deregistered")
}

// idle reports whether the drain may end: the server reports no running or
// waiting requests and DrainGrace has passed since it started, or the
// server no longer accepts connections.
func (a *agent) idle(ctx context.Context, start time.Time) bool {
	busy, err := a.busy(ctx)
	var op *net.OpError
	switch {
	case errors.As(err, &op) && op.Op == "dial":
		// The model server is stopping too (in Kubernetes every container
		// of the pod gets SIGTERM at once): nothing can be in flight.
		a.log.Info("agent: model server no longer accepts connections; ending the drain", "err", err)
		return true
	case err != nil:
		// Unknown load: only the drain timeout ends the wait.
		if !a.warnedLoad {
			a.warnedLoad = true
			a.log.Warn("agent: cannot read the model server's load; waiting for the drain timeout", "err", err)
		}
		return false
	case busy > 0:
		return false
	case time.Since(start) < a.cfg.DrainGrace:
		return false
	}
	a.log.Info("agent: drained", "after", time.Since(start).Round(time.Millisecond))
	return true
}

// busy returns the requests the server reports running and waiting. It is
// an error when the scrape fails or the gauges are not exposed (the load
// is then unknown).
func (a *agent) busy(ctx context.Context) (float64, error) {
	m, err := probe.Scrape(ctx, a.cfg.HTTPClient, a.url(a.cfg.MetricsPath))
	if err != nil {
		return 0, err
	}
	return a.busyIn(m)
}

// busyIn reads the busy metrics from a scrape: BusyMetrics when set, else
// the engine's running and waiting gauges.
func (a *agent) busyIn(m probe.Metrics) (float64, error) {
	if len(a.cfg.BusyMetrics) > 0 {
		return m.Sum(a.cfg.BusyMetrics...)
	}
	l, err := m.EngineLoad(a.profile)
	return l.Requests(), err
}
