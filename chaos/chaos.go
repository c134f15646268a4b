// Package chaos runs scale and fault scenarios against a local fleet and
// measures how much routing moves and whether any request is lost.
package chaos

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/prefixrouter/prefixrouter/agent"
	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/localfleet"
	"github.com/prefixrouter/prefixrouter/internal/sim"
	"github.com/prefixrouter/prefixrouter/overload"
	"github.com/prefixrouter/prefixrouter/replica"
	"github.com/prefixrouter/prefixrouter/router"
)

// Scenario names, in the order Run runs them.
const (
	ScaleUp         = "scale-up"
	ScaleDown       = "scale-down"
	Crash           = "crash"
	EtcdOutage      = "etcd-outage"
	FailingInstance = "failing-instance"
	RollingRestart  = "rolling-restart"
	HungInstance    = "hung-instance"
)

// Health checks of the chaos fleet's replicas: short, so that the
// hung-instance scenario detects within a load window.
const (
	healthCheckInterval = 100 * time.Millisecond
	healthCheckTimeout  = 200 * time.Millisecond
)

// scenarios are every scenario in the order Run runs them: its name, what it
// does (its one-line description) and what it checks.
var scenarios = []struct {
	name string
	run  func(s *suite, ctx context.Context, res *Result) error
	doc  string
}{
	{ScaleUp, (*suite).scaleUp, "add one instance (N→N+1): only keys of the new instance move, no request fails"},
	{ScaleDown, (*suite).scaleDown, "graceful stop of one instance (drain, revoke): only its keys move, no request fails"},
	{Crash, (*suite).crash, "kill one instance without revoking its lease: routers drop it when the lease expires (≈TTL); requests that hit it meanwhile are retried elsewhere; only requests in flight at the crash instant may fail"},
	{EtcdOutage, (*suite).etcdOutage, "stop etcd for a window under load: routing continues on the last snapshot, no request fails; restart etcd, add an instance, every replica converges"},
	{FailingInstance, (*suite).failingInstance, "one instance answers 500: its breaker opens, traffic spills to the next candidates; clear the fault: the breaker closes after its open timeout and a probe"},
	{RollingRestart, (*suite).rollingRestart, "stop (gracefully) and re-add every instance in turn under load: no request fails"},
	{HungInstance, (*suite).hungInstance, "freeze one instance (connections accepted, nothing answers; still registered): active health checks mark it down on every replica within 2 probes, new requests avoid it, only requests already sent to it wait; unfreeze: it is marked up and they complete"},
	{AdapterJoin, (*suite).adapterJoin, "an adapter is loaded on one more instance (its set grows by one): at most 1.05 × 1/(|set|+1) of its keys move, none of other adapters, no request fails"},
	{AdapterUnload, (*suite).adapterUnload, "an adapter is unloaded from one member (its set shrinks by one): only that member's keys move, none of other adapters, no request fails"},
	{AdapterHot, (*suite).adapterHot, "one adapter gets sustained load above the threshold: the agents grow its set by the next rendezvous choice; movement as for a join, no request fails"},
	{AdapterCrash, (*suite).adapterCrash, "the only instance holding an adapter crashes: its requests wait until, after its lease expires, the adapter is placed and loaded elsewhere; only requests in flight at the crash instant may fail; adapters not on it neither move nor fail"},
}

// Scenarios returns the scenario names in the order Run runs them; see
// Description.
func Scenarios() []string {
	out := make([]string, len(scenarios))
	for i, s := range scenarios {
		out[i] = s.name
	}
	return out
}

// Description is a one-line description of a scenario, empty for an unknown
// name.
func Description(name string) string {
	for _, s := range scenarios {
		if s.name == name {
			return s.doc
		}
	}
	return ""
}

// Options configures a run. Zero values mean the defaults in brackets; the
// long mode (Long) changes the defaults of the windows and cycles.
type Options struct {
	// Instances and Replicas of the fleet at the start [7, 2].
	Instances, Replicas int
	// Keys is the number of distinct probe requests whose ring primary is
	// compared before and after each event [10,000].
	Keys int
	// TimeScale runs the simulated GPUs that many times faster than real
	// time, so that load requests are quick [20].
	TimeScale float64
	// LoadRate is the background load across each event, in requests/s,
	// spread over the replicas in turn [40].
	LoadRate float64
	// Long runs more cycles of each scenario and longer windows.
	Long bool
	// Seed drives the probe texts and the choice of victims [1].
	Seed int64
	// TTL of every lease [2 s].
	TTL time.Duration
	// LoadWindow is how long the load runs before an event and after the
	// fleet converged [1 s; long 5 s].
	LoadWindow time.Duration
	// OutageWindow is how long etcd stays down [10 s; long 30 s].
	OutageWindow time.Duration
	// Cycles of each scenario [1; long 3].
	Cycles int
	// BreakerOpenTimeout of every replica's breakers [3 s].
	BreakerOpenTimeout time.Duration
	// Logger of the fleet; nil discards.
	Logger *slog.Logger
	// Progress receives one line per step; nil discards.
	Progress io.Writer
	// Scenarios to run, in this order; empty means all of Scenarios().
	Scenarios []string
}

// ErrUnknownScenario is returned by Run for a name not in Scenarios().
var ErrUnknownScenario = errors.New("chaos: unknown scenario")

// Defaults are the sizes a zero Options field stands for: the command's
// flag defaults, so that the two never disagree.
func Defaults() Options {
	return Options{Instances: 7, Replicas: 2, Keys: 10_000, TimeScale: 20, LoadRate: 40, Seed: 1}
}

