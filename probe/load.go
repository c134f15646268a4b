package probe

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/prefixrouter/prefixrouter/engine"
)

// Load is load polling: it scrapes each instance's Prometheus metrics and
// records the load other sources put on it (the requests its engine reports
// running and waiting, minus this replica's own in-flight requests) with
// Instance.SetExternalLoad. A failed scrape, or one without the engine's
// gauges, sets the load to unknown, so that admission falls back to the
// replica's share of the threshold.
type Load struct {
	// Client performs the scrapes; nil means NewClient(http.DefaultTransport). Each
	// scrape is bounded by Options.Timeout through its context regardless.
	Client *http.Client
	// Metrics, when set, are summed over all their series to give every
	// instance's load; nil means each target's engine gauges
	// (Metrics.EngineLoad of Target.Engine's profile).
	Metrics []string
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// StartLoad starts polling targets() every o.Interval; a zero o.Timeout
// means o.Interval.
func StartLoad(o Options, l Load, targets func() []Target) (*Prober, error) {
	l = l.withDefaults()
	return Start(o, targets, l.probe, l.observe)
}

func (l Load) withDefaults() Load {
	if l.Client == nil {
		l.Client = NewClient(http.DefaultTransport)
	}
	if l.Logger == nil {
		l.Logger = slog.Default()
	}
	return l
}

func (l Load) probe(ctx context.Context, t Target) (int64, error) {
	m, err := Scrape(ctx, l.Client, t.URL)
	if err != nil {
		return 0, err
	}
	var sum float64
	if l.Metrics != nil {
		sum, err = m.Sum(l.Metrics...)
	} else {
		p, _ := engine.Lookup(t.Engine)
		var el EngineLoad
		el, err = m.EngineLoad(p)
		sum = el.Requests()
	}
	if err != nil {
		return 0, err
	}
	// A count of requests: NaN, negative or absurd values (which would
	// not even convert to int64) mean a broken exporter, so unknown.
	if !(sum >= 0 && sum < 1<<53) {
		return 0, fmt.Errorf("probe: load %v from %s is not a request count", sum, t.URL)
	}
	return int64(sum + 0.5), nil
}

func (l Load) observe(t Target, load int64, err error) {
	if err != nil {
		l.Logger.Debug("probe: load poll failed", "instance", t.Instance.ID(), "err", err)
		t.Instance.SetExternalLoad(-1)
		return
	}
	// The reported load includes our own requests that reached the
	// instance; subtract them so that admission does not count them twice.
	t.Instance.SetExternalLoad(max(0, load-t.Instance.InFlight()))
}
