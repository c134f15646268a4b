package router

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/overload"
)

// TestUpgradeNeverReachesInstances reproduces issue 19's Upgrade probe: the
// router forwarded Upgrade headers; a model server answering 101 left its
// connections open (fds 10 -> 70) and each 101 counted as a failure, so
// five of them opened the breaker and the next ordinary request got 503.
// Now no instance sees an upgrade asked for, a 101 closes its connection,
// and the breaker stays closed.
func TestUpgradeNeverReachesInstances(t *testing.T) {
	var upgrades, open atomic.Int64
	closed := make(chan struct{}, 64)
	b := newBackend(t, "a")
	b.handler = func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "" || strings.Contains(strings.ToLower(r.Header.Get("Connection")), "upgrade") {
			upgrades.Add(1)
		}
		if r.Header.Get("X-Answer-101") == "" {
			_, _ = io.Copy(io.Discard, r.Body)
			_, _ = io.WriteString(w, `{"ok":true}`)
			return
		}
		// Switch protocols whatever was asked, and hold the connection
		// until the router closes it.
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		open.Add(1)
		_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
		_ = brw.Flush()
		go func() {
			defer c.Close()
			_, _ = io.Copy(io.Discard, bufio.NewReader(c))
			open.Add(-1)
			closed <- struct{}{}
		}()
	}
	r, err := New(Options{DefaultEndpoint: "ep", Logger: slog.New(slog.DiscardHandler), Breaker: overload.BreakerOptions{ConsecutiveFailures: 5, OpenTimeout: time.Hour, MaxEjectionPercent: 100}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	r.Update(fleet.NewSnapshot([]fleet.Endpoint{{Name: "ep", Instances: []fleet.Instance{{ID: "a", Addr: b.srv.URL}}}}, 0, 1, time.Now()))
	srv := httptest.NewServer(r)
	defer srv.Close()
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	send := func(answer101 bool) int {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/invocations", strings.NewReader(`{"inputs":"x"}`))
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "websocket")
		if answer101 {
			req.Header.Set("X-Answer-101", "1")
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	const n = 10
	for i := range n {
		// 424 on an invoke path: SageMaker's ModelError.
		if code := send(true); code < 400 {
			t.Fatalf("101 answer %d: status %d, want an error", i, code)
		}
	}
	for range n {
		select {
		case <-closed:
		case <-time.After(5 * time.Second):
			t.Fatalf("%d connections that switched protocols are still open", open.Load())
		}
	}
	if st, _ := r.Status("ep", "a"); st.Breaker != gobreaker.StateClosed || st.InFlight != 0 {
		t.Fatalf("after %d answers of 101: breaker %v, in flight %d; want closed, 0", n, st.Breaker, st.InFlight)
	}
	if code := send(false); code != 200 {
		t.Fatalf("an ordinary request after the 101s: status %d, want 200", code)
	}
	if n := upgrades.Load(); n != 0 {
		t.Fatalf("%d requests reached the instance asking for an upgrade", n)
	}
}

// TestUpstreamIdleTimeoutCutsAStalledStream: a model server that sent one
// SSE event and then nothing kept the client's stream open until
// --max-stream-duration (30 min; issue 19). The idle timeout cuts it, and
// counts against the instance; a client that stops reading is not the
// instance's silence.
func TestUpstreamIdleTimeoutCutsAStalledStream(t *testing.T) {
	b := newBackend(t, "stalls")
	b.handler = func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n")
		http.NewResponseController(w).Flush()
		<-r.Context().Done()
	}
	h := newHarness(t, hopts{idle: 200 * time.Millisecond, breaker: overload.BreakerOptions{ConsecutiveFailures: 2, OpenTimeout: time.Hour, MaxEjectionPercent: 100}}, b)
	r, srv := h.r, h.srv
	for i := range 2 {
		start := time.Now()
		resp, err := srv.Client().Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"stream":true,"messages":[{"role":"user","content":"x"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil {
			t.Fatalf("call %d: the stream ended cleanly after %q; want it cut", i, got)
		}
		if !strings.Contains(string(got), "hi") {
			t.Fatalf("call %d: the event before the silence did not arrive: %q", i, got)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Fatalf("call %d took %v: not cut", i, took)
		}
	}
	if st, _ := r.Status("ep", "stalls"); st.Breaker != gobreaker.StateOpen || st.InFlight != 0 {
		t.Fatalf("after two stalled streams: breaker %v, in flight %d; want open, 0", st.Breaker, st.InFlight)
	}
}

// TestUpstreamIdleTimeoutSparesSlowReaders: the timer runs only while the
// proxy waits for the instance; a stream whose client pauses six idle
// timeouts long, with more unread than the socket buffers hold, is delivered
// whole.
func TestUpstreamIdleTimeoutSparesSlowReaders(t *testing.T) {
	const events = 16
	// 16 MiB, more than the socket buffers hold, so the writes block
	// while the client does not read; made before the answer starts.
	event := []byte("data: " + strings.Repeat("a", 1<<20) + "\n\n")
	b := newBackend(t, "fast")
	b.handler = func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for range events {
			_, _ = w.Write(event)
			http.NewResponseController(w).Flush()
		}
	}
	r, err := New(Options{DefaultEndpoint: "ep", Logger: slog.New(slog.DiscardHandler), UpstreamIdleTimeout: 250 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	r.Update(fleet.NewSnapshot([]fleet.Endpoint{{Name: "ep", Instances: []fleet.Instance{{ID: "fast", Addr: b.srv.URL}}}}, 0, 1, time.Now()))
	srv := httptest.NewServer(r)
	defer srv.Close()
	resp, err := srv.Client().Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"stream":true,"messages":[{"role":"user","content":"x"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	// A client that reads nothing for a while: the router's writes to it
	// block, so it stops reading from the instance, and nothing is cut.
	<-time.After(1500 * time.Millisecond)
	total, err := io.Copy(io.Discard, resp.Body)
	if err != nil {
		t.Fatalf("after %d bytes: %v", total, err)
	}
	if want := int64(events * (1<<20 + 8)); total != want {
		t.Fatalf("read %d bytes, want %d", total, want)
	}
}

// TestDialCheckRefusesConnections: Options.DialCheck judges the address of
// every connection the default transport opens, after name resolution
// (issue 19: a record's host name may lead back to the router, or to a
// metadata address, after the record was accepted). An instance whose name
// leads to a refused address gets no connection; its requests fail over
// as on a dial error.
func TestDialCheckRefusesConnections(t *testing.T) {
	refused, other := newBackend(t, "refused"), newBackend(t, "other")
	u, _ := url.Parse(refused.srv.URL)
	port := u.Port()
	r, err := New(Options{DefaultEndpoint: "ep", Logger: slog.New(slog.DiscardHandler), DialCheck: func(ap netip.AddrPort) error {
		if strconv.Itoa(int(ap.Port())) == port {
			return fmt.Errorf("%w: %s is refused", fleet.ErrUpstreamNotAllowed, ap)
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	r.Update(fleet.NewSnapshot([]fleet.Endpoint{{Name: "ep", Instances: []fleet.Instance{
		{ID: "refused", Addr: "http://localhost:" + port}, // a name: resolved when dialled
		{ID: "other", Addr: other.srv.URL},
	}}}, 0, 1, time.Now()))
	srv := httptest.NewServer(r)
	defer srv.Close()
	for i := range 20 {
		resp, err := srv.Client().Post(srv.URL+"/invocations", "application/json", strings.NewReader(fmt.Sprintf(`{"inputs":"request %d"}`, i)))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get(HeaderInstance) != "other" {
			t.Fatalf("request %d: %d from %q, want 200 from other", i, resp.StatusCode, resp.Header.Get(HeaderInstance))
		}
	}
	if n := refused.hits.Load(); n != 0 {
		t.Fatalf("the refused instance got %d requests", n)
	}
}
