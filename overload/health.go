package overload

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"
)

// Health check defaults.
const (
	DefaultHealthCheckPath        = "/health"
	DefaultHealthCheckTimeout     = time.Second
	DefaultUnhealthyThreshold     = 2
	DefaultHealthCheckConcurrency = 32
)

// HealthCheckerOptions configures a HealthChecker.
type HealthCheckerOptions struct {
	// Interval between probe rounds; required (> 0).
	Interval time.Duration
	// Timeout bounds each probe; zero means DefaultHealthCheckTimeout.
	Timeout time.Duration
	// Targets returns the instances to probe (URL is the full health URL);
	// called once per round.
	Targets func() []Target
	// Client performs the probes; nil means http.DefaultClient. Each probe
	// is bounded by Timeout through its context regardless.
	Client *http.Client
	// UnhealthyThreshold is how many consecutive failed probes mark an
	// instance down; zero means DefaultUnhealthyThreshold. One success
	// marks it up again.
	UnhealthyThreshold int
	// Concurrency bounds the probes in flight at once; zero means
	// DefaultHealthCheckConcurrency.
	Concurrency int
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// HealthChecker actively probes instances: GET of the health URL, healthy if
// any HTTP response with a status below 500 arrives within the timeout (so a
// server without the path, answering 404, counts as healthy), unhealthy on a
// connection error, a timeout or a 5xx. It catches instances that accept
// connections but never answer (stopped, deadlocked), which the passive
// circuit breaker only learns about through failed requests.
type HealthChecker struct {
	opts   HealthCheckerOptions
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// NewHealthChecker starts probing in a goroutine owned by the checker; Close
// stops it.
func NewHealthChecker(o HealthCheckerOptions) (*HealthChecker, error) {
	if o.Interval <= 0 {
		return nil, fmt.Errorf("overload: health check interval %v must be positive", o.Interval)
	}
	if o.Timeout < 0 || o.UnhealthyThreshold < 0 || o.Concurrency < 0 {
		return nil, fmt.Errorf("overload: negative health check timeout, threshold or concurrency")
	}
	if o.Targets == nil {
		return nil, fmt.Errorf("overload: health checker needs Targets")
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultHealthCheckTimeout
	}
	if o.UnhealthyThreshold == 0 {
		o.UnhealthyThreshold = DefaultUnhealthyThreshold
	}
	if o.Concurrency == 0 {
		o.Concurrency = DefaultHealthCheckConcurrency
	}
	if o.Client == nil {
		o.Client = http.DefaultClient
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &HealthChecker{opts: o, cancel: cancel}
	h.wg.Add(1)
	go h.run(ctx)
	return h, nil
}

// Close stops the checker and waits for its goroutines.
func (h *HealthChecker) Close() error {
	h.cancel()
	h.wg.Wait()
	return nil
}

func (h *HealthChecker) run(ctx context.Context) {
	defer h.wg.Done()
	t := time.NewTicker(h.opts.Interval)
	defer t.Stop()
	for {
		h.Check(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Check probes every target once, at most Concurrency at a time, records the
// outcomes and returns when all probes are done (each within Timeout). A
// round cut short by ctx records nothing for the probes it cancelled.
func (h *HealthChecker) Check(ctx context.Context) {
	sem := make(chan struct{}, h.opts.Concurrency)
	var wg sync.WaitGroup
	for _, tg := range h.opts.Targets() {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			err := h.probe(ctx, tg.URL)
			if ctx.Err() != nil {
				return // shutting down: not the instance's fault
			}
			if tg.State.ObserveProbe(err == nil, h.opts.UnhealthyThreshold) {
				if err != nil {
					h.opts.Logger.Warn("overload: instance failed health checks; marked down", "instance", tg.State.ID(), "err", err)
				} else {
					h.opts.Logger.Info("overload: instance passed a health check; marked up", "instance", tg.State.ID())
				}
			}
		}()
	}
	wg.Wait()
}

func (h *HealthChecker) probe(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, h.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := h.opts.Client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	if resp.StatusCode >= 500 {
		return fmt.Errorf("overload: %s answered %d", url, resp.StatusCode)
	}
	return nil
}
