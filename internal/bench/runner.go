package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prefixrouter/prefixrouter/probe"
)

// API modes.
const (
	// APIOpenAI posts to /v1/chat/completions (or the endpoint's OpenAI
	// path) with the tenant as prompt_cache_key.
	APIOpenAI = "openai"
	// APIInvoke posts the same body to /invocations (or
	// /endpoints/{endpoint}/invocations) with the tenant in
	// X-Amzn-SageMaker-Prefix-Aware-Id, like SageMaker's InvokeEndpoint.
	APIInvoke = "invoke"
)

// Defaults for Config's zero values.
const (
	DefaultConcurrency = 256
	DefaultTimeout     = 2 * time.Minute
)

// Options is one benchmark run. The zero value of each field is documented;
// Targets and at least one of Requests and Duration are required.
type Options struct {
	// Targets are base URLs (router replicas or model servers); requests
	// alternate between them round-robin.
	Targets []string
	// MetricsURLs are the instances' /metrics URLs; the KV hit rate is the
	// delta of vllm:prefix_cache_hits_total / queries_total over the
	// measured window. Empty: no metrics hit rate.
	MetricsURLs []string
	// Preset names a built-in workload; Workload, if set, replaces it.
	Preset   string
	Workload *Preset
	// Rate is the mean arrival rate in requests/s (Poisson). 0 sends as
	// fast as Concurrency allows.
	Rate float64
	// Burstiness is the shape of gamma-distributed inter-arrival times
	// (vLLM's --burstiness): 0 or 1 is Poisson, below 1 burstier, above 1
	// more regular.
	Burstiness float64
	// Requests is the number of measured requests; Duration bounds the
	// measured arrivals in time. Either may be 0 (not both).
	Requests int
	Duration time.Duration
	// Warmup requests are sent first and drained before the measured
	// window; they warm the caches (and the oracle) but are not measured.
	Warmup int
	// Seed fixes the request stream and the arrival times.
	Seed int64
	// Tenants, AdapterMix and Adapters: see StreamOptions.
	Tenants    int
	AdapterMix float64
	Adapters   []string
	// Model is the base model's name; empty omits the field.
	Model string
	// API is APIOpenAI (default when empty) or APIInvoke.
	API string
	// Endpoint, if set, uses the router's /endpoints/{Endpoint}/... paths.
	Endpoint string
	// Concurrency caps requests in flight (0: DefaultConcurrency). At the
	// cap, arrivals wait: the run turns closed-loop, which the result
	// reports as ClientDelayed.
	Concurrency int
	// Timeout is the per-request timeout (0: DefaultTimeout).
	Timeout time.Duration
	// Progress, if set, receives a progress bar (a terminal) or a line
	// every few seconds (anything else).
	Progress io.Writer
	// InstanceKVTokens is one instance's KV-cache capacity in tokens and
	// Instances the fleet size, for the regime line. InstanceKVTokens 0:
	// read at the start of the run from every metrics URL's
	// vllm:cache_config_info (block_size × num_gpu_blocks; the smallest
	// instance's, the fleet's is their sum), "capacity unknown" if any
	// instance does not export it. Instances 0: len(MetricsURLs).
	InstanceKVTokens int64
	Instances        int
	// ResetPrefixCache, before the warmup, POSTs /reset_prefix_cache
	// (vLLM's; a real vLLM serves it only with VLLM_SERVER_DEV_MODE=1) to
	// the host of every metrics URL, so a run on a fleet reused from an
	// earlier run starts cold. Any answer but 2xx fails the run.
	// Requires MetricsURLs.
	ResetPrefixCache bool
	// TimeScale says the servers run TimeScale times faster than real
	// time (the simulator's --time-scale); 0 or 1 is real time. Rate,
	// Duration and Timeout are then in server time: the wall-clock arrival
	// rate is Rate×TimeScale, the wall-clock Duration Duration/TimeScale
	// and the wall-clock Timeout Timeout/TimeScale. Every measured
	// duration (TTFT, E2E, start and delay, the measured window) is
	// multiplied by TimeScale before it is reported, and throughputs are
	// per server-time second. Client and router overhead is multiplied
	// too, so keep TimeScale modest. The client-delayed threshold (10 ms)
	// stays in wall time: it measures the client, not the servers.
	TimeScale float64
	// NoStream asks for non-streamed answers ("stream": false): one JSON
	// object, whose TTFT is its end-to-end time. Zero: streamed (SSE).
	NoStream bool
	// Label names the run in reports (e.g. the routing strategy).
	Label string
	// Client is the HTTP client (nil: a fresh one, closed after the run).
	Client *http.Client
}

