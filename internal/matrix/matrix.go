// Package matrix runs the seed's 16-configuration benchmark (issue 11):
// {single model, LoRA adapters} × {invoke, OpenAI} × {shared-8k, sharegpt-like}
// × {streamed, not}, each under PREFIX_AWARE and RANDOM, on one in-process
// fleet, and reports one table row per configuration.
package matrix

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/prefixrouter/prefixrouter/agent"
	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/bench"
	"github.com/prefixrouter/prefixrouter/internal/localfleet"
	"github.com/prefixrouter/prefixrouter/internal/sim"
	"github.com/prefixrouter/prefixrouter/membership"
)

// Options size the run. Zero values mean the defaults in brackets, chosen
// so that the 32 runs take a few minutes on a 2-core machine.
type Options struct {
	// Instances of the simulated fleet [4] and router replicas [1].
	Instances, Replicas int
	// Requests measured per run [40], after Warmup [8].
	Requests, Warmup int
	// Concurrency of each run's client [8].
	Concurrency int
	// TimeScale of the simulated servers [20].
	TimeScale float64
	// Seed of the request streams [1].
	Seed int64
	// Progress receives a line per run; nil discards.
	Progress io.Writer
	// Logger of the fleet; nil discards.
	Logger *slog.Logger
}

// Defaults are the sizes a zero Options field stands for: the command's
// flag defaults, so that the two never disagree.
func Defaults() Options {
	return Options{Instances: 4, Replicas: 1, Requests: 40, Warmup: 8, Concurrency: 8, TimeScale: 20, Seed: 1}
}

