package main

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/prefixrouter/prefixrouter/agent"
	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/lora"
	"github.com/prefixrouter/prefixrouter/membership"
)

func newRegisterCmd() *cobra.Command {
	var (
		ef       etcdFlags
		endpoint string
		inst     fleet.Instance
		discover bool
		ttl      time.Duration
		drain    time.Duration
		poll     time.Duration
		labels   map[string]string
		health   []string
		logLevel slog.Level
		place    agent.Options
		eng      string
	)
	c := &cobra.Command{
		Use:   "register",
		Short: "Register a model server in etcd and hold its lease (the agent beside each model server)",
		Long: `register is the agent that runs beside a model server (vLLM, SGLang, llama.cpp's
llama-server, TGI, modelsim). It waits until the server answers its health path, names its
engine (--engine, or detected from its /metrics names, /v1/models owned_by and Server
header; docs/engines.md), registers it in etcd under a lease
(<prefix>/endpoints/<endpoint>/instances/<id>, with "engine"), keeps the lease alive, and
with --discover-adapters polls the server's /v1/models and updates the record when its LoRA
adapters change (vLLM and SGLang list adapters with "parent" set; the base model's id goes
into the "model" label). Beside llama-server it always reads GET /lora-adapters: the
adapters it loaded at start (--lora), named by their file name without .gguf, with the
positions routers use to select them; --adapters must name some of those.

With --place-adapters (the default) it also loads the catalogued adapters that placement
assigns to this instance (vLLM: POST /v1/load_lora_adapter with
VLLM_ALLOW_RUNTIME_LORA_UPDATING=True; SGLang: POST /load_lora_adapter), unloads the others
but --adapters, publishes whether the instance is saturated and which adapters are in use, and
writes the growth and shrink decisions every agent makes alike (docs/adapters.md).
llama-server cannot load adapters at run time: it gets no placement.

On SIGTERM or SIGINT it marks the instance draining (routers stop sending new requests),
waits until the server reports no running or waiting requests (its engine's gauges on
/metrics: vllm:num_requests_running/waiting, sglang:num_running_reqs/num_queue_reqs,
llamacpp:requests_processing/deferred) or --drain-timeout passes, revokes the lease and
exits 0. If the agent crashes, the lease expires after --ttl and routers drop the
instance.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger := newLogger(logLevel)
			if inst.ID == "" || inst.Addr == "" {
				return usageErr("--id and --addr are required")
			}
			if err := fleet.ValidateName("endpoint name", endpoint); err != nil {
				return usageErr("--endpoint: %w", err)
			}
			if len(labels) > 0 {
				inst.Labels = labels
			}
			if inst.Addr != "" && !strings.Contains(inst.Addr, "://") {
				inst.Addr = "http://" + inst.Addr
			}
			if err := inst.Validate(); err != nil {
				return usageErr("%w", err)
			}
			if err := (agent.Options{Engine: eng}).Validate(); err != nil {
				return usageErr("--engine: %w", err)
			}
			cli, err := ef.client()
			if err != nil {
				return err
			}
			defer cli.Close()
			err = agent.Run(cmd.Context(), agent.Options{
				Client:           cli,
				Options:          membership.Options{Layout: ef.layout, TTL: ttl, Logger: logger},
				Endpoint:         endpoint,
				Instance:         inst,
				Engine:           eng,
				DiscoverAdapters: discover,
				HealthPaths:      health,
				PollInterval:     poll,
				DrainTimeout:     drain,
				PlaceAdapters:    place.PlaceAdapters,
				LoadPollInterval: place.LoadPollInterval,
				SaturationWindow: place.SaturationWindow,
				ActiveWindow:     place.ActiveWindow,
				ScaleCooldown:    place.ScaleCooldown,
			})
			if err != nil {
				return fmt.Errorf("register: %w", err)
			}
			return nil
		},
	}
	f := c.Flags()
	ef.register(f)
	f.StringVar(&endpoint, "endpoint", "default", "endpoint the instance serves")
	f.StringVar(&inst.ID, "id", "", "instance id, unique within the endpoint (required)")
	f.StringVar(&inst.Addr, "addr", "", "base URL routers send requests to, e.g. http://10.0.0.7:8000 (required)")
	f.StringSliceVar(&inst.Adapters, "adapters", nil, "LoRA adapters loaded on the instance (comma-separated; kept alongside discovered ones)")
	f.StringVar(&eng, "engine", "", "the model server's engine: vllm, sglang, llamacpp or tgi (default: detect it once the server is healthy)")
	f.BoolVar(&discover, "discover-adapters", false, "poll the server's /v1/models and register the adapters it lists")
	f.IntVar(&inst.MaxAdapters, "max-adapters", 0, "adapter slots of the instance (vLLM's --max-loras/--max-cpu-loras); 0: read max_lora from vllm:lora_requests_info, else unlimited")
	f.BoolVar(&place.PlaceAdapters, "place-adapters", true, "load the catalogued adapters placed on this instance and unload the others (see 'prefixrouter adapter')")
	f.DurationVar(&place.LoadPollInterval, "load-poll-interval", agent.DefaultLoadPollInterval, "how often placement reads the server's load and adapters in use")
	f.DurationVar(&place.SaturationWindow, "saturation-window", agent.DefaultSaturationWindow, "load at or above the concurrency threshold this long marks the instance saturated (below half of it as long clears it)")
	// The flag's name until issue 18 ("hot" now means a popular key only).
	f.DurationVar(&place.SaturationWindow, "hot-window", agent.DefaultSaturationWindow, "old name of --saturation-window")
	_ = f.MarkDeprecated("hot-window", "use --saturation-window")
	f.DurationVar(&place.ActiveWindow, "active-window", agent.DefaultActiveWindow, "an adapter unused this long on every instance is cold (its set shrinks to --min-replicas)")
	f.DurationVar(&place.ScaleCooldown, "scale-cooldown", lora.DefaultScaleCooldown, "least time between two size changes of an adapter's set")
	f.IntVar(&inst.Weight, "weight", 1, "relative share of the hash space (e.g. 2 for an instance twice as large; 1..100)")
	f.StringToStringVar(&labels, "labels", nil, "labels, key=value,...; model=NAME declares the base model")
	f.StringSliceVar(&health, "health-path", agent.DefaultHealthPaths, "health paths tried in order until one answers 2xx")
	f.DurationVar(&ttl, "ttl", membership.DefaultTTL, "lease TTL: a crashed agent's instance disappears after about this long")
	f.DurationVar(&drain, "drain-timeout", agent.DefaultDrainTimeout, "on SIGTERM, the longest wait for requests in flight before revoking")
	f.DurationVar(&poll, "discover-interval", agent.DefaultPollInterval, "how often --discover-adapters polls /v1/models")
	bindLogLevel(f, &logLevel, slog.LevelInfo, "log level")
	return c
}

func newConfigCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "config",
		Short: "Read or change an endpoint's routing config in etcd (live on every replica)",
	}
	c.AddCommand(newConfigSetCmd(), newConfigGetCmd())
	return c
}

func newConfigSetCmd() *cobra.Command {
	c := newEndpointCmd("set", "Validate and write an endpoint's routing config", "endpoint whose config to set")
	c.Long = `config set writes <prefix>/endpoints/<endpoint>/config in SageMaker's RoutingConfig shape,
e.g. {"RoutingStrategy":"PREFIX_AWARE","PrefixAwareRoutingConfig":{"PrefixLength":4096,
"ConcurrencyThreshold":10}}, from its flags (one per field; a field left out means its
default) or whole from --routing-config. Every router replica applies it within about a
second, without a restart. An invalid value is refused with exit code 2 and nothing is
written. config get prints it with every field that is set.`
	var rc fleet.RoutingConfig
	f := c.Flags()
	bindRouting(f, &rc)
	raw := f.String("routing-config", "", "the whole RoutingConfig as JSON (instead of the other flags)")
	firstByte := f.Duration("first-byte-timeout", 0, "cut this endpoint's streamed calls whose instance sends no response byte within this long, counting against its breaker (non-streamed calls are not cut: their first byte comes when the whole generation is done) (FirstByteTimeoutInMilliseconds; 1ms..1h; left out: each replica's --upstream-first-byte-timeout)")
	variants := f.StringSlice("production-variants", nil, "split traffic that names no X-Amzn-SageMaker-Target-Variant by weight between variants, NAME=WEIGHT,... (ProductionVariants; weights 0..1e6, not all 0; an instance's variant is its label \"variant\")")
	c.RunE = func(cmd *cobra.Command, _ []string) error {
		if *raw != "" {
			for _, name := range []string{"strategy", "prefix-length", "concurrency-threshold", "hot-key-replication", "fixed-length-keys", "tenant-cache-salt", "production-variants", "first-byte-timeout"} {
				if f.Changed(name) {
					return usageErr("--routing-config excludes --%s", name)
				}
			}
			var err error
			if rc, err = membership.ParseRoutingConfig([]byte(*raw)); err != nil {
				return usageErr("--routing-config: %w", err)
			}
		} else {
			if f.Changed("first-byte-timeout") {
				if d := *firstByte; d < time.Millisecond || d%time.Millisecond != 0 {
					return usageErr("--first-byte-timeout %v must be a whole number of milliseconds, at least 1ms", d)
				}
				rc.FirstByteTimeoutInMilliseconds = int(firstByte.Milliseconds())
			}
			for _, v := range *variants {
				name, weight, ok := strings.Cut(v, "=")
				w, err := strconv.ParseFloat(weight, 64)
				if !ok || err != nil {
					return usageErr("--production-variants %q: want NAME=WEIGHT", v)
				}
				rc.ProductionVariants = append(rc.ProductionVariants, fleet.ProductionVariant{VariantName: name, InitialVariantWeight: w})
			}
			if err := rc.Validate(); err != nil {
				return usageErr("%w", err)
			}
		}
		return c.etcd(cmd, func(ctx context.Context, cli *clientv3.Client) error {
			if err := membership.PutConfig(ctx, cli, c.ef.layout, c.endpoint, rc); err != nil {
				return fmt.Errorf("config set: %w", err)
			}
			return printJSON(cmd.OutOrStdout(), rc.WithDefaults())
		})
	}
	return c.Command
}

func newConfigGetCmd() *cobra.Command {
	c := newEndpointCmd("get", "Print an endpoint's routing config (the default when none is set)", "endpoint whose config to print")
	c.RunE = func(cmd *cobra.Command, _ []string) error {
		return c.etcd(cmd, func(ctx context.Context, cli *clientv3.Client) error {
			rc, set, err := membership.GetConfig(ctx, cli, c.ef.layout, c.endpoint)
			if err != nil {
				return fmt.Errorf("config get: %w", err)
			}
			if !set {
				fmt.Fprintf(cmd.ErrOrStderr(), "no config set for endpoint %q; routers use the default:\n", c.endpoint)
			}
			return printJSON(cmd.OutOrStdout(), rc)
		})
	}
	return c.Command
}
