package router

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/probe"
)

// healthHang as a /health status makes the probe block until the client
// gives up.
const healthHang = -1

// healthBackend is a backend whose /health answers the status in health
// (200 initially; healthHang blocks) and counts probes.
type healthBackend struct {
	*backend
	health atomic.Int32
	probes atomic.Int64
}

func newHealthBackend(t *testing.T, id string) *healthBackend {
	t.Helper()
	hb := &healthBackend{backend: newBackend(t, id)}
	hb.health.Store(http.StatusOK)
	hb.handler = func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			hb.probes.Add(1)
			code := int(hb.health.Load())
			if code == healthHang {
				<-r.Context().Done()
				return
			}
			w.WriteHeader(code)
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":%q,"path":%q}`, id, r.URL.Path)
	}
	return hb
}

func healthBackends(t *testing.T) []*healthBackend {
	return []*healthBackend{newHealthBackend(t, "i-a"), newHealthBackend(t, "i-b"), newHealthBackend(t, "i-c")}
}

// healthInterval is the health-check period of newHealthHarness, on its
// fake clock: healthRound advances it.
const healthInterval = time.Second

// healthHarness is a harness whose health checks run only when the test
// calls healthRound.
type healthHarness struct {
	*harness
	clock *testsupport.FakeClock
}

func newHealthHarness(t *testing.T, cfg fleet.RoutingConfig, hbs []*healthBackend) *healthHarness {
	t.Helper()
	bs := make([]*backend, len(hbs))
	for i, hb := range hbs {
		bs[i] = hb.backend
	}
	fc := testsupport.NewFakeClock()
	h := &healthHarness{harness: newHarness(t, hopts{cfg: cfg, health: healthInterval, hTimeout: 100 * time.Millisecond, clock: fc}, bs...), clock: fc}
	h.waitRound() // the round at start, which may have run before the fleet was loaded
	return h
}

// healthRound runs one round of health checks and returns when it is done.
func (h *healthHarness) healthRound() {
	h.t.Helper()
	h.clock.Advance(healthInterval)
	h.waitRound()
}

// waitRound returns once the health checker has finished its round and
// waits on the clock for the next.
func (h *healthHarness) waitRound() {
	h.t.Helper()
	if err := h.clock.BlockUntilContext(testsupport.Context(h.t, 10*time.Second), 1); err != nil {
		h.t.Fatalf("health round not finished: %v", err)
	}
}

func healthyGauge(t *testing.T, h *healthHarness, id string) float64 {
	t.Helper()
	return gaugeValue(t, h.reg, "prefixrouter_instance_healthy", "instance", id)
}

// gaugeValue is the value of the gauge name whose label is value.
func gaugeValue(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	ms := testsupport.Series(t, reg, name, map[string]string{label: value})
	if len(ms) == 0 {
		t.Fatalf("%s{%s=%q} missing", name, label, value)
	}
	return ms[0].GetGauge().GetValue()
}

// TestHealthCheckSkipsUnhealthy marks one instance down through its /health
// (500, or a probe that outlasts the timeout) and checks that every strategy
// avoids it (PREFIX_AWARE spills to the next candidate when it is the
// primary) and uses it again once it recovers.
func TestHealthCheckSkipsUnhealthy(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  fleet.RoutingConfig
		bad  int32
	}{
		{"prefix/500", prefixCfg(100), http.StatusInternalServerError},
		{"prefix/hang", prefixCfg(100), healthHang},
		{"random/500", fleet.RoutingConfig{RoutingStrategy: fleet.Random}, http.StatusServiceUnavailable},
		{"least/hang", fleet.RoutingConfig{RoutingStrategy: fleet.LeastOutstanding}, healthHang},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hbs := healthBackends(t)
			h := newHealthHarness(t, tc.cfg, hbs)
			body := strings.Repeat("health me ", 200)
			rr, _ := parseRequest(kindInvoke, http.Header{}, []byte(body), 1024)
			order := ringOrder(t, h.harness, rr.key)
			var down *healthBackend
			for _, hb := range hbs {
				if hb.id == order[0] {
					down = hb
				}
			}

			down.health.Store(tc.bad)
			h.healthRound()
			if !h.state(down.id).Healthy() {
				t.Fatal("marked down after one failed probe")
			}
			h.healthRound()
			if h.state(down.id).Healthy() {
				t.Fatalf("not marked down after %d failed probes", probe.DefaultUnhealthyThreshold)
			}
			if g := healthyGauge(t, h, down.id); g != 0 {
				t.Fatalf("prefixrouter_instance_healthy = %v for a down instance", g)
			}
			for range 30 {
				res := h.mustDo("/invocations", body, nil)
				if res.status != 200 || res.instance == down.id {
					t.Fatalf("status %d from %s (%s); %s is down", res.status, res.instance, res.decision, down.id)
				}
				if tc.cfg.RoutingStrategy == fleet.PrefixAware && (res.instance != order[1] || res.decision != DecisionSpill) {
					t.Fatalf("went to %s (%s), want spill to %s", res.instance, res.decision, order[1])
				}
			}

			down.health.Store(http.StatusOK)
			h.healthRound()
			if !h.state(down.id).Healthy() {
				t.Fatal("still down after a good probe")
			}
			if g := healthyGauge(t, h, down.id); g != 1 {
				t.Fatalf("prefixrouter_instance_healthy = %v after recovery", g)
			}
			if tc.cfg.RoutingStrategy == fleet.PrefixAware {
				if res := h.mustDo("/invocations", body, nil); res.instance != order[0] || res.decision != DecisionAffinity {
					t.Fatalf("after recovery went to %s (%s), want primary %s", res.instance, res.decision, order[0])
				}
			} else {
				testsupport.Eventually(t, 10*time.Second, "recovered instance picked again", func() bool {
					return h.mustDo("/invocations", body, nil).instance == down.id
				})
			}
		})
	}
}

