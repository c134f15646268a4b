package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/prefixrouter/prefixrouter/internal/sim"
)

func newModelsimCmd() *cobra.Command {
	var (
		listen string
		cfg    sim.Options
	)
	var profiles []string
	for _, p := range sim.Profiles() {
		profiles = append(profiles, fmt.Sprintf("  %-18s %s", p.Name, p.Description))
	}
	c := &cobra.Command{
		Use:   "modelsim",
		Short: "Run a simulated model server (vLLM-like, with prefix caching)",
		Long: `modelsim runs an HTTP server that behaves like vLLM with automatic prefix caching:
OpenAI /v1/chat/completions and /v1/completions (SSE streaming or not), SageMaker
/invocations and /ping, /v1/models, /health and /metrics under vLLM's metric names, and
vLLM's runtime LoRA updates (/v1/load_lora_adapter, /v1/unload_lora_adapter) with a load
time, a cap (--max-loras) and LRU eviction; a step with an adapter in its batch costs 8 % more.

Its KV cache works in blocks of 16 tokens (about 4 characters a token) with LRU eviction, and
its step-based continuous-batching scheduler charges time from a cost model fitted to prefill
and decode timings measured on a real GPU. No GPU is used: this is a simulator.

Profiles:
` + strings.Join(profiles, "\n"),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
			cfg.Logger = logger
			srv, err := sim.New(cfg)
			if err != nil {
				return usageErr("%w", err)
			}
			defer srv.Close()
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("modelsim: listen: %w", err)
			}
			logger.Info("modelsim serving", "addr", ln.Addr().String(), "id", srv.ID(), "profile", srv.Profile().Name)
			return serveUntilDone(cmd.Context(), &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second}, ln)
		},
	}
	f := c.Flags()
	f.StringVar(&listen, "listen", "127.0.0.1:8000", "address to serve on")
	f.StringVar(&cfg.ID, "id", sim.DefaultID, "instance id, reported in the X-Instance-Id response header")
	f.StringVar(&cfg.BaseModel, "base-model", sim.DefaultBaseModel, "base model id listed by /v1/models")
	f.StringSliceVar(&cfg.Adapters, "adapters", nil, "LoRA adapters to report as loaded (comma-separated)")
	f.IntVar(&cfg.MaxLoras, "max-loras", 0, "adapters held at most; loading one more evicts the least recently used idle one (0: no cap)")
	f.DurationVar(&cfg.AdapterLoadTime, "lora-load-time", sim.DefaultAdapterLoadTime, "simulated duration of POST /v1/load_lora_adapter")
	f.StringVar(&cfg.Profile, "profile", sim.DefaultProfile, "cost-model profile (see above)")
	f.IntVar(&cfg.KVCapacityTokens, "kv-capacity-tokens", 0, "KV cache capacity in tokens (0: the profile's)")
	f.IntVar(&cfg.MaxRunningSeqs, "max-running-seqs", 0, "maximum running sequences (0: the profile's, like vLLM's max_num_seqs)")
	f.IntVar(&cfg.TokenBudget, "token-budget", 0, "tokens per scheduler step (0: the profile's, like vLLM's max_num_batched_tokens)")
	f.Float64Var(&cfg.TimeScale, "time-scale", 1, "run this many times faster than real time (metrics report simulated time)")
	f.IntVar(&cfg.DefaultMaxTokens, "default-max-tokens", 16, "output tokens when a request names no max_tokens")
	return c
}

// serveUntilDone serves on ln until ctx ends, then shuts the server down
// gracefully (bounded) and returns.
func serveUntilDone(ctx context.Context, srv *http.Server, ln net.Listener) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := srv.Shutdown(shutCtx)
	if serveErr := <-errc; serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return serveErr
	}
	return err
}
