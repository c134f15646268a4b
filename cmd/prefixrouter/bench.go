package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/prefixrouter/prefixrouter/internal/bench"
)

func newBenchCmd() *cobra.Command {
	var (
		cfg     bench.Options
		capa    bench.CapacityOptions
		out     string
		presets []string
	)
	for _, p := range bench.Presets() {
		presets = append(presets, fmt.Sprintf("  %-18s %s", p.Name, p.Description))
	}
	c := &cobra.Command{
		Use:   "bench",
		Short: "Drive a workload against a router or model servers and report TTFT, hit rate and balance",
		Long: `bench sends an open-loop (Poisson) stream of requests from a workload preset to one or more
base URLs (router replicas, or a single model server), and measures client-side time to first
token, end-to-end latency, throughput and success rate. With --metrics-url (each instance's
/metrics, vLLM's metric names) it also reports the KV-cache hit rate over the measured window,
against the oracle: the hit rate of the same request stream on one unbounded cache.

Presets:
` + strings.Join(presets, "\n") + `

Example, against a real vLLM fleet behind a router:
  prefixrouter bench --target http://router:8080 --preset shared-8k --rate 10 \
    --requests 2000 --warmup 300 --model meta-llama/Llama-3.1-8B-Instruct \
    --metrics-url http://vllm-0:8000/metrics --metrics-url http://vllm-1:8000/metrics

Capacity: with --capacity-p90 D, bench searches the highest offered rate at which TTFT p90
stays within D (and 99 % succeed), starting at --rate: the rate grows ×1.5 while the target
holds, then bisects; each step is a whole run (--warmup, --requests). With --rate 0 it
searches a closed loop instead, from --concurrency requests in flight up. Throughput and
goodput count the requests finished between the first and the last measured send. Throughput
gains from cache hits show only there: below capacity every strategy finishes the same requests.
  prefixrouter bench --target http://router:8080 --preset shared-8k-seed --rate 0 --concurrency 7 \
    --capacity-p90 2s --requests 600 --warmup 150 --reset-prefix-cache --metrics-url ...`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(cfg.Targets) == 0 {
				return usageErr("--target is required")
			}
			if _, err := bench.LookupPreset(cfg.Preset); err != nil {
				return usageErr("%w", err)
			}
			if cfg.Requests == 0 && cfg.Duration == 0 {
				return usageErr("set --requests or --duration")
			}
			cfg.Progress = os.Stderr
			if capa.TargetP90 > 0 {
				capa.Run, capa.StartRate, capa.Progress = cfg, cfg.Rate, os.Stderr
				if cfg.Rate == 0 {
					if cfg.Concurrency == 0 {
						return usageErr("a closed-loop capacity search (--rate 0) starts at --concurrency: set it")
					}
					capa.StartConcurrency = cfg.Concurrency
				}
				res, err := bench.Capacity(cmd.Context(), capa)
				if res != nil {
					if werr := res.WriteTable(cmd.OutOrStdout()); werr != nil {
						return werr
					}
					if out != "" {
						if werr := writeJSONFile(out, res); werr != nil {
							return werr
						}
					}
				}
				return err
			}
			res, err := bench.Run(cmd.Context(), cfg)
			if res != nil {
				if werr := res.WriteTable(cmd.OutOrStdout()); werr != nil {
					return werr
				}
				if out != "" {
					f, ferr := os.Create(out)
					if ferr != nil {
						return ferr
					}
					defer f.Close()
					if werr := res.WriteJSON(f); werr != nil {
						return werr
					}
				}
			}
			return err
		},
	}
	f := c.Flags()
	f.StringSliceVar(&cfg.Targets, "target", nil, "base URL(s) to send to, e.g. http://127.0.0.1:8080 (repeat or comma-separate: requests alternate)")
	f.StringSliceVar(&cfg.MetricsURLs, "metrics-url", nil, "each instance's /metrics URL, for the KV hit rate and capacity")
	f.StringVar(&cfg.Preset, "preset", "shared-8k", "workload preset (see above)")
	f.Float64Var(&cfg.Rate, "rate", 5, "mean arrival rate, requests/s (Poisson)")
	f.Float64Var(&cfg.Burstiness, "burstiness", 0, "gamma shape of inter-arrival times: 0/1 Poisson, <1 burstier")
	f.IntVar(&cfg.Requests, "requests", 500, "measured requests")
	f.DurationVar(&cfg.Duration, "duration", 0, "bound on the measured window's arrivals (0: none)")
	f.IntVar(&cfg.Warmup, "warmup", 100, "requests sent first to warm caches, not measured")
	f.Int64Var(&cfg.Seed, "seed", 1, "seed of the request stream and arrivals")
	f.IntVar(&cfg.Tenants, "tenants", 0, "number of tenants (prompt_cache_key / X-Amzn-SageMaker-Prefix-Aware-Id); 0: none")
	f.Float64Var(&cfg.AdapterMix, "adapter-mix", 0, "share of requests naming a LoRA adapter from --adapters")
	f.StringSliceVar(&cfg.Adapters, "adapters", nil, "LoRA adapter names for --adapter-mix")
	f.StringVar(&cfg.Model, "model", "", "base model name for the model field (empty: omitted)")
	f.StringVar(&cfg.API, "api", bench.APIOpenAI, "openai (/v1/chat/completions) or invoke (SageMaker /invocations)")
	f.StringVar(&cfg.Endpoint, "endpoint", "", "use the router's /endpoints/{endpoint}/... paths")
	f.IntVar(&cfg.Concurrency, "concurrency", 0, "cap on requests in flight (0: the default)")
	f.DurationVar(&cfg.Timeout, "timeout", 2*time.Minute, "per-request timeout")
	f.BoolVar(&cfg.ResetPrefixCache, "reset-prefix-cache", false, "POST /reset_prefix_cache to each --metrics-url host first (vLLM), so the run starts cold")
	f.Float64Var(&cfg.TimeScale, "time-scale", 1, "the servers run this many times faster than real time (modelsim --time-scale): rates and timeouts are in server time, figures are reported in server time")
	f.StringVar(&cfg.Label, "label", "", "name of the run in the report")
	f.StringVar(&out, "out", "", "write the result as JSON to this file")
	f.DurationVar(&capa.TargetP90, "capacity-p90", 0, "search the capacity: the highest rate (from --rate up) at which TTFT p90 stays within this (server time); 0: one run at --rate")
	f.Float64Var(&capa.MaxRate, "capacity-max-rate", 0, "cap of the capacity search, requests/s (0: 64 × --rate)")
	f.IntVar(&capa.MaxConcurrency, "capacity-max-concurrency", 0, "cap of a closed-loop capacity search, requests in flight (0: 64 × --concurrency)")
	f.IntVar(&capa.Refine, "capacity-refine", 0, "bisection steps after the first rate that misses the target (0: 3; -1: none)")
	return c
}

// writeJSONFile writes v as indented JSON to path.
func writeJSONFile(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
