package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/prefixrouter/prefixrouter/chaos"
)

func newChaosCmd() *cobra.Command {
	cfg := chaos.Defaults()
	var outDir string
	var logLevel slog.Level
	var lines []string
	for _, s := range chaos.Scenarios() {
		lines = append(lines, fmt.Sprintf("  %-17s %s", s, chaos.Description(s)))
	}
	c := &cobra.Command{
		Use:   "chaos",
		Short: "Run scale and fault scenarios; measure how much routing moves and that nothing is lost",
		Long: `chaos starts a local fleet (embedded etcd, simulated model servers registered by the real
agent, router replicas), keeps a bounded background load running through the replicas, and
plays scale and fault events. For each it measures how many of a fixed set of probe keys
changed instance (against the ideal, with collateral moves that should be zero), agreement
across replicas, convergence time, and every failed request.

Scenarios:
` + strings.Join(lines, "\n") + `

Exits 1 when a check fails. --long runs more cycles and longer windows (a 30 s etcd outage).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger := newLogger(logLevel)
			cfg.Logger = logger
			cfg.Progress = os.Stderr
			rep, err := chaos.Run(cmd.Context(), cfg)
			if errors.Is(err, chaos.ErrUnknownScenario) {
				return usageErr("%w", err)
			}
			if rep != nil {
				if werr := rep.WriteTable(cmd.OutOrStdout()); werr != nil {
					return werr
				}
				if outDir != "" {
					if werr := writeChaosReport(outDir, rep); werr != nil {
						return werr
					}
					fmt.Fprintf(os.Stderr, "chaos: report written to %s/report.{md,json}\n", outDir)
				}
			}
			if err != nil {
				return err
			}
			return verdict(rep.Passed(), "chaos: some checks failed (see the report)")
		},
	}
	f := c.Flags()
	bindSimulatedFleet(f, &cfg.Instances, &cfg.Replicas, &cfg.TimeScale)
	f.IntVar(&cfg.Keys, "keys", cfg.Keys, "probe keys compared before and after each event")
	f.Float64Var(&cfg.LoadRate, "rate", cfg.LoadRate, "background load, requests/s over all replicas")
	f.BoolVar(&cfg.Long, "long", false, "more cycles and longer windows (soak)")
	f.Int64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the probe texts and of the victims")
	f.StringSliceVar(&cfg.Scenarios, "scenario", nil, "scenarios to run (default: all)")
	f.StringVar(&outDir, "out-dir", "chaos-report", "directory for report.md and report.json (empty: none)")
	bindLogLevel(f, &logLevel, slog.LevelError, "log level of the embedded components")
	return c
}

func writeChaosReport(dir string, rep *chaos.Report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	md, err := os.Create(filepath.Join(dir, "report.md"))
	if err != nil {
		return err
	}
	if err := rep.WriteMarkdown(md); err != nil {
		md.Close()
		return err
	}
	if err := md.Close(); err != nil {
		return err
	}
	js, err := os.Create(filepath.Join(dir, "report.json"))
	if err != nil {
		return err
	}
	if err := rep.WriteJSON(js); err != nil {
		js.Close()
		return err
	}
	return js.Close()
}
