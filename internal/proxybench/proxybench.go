// Package proxybench measures what a proxy in front of model servers costs
// (issue 9): closed-loop clients post SageMaker invoke bodies to zero-delay
// stand-in backends directly, through prefixrouter and through HAProxy 2.6
// configured to hash the same prefix, on loopback; it reports throughput,
// the latency each proxy adds over direct, and each proxy process's CPU per
// request.
package proxybench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// Options size the run. Zero values mean the defaults in brackets.
type Options struct {
	// Sizes of the request bodies in bytes [1 KiB, 16 KiB, 256 KiB].
	Sizes []int
	// Clients are the closed-loop client counts [1, 16, 64].
	Clients []int
	// Rounds per cell [3]; each round runs every target once, in an order
	// rotated each round, and cells report medians over rounds.
	Rounds int
	// Duration of one measured run [2 s], after Warmup [300 ms].
	Duration, Warmup time.Duration
	// MaxRequests bounds one run's requests [1,000,000].
	MaxRequests int
	// Backends is the number of stand-in model servers [7]; Documents the
	// number of distinct bodies [256].
	Backends, Documents int
	// Prefixrouter is the binary run as `serve` (required).
	Prefixrouter string
	// Baselines are more binaries run beside Prefixrouter, with the same
	// `serve` arguments, so that a change (an older build) or a measuring
	// stick (internal/proxybench/minproxy, rawfloor, eventloopfloor) is
	// measured in the same run: the target "baseline" when there is one,
	// "baseline:<file name>" each when there are more.
	Baselines []string
	// HAProxy is the haproxy binary; "" looks it up in PATH, and without
	// it (or with "none") the HAProxy column is skipped.
	HAProxy string
	// ProfileDir, when set, runs prefixrouter with --pprof and saves a CPU
	// and an allocation profile of its first round in each cell there
	// (cpu-<size>-<clients>.pprof, allocs-…). That round pays the
	// profiler's cost.
	ProfileDir string
	// Progress receives a line per run; nil discards.
	Progress io.Writer
}

func (o Options) withDefaults() Options {
	if len(o.Sizes) == 0 {
		o.Sizes = []int{1 << 10, 16 << 10, 256 << 10}
	}
	if len(o.Clients) == 0 {
		o.Clients = []int{1, 16, 64}
	}
	if o.Rounds == 0 {
		o.Rounds = 3
	}
	if o.Duration == 0 {
		o.Duration = 2 * time.Second
	}
	if o.Warmup == 0 {
		o.Warmup = 300 * time.Millisecond
	}
	if o.MaxRequests == 0 {
		o.MaxRequests = 1_000_000
	}
	if o.Backends == 0 {
		o.Backends = 7
	}
	if o.Documents == 0 {
		o.Documents = 256
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	return o
}

// Run starts the backends and the proxies, measures every cell and stops
// everything it started.
func Run(ctx context.Context, o Options) (*Report, error) {
	o = o.withDefaults()
	if o.Prefixrouter == "" {
		return nil, errors.New("proxybench: no prefixrouter binary")
	}
	if o.ProfileDir != "" {
		if err := os.MkdirAll(o.ProfileDir, 0o755); err != nil {
			return nil, fmt.Errorf("proxybench: profile directory: %w", err)
		}
	}
	rep := &Report{Options: o, LoadBefore: loadavg()}
	haproxy := o.HAProxy
	switch haproxy {
	case "none":
		haproxy = ""
		rep.Skipped = "HAProxy left out (--haproxy none)"
	case "":
		if p, err := exec.LookPath("haproxy"); err == nil {
			haproxy = p
		} else {
			rep.Skipped = "haproxy is not installed (Debian: apt-get install haproxy); its column is skipped"
			fmt.Fprintln(o.Progress, "proxybench:", rep.Skipped)
		}
	}
	if haproxy != "" {
		out, err := exec.CommandContext(ctx, haproxy, "-v").Output()
		if err != nil {
			return nil, fmt.Errorf("proxybench: %s -v: %w", haproxy, err)
		}
		rep.HAProxyVersion = firstLine(string(out))
	}
	b, err := startBackends(o.Backends)
	if err != nil {
		return nil, err
	}
	defer b.Close()
	targets := []*target{directTarget(b)}
	pr, err := startPrefixrouter(ctx, o.Prefixrouter, b, o.ProfileDir != "")
	if err != nil {
		return nil, err
	}
	defer pr.Close()
	for _, bin := range o.Baselines {
		base, err := startPrefixrouter(ctx, bin, b, false)
		if err != nil {
			return nil, err
		}
		defer base.Close()
		base.name = "baseline"
		if len(o.Baselines) > 1 {
			base.name += ":" + filepath.Base(bin)
		}
		targets = append(targets, base)
	}
	targets = append(targets, pr)
	if haproxy != "" {
		dir, err := os.MkdirTemp("", "proxybench-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		ha, err := startHAProxy(ctx, haproxy, dir, b)
		if err != nil {
			return nil, err
		}
		defer ha.Close()
		targets = append(targets, ha)
	}
	for _, t := range targets {
		rep.Targets = append(rep.Targets, t.name)
	}
	for _, size := range o.Sizes {
		docs, err := bodies(o.Documents, size)
		if err != nil {
			return nil, err
		}
		for _, clients := range o.Clients {
			cell := Cell{Size: size, Clients: clients, Samples: map[string][]sample{}}
			for round := range o.Rounds {
				for k := range targets {
					t := targets[(k+round)%len(targets)]
					var stopProfile func() error
					if o.ProfileDir != "" && round == 0 && t == pr {
						stopProfile = profile(ctx, pr.admin, o.ProfileDir, size, clients, o.Duration)
					}
					s, err := load(ctx, t, docs, clients, o.Warmup, o.Duration, o.MaxRequests)
					if stopProfile != nil {
						if perr := stopProfile(); perr != nil && err == nil {
							err = perr
						}
					}
					if err != nil {
						return nil, err
					}
					cell.Samples[t.name] = append(cell.Samples[t.name], s)
					fmt.Fprintf(o.Progress, "proxybench: %s, %d clients, round %d, %-12s %8.0f req/s  p50 %6.2f ms  p99 %6.2f ms  errors %d\n",
						sizeName(size), clients, round+1, t.name, s.rate(), ms(s.p50), ms(s.p99), s.errors)
				}
			}
			rep.Cells = append(rep.Cells, cell)
		}
	}
	rep.LoadAfter = loadavg()
	return rep, nil
}

// profile starts a CPU profile of prefixrouter covering the run (d) in the
// background; the returned func waits for it, then saves an allocation
// profile too.
func profile(ctx context.Context, admin, dir string, size, clients int, d time.Duration) func() error {
	name := fmt.Sprintf("%s-%d.pprof", sizeName(size), clients)
	secs := max(1, int(d.Seconds()))
	done := make(chan error, 1)
	go func() { // waited for by the returned func
		done <- fetch(ctx, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", admin, secs), filepath.Join(dir, "cpu-"+name))
	}()
	return func() error {
		if err := <-done; err != nil {
			return err
		}
		return fetch(ctx, "http://"+admin+"/debug/pprof/allocs", filepath.Join(dir, "allocs-"+name))
	}
}

func fetch(ctx context.Context, url, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("proxybench: profile: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("proxybench: profile %s: status %d", url, resp.StatusCode)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// loadavg is the first three fields of /proc/loadavg, as uptime prints them.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	var a, b5, c string
	fmt.Sscan(string(b), &a, &b5, &c)
	return a + ", " + b5 + ", " + c
}