func (c *Options) withDefaults() (Preset, error) {
	if len(c.Targets) == 0 {
		return Preset{}, errors.New("bench: no target")
	}
	if c.Requests <= 0 && c.Duration <= 0 {
		return Preset{}, errors.New("bench: set requests or duration (an unbounded run is refused)")
	}
	if c.TimeScale < 0 || math.IsNaN(c.TimeScale) || math.IsInf(c.TimeScale, 0) {
		return Preset{}, fmt.Errorf("bench: time scale %v (want 0 or 1 for real time, or a positive factor)", c.TimeScale)
	}
	if c.Requests < 0 || c.Warmup < 0 || c.Rate < 0 || c.Burstiness < 0 || c.Concurrency < 0 || c.Timeout < 0 {
		return Preset{}, errors.New("bench: negative requests, warmup, rate, burstiness, concurrency or timeout")
	}
	switch c.API {
	case "":
		c.API = APIOpenAI
	case APIOpenAI, APIInvoke:
	default:
		return Preset{}, fmt.Errorf("bench: unknown API %q (openai or invoke)", c.API)
	}
	for _, t := range c.Targets {
		if _, err := endpointURL(t, c.API, c.Endpoint); err != nil {
			return Preset{}, err
		}
	}
	if c.ResetPrefixCache {
		if len(c.MetricsURLs) == 0 {
			return Preset{}, errors.New("bench: resetting the prefix cache needs the instances' metrics URLs")
		}
		for _, u := range c.MetricsURLs {
			if _, err := resetURL(u); err != nil {
				return Preset{}, err
			}
		}
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Workload != nil {
		return *c.Workload, c.Workload.Validate()
	}
	if c.Preset == "" {
		return Preset{}, errors.New("bench: no preset")
	}
	return LookupPreset(c.Preset)
}

// runner is the state of one Run.
type runner struct {
	cfg     Options
	preset  Preset
	hc      *http.Client
	urls    []string
	stream  *Stream
	oracle  *Oracle
	arrival *rand.Rand
	sem     chan struct{}
	start   time.Time
	// scale is Config.TimeScale, 1 for real time.
	scale float64

	// done channels of session turns a later turn waits for; only the
	// scheduler goroutine touches the map.
	done map[int]chan struct{}
	rr   int

	mu      sync.Mutex // guards samples
	samples []Sample

	sent, finished, failed atomic.Int64
	total                  int64 // planned requests (0: unknown)

	// KV capacities read from vllm:cache_config_info at the start, 0 if
	// not every instance exported it.
	instanceKV, fleetKV int64
}

// Run sends the workload and measures it. If ctx is canceled, Run stops,
// cancels in-flight requests and returns the partial result with ctx.Err().
func Run(ctx context.Context, cfg Options) (*Result, error) {
	p, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	st, err := p.NewStream(cfg.Seed, StreamOptions{Tenants: cfg.Tenants, AdapterMix: cfg.AdapterMix, Adapters: cfg.Adapters})
	if err != nil {
		return nil, err
	}
	r := &runner{
		cfg: cfg, preset: p, stream: st, oracle: NewOracle(),
		arrival: rand.New(rand.NewPCG(seedFor(cfg.Seed, "arrivals"), seedFor(cfg.Seed, "arrivals", 1))),
		sem:     make(chan struct{}, cfg.Concurrency),
		done:    make(map[int]chan struct{}),
		hc:      cfg.Client,
		scale:   cfg.TimeScale,
	}
	if r.scale == 0 {
		r.scale = 1
	}
	if r.hc == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = cfg.Concurrency
		tr.MaxIdleConns = cfg.Concurrency * len(cfg.Targets)
		r.hc = &http.Client{Transport: tr}
		defer tr.CloseIdleConnections()
	}
	for _, t := range cfg.Targets {
		u, _ := endpointURL(t, cfg.API, cfg.Endpoint)
		r.urls = append(r.urls, u)
	}
	if cfg.ResetPrefixCache {
		if err := r.resetAll(ctx); err != nil {
			return nil, err
		}
	}
	if cfg.InstanceKVTokens == 0 && len(cfg.MetricsURLs) > 0 {
		r.readCapacities(ctx)
	}
	if cfg.Requests > 0 {
		r.total = int64(cfg.Requests + cfg.Warmup)
	}
	r.start = time.Now()
	stopProgress := startProgress(cfg.Progress, r)

	if cfg.Warmup > 0 {
		r.phase(ctx, cfg.Warmup, 0, false)
	}
	var before []scrape
	var metricsErrs []string
	if len(cfg.MetricsURLs) > 0 && ctx.Err() == nil {
		before, metricsErrs = r.scrapeAll(ctx)
	}
	mStart := time.Now()
	r.phase(ctx, cfg.Requests, r.wall(cfg.Duration), true)
	mEnd := time.Now()
	var after []scrape
	if len(cfg.MetricsURLs) > 0 && ctx.Err() == nil && len(metricsErrs) == 0 {
		after, metricsErrs = r.scrapeAll(ctx)
	}
	stopProgress()

	res := r.result(mEnd.Sub(mStart), before, after, metricsErrs)
	res.Interrupted = ctx.Err() != nil
	return res, ctx.Err()
}

