package overload

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// DefaultLoadMetrics are the vLLM gauges whose sum is an instance's load.
var DefaultLoadMetrics = []string{"vllm:num_requests_running", "vllm:num_requests_waiting"}

// Target is one instance to poll: its /metrics URL and the State to update.
type Target struct {
	URL   string
	State *State
}

// PollerOptions configures a Poller.
type PollerOptions struct {
	// Interval between polls; required (> 0).
	Interval time.Duration
	// Targets returns the instances to poll; called once per round.
	Targets func() []Target
	// Client performs the scrapes; nil means a client with a timeout of
	// Interval.
	Client *http.Client
	// Metrics are summed over all their series to give the instance's load.
	// Nil means DefaultLoadMetrics.
	Metrics []string
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// Poller periodically scrapes each instance's Prometheus metrics and records
// the load other sources put on it (reported load minus this replica's own
// in-flight requests) with State.SetExternalLoad. A failed scrape sets the
// load to unknown, so admission falls back to the replica share.
type Poller struct {
	opts   PollerOptions
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// NewPoller starts polling in a goroutine owned by the Poller; Close stops it.
func NewPoller(o PollerOptions) (*Poller, error) {
	if o.Interval <= 0 {
		return nil, fmt.Errorf("overload: poll interval %v must be positive", o.Interval)
	}
	if o.Targets == nil {
		return nil, fmt.Errorf("overload: poller needs Targets")
	}
	if o.Client == nil {
		o.Client = &http.Client{Timeout: o.Interval}
	}
	if o.Metrics == nil {
		o.Metrics = DefaultLoadMetrics
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Poller{opts: o, cancel: cancel}
	p.wg.Add(1)
	go p.run(ctx)
	return p, nil
}

// Close stops the poller and waits for its goroutines.
func (p *Poller) Close() error {
	p.cancel()
	p.wg.Wait()
	return nil
}

func (p *Poller) run(ctx context.Context) {
	defer p.wg.Done()
	t := time.NewTicker(p.opts.Interval)
	defer t.Stop()
	for {
		p.Poll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Poll scrapes every target once, concurrently, and returns when all are done.
func (p *Poller) Poll(ctx context.Context) {
	var wg sync.WaitGroup
	for _, tg := range p.opts.Targets() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			load, err := p.scrape(ctx, tg.URL)
			if err != nil {
				if ctx.Err() == nil {
					p.opts.Logger.Debug("overload: load poll failed", "instance", tg.State.ID(), "err", err)
				}
				tg.State.SetExternalLoad(-1)
				return
			}
			// The reported load includes our own requests that reached the
			// instance; subtract them so Load() does not count them twice.
			tg.State.SetExternalLoad(max(0, load-tg.State.InFlight()))
		}()
	}
	wg.Wait()
}

func (p *Poller) scrape(ctx context.Context, url string) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Accept", "text/plain")
	resp, err := p.opts.Client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return 0, fmt.Errorf("overload: %s answered %d", url, resp.StatusCode)
	}
	return ParseLoad(io.LimitReader(resp.Body, 8<<20), p.opts.Metrics)
}

// ParseLoad sums the values of the named gauges (all series, e.g. one per
// model) in a Prometheus text exposition. It fails if none is present, so
// that a server which does not export them is treated as unknown, not idle.
func ParseLoad(r io.Reader, names []string) (int64, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return 0, fmt.Errorf("overload: parse metrics: %w", err)
	}
	var sum float64
	found := false
	for _, name := range names {
		fam, ok := fams[name]
		if !ok {
			continue
		}
		found = true
		for _, m := range fam.GetMetric() {
			sum += value(m)
		}
	}
	if !found {
		return 0, fmt.Errorf("overload: none of %s exported", strings.Join(names, ", "))
	}
	return int64(sum + 0.5), nil
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Untyped != nil:
		return m.GetUntyped().GetValue()
	}
	return 0
}
