package main

import (
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/prefixrouter/prefixrouter/internal/matrix"
)

func newMatrixCmd() *cobra.Command {
	o := matrix.Defaults()
	var out string
	var logLevel slog.Level
	c := &cobra.Command{
		Use:   "matrix",
		Short: "Run the seed's 16-configuration benchmark, PREFIX_AWARE against RANDOM (make matrix)",
		Long: `matrix starts an embedded fleet (etcd, simulated vLLM servers placed with LoRA adapters by
their agents, router replicas) and runs {single model, adapters} × {invoke, OpenAI} ×
{shared-8k, sharegpt-like} × {streamed, not}: 16 configurations, each under PREFIX_AWARE and
RANDOM from a cold prefix cache. It prints one table (success rate, KV hit rate, TTFT P50) and
exits 1 unless every request of every run succeeded. The servers are simulated.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Instances < 0 || o.Replicas < 0 || o.Requests < 0 || o.Warmup < 0 || o.Concurrency < 0 || o.TimeScale < 0 {
				return usageErr("matrix: sizes must not be negative")
			}
			o.Logger = newLogger(logLevel)
			o.Progress = cmd.ErrOrStderr()
			rep, err := matrix.Run(cmd.Context(), o)
			if err != nil {
				return err
			}
			if err := writeOut(cmd, out, rep.WriteMarkdown); err != nil {
				return err
			}
			return verdict(rep.Passed(), "matrix: not every request succeeded")
		},
	}
	f := c.Flags()
	bindSimulatedFleet(f, &o.Instances, &o.Replicas, &o.TimeScale)
	f.IntVar(&o.Requests, "requests", o.Requests, "measured requests per run")
	f.IntVar(&o.Warmup, "warmup", o.Warmup, "warm-up requests per run")
	f.IntVar(&o.Concurrency, "concurrency", o.Concurrency, "requests in flight per run")
	f.StringVar(&out, "out", "", "write the table to this file instead of stdout")
	bindLogLevel(f, &logLevel, slog.LevelWarn, "log level")
	return c
}