func (r *runner) scrapeAll(ctx context.Context) ([]scrape, []string) {
	out := make([]scrape, len(r.cfg.MetricsURLs))
	var errs []string
	for i, u := range r.cfg.MetricsURLs {
		s, err := readMetrics(ctx, r.hc, u)
		if err == nil && !s.found {
			err = fmt.Errorf("bench: metrics %s: no vllm:prefix_cache_hits_total / queries_total, nor %s", u, probe.LlamaCppPromptTokens)
		}
		if err != nil {
			errs = append(errs, err.Error())
		}
		out[i] = s
	}
	return out, errs
}

// gap draws the next inter-arrival time.
func (r *runner) gap() time.Duration {
	if r.cfg.Rate <= 0 {
		return 0
	}
	mean := 1 / (r.cfg.Rate * r.scale) // wall-clock seconds
	var secs float64
	if r.cfg.Burstiness <= 0 || r.cfg.Burstiness == 1 {
		secs = r.arrival.ExpFloat64() * mean
	} else {
		k := r.cfg.Burstiness
		secs = gamma(r.arrival, k) * mean / k
	}
	return time.Duration(secs * float64(time.Second))
}

// gamma draws Gamma(k, 1) (Marsaglia and Tsang, 2000; k < 1 by boosting).
func gamma(rng *rand.Rand, k float64) float64 {
	if k < 1 {
		return gamma(rng, k+1) * math.Pow(rng.Float64(), 1/k)
	}
	d := k - 1.0/3
	c := 1 / math.Sqrt(9*d)
	for {
		x := rng.NormFloat64()
		v := 1 + c*x
		if v <= 0 {
			continue
		}
		v = v * v * v
		u := rng.Float64()
		if math.Log(u) < 0.5*x*x+d-d*v+d*math.Log(v) {
			return d * v
		}
	}
}

