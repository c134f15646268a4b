package router

import (
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
)

// setRate makes r measure rate requests/s: two measures one second apart
// around rate counted requests.
func setRate(r *Router, rate int) {
	t0 := time.Unix(1000, 0)
	r.rate.mu.Lock()
	r.rate.lastAt = time.Time{}
	r.rate.mu.Unlock()
	r.MeasureRate(t0)
	r.rate.requests.Add(int64(rate))
	r.MeasureRate(t0.Add(time.Second))
}

func TestMeasureRate(t *testing.T) {
	r, err := New(Options{DefaultEndpoint: "ep", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	t0 := time.Unix(1000, 0)
	if got := r.MeasureRate(t0); got != 0 || r.Rate() != 0 {
		t.Fatalf("first measure %v (rate %v), want 0: it only starts the count", got, r.Rate())
	}
	r.rate.requests.Add(20)
	if got := r.MeasureRate(t0.Add(2 * time.Second)); got != 10 {
		t.Fatalf("20 requests in 2 s measured %v/s, want 10", got)
	}
	// Smoothed: the next interval weighs half.
	r.rate.requests.Add(30)
	if got := r.MeasureRate(t0.Add(3 * time.Second)); got != 20 {
		t.Fatalf("30 requests in the next second measured %v/s, want (10+30)/2 = 20", got)
	}
	if got := r.MeasureRate(t0.Add(3 * time.Second)); got != 20 {
		t.Fatalf("a measure at the same instant gave %v, want the last rate", got)
	}
	if got := r.MeasureRate(t0.Add(4 * time.Second)); got != 10 || r.Rate() != 10 {
		t.Fatalf("an idle second measured %v (rate %v), want 10", got, r.Rate())
	}
}

func TestThresholdShareLimit(t *testing.T) {
	const T = 8
	tests := []struct {
		name     string
		share    Share
		self     string
		replicas int
		rates    map[string]float64
		own      int // measured requests/s; 0: none measured
		want     int
	}{
		{"traffic: most of the traffic", ShareTraffic, "me", 3, map[string]float64{"me": 0, "a": 5, "b": 5}, 30, 6},
		{"traffic: own published rate ignored, local one used", ShareTraffic, "me", 3, map[string]float64{"me": 1000, "a": 5, "b": 5}, 30, 6},
		{"traffic: a light replica keeps 1", ShareTraffic, "me", 3, map[string]float64{"me": 0, "a": 50, "b": 50}, 1, 1},
		{"traffic: alone with traffic", ShareTraffic, "me", 3, map[string]float64{"me": 0, "a": 0, "b": 0}, 5, 8},
		{"traffic: nothing measured yet", ShareTraffic, "me", 3, map[string]float64{"me": 0, "a": 5, "b": 5}, 0, 3},
		{"traffic: a replica without a rate", ShareTraffic, "me", 3, map[string]float64{"me": 0, "a": 5, "b": -1}, 30, 3},
		{"traffic: own record not seen yet", ShareTraffic, "me", 2, map[string]float64{"a": 5, "b": 5}, 30, 4},
		{"traffic: rates of fewer replicas than counted", ShareTraffic, "me", 4, map[string]float64{"me": 0, "a": 5, "b": 5}, 30, 2},
		{"traffic: no replica id", ShareTraffic, "", 3, map[string]float64{"me": 0, "a": 5, "b": 5}, 30, 3},
		{"traffic: static fleet", ShareTraffic, "me", 1, nil, 30, 8},
		{"replicas", ShareReplicas, "me", 3, map[string]float64{"me": 0, "a": 5, "b": 5}, 30, 3},
		{"none", ShareNone, "me", 3, map[string]float64{"me": 0, "a": 5, "b": 5}, 30, 8},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := New(Options{DefaultEndpoint: "ep", Logger: slog.New(slog.DiscardHandler), ThresholdShare: tc.share, ReplicaID: tc.self})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			s := fleet.NewSnapshot([]fleet.Endpoint{{Name: "ep", Config: prefixCfg(T)}}, 1, tc.replicas, time.Now())
			s.ReplicaRates = tc.rates
			r.Update(s)
			if tc.own > 0 {
				setRate(r, tc.own)
			}
			v := r.view.Load()
			l := r.limit(v, v.endpoints["ep"])
			if l.Threshold != T || l.Share != tc.want {
				t.Fatalf("limit %+v, want threshold %d share %d", l, T, tc.want)
			}
		})
	}
}

// TestRatesOnlyUpdateKeepsViews: a snapshot that changes the replicas
// alone (fleet.Snapshot.WithReplicas) keeps the endpoint views, so their
// rings, states and caches; one with new endpoints rebuilds them.
func TestRatesOnlyUpdateKeepsViews(t *testing.T) {
	bs := threeBackends(t)
	h := newHarness(t, hopts{cfg: prefixCfg(4), self: "me"}, bs...)
	s := fleet.NewSnapshot([]fleet.Endpoint{h.ep}, 1, 2, time.Now())
	s.ReplicaRates = map[string]float64{"me": 0, "a": 1}
	h.r.Update(s)
	ev := h.r.view.Load().endpoints["ep"]
	h.mustDo("/invocations", "p", nil)
	h.r.Update(s.WithReplicas(2, map[string]float64{"me": 0, "a": 3}, time.Now()))
	v := h.r.view.Load()
	if v.endpoints["ep"] != ev || v.snap.Revision != 2 || v.rates.others != 3 || !v.ready {
		t.Fatalf("a rates-only update: view kept %v, revision %d, others %v, ready %v", v.endpoints["ep"] == ev, v.snap.Revision, v.rates.others, v.ready)
	}
	h.update()
	if h.r.view.Load().endpoints["ep"] == ev {
		t.Fatal("a snapshot with new endpoints kept the old view")
	}
	h.mustDo("/invocations", "p", nil)
}

