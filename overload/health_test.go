package overload

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

func TestObserveProbe(t *testing.T) {
	for _, tc := range []struct {
		name      string
		threshold int
		probes    string // o ok, x failed
		healthy   bool
		changes   int
	}{
		{"fresh", 2, "", true, 0},
		{"one failure", 2, "x", true, 0},
		{"two failures", 2, "xx", false, 1},
		{"failures not consecutive", 2, "xoxox", true, 0},
		{"up after one success", 2, "xxxo", true, 2},
		{"threshold 1", 1, "x", false, 1},
		{"threshold 0 means 1", 0, "x", false, 1},
		{"down again", 3, "xxxoxxx", false, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewState("i", BreakerSettings{})
			changes := 0
			for _, p := range tc.probes {
				if s.ObserveProbe(p == 'o', tc.threshold) {
					changes++
				}
			}
			if s.Healthy() != tc.healthy || changes != tc.changes {
				t.Fatalf("healthy %v after %d changes, want %v after %d", s.Healthy(), changes, tc.healthy, tc.changes)
			}
		})
	}
}

// TestHealthCheckerCheck runs probe rounds by hand against real servers:
// 200 and 404 are healthy; 500, a refused connection and a probe that
// outlasts the timeout are not.
func TestHealthCheckerCheck(t *testing.T) {
	var hang atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/ok":
		case "/missing":
			w.WriteHeader(http.StatusNotFound)
		case "/err":
			w.WriteHeader(http.StatusInternalServerError)
		case "/hang":
			if hang.Load() {
				<-r.Context().Done()
			}
		}
	}))
	defer srv.Close()
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()
	hang.Store(true)

	targets := []Target{
		{srv.URL + "/ok", NewState("ok", BreakerSettings{})},
		{srv.URL + "/missing", NewState("missing", BreakerSettings{})},
		{srv.URL + "/err", NewState("err", BreakerSettings{})},
		{srv.URL + "/hang", NewState("hang", BreakerSettings{})},
		{deadURL + "/ok", NewState("dead", BreakerSettings{})},
	}
	want := map[string]bool{"ok": true, "missing": true, "err": false, "hang": false, "dead": false}
	// Construct without the background loop: the zero HealthChecker with
	// options set is enough for Check.
	h := &HealthChecker{opts: HealthCheckerOptions{
		Timeout: 50 * time.Millisecond, Targets: func() []Target { return targets },
		Client: http.DefaultClient, UnhealthyThreshold: 2, Concurrency: 2, Logger: discardLogger(),
	}}
	h.Check(context.Background())
	for _, tg := range targets {
		if !tg.State.Healthy() {
			t.Fatalf("%s down after one probe; threshold is 2", tg.State.ID())
		}
	}
	h.Check(context.Background())
	for _, tg := range targets {
		if tg.State.Healthy() != want[tg.State.ID()] {
			t.Errorf("%s: healthy %v, want %v", tg.State.ID(), tg.State.Healthy(), want[tg.State.ID()])
		}
	}
	hang.Store(false)
	h.Check(context.Background())
	if !targets[3].State.Healthy() {
		t.Error("hang: still down after a good probe")
	}
}

func TestHealthCheckerLoopAndClose(t *testing.T) {
	var probes atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		probes.Add(1)
		w.WriteHeader(http.StatusBadGateway)
	}))
	defer srv.Close()
	st := NewState("i", BreakerSettings{})
	h, err := NewHealthChecker(HealthCheckerOptions{
		Interval: 5 * time.Millisecond, Targets: func() []Target { return []Target{{srv.URL + "/health", st}} }, Logger: discardLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for st.Healthy() {
		if time.Now().After(deadline) {
			t.Fatal("never marked down")
		}
		time.Sleep(time.Millisecond)
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if n := probes.Load(); n < 2 {
		t.Fatalf("down after %d probes", n)
	}
}

func TestNewHealthCheckerValidates(t *testing.T) {
	tg := func() []Target { return nil }
	for _, o := range []HealthCheckerOptions{
		{Targets: tg},
		{Interval: -1, Targets: tg},
		{Interval: time.Second},
		{Interval: time.Second, Targets: tg, Timeout: -1},
		{Interval: time.Second, Targets: tg, UnhealthyThreshold: -1},
	} {
		if h, err := NewHealthChecker(o); err == nil {
			h.Close()
			t.Errorf("NewHealthChecker(%+v) accepted", o)
		}
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
