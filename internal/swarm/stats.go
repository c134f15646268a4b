package swarm

import (
	"math"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/lora"
	"github.com/prefixrouter/prefixrouter/ring"
)

// etcdCounters are the embedded member's own counters (it registers them
// with Prometheus' default registry), summed over label values.
type etcdCounters struct {
	received, keepAlives, watchRecv, watchSent, events, txns, grants, revokes, ranges, renewed float64
	// cpu and rss are the process's (process_cpu_seconds_total,
	// process_resident_memory_bytes): etcd's alone when it runs apart.
	cpu, rss float64
}

// EtcdRates are etcd's per-second figures over a window.
type EtcdRates struct {
	// Requests: every gRPC message etcd received (unary requests and
	// stream messages: keepalives, watch creates and progress requests).
	Requests float64
	// KeepAlives: lease keepalive messages received; Renewed: leases the
	// leader renewed.
	KeepAlives, Renewed float64
	// Txns (the registrations' compare-and-swap puts), Grants, Revokes
	// and Ranges (lists, lease lookups) are unary requests.
	Txns, Grants, Revokes, Ranges float64
	// WatchRequests: watch stream messages received (creates, progress
	// requests); WatchResponses: watch responses sent; Events: watch
	// events sent (one per event per matching watcher).
	WatchRequests, WatchResponses, Events float64
	// CPU is the cores etcd's process used (with an embedded member, the
	// whole harness's).
	CPU float64
}

// countersOf sums the series etcd exports into c's fields: a family's
// series whose gRPC method is the one named after the family ("" for any).
func countersOf(mfs []*dto.MetricFamily) etcdCounters {
	var c etcdCounters
	into := map[string][]struct {
		method string
		sum    *float64
	}{
		"grpc_server_msg_received_total": {{"", &c.received}, {"LeaseKeepAlive", &c.keepAlives}, {"Watch", &c.watchRecv}},
		"grpc_server_msg_sent_total":     {{"Watch", &c.watchSent}},
		"grpc_server_handled_total": {{"Txn", &c.txns}, {"LeaseGrant", &c.grants}, {"LeaseRevoke", &c.revokes},
			{"Range", &c.ranges}, {"LeaseTimeToLive", &c.ranges}},
		"etcd_debugging_mvcc_events_total":   {{"", &c.events}},
		"etcd_debugging_lease_renewed_total": {{"", &c.renewed}},
		"process_cpu_seconds_total":          {{"", &c.cpu}},
		"process_resident_memory_bytes":      {{"", &c.rss}},
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue() // one of them is set
			for _, f := range into[mf.GetName()] {
				if f.method == "" || f.method == label(m, "grpc_method") {
					*f.sum += v
				}
			}
		}
	}
	return c
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// rates are c minus before, per second of d.
func (c etcdCounters) rates(before etcdCounters, d time.Duration) EtcdRates {
	s := d.Seconds()
	per := func(a, b float64) float64 { return (a - b) / s }
	return EtcdRates{
		Requests: per(c.received, before.received), KeepAlives: per(c.keepAlives, before.keepAlives), Renewed: per(c.renewed, before.renewed),
		Txns: per(c.txns, before.txns), Grants: per(c.grants, before.grants), Revokes: per(c.revokes, before.revokes), Ranges: per(c.ranges, before.ranges),
		WatchRequests: per(c.watchRecv, before.watchRecv), WatchResponses: per(c.watchSent, before.watchSent), Events: per(c.events, before.events),
		CPU: per(c.cpu, before.cpu),
	}
}

// Histogram is a summary of prefixrouter_membership_snapshot_build_seconds.
type Histogram struct {
	Count  uint64
	Sum    float64
	bounds []float64
	counts []uint64 // cumulative, per bound
}

func histogramOf(g prometheus.Gatherer) Histogram {
	mfs, err := g.Gather()
	if err != nil {
		return Histogram{}
	}
	for _, mf := range mfs {
		if mf.GetName() != "prefixrouter_membership_snapshot_build_seconds" || len(mf.GetMetric()) == 0 {
			continue
		}
		h := mf.GetMetric()[0].GetHistogram()
		out := Histogram{Count: h.GetSampleCount(), Sum: h.GetSampleSum()}
		for _, b := range h.GetBucket() {
			out.bounds = append(out.bounds, b.GetUpperBound())
			out.counts = append(out.counts, b.GetCumulativeCount())
		}
		return out
	}
	return Histogram{}
}

// minus is the histogram of the observations since before.
func (h Histogram) minus(before Histogram) Histogram {
	out := Histogram{Count: h.Count - before.Count, Sum: h.Sum - before.Sum, bounds: h.bounds}
	for i := range h.counts {
		c := h.counts[i]
		if i < len(before.counts) {
			c -= before.counts[i]
		}
		out.counts = append(out.counts, c)
	}
	return out
}

// Mean is the mean observation.
func (h Histogram) Mean() time.Duration {
	if h.Count == 0 {
		return 0
	}
	return time.Duration(h.Sum / float64(h.Count) * float64(time.Second))
}

// Quantile is the upper bound of the bucket holding quantile q (an upper
// estimate; +Inf beyond the last bucket).
func (h Histogram) Quantile(q float64) time.Duration {
	if h.Count == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.Count)))
	for i, c := range h.counts {
		if c >= rank {
			return time.Duration(h.bounds[i] * float64(time.Second))
		}
	}
	return time.Duration(math.MaxInt64)
}

// PickCost is what routing costs a replica at the measured fleet size: the
// endpoint's base set (every instance) and its ring, built from a replica's
// snapshot, and ring lookups of random keys.
type PickCost struct {
	Instances int
	// Build is lora.New plus the base set's ring, what the first request
	// after a membership change pays.
	Build time.Duration
	// Candidates4 is the mean time of Candidates(key, 4), the PREFIX_AWARE
	// pick's ranking, over Lookups random keys.
	Candidates4 time.Duration
	Lookups     int
}

func measurePick(ep *fleet.Endpoint) PickCost {
	if ep == nil {
		return PickCost{}
	}
	start := time.Now()
	set, err := lora.New(ep).Set("")
	if err != nil {
		return PickCost{}
	}
	pc := PickCost{Instances: set.Len(), Build: time.Since(start), Lookups: 200_000}
	r := set.Ring()
	buf := make([]int, 0, 4)
	sink := 0
	start = time.Now()
	for i := range pc.Lookups {
		buf = r.Candidates(ring.Mix64(uint64(i)+1), 4, buf[:0])
		sink += buf[0]
	}
	pc.Candidates4 = time.Since(start) / time.Duration(pc.Lookups)
	_ = sink
	return pc
}

// processCPU is the CPU time (user and system) this process used so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// loadAverage is the first three fields of /proc/loadavg, "" elsewhere.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}