func (o Options) withDefaults() Options {
	d := Defaults()
	o.Instances = cmp.Or(o.Instances, d.Instances)
	o.Replicas = cmp.Or(o.Replicas, d.Replicas)
	o.Requests = cmp.Or(o.Requests, d.Requests)
	o.Warmup = cmp.Or(o.Warmup, d.Warmup)
	o.Concurrency = cmp.Or(o.Concurrency, d.Concurrency)
	o.TimeScale = cmp.Or(o.TimeScale, d.TimeScale)
	o.Seed = cmp.Or(o.Seed, d.Seed)
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// Adapters catalogued for the adapter rows (min = max = 2 replicas, so each
// adapter's sticky set is 2 of the instances).
var Adapters = []string{"lora-sql", "lora-chat", "lora-code", "lora-med"}

// Config is one row of the matrix.
type Config struct {
	Adapters bool   // requests name LoRA adapters (else the base model)
	API      string // bench.APIInvoke or bench.APIOpenAI
	Preset   string // "shared-8k" or "sharegpt-like"
	Stream   bool
}

func (c Config) String() string {
	model := "single model"
	if c.Adapters {
		model = "adapters"
	}
	s := "not streamed"
	if c.Stream {
		s = "streamed"
	}
	return fmt.Sprintf("%s, %s, %s, %s", model, c.API, c.Preset, s)
}

// Configs returns the 16 configurations in table order.
func Configs() []Config {
	var out []Config
	for _, ad := range []bool{false, true} {
		for _, api := range []string{bench.APIInvoke, bench.APIOpenAI} {
			for _, p := range []string{"shared-8k", "sharegpt-like"} {
				for _, st := range []bool{true, false} {
					out = append(out, Config{Adapters: ad, API: api, Preset: p, Stream: st})
				}
			}
		}
	}
	return out
}

// Measure is one strategy's measurement of one configuration.
type Measure struct {
	Requests, Succeeded int
	SuccessRate         float64
	HitRate             float64 // usage-based KV hit rate
	TTFTp50, E2Ep50     float64 // ms, simulated time
}

// Row is one configuration under both strategies.
type Row struct {
	Config              Config
	PrefixAware, Random Measure
}

// Report is the whole matrix.
type Report struct {
	Options Options
	Rows    []Row
	Took    time.Duration
}

// Run starts the fleet, catalogues the adapters and runs every
// configuration under PREFIX_AWARE and RANDOM, each from a cold prefix
// cache.
func Run(ctx context.Context, o Options) (*Report, error) {
	o = o.withDefaults()
	start := time.Now()
	f, err := localfleet.Start(ctx, localfleet.Options{
		Instances: o.Instances, Replicas: o.Replicas, FastEtcd: true, Logger: o.Logger, TTL: 5 * time.Second,
		Sim:     sim.Options{TimeScale: o.TimeScale, MaxLoras: 4},
		Routing: fleet.RoutingConfig{RoutingStrategy: fleet.PrefixAware},
		Agent:   agent.Options{PlaceAdapters: true, LoadPollInterval: 200 * time.Millisecond},
	})
	if err != nil {
		return nil, fmt.Errorf("matrix: start the fleet: %w", err)
	}
	defer f.Close()
	for _, a := range Adapters {
		if err := membership.PutAdapter(ctx, f.Client(), membership.Layout{}, f.Endpoint(), fleet.Adapter{Name: a, Source: "/adapters/" + a, MinReplicas: 2, MaxReplicas: 2}); err != nil {
			return nil, err
		}
	}
	// Every adapter loaded on its 2 instances before the first run.
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	err = f.WaitFor(wctx, func(s *fleet.Snapshot) bool {
		ep := s.Endpoint(f.Endpoint())
		for _, a := range Adapters {
			n := 0
			for _, in := range ep.Instances {
				if in.HasAdapter(a) {
					n++
				}
			}
			if n != 2 {
				return false
			}
		}
		return true
	})
	cancel()
	if err != nil {
		return nil, fmt.Errorf("matrix: adapters not loaded: %w", err)
	}
	rep := &Report{Options: o}
	for i, c := range Configs() {
		row := Row{Config: c}
		for _, st := range []fleet.Strategy{fleet.PrefixAware, fleet.Random} {
			if err := f.SetRouting(ctx, fleet.RoutingConfig{RoutingStrategy: st}); err != nil {
				return nil, err
			}
			bo := bench.Options{
				Targets: f.RouterURLs(), MetricsURLs: f.MetricsURLs(), Preset: c.Preset,
				Requests: o.Requests, Warmup: o.Warmup, Concurrency: o.Concurrency, Seed: o.Seed + int64(i),
				API: c.API, NoStream: !c.Stream, TimeScale: o.TimeScale, ResetPrefixCache: true,
				Model: sim.DefaultBaseModel, Label: string(st), Tenants: 1,
				// Server time: a non-streamed answer of a long ShareGPT
				// output on a loaded fleet takes tens of simulated seconds.
				Timeout: 10 * time.Minute,
			}
			if c.Adapters {
				bo.AdapterMix, bo.Adapters = 1, Adapters
			}
			res, err := bench.Run(ctx, bo)
			if err != nil {
				return nil, fmt.Errorf("matrix: %s under %s: %w", c, st, err)
			}
			r := Measure{Requests: res.Requests, Succeeded: res.Succeeded, SuccessRate: res.SuccessRate,
				HitRate: res.UsageHitRate, TTFTp50: res.TTFT.P50, E2Ep50: res.E2E.P50}
			if st == fleet.PrefixAware {
				row.PrefixAware = r
			} else {
				row.Random = r
			}
			fmt.Fprintf(o.Progress, "matrix %2d/16 %-12s %-50s success %5.1f %%  hit %5.1f %%  TTFT p50 %7.1f ms %v\n",
				i+1, st, c, 100*r.SuccessRate, 100*r.HitRate, r.TTFTp50, res.Errors)
		}
		rep.Rows = append(rep.Rows, row)
	}
	rep.Took = time.Since(start)
	return rep, nil
}

// Passed reports whether every run of every row succeeded fully.
func (r *Report) Passed() bool {
	for _, row := range r.Rows {
		for _, run := range []Measure{row.PrefixAware, row.Random} {
			if run.Requests == 0 || run.Succeeded != run.Requests {
				return false
			}
		}
	}
	return len(r.Rows) == len(Configs())
}

// WriteMarkdown writes the table.
func (r *Report) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	o := r.Options
	fmt.Fprintf(&b, "%d simulated instances (time scale %g), %d router replica(s); per run %d measured requests after %d warm-up, %d concurrent, cold prefix cache; adapter rows: %d adapters, 2 replicas each; run took %.0f s.\n\n",
		o.Instances, o.TimeScale, o.Replicas, o.Requests, o.Warmup, o.Concurrency, len(Adapters), r.Took.Seconds())
	b.WriteString("| # | model | API | workload | stream | success PA / RANDOM | KV hit PA / RANDOM | TTFT p50 ms PA / RANDOM |\n|---|---|---|---|---|---|---|---|\n")
	for i, row := range r.Rows {
		c := row.Config
		model := "single model"
		if c.Adapters {
			model = "adapters"
		}
		stream := "no"
		if c.Stream {
			stream = "yes"
		}
		pa, rd := row.PrefixAware, row.Random
		fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %.0f %% / %.0f %% | %.1f %% / %.1f %% | %.0f / %.0f |\n",
			i+1, model, c.API, c.Preset, stream, 100*pa.SuccessRate, 100*rd.SuccessRate, 100*pa.HitRate, 100*rd.HitRate, pa.TTFTp50, rd.TTFTp50)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
