package main

import (
	"github.com/spf13/cobra"
	"log/slog"

	"github.com/prefixrouter/prefixrouter/internal/demo"
)

func newDemoCmd() *cobra.Command {
	cfg := demo.Default()
	var (
		logLevel  slog.Level
		workloads []string
	)
	c := &cobra.Command{
		Use:   "demo",
		Short: "Run everything embedded: simulated fleet, two router replicas, every strategy side by side",
		Long: `demo is the main job on a fresh machine. It starts an embedded etcd, simulated model
servers (vLLM-like, with prefix caching and a cost model calibrated on an H200) registered
through the real agent, and two router replicas; then drives each workload under RANDOM,
LEAST_OUTSTANDING_REQUESTS and PREFIX_AWARE, switching the routing config through etcd
between runs (no restart). It prints P50/P90 time to first token, throughput, KV hit rate
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
						return usageErr("--workload %q is not one of the demo's workloads", name)
					}
				}
				cfg.Workloads = keep
			}
			cfg.Out = cmd.OutOrStdout()
			_, err := demo.Run(cmd.Context(), cfg)
			return err
		},
	}
	f := c.Flags()
	f.IntVar(&cfg.Instances, "instances", cfg.Instances, "simulated model servers")
	f.IntVar(&cfg.Replicas, "replicas", cfg.Replicas, "router replicas")
	f.StringVar(&cfg.Profile, "profile", cfg.Profile, "simulator cost-model profile")
	f.IntVar(&cfg.KVCapacityTokens, "kv-capacity-tokens", cfg.KVCapacityTokens, "KV cache capacity of each simulated instance, in tokens")
	f.Float64Var(&cfg.TimeScale, "time-scale", cfg.TimeScale, "run the simulated servers this many times faster than real time (figures stay in simulated time)")
	f.Float64Var(&cfg.BalanceFactor, "balance-factor", cfg.BalanceFactor, "bounded-load factor of the router replicas under PREFIX_AWARE (0: off)")
	f.StringSliceVar(&workloads, "workload", nil, "run only these workload presets (default: all of the demo's)")
	f.Int64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the request streams")
	f.StringVar(&cfg.OutDir, "out-dir", cfg.OutDir, "directory for report.md, report.json and report.html")
	bindLogLevel(f, &logLevel, slog.LevelError, "log level of the embedded components")
	return c
}