// TestHealthCheck404IsHealthy: servers without a health path stay routable.
func TestHealthCheck404IsHealthy(t *testing.T) {
	hbs := healthBackends(t)
	for _, hb := range hbs {
		hb.health.Store(http.StatusNotFound)
	}
	h := newHealthHarness(t, prefixCfg(100), hbs)
	for range 4 {
		h.healthRound()
	}
	if n := hbs[0].probes.Load(); n < 4 {
		t.Fatalf("%d probes in 4 rounds", n)
	}
	for _, hb := range hbs {
		if !h.state(hb.id).Healthy() {
			t.Fatalf("%s marked down on 404", hb.id)
		}
	}
}

// TestHealthCheckFailsOpen: with every instance down, health is ignored and
// each strategy routes as if there were no health checks.
func TestHealthCheckFailsOpen(t *testing.T) {
	for _, cfg := range []fleet.RoutingConfig{prefixCfg(100), {RoutingStrategy: fleet.Random}, {RoutingStrategy: fleet.LeastOutstanding}} {
		t.Run(string(cfg.RoutingStrategy), func(t *testing.T) {
			hbs := healthBackends(t)
			for _, hb := range hbs {
				hb.health.Store(http.StatusInternalServerError)
			}
			h := newHealthHarness(t, cfg, hbs)
			h.healthRound()
			h.healthRound()
			for _, hb := range hbs {
				if h.state(hb.id).Healthy() {
					t.Fatalf("%s not marked down", hb.id)
				}
			}
			body := strings.Repeat("open ", 300)
			rr, _ := parseRequest(kindInvoke, http.Header{}, []byte(body), 1024)
			order := ringOrder(t, h.harness, rr.key)
			for range 10 {
				res := h.mustDo("/invocations", body, nil)
				if res.status != 200 {
					t.Fatalf("status %d with every instance down (fail open)", res.status)
				}
				if cfg.RoutingStrategy == fleet.PrefixAware && (res.instance != order[0] || res.decision != DecisionAffinity) {
					t.Fatalf("went to %s (%s), want primary %s", res.instance, res.decision, order[0])
				}
			}
		})
	}
}

// TestHealthCheckerStopsOnClose: the checker's goroutines end with Close.
func TestHealthCheckerStopsOnClose(t *testing.T) {
	hb := newHealthBackend(t, "i-a")
	hb.health.Store(healthHang) // a probe in flight at Close must end too
	ignore := goleak.IgnoreCurrent()
	tr := NewTransport(0)
	r, err := New(Options{DefaultEndpoint: "ep", HealthCheckInterval: 5 * time.Millisecond, HealthCheckTimeout: time.Minute, Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	r.Update(fleet.NewSnapshot([]fleet.Endpoint{{Name: "ep", Instances: []fleet.Instance{{ID: "i-a", Addr: hb.srv.URL}}}}, 0, 1, time.Now()))
	testsupport.Eventually(t, 10*time.Second, "a probe in flight", func() bool { return hb.probes.Load() > 0 })
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	tr.CloseIdleConnections()
	goleak.VerifyNone(t, ignore)
}

func TestNewValidatesHealthCheck(t *testing.T) {
	for _, o := range []Options{
		{DefaultEndpoint: "e", HealthCheckInterval: -time.Second},
		{DefaultEndpoint: "e", HealthCheckInterval: time.Second, HealthCheckTimeout: -1},
	} {
		if r, err := New(o); err == nil {
			r.Close()
			t.Errorf("New(%+v) accepted", o)
		}
	}
}
