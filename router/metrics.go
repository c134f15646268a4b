package router

import (
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixrouter/prefixrouter/fleet"
)

// Decisions, the values of the decision label and of X-Prefixrouter-Decision.
const (
	DecisionAffinity         = "affinity"          // PREFIX_AWARE: the ring's primary
	DecisionSpill            = "spill"             // PREFIX_AWARE: a later candidate with room
	DecisionFallback         = "fallback"          // PREFIX_AWARE: no candidate had room; least loaded
	DecisionRandom           = "random"            // RANDOM
	DecisionSession          = "session"           // a stateful session's instance (X-Amzn-SageMaker-Session-Id)
	DecisionLeastOutstanding = "least_outstanding" // LEAST_OUTSTANDING_REQUESTS
	decisionNone             = "none"              // rejected before a pick
)

// Upstream error kinds, the values of the kind label.
const (
	errKindDial    = "dial"    // connection refused / unreachable: retried
	errKindTimeout = "timeout" // no answer in time
	errKindStatus  = "status"  // 5xx that counts as a failure
	errKindBody    = "body"    // the response broke off while streaming
	errKindOther   = "other"
)

// Adapter wait outcomes, the values of the outcome label.
const (
	adapterWaitLoaded     = "loaded"      // the adapter was loaded within the wait
	adapterWaitTimeout    = "timeout"     // the wait ended first
	adapterWaitQueueFull  = "queue_full"  // too many requests were waiting already
	adapterWaitClientGone = "client_gone" // the client hung up while waiting
)

type metrics struct {
	requests       *prometheus.CounterVec
	pickSeconds    *prometheus.HistogramVec
	retries        *prometheus.CounterVec
	upstreamErrors *prometheus.CounterVec
	keysMoved      *prometheus.HistogramVec
	promptTokens   *prometheus.CounterVec
	cachedTokens   *prometheus.CounterVec
	adapterWaits   *prometheus.CounterVec
	staleRetries   *prometheus.CounterVec
	codes          [600]string // status code label values, to avoid Itoa per request
}

// counterVec declares one of the router's counters: its name, its help, the
// labels it is counted by.
func counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
}