// TestTrafficShareLetsBusyReplicaFillPrimary: a replica that carries most
// of the fleet's requests (10 of 11.5 per second) puts up to its traffic
// share ceil(4 × 10/11.5) = 4 of a hot prefix's requests on the primary
// and spills the fifth, where the share by count, ceil(4/4) = 1, spills the
// second.
func TestTrafficShareLetsBusyReplicaFillPrimary(t *testing.T) {
	for _, tc := range []struct {
		share   Share
		primary int
	}{{ShareTraffic, 4}, {ShareReplicas, 1}} {
		t.Run(string(tc.share), func(t *testing.T) {
			bs := threeBackends(t)
			h := newHarness(t, hopts{cfg: prefixCfg(4), share: tc.share, self: "me"}, bs...)
			s := fleet.NewSnapshot([]fleet.Endpoint{h.ep}, 1, 4, time.Now())
			s.ReplicaRates = map[string]float64{"me": 0, "a": 0.5, "b": 0.5, "c": 0.5}
			h.r.Update(s)
			setRate(h.r, 10)
			primary := h.mustDo("/invocations", "p", nil).instance
			var wg sync.WaitGroup
			defer func() {
				for _, b := range bs {
					close(b.release)
				}
				wg.Wait()
			}()
			// One more than the share: the last one spills.
			for i := range tc.primary + 1 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					h.do(t.Context(), "/invocations", "p", map[string]string{"X-Test-Block": "1"})
				}()
				testsupport.Eventually(t, 10*time.Second, fmt.Sprintf("request %d blocked", i+1), func() bool {
					n := int64(0)
					for _, b := range bs {
						n += b.blocked.Load()
					}
					return n == int64(i+1)
				})
			}
			if got := h.bySrvID[primary].blocked.Load(); got != int64(tc.primary) {
				t.Fatalf("%d of %d blocked requests on the primary, want %d", got, tc.primary+1, tc.primary)
			}
		})
	}
}

// TestRateWritesUnderSteadyTraffic runs the measure and RateReport on an
// hour of simulated Poisson traffic at steady rates, one measure a second
// (the default --rate-interval), and counts the writes a replica makes.
// At 1,000 requests/s the smoothed rate's noise (a standard deviation of
// √(2λ/3) = 26 requests/s between two measures) is far below both tests'
// thresholds: fewer than 1 % of the measures may write. A light replica
// (0.5 requests/s, registered with 0) writes its rate within a minute, and
// the long-run rate it has written last is within a fifth of the truth.
func TestRateWritesUnderSteadyTraffic(t *testing.T) {
	const seconds = 3600
	for _, rate := range []float64{0.5, 2, 10, 50, 200, 1000} {
		r, err := New(Options{DefaultEndpoint: "ep", Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(22, uint64(rate*10)))
		t0 := time.Unix(1000, 0)
		var rep RateReport
		rep.Next(t0, r.Requests(), r.MeasureRate(t0))
		written, writes, first := 0.0, 0, 0
		for s := 1; s <= seconds; s++ {
			r.rate.requests.Add(int64(poisson(rng, rate)))
			now := t0.Add(time.Duration(s) * time.Second)
			if w, ok := rep.Next(now, r.Requests(), r.MeasureRate(now)); ok {
				written = w
				writes++
				if first == 0 {
					first = s
				}
			}
		}
		r.Close()
		t.Logf("%v requests/s: %d writes in %d s (%.4f per s), the first after %d s; last written %v", rate, writes, seconds, float64(writes)/seconds, first, written)
		if rate >= 1000 && writes > seconds/100 {
			t.Errorf("%v requests/s: %d writes in %d s, want under 1 %% of the measures", rate, writes, seconds)
		}
		if first == 0 || first > 60 || math.Abs(written-rate) > 0.2*rate {
			t.Errorf("%v requests/s: first write after %d s (want within 60), last written %v (want within a fifth)", rate, first, written)
		}
	}
}

// TestRateReportFollowsSteps: a replica whose traffic steps (DNS moved
// clients) writes the new rate within a few measures, in either direction.
func TestRateReportFollowsSteps(t *testing.T) {
	for _, tc := range []struct {
		from, to float64
		within   int
	}{{45, 10, 2}, {10, 40, 3}, {10, 0, 3}, {200, 100, 3}} {
		r, err := New(Options{DefaultEndpoint: "ep", Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(22, uint64(tc.from)))
		t0 := time.Unix(1000, 0)
		var rep RateReport
		rep.Next(t0, r.Requests(), r.MeasureRate(t0))
		step := func(s int, rate float64) (float64, bool) {
			r.rate.requests.Add(int64(poisson(rng, rate)))
			now := t0.Add(time.Duration(s) * time.Second)
			return rep.Next(now, r.Requests(), r.MeasureRate(now))
		}
		for s := 1; s <= 120; s++ {
			step(s, tc.from)
		}
		took := 0
		for s := 121; s <= 121+10 && took == 0; s++ {
			if w, ok := step(s, tc.to); ok && math.Abs(w-tc.to) < math.Abs(w-tc.from) {
				took = s - 120
			}
		}
		r.Close()
		if took == 0 || took > tc.within {
			t.Errorf("%v → %v requests/s: written after %d measures, want within %d", tc.from, tc.to, took, tc.within)
		}
	}
}

// poisson draws a Poisson count of mean rate (one second of arrivals).
func poisson(rng *rand.Rand, rate float64) int {
	n := 0
	for at := rng.ExpFloat64() / rate; at < 1; at += rng.ExpFloat64() / rate {
		n++
	}
	return n
}
