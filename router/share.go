package router

import (
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/overload"
)

// Share is how a replica divides an instance's ConcurrencyThreshold T with
// the other router replicas. Each replica sees only its own requests in
// flight and the replicas never talk on the request path, so each admits
// at most its share of T on an instance (and, with a load poll, at most
// what the instance's reported load leaves of T). docs/concurrency.md
// measures them.
type Share string

const (
	// ShareTraffic (the default): ceil(T × own/total), at least 1
	// (overload.TrafficShare), where own is this replica's request rate,
	// measured here (MeasureRate), and total adds the rates the other
	// replicas published in their records (fleet.Snapshot.ReplicaRates).
	// A replica that carries most of the traffic (a skewed DNS share)
	// may put most of T on an instance. ShareReplicas applies while this
	// replica has measured no rate, while a registered replica has
	// published none (an older version) and without a ReplicaID.
	ShareTraffic Share = "traffic"
	// ShareReplicas: ceil(T/R) of the R registered replicas
	// (overload.ReplicaShare). The fleet-wide load on an instance stays
	// within R·ceil(T/R) ≤ T+R−1 whatever the timing, but a replica that
	// carries most of the traffic still admits only T/R and spills the
	// rest of a hot prefix.
	ShareReplicas Share = "replicas"
	// ShareNone: T for every replica, as if it routed alone; with a load
	// poll (LoadPollInterval) the polled load is the only coordination.
	ShareNone Share = "none"
)

// rateSmoothing is the weight of the newest interval in the measured rate,
// an exponentially weighted moving average: a step in traffic shows half
// in the first interval and 7/8 after three, and the noise of a Poisson
// arrival count shrinks by a factor of 0.58 (√(α/(2−α))).
const rateSmoothing = 0.5

// rateMeter measures the replica's request rate: the request path adds one
// to requests (one atomic add, no lock); MeasureRate turns the count into
// a rate, which admission reads with one atomic load.
type rateMeter struct {
	requests atomic.Int64
	rate     atomic.Uint64 // math.Float64bits of requests/s; 0 until measured

	mu     sync.Mutex // guards last and lastAt (MeasureRate's; never the request path)
	last   int64
	lastAt time.Time
}

// MeasureRate measures this replica's request rate (requests per second
// since the previous call, smoothed over the last few calls) at now, and
// returns it; ShareTraffic uses it until the next call. The replica calls
// it every replica.Options.RateInterval and publishes the result in its
// record. The first call starts the count and returns 0.
func (r *Router) MeasureRate(now time.Time) float64 {
	m := &r.rate
	m.mu.Lock()
	defer m.mu.Unlock()
	n := m.requests.Load()
	if m.lastAt.IsZero() {
		m.last, m.lastAt = n, now
		return 0
	}
	d := now.Sub(m.lastAt).Seconds()
	if d <= 0 {
		return r.Rate()
	}
	sample := float64(n-m.last) / d
	rate := sample
	if prev := r.Rate(); prev > 0 {
		rate = rateSmoothing*sample + (1-rateSmoothing)*prev
	}
	m.last, m.lastAt = n, now
	m.rate.Store(math.Float64bits(rate))
	return rate
}

// RateReport decides when a replica writes its request rate into its
// record under routers/, and what it writes. Either of two tests writes:
//
//   - a step: the smoothed rate (MeasureRate) differs from the written one
//     by more than a fifth and by at least twice the noise of a Poisson
//     count's smoothed rate (2√rate, at least 1 request/s), so that a change
//     of DNS shows within a few measures while steady traffic writes rarely;
//   - a drift: the requests counted since the last write differ from what
//     the written rate predicts by more than three standard deviations and
//     the average since then differs by more than a fifth; it writes that
//     average. A replica too small for the first test (each of many light
//     replicas carries a sliver of the traffic, but their sum weighs in
//     every share) still writes its long-run rate, from enough requests to
//     be accurate.
//
// TestRateWritesUnderSteadyTraffic counts the writes both make. The zero
// value starts from a written rate of 0, the record a replica registers
// with. The publisher's goroutine owns it (not safe for concurrent use).
type RateReport struct {
	written float64
	at      time.Time // when written was written; zero before the first Next
	count   int64     // the requests counted then
}

// rateChange is the least relative change a write reports.
const rateChange = 0.2

// Next takes the time, the requests the router counted so far (Requests)
// and its smoothed rate (MeasureRate), and returns the rate to write now,
// rounded to 3 significant digits, and whether to write it. The first call
// only starts the count.
func (p *RateReport) Next(now time.Time, requests int64, smoothed float64) (float64, bool) {
	e := now.Sub(p.at).Seconds()
	if p.at.IsZero() || e <= 0 {
		if p.at.IsZero() {
			p.at, p.count = now, requests
		}
		return 0, false
	}
	moved := func(rate float64) bool {
		return math.Abs(rate-p.written) > rateChange*max(rate, p.written)
	}
	if hi := max(smoothed, p.written); moved(smoothed) && math.Abs(smoothed-p.written) >= max(1, 2*math.Sqrt(hi)) {
		return p.write(now, requests, smoothed), true
	}
	n, want := float64(requests-p.count), p.written*e
	if avg := n / e; math.Abs(n-want) > 3*math.Sqrt(want+1) && moved(avg) {
		return p.write(now, requests, avg), true
	}
	return 0, false
}

func (p *RateReport) write(now time.Time, requests int64, rate float64) float64 {
	// 3 significant digits: the record stays short, and a share, a
	// ceiling of T times a ratio, needs no more.
	rate, _ = strconv.ParseFloat(strconv.FormatFloat(rate, 'g', 3, 64), 64)
	p.written, p.at, p.count = rate, now, requests
	return rate
}

// Requests returns how many requests this router routed since it started
// (the count MeasureRate turns into a rate).
func (r *Router) Requests() int64 { return r.rate.requests.Load() }

// Rate returns the request rate MeasureRate measured last (0 before).
func (r *Router) Rate() float64 { return math.Float64frombits(r.rate.rate.Load()) }

// replicaRates is what a view keeps of the snapshot's replica rates for
// ShareTraffic: the sum of the other replicas' published rates, and
// whether it can be used (every registered replica, this one included,
// has a record with a rate).
type replicaRates struct {
	others float64
	usable bool
}

// newReplicaRates reads s's rates, self being this replica's id.
func newReplicaRates(s *fleet.Snapshot, self string) replicaRates {
	if _, ok := s.ReplicaRates[self]; !ok || self == "" || len(s.ReplicaRates) != s.Replicas {
		return replicaRates{}
	}
	rr := replicaRates{usable: true}
	for id, rate := range s.ReplicaRates {
		if rate < 0 {
			return replicaRates{}
		}
		if id != self {
			rr.others += rate
		}
	}
	return rr
}

// limit is the admission limit on each instance of ev for a request on v:
// the endpoint's threshold and this replica's share of it. Lock-free: a
// few loads and a division.
func (r *Router) limit(v *view, ev *endpointView) overload.Limit {
	t := ev.threshold
	switch r.opts.ThresholdShare {
	case ShareNone:
		return overload.Whole(t)
	case ShareTraffic:
		if own := r.Rate(); own > 0 && v.rates.usable {
			return overload.Limit{Threshold: t, Share: overload.TrafficShare(t, own, own+v.rates.others)}
		}
	}
	return overload.Limit{Threshold: t, Share: overload.ReplicaShare(t, v.snap.Replicas)}
}
