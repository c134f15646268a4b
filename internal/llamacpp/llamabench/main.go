// Command llamabench runs the routing strategies side by side on real
// llama.cpp llama-server instances (issue 20): for each strategy it starts
// a fresh fleet of servers (cold caches) serving a tiny random-weight
// model, a router replica over them as `prefixrouter serve
// --static-instances` runs one, and the bench workload through the
// router; then it prints the comparison (Markdown) and writes report.md
// and report.json. `make bench-llamacpp` runs it with the kit from
// ../shared/engines; docs/benchmarks.md has a run. Everything listens on
// loopback, and every run is bounded in requests and time.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/bench"
	"github.com/prefixrouter/prefixrouter/internal/gguf"
	"github.com/prefixrouter/prefixrouter/internal/llamacpp"
	"github.com/prefixrouter/prefixrouter/replica"
	"github.com/prefixrouter/prefixrouter/router"
)

type config struct {
	instances, slots, context, threads int
	preset                             string
	rate                               float64
	concurrency, warmup, requests      int
	threshold                          int
	seed                               int64
	strategies                         string
	out                                string
	limit                              time.Duration
}

func main() {
	var c config
	flag.IntVar(&c.instances, "instances", 4, "llama-server instances")
	flag.IntVar(&c.slots, "slots", 3, "slots per server (-np); each caches one prompt")
	flag.IntVar(&c.context, "context", 3072, "KV cache per server in tokens (-c), shared by its slots")
	flag.IntVar(&c.threads, "threads", 1, "threads per server (-t)")
	flag.StringVar(&c.preset, "preset", "llamacpp-tiny", "bench workload preset")
	flag.Float64Var(&c.rate, "rate", 0, "arrival rate in requests/s (0: closed loop, --concurrency requests in flight)")
	flag.IntVar(&c.concurrency, "concurrency", 4, "requests in flight at most")
	flag.IntVar(&c.warmup, "warmup", 24, "warm-up requests per run, not measured")
	flag.IntVar(&c.requests, "requests", 120, "measured requests per run")
	flag.IntVar(&c.threshold, "concurrency-threshold", 4, "PREFIX_AWARE ConcurrencyThreshold")
	flag.Int64Var(&c.seed, "seed", 1, "seed of the request stream and the model's weights")
	flag.StringVar(&c.strategies, "strategies", "RANDOM,LEAST_OUTSTANDING_REQUESTS,PREFIX_AWARE", "strategies to run, in order")
	flag.StringVar(&c.out, "out", "llamacpp-report", "directory for report.md and report.json (empty: none)")
	flag.DurationVar(&c.limit, "time-limit", 20*time.Minute, "bound on the whole run")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, c.limit)
	defer cancel()
	if err := run(ctx, c, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "llamabench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, c config, out, progress io.Writer) error {
	kit, err := llamacpp.FromEnv()
	if err != nil {
		return err
	}
	var strategies []fleet.Strategy
	for _, s := range strings.Split(c.strategies, ",") {
		st := fleet.Strategy(strings.ToUpper(strings.TrimSpace(s)))
		if !st.Valid() {
			return fmt.Errorf("strategy %q is not one of RANDOM, LEAST_OUTSTANDING_REQUESTS, PREFIX_AWARE", s)
		}
		strategies = append(strategies, st)
	}
	tmp, err := os.MkdirTemp("", "llamabench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	shape := gguf.Llama{Seed: uint64(c.seed)}
	model, err := kit.ModelIn(tmp, shape)
	if err != nil {
		return err
	}
	cmp := &bench.Comparison{Title: "prefixrouter on real llama.cpp llama-server instances", Environment: environment(c, kit, shape)}
	for _, st := range strategies {
		res, urlToID, err := runOne(ctx, c, kit, model, st, progress)
		if res != nil {
			cmp.Runs = append(cmp.Runs, res)
			cmp.Notes = append(cmp.Notes, perInstance(res, urlToID))
			_ = res.WriteTable(progress)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", st, err)
		}
	}
	if c.out != "" {
		if err := os.MkdirAll(c.out, 0o755); err != nil {
			return err
		}
		for name, write := range map[string]func(io.Writer) error{"report.md": cmp.WriteMarkdown, "report.json": cmp.WriteJSON} {
			if err := writeFile(filepath.Join(c.out, name), write); err != nil {
				return err
			}
		}
	}
	return cmp.WriteMarkdown(out)
}

// environment says what served the runs, for the report.
func environment(c config, kit llamacpp.Kit, shape gguf.Llama) string {
	return fmt.Sprintf("%d llama.cpp llama-server instances (%s), each -t %d -np %d -c %d, serving %s, "+
		"on %d CPU cores shared with other work; one router replica (static fleet, as `serve --static-instances`), "+
		"in process; each strategy gets freshly started servers (cold caches); warm-up %d requests not measured; "+
		"%s; PREFIX_AWARE ConcurrencyThreshold %d, PrefixLength %d. A server's prefix cache holds one prompt per slot "+
		"(the regime line counts its capacity as slots × document tokens). Hit (metrics) is 1 - the prompt tokens the engines "+
		"evaluated (llamacpp:prompt_tokens_total) / the prompt tokens their answers reported; hit (usage) reads each "+
		"answer's timings (usage.prompt_tokens - timings.prompt_n).",
		c.instances, kit.Server, c.threads, c.slots, c.context, modelName(kit, shape), runtime.NumCPU(), c.warmup,
		load(c), c.threshold, fleet.MinPrefixLength)
}

func modelName(kit llamacpp.Kit, shape gguf.Llama) string {
	if kit.Model != "" {
		return kit.Model
	}
	return fmt.Sprintf("a random-weight llama model written by internal/gguf (its default shape: 4 layers, embedding 256, "+
		"4 heads, FFN 768, F16; the vocabulary of %s; seed %d)", filepath.Base(kit.Vocab), shape.Seed)
}

func load(c config) string {
	if c.rate <= 0 {
		return fmt.Sprintf("closed loop: %d requests in flight, %d measured", c.concurrency, c.requests)
	}
	return fmt.Sprintf("Poisson arrivals at %g req/s (at most %d in flight), %d measured", c.rate, c.concurrency, c.requests)
}

// runOne measures one strategy on a fresh fleet and returns the result and
// each metrics URL's instance id.
func runOne(ctx context.Context, c config, kit llamacpp.Kit, model string, st fleet.Strategy, progress io.Writer) (*bench.Result, map[string]string, error) {
	fmt.Fprintf(progress, "llamabench: %s: starting %d llama-server instances\n", st, c.instances)
	f, err := llamacpp.Start(ctx, llamacpp.Options{Kit: kit, Model: model, Instances: c.instances,
		Threads: c.threads, Slots: c.slots, Context: c.context})
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	var insts []fleet.Instance
	var metrics []string
	urlToID := map[string]string{}
	for _, s := range f.Servers() {
		insts = append(insts, fleet.Instance{ID: s.ID, Addr: s.URL})
		metrics = append(metrics, s.URL+"/metrics")
		urlToID[s.URL+"/metrics"] = s.ID
	}
	rep, err := replica.Start(ctx, replica.Options{
		Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0",
		Logger: slog.New(slog.DiscardHandler),
		Router: router.Options{DefaultEndpoint: "default"},
		Static: insts,
		Routing: fleet.RoutingConfig{RoutingStrategy: st, PrefixAwareRoutingConfig: &fleet.PrefixAwareConfig{
			PrefixLength: fleet.MinPrefixLength, ConcurrencyThreshold: c.threshold}},
	})
	if err != nil {
		return nil, nil, err
	}
	defer rep.Close(context.Background())
	res, err := bench.Run(ctx, bench.Options{
		Targets: []string{rep.URL()}, MetricsURLs: metrics, Preset: c.preset,
		Rate: c.rate, Concurrency: c.concurrency, Warmup: c.warmup, Requests: c.requests, Seed: c.seed,
		Model: "tiny", Label: string(st), Progress: progress, Instances: c.instances,
		InstanceKVTokens: instanceCapacity(c),
		Timeout:          5 * time.Minute,
	})
	return res, urlToID, err
}

// instanceCapacity is one server's prefix cache in the preset's tokens for
// the regime line: llama-server caches one prompt per slot, so its
// capacity is slots documents, whatever its context.
func instanceCapacity(c config) int64 {
	p, err := bench.LookupPreset(c.preset)
	if err != nil {
		return 0 // bench.Run reports the unknown preset
	}
	return int64(c.slots) * int64(p.DocumentTokens)
}

// perInstance is a note on one run: each instance's share of the requests
// and its cache hit rate by its own /metrics.
func perInstance(res *bench.Result, urlToID map[string]string) string {
	evaluated := map[string]float64{}
	for _, m := range res.Metrics {
		evaluated[urlToID[m.URL]] = m.Evaluated
	}
	var parts []string
	for _, is := range res.Instances {
		hit := "n/a"
		if is.PromptTokens > 0 {
			hit = fmt.Sprintf("%.1f %%", 100*(1-evaluated[is.Instance]/float64(is.PromptTokens)))
		}
		parts = append(parts, fmt.Sprintf("%s %.1f %% of requests, hit %s", is.Instance, 100*is.Share, hit))
	}
	sort.Strings(parts)
	return fmt.Sprintf("%s per instance (share; hit by the engine's /metrics): %s", res.Label, strings.Join(parts, "; "))
}

func writeFile(path string, write func(io.Writer) error) error {
	fh, err := os.Create(path)
	if err != nil {
		return err
	}
	werr := write(fh)
	if cerr := fh.Close(); werr == nil {
		werr = cerr
	}
	return werr
}
