package probe

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"
)

// Health check defaults.
const (
	DefaultHealthPath         = "/health"
	DefaultHealthTimeout      = time.Second
	DefaultUnhealthyThreshold = 2
)

// Instance is the per-instance state that health checks and load polls
// update; overload.State implements it.
type Instance interface {
	ID() string
	// ObserveProbe records one health probe's outcome and reports whether
	// the instance's health changed.
	ObserveProbe(ok bool, threshold int) (changed bool)
	// InFlight is the number of requests this replica has in flight on it.
	InFlight() int64
	// SetExternalLoad records the load other sources put on it; negative
	// means unknown.
	SetExternalLoad(n int64)
}

// Target is one instance to probe: the full URL to GET, the state the
// outcome goes to and the engine its record names ("" unknown: see
// engine.Lookup), whose gauges give its load.
type Target struct {
	URL      string
	Instance Instance
	Engine   string
}

// Health is the active health check: GET of the health URL, healthy if any
// HTTP response with a status below 500 arrives within the timeout (so a
// server without the path, answering 404, counts as healthy), unhealthy on
// a connection error, a timeout or a 5xx. An instance is marked down after
// UnhealthyThreshold consecutive failures and up after one success. It
// catches instances that accept connections but never answer (stopped,
// deadlocked), which the passive circuit breaker only learns about through
// failed requests.
type Health struct {
	// Client performs the probes; nil means NewClient(http.DefaultTransport). Each probe
	// is bounded by Options.Timeout through its context regardless.
	Client *http.Client
	// UnhealthyThreshold is how many consecutive failed probes mark an
	// instance down; zero means DefaultUnhealthyThreshold.
	UnhealthyThreshold int
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// StartHealth starts health checks of targets() every o.Interval; a zero
// o.Timeout means DefaultHealthTimeout.
func StartHealth(o Options, h Health, targets func() []Target) (*Prober, error) {
	o, h, err := h.withDefaults(o)
	if err != nil {
		return nil, err
	}
	return Start(o, targets, h.probe, h.observe)
}

func (h Health) withDefaults(o Options) (Options, Health, error) {
	if h.UnhealthyThreshold < 0 {
		return o, h, fmt.Errorf("probe: unhealthy threshold %d must not be negative", h.UnhealthyThreshold)
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultHealthTimeout
	}
	if h.UnhealthyThreshold == 0 {
		h.UnhealthyThreshold = DefaultUnhealthyThreshold
	}
	if h.Client == nil {
		h.Client = NewClient(http.DefaultTransport)
	}
	if h.Logger == nil {
		h.Logger = slog.Default()
	}
	return o, h, nil
}

func (h Health) probe(ctx context.Context, t Target) (struct{}, error) {
	body, err := get(ctx, h.Client, t.URL, "", func(code int) bool { return code < 500 })
	if err != nil {
		return struct{}{}, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(body, 4096))
	return struct{}{}, body.Close()
}

func (h Health) observe(t Target, _ struct{}, err error) {
	if !t.Instance.ObserveProbe(err == nil, h.UnhealthyThreshold) {
		return
	}
	if err != nil {
		h.Logger.Warn("probe: instance failed health checks; marked down", "instance", t.Instance.ID(), "err", err)
	} else {
		h.Logger.Info("probe: instance passed a health check; marked up", "instance", t.Instance.ID())
	}
}

// NewClient returns the client probes should use over tr: it never follows a
// redirect (a record pointing at a redirector must not make every replica
// fetch another URL; the 3xx itself is the answer) and has no timeout of its
// own (each probe's context bounds it).
func NewClient(tr http.RoundTripper) *http.Client {
	return &http.Client{
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// get GETs url (with an Accept header unless accept is empty) and returns
// the body of an answer whose status passes ok; otherwise an error, with
// the body drained so that the connection is reused.
func get(ctx context.Context, c *http.Client, url, accept string, ok func(code int) bool) (io.ReadCloser, error) {
	resp, err := getResponse(ctx, c, url, accept, ok)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// getResponse is get returning the whole response.
func getResponse(ctx context.Context, c *http.Client, url, accept string, ok func(code int) bool) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("probe: %w", err)
	}
	if req.URL.User != nil {
		// Probes would send the credentials of whatever a record names.
		return nil, fmt.Errorf("probe: GET %s: a target with user info is refused", req.URL.Redacted())
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("probe: %w", err)
	}
	if !ok(resp.StatusCode) {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		return nil, fmt.Errorf("probe: GET %s: %s", url, resp.Status)
	}
	return resp, nil
}
