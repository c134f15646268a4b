package probe

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/internal/testsupport"

	"github.com/prefixrouter/prefixrouter/overload"
)

// TestLoadRound: the external load is the reported load minus this
// replica's own requests; a failed scrape, a server that exports none of
// the gauges and a value that is not a request count all make it unknown.
func TestLoadRound(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/metrics":
			fmt.Fprint(w, vllmText) // load 6
		case "/idle":
			fmt.Fprint(w, "vllm:num_requests_running 0\n")
		case "/other":
			fmt.Fprint(w, "other_total 3\n")
		case "/nan":
			fmt.Fprint(w, "vllm:num_requests_running NaN\n")
		case "/negative":
			fmt.Fprint(w, "vllm:num_requests_running -3\n")
		case "/huge":
			fmt.Fprint(w, "vllm:num_requests_running 1e300\n")
		default:
			http.Error(w, "down", http.StatusInternalServerError)
		}
	}))
	defer srv.Close()
	state := func(id string, known int64) *overload.State {
		s := overload.NewState(id, overload.BreakerOptions{})
		s.SetExternalLoad(known)
		return s
	}
	busy := state("busy", -1)
	own, _ := busy.Acquire() // one of the 6 reported requests is ours
	defer own(nil)
	oversubscribed := state("own-only", -1)
	for range 8 { // more own requests than the server reports
		d, _ := oversubscribed.Acquire()
		defer d(nil)
	}
	targets := []Target{
		{srv.URL + "/metrics", busy},
		{srv.URL + "/metrics", oversubscribed},
		{srv.URL + "/idle", state("idle", 7)},
		{srv.URL + "/other", state("other", 7)},
		{srv.URL + "/nan", state("nan", 7)},
		{srv.URL + "/negative", state("negative", 7)},
		{srv.URL + "/huge", state("huge", 7)},
		{srv.URL + "/down", state("down", 7)},
	}
	want := map[string]int64{"busy": 5, "own-only": 0, "idle": 0, "other": -1, "nan": -1, "negative": -1, "huge": -1, "down": -1}
	l := Load{Logger: discardLogger()}.withDefaults()
	r, err := newRounds(Options{Interval: time.Hour}, func() []Target { return targets }, l.probe, l.observe)
	if err != nil {
		t.Fatal(err)
	}
	r.round(context.Background())
	for _, tg := range targets {
		if got := tg.Instance.(*overload.State).ExternalLoad(); got != want[tg.Instance.ID()] {
			t.Errorf("%s: external load %d, want %d", tg.Instance.ID(), got, want[tg.Instance.ID()])
		}
	}
	if got := busy.Load(); got != 6 {
		t.Fatalf("busy: Load = %d, want 6 (own 1 + external 5)", got)
	}
}

// TestStartLoad drives the load prober with a fake clock.
func TestStartLoad(t *testing.T) {
	var fail atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if fail.Load() {
			http.Error(w, "down", http.StatusInternalServerError)
			return
		}
		fmt.Fprint(w, vllmText)
	}))
	defer srv.Close()
	s := overload.NewState("a", overload.BreakerOptions{})
	fc := testsupport.NewFakeClock()
	p, err := StartLoad(Options{Interval: time.Second, Clock: fc}, Load{Logger: discardLogger()},
		func() []Target { return []Target{{URL: srv.URL + "/metrics", Instance: s}} })
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	waitRound(t, fc)
	if got := s.ExternalLoad(); got != 6 {
		t.Fatalf("external load %d, want 6", got)
	}
	fail.Store(true)
	nextRound(t, fc, time.Second)
	if got := s.ExternalLoad(); got != -1 {
		t.Fatalf("external load %d after a failed poll, want -1 (unknown)", got)
	}
}

func TestStartLoadValidates(t *testing.T) {
	if p, err := StartLoad(Options{}, Load{}, func() []Target { return nil }); err == nil {
		p.Close()
		t.Fatal("zero interval accepted")
	}
	if p, err := StartLoad(Options{Interval: time.Second}, Load{}, nil); err == nil {
		p.Close()
		t.Fatal("nil targets accepted")
	}
}
