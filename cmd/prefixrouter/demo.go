package main

import (
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/bench"
	"github.com/prefixrouter/prefixrouter/internal/demo"
)

func newDemoCmd() *cobra.Command {
	cfg := demo.Default()
	var (
		logLevel   slog.Level
		workloads  []string
		strategies []string
		capacity   string
	)
	c := &cobra.Command{
		Use:   "demo",
		Short: "Run everything embedded: simulated fleet, two router replicas, every strategy side by side",
		Long: `demo is the main job on a fresh machine. It starts an embedded etcd, simulated model
servers (vLLM-like, with prefix caching and a cost model calibrated on an H200) registered
through the real agent, and two router replicas; then drives each workload under RANDOM,
LEAST_OUTSTANDING_REQUESTS, PREFIX_AWARE (keys that follow the prompt's tree, the default), PREFIX_AWARE
with SageMaker's fixed-length keys and with fixed-length keys and hot-key replication,
switching the routing config through etcd between runs (no restart). It prints P50/P90 time to first token, throughput, KV hit rate
against the oracle and each instance's share of requests, and writes report.md, report.json
and report.html (self-contained charts) to --out-dir.

The model servers are simulated: no GPU is used, and the figures are the simulator's.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger := newLogger(logLevel)
			cfg.Logger = logger
			if len(workloads) > 0 {
				var keep []demo.Workload
				for _, name := range workloads {
					found := false
					for _, w := range cfg.Workloads {
						if w.Preset == name {
							keep, found = append(keep, w), true
						}
					}
					if !found {
						// Any other preset runs at the demo's usual size.
						if _, err := bench.LookupPreset(name); err != nil {
							return usageErr("--workload %q: %v", name, err)
						}
						keep = append(keep, demo.Workload{Preset: name, Rate: 7, Warmup: 200, Requests: 600})
					}
				}
				cfg.Workloads = keep
			}
			if len(strategies) > 0 {
				cfg.Strategies = nil
				for _, name := range strategies {
					st := fleet.Strategy(name)
					if !st.Valid() {
						return usageErr("--strategy %q is not one of RANDOM, LEAST_OUTSTANDING_REQUESTS, PREFIX_AWARE", name)
					}
					cfg.Strategies = append(cfg.Strategies, st)
				}
				cfg.Capacity.Strategies = cfg.Strategies
			}
			switch capacity {
			case "on":
			case "off":
				cfg.Capacity = nil
			case "only":
				cfg.Workloads, cfg.OverheadProbes = nil, 0
			default:
				return usageErr("--capacity %q is not one of on, off, only", capacity)
			}
			cfg.Out = cmd.OutOrStdout()
			_, err := demo.Run(cmd.Context(), cfg)
			return err
		},
	}
	f := c.Flags()
	bindSimulatedFleet(f, &cfg.Instances, &cfg.Replicas, &cfg.TimeScale)
	f.StringVar(&cfg.Profile, "profile", cfg.Profile, "simulator cost-model profile")
	f.IntVar(&cfg.KVCapacityTokens, "kv-capacity-tokens", cfg.KVCapacityTokens, "KV cache capacity of each simulated instance, in tokens")
	f.Float64Var(&cfg.BalanceFactor, "balance-factor", cfg.BalanceFactor, "bounded-load factor of the router replicas under PREFIX_AWARE (0: off)")
	f.StringSliceVar(&workloads, "workload", nil, "run only these workload presets (default: all of the demo's; another preset runs at 7 req/s, 200 warm-up + 600 measured requests)")
	f.StringSliceVar(&strategies, "strategy", nil, "run only these strategies (default: RANDOM, LEAST_OUTSTANDING_REQUESTS, PREFIX_AWARE)")
	f.StringVar(&capacity, "capacity", "on", "the capacity search after the workloads (issue 22): on, off, or only (no workloads)")
	f.BoolVar(&cfg.FixedKeys, "fixed-keys", cfg.FixedKeys, "after each PREFIX_AWARE run, run PREFIX_AWARE with SageMaker's fixed-length keys ("+demo.FixedLabel+")")
	f.BoolVar(&cfg.HotKeys, "hot-keys", cfg.HotKeys, "after each PREFIX_AWARE run, run PREFIX_AWARE with fixed-length keys and hot-key replication ("+demo.HotLabel+")")
	f.Int64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the request streams")
	f.StringVar(&cfg.OutDir, "out-dir", cfg.OutDir, "directory for report.md, report.json and report.html")
	bindLogLevel(f, &logLevel, slog.LevelError, "log level of the embedded components")
	return c
}
