package membership

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Reasons the watcher lists the prefix again, the values of
// prefixrouter_membership_relists_total's reason label.
const (
	relistStart             = "start"
	relistCompacted         = "compacted"
	relistWatchClosed       = "watch_closed"
	relistWatchError        = "watch_error"
	relistRevisionRegressed = "revision_regressed"
)

// Kinds of ignored records, the values of
// prefixrouter_membership_invalid_records_total's kind label.
const (
	invalidInstance   = "instance"
	invalidUpstream   = "upstream" // an instance whose address is outside --allowed-upstreams
	invalidConfig     = "config"
	invalidEndpoint   = "endpoint"
	invalidAdapter    = "adapter"
	invalidPlacement  = "placement"
	invalidPopularity = "popularity"
	invalidRouter     = "router" // a router record whose rate does not parse (it still counts as a replica)
)

// Metrics are the membership's Prometheus collectors. A nil *Metrics is
// valid and records nothing. Create one per process with NewMetrics and
// hand it to the Watcher and registrations.
type Metrics struct {
	invalid    *prometheus.CounterVec
	relists    *prometheus.CounterVec
	published  prometheus.Counter
	build      prometheus.Histogram
	regrants   prometheus.Counter
	reopens    *prometheus.CounterVec
	held       *prometheus.GaugeVec
	lastSyncNs atomic.Int64 // unix nanoseconds of the last sync; 0 = never
	now        func() time.Time
}

// NewMetrics creates the collectors and registers them with reg (nil means
// do not register: useful in tests):
//
//	prefixrouter_membership_invalid_records_total{kind="instance|upstream|config|endpoint|adapter|placement|popularity|session-key|router"}
//	prefixrouter_membership_relists_total{reason="start|compacted|watch_closed|watch_error|revision_regressed"}
//	prefixrouter_membership_snapshots_published_total
//	prefixrouter_membership_snapshot_build_seconds (histogram)
//	prefixrouter_membership_lease_regrants_total
//	prefixrouter_membership_stream_reopens_total{stream="watch|keepalive"}
//	prefixrouter_membership_vanish_guard_held_instances{endpoint}
//	prefixrouter_membership_last_sync_timestamp_seconds
//	prefixrouter_snapshot_age_seconds
//
// Every kind and reason exists at 0 from the start, so that dashboards read 0
// rather than no data until the first event. The age is the time since the watcher last heard from etcd (a list, a
// watch event or a progress notification); +Inf before the first sync.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		invalid: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixrouter_membership_invalid_records_total",
			Help: "Records in etcd the watcher ignored because they do not parse or validate, by kind.",
		}, []string{"kind"}),
		relists: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixrouter_membership_relists_total",
			Help: "Full lists of the etcd prefix, by reason.",
		}, []string{"reason"}),
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prefixrouter_membership_snapshots_published_total",
			Help: "Fleet snapshots published to the data plane.",
		}),
		build: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "prefixrouter_membership_snapshot_build_seconds",
			Help:    "Time to build and publish one fleet snapshot after a list or a watch response: O(instances) copying per change.",
			Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16), // 50 µs .. 1.6 s
		}),
		regrants: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prefixrouter_membership_lease_regrants_total",
			Help: "Leases granted again after the previous one was lost (expired, revoked or unreachable).",
		}),
		reopens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixrouter_membership_stream_reopens_total",
			Help: "etcd streams opened anew because their member stopped answering: watches (nothing for three progress intervals; reopened from the revision reached) and lease keepalives (no answer for half a TTL, at least TTL/3 + 1 s; the old stream kept beside the new).",
		}, []string{"stream"}),
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "prefixrouter_membership_vanish_guard_held_instances",
			Help: "Instances whose keys vanished with more than half of their endpoint's within one TTL and that the watcher keeps routing to for the grace period.",
		}, []string{"endpoint"}),
		now: time.Now,
	}
	lastSync := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "prefixrouter_membership_last_sync_timestamp_seconds",
		Help: "Unix time the watcher last heard from etcd; 0 before the first sync.",
	}, func() float64 {
		ns := m.lastSyncNs.Load()
		return float64(ns) / 1e9
	})
	age := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "prefixrouter_snapshot_age_seconds",
		Help: "Seconds since the watcher last heard from etcd (list, event or progress notification); +Inf before the first sync.",
	}, func() float64 {
		ns := m.lastSyncNs.Load()
		if ns == 0 {
			return math.Inf(1)
		}
		return m.now().Sub(time.Unix(0, ns)).Seconds()
	})
	for _, k := range []string{invalidInstance, invalidUpstream, invalidConfig, invalidEndpoint, invalidAdapter, invalidPlacement, invalidRouter} {
		m.invalid.WithLabelValues(k)
	}
	for _, r := range []string{relistStart, relistCompacted, relistWatchClosed, relistWatchError, relistRevisionRegressed} {
		m.relists.WithLabelValues(r)
	}
	for _, r := range []string{streamWatch, streamKeepalive} {
		m.reopens.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.invalid, m.relists, m.published, m.build, m.regrants, m.reopens, m.held, lastSync, age)
	}
	return m
}

func (m *Metrics) invalidRecord(kind string) {
	if m != nil {
		m.invalid.WithLabelValues(kind).Inc()
	}
}

func (m *Metrics) relist(reason string) {
	if m != nil {
		m.relists.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) snapshotPublished(build time.Duration) {
	if m != nil {
		m.published.Inc()
		m.build.Observe(build.Seconds())
	}
}

func (m *Metrics) leaseRegranted() {
	if m != nil {
		m.regrants.Inc()
	}
}

// Streams reopenStream counts, the values of
// prefixrouter_membership_stream_reopens_total's stream label.
const (
	streamWatch     = "watch"
	streamKeepalive = "keepalive"
)

func (m *Metrics) reopenStream(stream string) {
	if m != nil {
		m.reopens.WithLabelValues(stream).Inc()
	}
}

func (m *Metrics) synced(t time.Time) {
	if m != nil {
		m.lastSyncNs.Store(t.UnixNano())
	}
}

func (m *Metrics) vanishHeld(endpoint string, n int) {
	if m != nil {
		m.held.WithLabelValues(endpoint).Set(float64(n))
	}
}