// phase sends n requests (0: unbounded) whose arrivals stop after dur (0:
// no limit), then waits for all of them. The oracle sees every request in
// stream order.
func (r *runner) phase(ctx context.Context, n int, dur time.Duration, measured bool) {
	var wg sync.WaitGroup
	defer wg.Wait()
	begin := time.Now()
	var deadline <-chan time.Time
	if dur > 0 {
		t := time.NewTimer(dur)
		defer t.Stop()
		deadline = t.C
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	due := begin
	for i := 0; n == 0 || i < n; i++ {
		due = due.Add(r.gap())
		if wait := time.Until(due); wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				return
			case <-deadline:
				return
			case <-timer.C:
			}
		} else {
			select {
			case <-ctx.Done():
				return
			case <-deadline:
				return
			default:
			}
		}
		req := r.stream.Next()
		oc, op := r.oracle.Observe(req.Adapter, req.Tenant, req.Prompt(), measured)
		var after chan struct{}
		if req.After >= 0 {
			after = r.done[req.After]
			delete(r.done, req.After)
		}
		var mine chan struct{}
		if r.preset.Kind == KindSessions {
			mine = make(chan struct{})
			r.done[req.Index] = mine
		}
		target := r.urls[r.rr%len(r.urls)]
		r.rr++
		if after == nil {
			// Take the slot here so a saturated target holds back arrivals
			// instead of piling up goroutines.
			select {
			case r.sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
		}
		at := due
		wg.Add(1)
		go func() {
			defer wg.Done()
			if mine != nil {
				defer close(mine)
			}
			if after != nil {
				select {
				case <-after:
				case <-ctx.Done():
					return
				}
				// A turn is due once its arrival has come and the previous
				// turn has completed; only the wait beyond that is a delay.
				at = later(at, time.Now())
				select {
				case r.sem <- struct{}{}:
				case <-ctx.Done():
					return
				}
			}
			defer func() { <-r.sem }()
			r.send(ctx, target, req, at, measured, oc, op)
		}()
	}
}

func (r *runner) send(ctx context.Context, target string, req Request, due time.Time, measured bool, oracleCached, oraclePrompt int) {
	r.sent.Add(1)
	body, err := req.body(r.cfg.Model, !r.cfg.NoStream)
	var o outcome
	if err != nil {
		o.errKind, o.errMsg, o.sent = ErrKindTransport, err.Error(), time.Now()
	} else {
		o = do(ctx, r.hc, target, r.cfg.API, r.wall(r.cfg.Timeout), req, body)
	}
	r.finished.Add(1)
	if o.errKind != "" && o.errKind != ErrKindCanceled {
		r.failed.Add(1)
	}
	if !measured {
		return
	}
	s := Sample{
		Index: req.Index, Target: target,
		StartMs:   r.serverMs(o.sent.Sub(r.start)),
		DelayMs:   r.serverMs(max(0, o.sent.Sub(due))),
		TTFTMs:    r.serverMs(o.ttft),
		E2EMs:     r.serverMs(o.e2e),
		Error:     o.errKind,
		ErrorText: truncate(o.errMsg, 200),
		Instance:  o.instance, Decision: o.decision,
		PromptTokens: o.promptTokens, CachedTokens: o.cachedTokens, OutputTokens: o.outputTokens,
		HasUsage:     o.hasUsage,
		OraclePrompt: oraclePrompt, OracleCached: oracleCached,
		Document: req.Document, Session: req.Session, Tenant: req.Tenant, Adapter: req.Adapter,
	}
	r.mu.Lock()
	r.samples = append(r.samples, s)
	r.mu.Unlock()
}

// wall converts a server-time duration to wall-clock time.
func (r *runner) wall(d time.Duration) time.Duration {
	if r.scale == 1 {
		return d
	}
	return time.Duration(float64(d) / r.scale)
}

// serverMs converts a wall-clock duration to server-time milliseconds.
func (r *runner) serverMs(d time.Duration) float64 { return ms(d) * r.scale }

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
