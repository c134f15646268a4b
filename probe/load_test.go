package probe

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/engine"
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
		{URL: srv.URL + "/metrics", Instance: busy},
		{URL: srv.URL + "/metrics", Instance: oversubscribed},
		{URL: srv.URL + "/idle", Instance: state("idle", 7)},
		{URL: srv.URL + "/other", Instance: state("other", 7)},
		{URL: srv.URL + "/nan", Instance: state("nan", 7)},
		{URL: srv.URL + "/negative", Instance: state("negative", 7)},
		{URL: srv.URL + "/huge", Instance: state("huge", 7)},
		{URL: srv.URL + "/down", Instance: state("down", 7)},
	}
	want := map[string]int64{"busy": 5, "own-only": 0, "idle": 0, "other": -1, "nan": -1, "negative": -1, "huge": -1, "down": -1}
	loadRound(t, targets, want)
	if got := busy.Load(); got != 6 {
		t.Fatalf("busy: Load = %d, want 6 (own 1 + external 5)", got)
	}
}

// loadRound runs one round of load polling over targets and checks each
// target's external load against want (by instance id).
func loadRound(t *testing.T, targets []Target, want map[string]int64) {
	t.Helper()
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

// TestLoadPerEngine: the load poller reads each engine's own gauges, from
// llama-server's captured /metrics (2 processing + 1 deferred) and from
// the vLLM and SGLang expositions built from their source (5 + 1 over two
// engine cores; 5 + 3). A record without an engine reads whichever engine
// the exposition shows; a record that names another engine reads unknown
// (issue 20: every llama-server showed "unknown" before).
func TestLoadPerEngine(t *testing.T) {
	files := map[string]string{
		"/llamacpp": "llamacpp-c392e50/metrics-busy.txt",
		"/vllm":     "vllm-source/metrics.txt",
		"/sglang":   "sglang-source/metrics.txt",
	}
	bodies := map[string][]byte{}
	for path, file := range files {
		bodies[path] = testsupport.EngineTestdata(t, file)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write(bodies[r.URL.Path])
	}))
	defer srv.Close()
	var targets []Target
	want := map[string]int64{}
	add := func(id, path, eng string, load int64) {
		targets = append(targets, Target{URL: srv.URL + path, Instance: overload.NewState(id, overload.BreakerOptions{}), Engine: eng})
		want[id] = load
	}
	add("llamacpp", "/llamacpp", engine.LlamaCpp, 3)
	add("vllm", "/vllm", engine.VLLM, 6)
	add("sglang", "/sglang", engine.SGLang, 8)
	add("generic-llamacpp", "/llamacpp", "", 3)
	add("generic-vllm", "/vllm", "", 6)
	add("generic-sglang", "/sglang", "", 8)
	add("newer-engine", "/sglang", "tgi-next", 8) // unknown name: Generic
	add("mismatch", "/llamacpp", engine.VLLM, -1)
	add("tgi-on-vllm", "/vllm", engine.TGI, -1)
	loadRound(t, targets, want)
}