func (c Options) withDefaults() (Options, error) {
	d := Defaults()
	c.Instances = cmp.Or(c.Instances, d.Instances)
	c.Replicas = cmp.Or(c.Replicas, d.Replicas)
	c.Keys = cmp.Or(c.Keys, d.Keys)
	c.TimeScale = cmp.Or(c.TimeScale, d.TimeScale)
	c.LoadRate = cmp.Or(c.LoadRate, d.LoadRate)
	c.Seed = cmp.Or(c.Seed, d.Seed)
	c.TTL = cmp.Or(c.TTL, 2*time.Second)
	if c.LoadWindow == 0 {
		c.LoadWindow = time.Second
		if c.Long {
			c.LoadWindow = 5 * time.Second
		}
	}
	if c.OutageWindow == 0 {
		c.OutageWindow = 10 * time.Second
		if c.Long {
			c.OutageWindow = 30 * time.Second
		}
	}
	if c.Cycles == 0 {
		c.Cycles = 1
		if c.Long {
			c.Cycles = 3
		}
	}
	if c.BreakerOpenTimeout == 0 {
		c.BreakerOpenTimeout = 3 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	if len(c.Scenarios) == 0 {
		c.Scenarios = Scenarios()
	}
	switch {
	case c.Instances < 2:
		return c, fmt.Errorf("chaos: %d instances: at least 2 are needed", c.Instances)
	case c.Instances > 64:
		return c, fmt.Errorf("chaos: %d instances: at most 64 (each is a simulated server in this process)", c.Instances)
	case c.Replicas < 1 || c.Replicas > 16:
		return c, fmt.Errorf("chaos: %d replicas: want 1 to 16", c.Replicas)
	case c.Keys < 100 || c.Keys > 1_000_000:
		return c, fmt.Errorf("chaos: %d keys: want 100 to 1,000,000", c.Keys)
	case c.TimeScale < 0, c.LoadRate <= 0 || c.LoadRate > 2000:
		return c, fmt.Errorf("chaos: time scale %v / load rate %v out of range", c.TimeScale, c.LoadRate)
	case c.TTL < time.Second || c.LoadWindow < 0 || c.OutageWindow <= 0 || c.Cycles < 1 || c.BreakerOpenTimeout <= 0:
		return c, errors.New("chaos: TTL must be at least 1 s; windows, cycles and the open timeout positive")
	}
	for _, s := range c.Scenarios {
		if Description(s) == "" {
			return c, fmt.Errorf("%w %q (known: %v)", ErrUnknownScenario, s, Scenarios())
		}
	}
	return c, nil
}

// Run starts a local fleet, runs the scenarios on it one after the other
// (each starts from the fleet the previous one left, converged) and returns
// the report. An error means the run could not go on (the fleet did not
// start or converge); property violations are failed Checks in the report.
func Run(ctx context.Context, cfg Options) (*Report, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	rep := &Report{Config: reportConfig(cfg), Started: time.Now()}
	progress(cfg, "chaos: starting %d instances, %d replicas (TTL %v, time scale %v)", cfg.Instances, cfg.Replicas, cfg.TTL, cfg.TimeScale)
	f, err := localfleet.Start(ctx, localfleet.Options{
		Instances: cfg.Instances, Replicas: cfg.Replicas,
		Sim:     sim.Options{TimeScale: cfg.TimeScale},
		Routing: fleet.DefaultRoutingConfig(),
		TTL:     cfg.TTL,
		Replica: replica.Options{
			// As serve runs: the vanish guard never holds the scenarios'
			// single crashes or graceful stops, which the movement checks
			// rely on.
			VanishGrace: replica.DefaultVanishGrace,
			Router: router.Options{
				Breaker: overload.BreakerOptions{OpenTimeout: cfg.BreakerOpenTimeout},
				// Opted in for hung-instance; the other scenarios do not depend
				// on it (a crashed instance is skipped sooner, before its lease
				// ends).
				HealthCheckInterval: healthCheckInterval,
				HealthCheckTimeout:  healthCheckTimeout,
			}},
		// Placement on, with quick windows for the adapter scenarios (no
		// effect before they catalogue adapters).
		Agent: agent.Options{PlaceAdapters: true, LoadPollInterval: agentLoadPoll, SaturationWindow: agentSaturationWindow, ScaleCooldown: agentScaleCooling},
		// Drain quickly: the load's requests last milliseconds.
		DrainTimeout: 10 * time.Second,
		Logger:       cfg.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("chaos: starting the fleet: %w", err)
	}
	defer f.Close()
	progress(cfg, "chaos: generating %d probe requests", cfg.Keys)
	s := &suite{cfg: cfg, f: f, probes: newProbes(cfg.Keys, cfg.Seed), rng: rand.New(rand.NewPCG(uint64(cfg.Seed), 0x6368616f73))}
	for _, name := range cfg.Scenarios {
		for c := 1; c <= cfg.Cycles; c++ {
			if err := ctx.Err(); err != nil {
				return rep, err
			}
			res := s.run(ctx, name)
			res.Cycle = c
			rep.Results = append(rep.Results, res)
			progress(cfg, "chaos: %s", res.summary())
			if res.Err != "" {
				rep.Duration = time.Since(rep.Started)
				return rep, fmt.Errorf("chaos: %s: %s", name, res.Err)
			}
		}
	}
	rep.Duration = time.Since(rep.Started)
	return rep, nil
}

func progress(cfg Options, format string, args ...any) {
	fmt.Fprintf(cfg.Progress, format+"\n", args...)
}

// pick returns a pseudo-random element of ids (sorted first, so that the
// choice depends only on the seed and the fleet).
func (s *suite) pick(ids []string) string {
	ids = slices.Clone(ids)
	slices.Sort(ids)
	return ids[s.rng.IntN(len(ids))]
}
