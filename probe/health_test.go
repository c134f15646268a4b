package probe

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/internal/testsupport"

	"github.com/prefixrouter/prefixrouter/overload"
)

var _ Instance = (*overload.State)(nil)

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// TestHealthRound runs health rounds by hand against real servers: 200 and
// 404 are healthy; 500, a refused connection and a probe that outlasts the
// timeout are not, after UnhealthyThreshold rounds; one good probe brings
// an instance back.
func TestHealthRound(t *testing.T) {
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
		{URL: srv.URL + "/ok", Instance: overload.NewState("ok", overload.BreakerOptions{})},
		{URL: srv.URL + "/missing", Instance: overload.NewState("missing", overload.BreakerOptions{})},
		{URL: srv.URL + "/err", Instance: overload.NewState("err", overload.BreakerOptions{})},
		{URL: srv.URL + "/hang", Instance: overload.NewState("hang", overload.BreakerOptions{})},
		{URL: deadURL + "/ok", Instance: overload.NewState("dead", overload.BreakerOptions{})},
	}
	want := map[string]bool{"ok": true, "missing": true, "err": false, "hang": false, "dead": false}
	o, h, err := Health{Logger: discardLogger()}.withDefaults(Options{Interval: time.Hour, Timeout: 50 * time.Millisecond, Concurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	r, err := newRounds(o, func() []Target { return targets }, h.probe, h.observe)
	if err != nil {
		t.Fatal(err)
	}
	healthy := func(tg Target) bool { return tg.Instance.(*overload.State).Healthy() }
	r.round(context.Background())
	for _, tg := range targets {
		if !healthy(tg) {
			t.Fatalf("%s down after one probe; threshold is %d", tg.Instance.ID(), DefaultUnhealthyThreshold)
		}
	}
	r.round(context.Background())
	for _, tg := range targets {
		if healthy(tg) != want[tg.Instance.ID()] {
			t.Errorf("%s: healthy %v, want %v", tg.Instance.ID(), healthy(tg), want[tg.Instance.ID()])
		}
	}
	hang.Store(false)
	r.round(context.Background())
	if !healthy(targets[3]) {
		t.Error("hang: still down after a good probe")
	}
}

// logLines is a log sink that hands each record (one Write each) to the
// test.
type logLines chan string

func (l logLines) Write(p []byte) (int, error) {
	l <- string(p)
	return len(p), nil
}

// TestStartHealth drives the health prober with a fake clock: down after
// UnhealthyThreshold failed rounds (logged once), up after one good round.
func TestStartHealth(t *testing.T) {
	var code atomic.Int32
	code.Store(http.StatusBadGateway)
	var probes atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		probes.Add(1)
		w.WriteHeader(int(code.Load()))
	}))
	defer srv.Close()
	st := overload.NewState("i", overload.BreakerOptions{})
	logs := make(logLines, 10)
	fc := testsupport.NewFakeClock()
	p, err := StartHealth(Options{Interval: time.Second, Clock: fc},
		Health{UnhealthyThreshold: 3, Logger: slog.New(slog.NewTextHandler(logs, nil))},
		func() []Target { return []Target{{URL: srv.URL + DefaultHealthPath, Instance: st}} })
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	waitRound(t, fc)
	nextRound(t, fc, time.Second)
	if !st.Healthy() {
		t.Fatal("down after 2 failed probes; threshold is 3")
	}
	nextRound(t, fc, time.Second)
	if st.Healthy() || probes.Load() != 3 {
		t.Fatalf("healthy %v after %d failed probes, want down after 3", st.Healthy(), probes.Load())
	}
	nextRound(t, fc, time.Second)
	code.Store(http.StatusOK)
	nextRound(t, fc, time.Second)
	if !st.Healthy() {
		t.Fatal("still down after a good probe")
	}
	p.Close()
	close(logs)
	var out []string
	for l := range logs {
		out = append(out, l)
	}
	if len(out) != 2 || !strings.Contains(out[0], "marked down") || !strings.Contains(out[1], "marked up") || !strings.Contains(out[0], "instance=i") {
		t.Fatalf("want one down and one up transition logged, got %q", out)
	}
}

func TestStartHealthValidates(t *testing.T) {
	tg := func() []Target { return nil }
	for _, tc := range []struct {
		o Options
		h Health
	}{
		{Options{}, Health{}},
		{Options{Interval: -1}, Health{}},
		{Options{Interval: time.Second, Timeout: -1}, Health{}},
		{Options{Interval: time.Second}, Health{UnhealthyThreshold: -1}},
	} {
		if p, err := StartHealth(tc.o, tc.h, tg); err == nil {
			p.Close()
			t.Errorf("StartHealth(%+v, %+v) accepted", tc.o, tc.h)
		}
	}
	if p, err := StartHealth(Options{Interval: time.Second}, Health{}, nil); err == nil {
		p.Close()
		t.Error("StartHealth without targets accepted")
	}
}

// TestProbesFollowNoRedirectAndSendNoUserInfo: a record pointing at a
// redirector must not make the probe fetch the redirect's target, and a
// target carrying user info is refused before any connection.
func TestProbesFollowNoRedirectAndSendNoUserInfo(t *testing.T) {
	var elsewhere, hits atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { elsewhere.Add(1) }))
	defer other.Close()
	redirector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		http.Redirect(w, r, other.URL+"/secret", http.StatusFound)
	}))
	defer redirector.Close()
	_, h, err := Health{Logger: discardLogger()}.withDefaults(Options{Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testsupport.Context(t, 5*time.Second)
	if _, err := h.probe(ctx, Target{URL: redirector.URL + "/health"}); err != nil {
		t.Fatalf("a 302 is an answer below 500 (healthy): %v", err)
	}
	if _, err := Scrape(ctx, NewClient(http.DefaultTransport), redirector.URL+"/metrics"); err == nil {
		t.Fatal("a scrape answered by a redirect succeeded")
	}
	if hits.Load() != 2 || elsewhere.Load() != 0 {
		t.Fatalf("redirector hit %d times, redirect target %d times; want 2 and 0", hits.Load(), elsewhere.Load())
	}
	withUser := strings.Replace(redirector.URL, "http://", "http://admin:secret@", 1)
	if _, err := h.probe(ctx, Target{URL: withUser + "/health"}); err == nil || strings.Contains(err.Error(), "secret") {
		t.Fatalf("probe of a URL with user info = %v; want a refusal that does not echo the password", err)
	}
	if hits.Load() != 2 {
		t.Fatal("a URL with user info reached the server")
	}
}
