package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/prefixrouter/prefixrouter/internal/proxybench"
)

func newProxybenchCmd() *cobra.Command {
	var (
		o   proxybench.Options
		out string
	)
	c := &cobra.Command{
		Use:   "proxybench",
		Short: "Compare direct, prefixrouter and HAProxy on loopback: req/s, added latency, CPU (make proxybench)",
		Long: `proxybench starts zero-delay stand-in model servers in this process, this binary as
'serve --static-instances' in front of them (defaults, --prefix-length 4096), and, when
installed, HAProxy hashing the first 4096 body bytes (balance hash req.body,bytes(0,4096),
hash-type consistent, hash-balance-factor 125, option http-buffer-request,
tune.bufsize 65536). Closed-loop clients post SageMaker invoke bodies directly and through
each proxy, alternating, and it prints req/s, the p50/p99 each proxy adds over direct and
each proxy process's CPU seconds per 1,000 requests (from /proc). Loopback only; it exits 1
if any request failed. See docs/benchmarks.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Rounds < 0 || o.Duration < 0 || o.Warmup < 0 || o.MaxRequests < 0 {
				return usageErr("proxybench: counts and durations must not be negative")
			}
			for _, n := range append(append([]int{}, o.Sizes...), o.Clients...) {
				if n <= 0 {
					return usageErr("proxybench: --sizes and --clients must be positive")
				}
			}
			if o.Prefixrouter == "" {
				exe, err := os.Executable()
				if err != nil {
					return err
				}
				o.Prefixrouter = exe
			}
			o.Progress = cmd.ErrOrStderr()
			rep, err := proxybench.Run(cmd.Context(), o)
			if err != nil {
				return err
			}
			if err := writeOut(cmd, out, rep.WriteMarkdown); err != nil {
				return err
			}
			if rep.Failed() {
				return fmt.Errorf("proxybench: some requests failed")
			}
			return nil
		},
	}
	f := c.Flags()
	f.IntSliceVar(&o.Sizes, "sizes", []int{1 << 10, 16 << 10, 256 << 10}, "request body sizes in bytes")
	f.IntSliceVar(&o.Clients, "clients", []int{1, 16, 64}, "closed-loop client counts")
	f.IntVar(&o.Rounds, "rounds", 3, "rounds per cell (medians over them)")
	f.DurationVar(&o.Duration, "duration", 2*time.Second, "measured time of one run (one target, one cell, one round)")
	f.DurationVar(&o.Warmup, "warmup", 300*time.Millisecond, "unmeasured time before each run")
	f.IntVar(&o.MaxRequests, "max-requests", 1_000_000, "requests per run at most")
	f.StringVar(&o.Prefixrouter, "prefixrouter", "", "prefixrouter binary to run as the proxy (default: this one)")
	f.StringSliceVar(&o.Baselines, "baseline", nil, "also run this binary (an older build, or a measuring stick such as internal/proxybench/minproxy) with the same serve arguments, as the target \"baseline\" (repeat or comma-separate for several: \"baseline:<file name>\" each): before and after in one run")
	f.StringVar(&o.HAProxy, "haproxy", "", "haproxy binary (default: haproxy in PATH; none: the HAProxy column is skipped)")
	f.StringVar(&o.ProfileDir, "profile-dir", "", "run prefixrouter with --pprof and save CPU and allocation profiles of each cell's first round here")
	f.StringVar(&out, "out", "", "write the table to this file instead of stdout")
	return c
}