func newMetrics(reg prometheus.Registerer, r *Router) (*metrics, error) {
	m := &metrics{
		requests: counterVec("prefixrouter_requests_total",
			"Requests answered, by endpoint, routing strategy, routing decision and status code.",
			"endpoint", "strategy", "decision", "code"),
		pickSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "prefixrouter_pick_duration_seconds",
			Help:    "Time to choose and admit an instance (model set, ring, admission; no I/O).",
			Buckets: []float64{1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2.5e-4, 1e-3, 1e-2},
		}, []string{"strategy"}),
		retries: counterVec("prefixrouter_retries_total",
			"Requests re-sent to another instance after the first provably received nothing.",
			"endpoint"),
		upstreamErrors: counterVec("prefixrouter_upstream_errors_total",
			"Upstream failures by kind: dial, timeout, status (5xx), body (stream broke off), other.",
			"endpoint", "kind"),
		keysMoved: newKeysMovedHistogram(),
		// The KV hit rate the router sees: cached / prompt tokens, from the
		// usage of the instances' answers (OpenAI's usage object).
		promptTokens: counterVec("prefixrouter_prompt_tokens_total",
			"Prompt tokens of answered requests, from the usage the instance reported (usage.prompt_tokens), by endpoint, model, instance and routing decision.",
			"endpoint", "model", "instance", "decision"),
		cachedTokens: counterVec("prefixrouter_cached_prompt_tokens_total",
			"Prompt tokens served from the instance's prefix cache (usage.prompt_tokens_details.cached_tokens), by endpoint, model, instance and routing decision.",
			"endpoint", "model", "instance", "decision"),
		adapterWaits: counterVec("prefixrouter_adapter_waits_total",
			"Requests that waited for an adapter to be loaded, by outcome: loaded, timeout, queue_full, client_gone.",
			"endpoint", "outcome"),
		staleRetries: counterVec("prefixrouter_stale_adapter_retries_total",
			"Requests re-sent after an instance answered 404 for an adapter its record lists (the record was stale).",
			"endpoint"),
	}
	for i := range m.codes {
		m.codes[i] = strconv.Itoa(i)
	}
	collectors := []prometheus.Collector{m.requests, m.pickSeconds, m.retries, m.upstreamErrors, m.keysMoved, m.promptTokens, m.cachedTokens, m.adapterWaits, m.staleRetries, stateCollector{r}}
	if tr, ok := r.opts.Transport.(interface{ Resent() int64 }); ok {
		// The upstream transport's own re-sends (issue 20), which the
		// router never sees as failures.
		collectors = append(collectors, prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "prefixrouter_upstream_resent_total",
			Help: "Requests the upstream transport sent again on a new connection because a reused keep-alive connection broke (closed or reset) before the instance read them.",
		}, func() float64 { return float64(tr.Resent()) }))
	}
	for _, c := range collectors {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// decisionsOf are the decisions a strategy makes when it picks (sessions
// aside: they are the endpoint's only when clients open them).
func decisionsOf(s fleet.Strategy) []string {
	switch s {
	case fleet.PrefixAware:
		return []string{DecisionAffinity, DecisionSpill, DecisionFallback}
	case fleet.Random:
		return []string{DecisionRandom}
	case fleet.LeastOutstanding:
		return []string{DecisionLeastOutstanding}
	}
	return nil
}

// upstreamErrorKinds are the values of prefixrouter_upstream_errors_total's
// kind label.
var upstreamErrorKinds = []string{errKindDial, errKindTimeout, errKindStatus, errKindBody, errKindOther}

// adapterWaitOutcomes are the values of prefixrouter_adapter_waits_total's
// outcome label.
var adapterWaitOutcomes = []string{adapterWaitLoaded, adapterWaitTimeout, adapterWaitQueueFull, adapterWaitClientGone}

// initSeries creates at 0 the series whose label values an endpoint's view
// already tells, so that a dashboard panel reads 0, not "No data", until
// the first event: per endpoint, the requests answered 200 by each of its
// strategy's decisions, the retries, the upstream errors of every kind, the
// adapter waits of every outcome, the keys-moved histogram; the pick
// duration of its strategy; and per instance the prompt tokens of requests
// naming no model. old is the view ev replaces (nil at first): only what ev
// adds (the endpoint, a strategy, instances) is created. Called by Update,
// under Router.mu.
func (m *metrics) initSeries(endpoint string, ev *endpointView, old *view) {
	var prev *endpointView
	if old != nil {
		prev = old.endpoints[endpoint]
	}
	decisions := decisionsOf(ev.strategy)
	if prev == nil {
		m.retries.WithLabelValues(endpoint)
		m.staleRetries.WithLabelValues(endpoint)
		m.keysMoved.WithLabelValues(endpoint)
		for _, k := range upstreamErrorKinds {
			m.upstreamErrors.WithLabelValues(endpoint, k)
		}
		for _, o := range adapterWaitOutcomes {
			m.adapterWaits.WithLabelValues(endpoint, o)
		}
	}
	newStrategy := prev == nil || prev.strategy != ev.strategy
	if newStrategy {
		m.pickSeconds.WithLabelValues(string(ev.strategy))
		for _, d := range decisions {
			m.requests.WithLabelValues(endpoint, string(ev.strategy), d, m.code(http.StatusOK))
		}
	}
	for id := range ev.instances {
		if !newStrategy && prev.instances[id] != nil {
			continue
		}
		for _, d := range decisions {
			m.promptTokens.WithLabelValues(endpoint, "", id, d)
			m.cachedTokens.WithLabelValues(endpoint, "", id, d)
		}
	}
}

func (m *metrics) code(status int) string {
	if status >= 0 && status < len(m.codes) {
		return m.codes[status]
	}
	return strconv.Itoa(status)
}

var (
	inFlightDesc = prometheus.NewDesc("prefixrouter_instance_in_flight",
		"Requests this replica has in flight on the instance.", []string{"endpoint", "instance"}, nil)
	breakerDesc = prometheus.NewDesc("prefixrouter_instance_breaker_state",
		"Circuit breaker state of the instance: 0 closed, 1 half-open, 2 open.", []string{"endpoint", "instance"}, nil)
	externalDesc = prometheus.NewDesc("prefixrouter_instance_external_load",
		"Load other sources put on the instance, from its /metrics (-1 unknown or not polled).", []string{"endpoint", "instance"}, nil)
	healthyDesc = prometheus.NewDesc("prefixrouter_instance_healthy",
		"1 unless active health checks marked the instance down (always 1 when they are off).", []string{"endpoint", "instance"}, nil)
	shareDesc = prometheus.NewDesc("prefixrouter_endpoint_threshold_share",
		"The most requests this replica puts on one of the endpoint's instances now: its share of the ConcurrencyThreshold (--threshold-share).", []string{"endpoint"}, nil)
	rateDesc = prometheus.NewDesc("prefixrouter_replica_request_rate",
		"This replica's request rate as last measured (requests per second, smoothed), which it publishes in its record under routers/ for the threshold's traffic share.", nil, nil)
	panicDesc = prometheus.NewDesc("prefixrouter_endpoint_panic",
		"1 while more of the endpoint's instances are out of rotation (open breakers, health marks) than its ejection cap (--max-ejection-percent) allows: picks then ignore both.", []string{"endpoint"}, nil)
	thresholdDesc = prometheus.NewDesc("prefixrouter_endpoint_concurrency_threshold",
		"The endpoint's ConcurrencyThreshold: requests in flight on one instance, summed over router replicas, beyond which PREFIX_AWARE spills (each replica admits its share of it, or compares it with the polled load).", []string{"endpoint"}, nil)
)

// stateCollector reads per-instance state at scrape time from the current
// view, so instances that left disappear from the metrics with the snapshot.
type stateCollector struct{ r *Router }

func (c stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- inFlightDesc
	ch <- breakerDesc
	ch <- externalDesc
	ch <- healthyDesc
	ch <- thresholdDesc
	ch <- shareDesc
	ch <- rateDesc
	ch <- panicDesc
}

func (c stateCollector) Collect(ch chan<- prometheus.Metric) {
	v := c.r.view.Load()
	if v == nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(rateDesc, prometheus.GaugeValue, c.r.Rate())
	for name, ev := range v.endpoints {
		ch <- prometheus.MustNewConstMetric(thresholdDesc, prometheus.GaugeValue, float64(ev.threshold), name)
		ch <- prometheus.MustNewConstMetric(shareDesc, prometheus.GaugeValue, float64(c.r.limit(v, ev).Share), name)
		panicking := 0.0
		for id, iv := range ev.instances {
			if iv.state.Panicking() { // the endpoint's states share one decision
				panicking = 1
			}
			st := iv.state.Status()
			ch <- prometheus.MustNewConstMetric(inFlightDesc, prometheus.GaugeValue, float64(st.InFlight), name, id)
			ch <- prometheus.MustNewConstMetric(breakerDesc, prometheus.GaugeValue, float64(st.Breaker), name, id)
			ch <- prometheus.MustNewConstMetric(externalDesc, prometheus.GaugeValue, float64(st.ExternalLoad), name, id)
			healthy := 0.0
			if st.Healthy {
				healthy = 1
			}
			ch <- prometheus.MustNewConstMetric(healthyDesc, prometheus.GaugeValue, healthy, name, id)
		}
		ch <- prometheus.MustNewConstMetric(panicDesc, prometheus.GaugeValue, panicking, name)
	}
}
