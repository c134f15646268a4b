package router

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/overload"
)

// TestHeaderHygiene covers issue 12 finding 9 over real HTTP: forwarded
// headers appended, forged router headers stripped, instance ids hidden on
// request, no internal address in error bodies.
func TestHeaderHygiene(t *testing.T) {
	t.Run("forwarded headers appended", func(t *testing.T) {
		b := newBackend(t, "i-a")
		var got http.Header
		var mu sync.Mutex
		b.handler = func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			got = r.Header.Clone()
			mu.Unlock()
		}
		h := newHarness(t, hopts{}, b)
		h.mustDo("/invocations", "x", map[string]string{"X-Forwarded-For": "203.0.113.9"})
		mu.Lock()
		defer mu.Unlock()
		if xff := got.Get("X-Forwarded-For"); xff != "203.0.113.9, 127.0.0.1" {
			t.Errorf("X-Forwarded-For upstream = %q, want the client appended", xff)
		}
		if p := got.Get("X-Forwarded-Proto"); p != "http" {
			t.Errorf("X-Forwarded-Proto = %q", p)
		}
	})
	t.Run("upstream router headers stripped", func(t *testing.T) {
		b := newBackend(t, "i-a")
		b.handler = func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set(HeaderInstance, "forged")
			w.Header().Set("X-Prefixrouter-Error", "forged")
			w.Header().Set("X-Prefixrouter-Anything", "forged")
			w.Header().Set("X-Model-Header", "kept")
		}
		h := newHarness(t, hopts{}, b)
		res := h.mustDo("/invocations", "x", nil)
		if res.instance != "i-a" || res.header.Get("X-Prefixrouter-Error") != "" || res.header.Get("X-Prefixrouter-Anything") != "" {
			t.Errorf("forged headers reached the client: %v", res.header)
		}
		if res.header.Get("X-Model-Header") != "kept" {
			t.Error("an ordinary upstream header was dropped")
		}
	})
	t.Run("instance ids hidden", func(t *testing.T) {
		b := newBackend(t, "i-secret")
		b.handler = func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/invocations" && r.Header.Get("X-Fail") != "" {
				w.WriteHeader(500)
				io.WriteString(w, "boom")
			}
		}
		h := newHarness(t, hopts{hide: true}, b)
		for _, hdr := range []map[string]string{nil, {"X-Fail": "1"}} {
			res := h.mustDo("/invocations", "x", hdr)
			if res.instance != "" || strings.Contains(string(res.body), "i-secret") {
				t.Errorf("instance id shown: header %q, body %s", res.instance, res.body)
			}
		}
	})
	t.Run("no internal address in error bodies", func(t *testing.T) {
		dead := deadAddr(t)
		h := newHarness(t, hopts{})
		h.ep.Instances = []fleet.Instance{{ID: "gone", Addr: "http://" + dead}}
		h.update()
		_, port, _ := net.SplitHostPort(dead)
		for _, path := range []string{"/invocations", "/v1/completions", "/endpoints/ep/invocations-response-stream"} {
			res := h.mustDo(path, `{"prompt":"x"}`, nil)
			if res.status < 400 || strings.Contains(string(res.body), dead) || strings.Contains(string(res.body), port) {
				t.Errorf("%s: %d %s", path, res.status, res.body)
			}
		}
	})
}

// TestIdempotencyKeyResentAtMostOnce: Go's Transport replays a POST that
// carries an Idempotency-Key whenever a reused connection breaks after the
// request was written, as often as that happens. The router re-sends only
// what a reused connection lost before any answer byte (issue 20: the
// instance closed it as it was reused, the race llama-server's close after
// every stream loses), once, and never a request whose fresh connection
// broke. The upstream answers the first request it ever gets and, for
// every later one, reads it and hangs up: the second request goes out on
// the reused connection, is lost, goes once more on a fresh one, is lost
// again, and fails.
func TestIdempotencyKeyResentAtMostOnce(t *testing.T) {
	var received atomic.Int64
	instance := testsupport.ServeEachConn(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, req.Body)
			if received.Add(1) > 1 {
				return // read it, then hang up
			}
			fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	h := newHarness(t, hopts{})
	h.ep.Instances = []fleet.Instance{{ID: "i", Addr: "http://" + instance}}
	h.update()
	key := map[string]string{"Idempotency-Key": "k-1"}
	if res := h.mustDo("/invocations", "x", key); res.status != 200 {
		t.Fatalf("first: %d", res.status)
	}
	res, err := h.do(context.Background(), "/invocations", "y", key)
	if err != nil {
		t.Fatal(err)
	}
	if res.status == 200 {
		t.Fatalf("second request answered 200 (upstream saw %d requests)", received.Load())
	}
	if n := received.Load(); n != 3 {
		t.Fatalf("upstream received %d requests, want 3: the first, the second, and one re-send of it on a fresh connection", n)
	}
}

// TestUpstreamFailuresWarnRateLimited: upstream failures are logged at warn
// (they were debug only), at most a few lines however many fail.
func TestUpstreamFailuresWarnRateLimited(t *testing.T) {
	var buf testsupport.LogBuffer
	r, err := New(Options{DefaultEndpoint: "ep", Logger: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	r.Update(fleet.NewSnapshot([]fleet.Endpoint{{Name: "ep", Instances: []fleet.Instance{{ID: "gone", Addr: "http://" + deadAddr(t)}}}}, 0, 1, time.Now()))
	srv := httptest.NewServer(r)
	defer srv.Close()
	for range 50 {
		resp, err := srv.Client().Post(srv.URL+"/invocations", "application/json", strings.NewReader("x"))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	lines := strings.Count(buf.String(), "router: upstream failed")
	if lines < 1 || lines > 6 || !strings.Contains(buf.String(), "level=WARN") || !strings.Contains(buf.String(), "instance=gone") {
		t.Fatalf("%d warn lines for 50 failures:\n%s", lines, buf.String())
	}
}

// TestFirstByteTimeoutTripsBreaker: an instance that answers its health
// check but hangs on streamed generations (before its headers, or after them
// with no body) has its calls cut after FirstByteTimeout, and the failures
// open its breaker; its slot is released each time. (Non-streamed
// generations are not cut: TestFirstByteTimeoutCutsStreamsOnly.)
func TestFirstByteTimeoutTripsBreaker(t *testing.T) {
	for _, afterHeaders := range []bool{false, true} {
		t.Run(fmt.Sprintf("after headers %v", afterHeaders), func(t *testing.T) {
			b := newBackend(t, "hung")
			b.handler = func(w http.ResponseWriter, r *http.Request) {
				// Read the body, so that the server notices the router
				// hanging up.
				_, _ = io.Copy(io.Discard, r.Body)
				if afterHeaders {
					w.Header().Set("Content-Type", "text/event-stream")
					w.WriteHeader(200)
					http.NewResponseController(w).Flush()
				}
				<-r.Context().Done()
			}
			h := newHarness(t, hopts{first: 100 * time.Millisecond, breaker: overload.BreakerOptions{ConsecutiveFailures: 2, OpenTimeout: time.Hour, MaxEjectionPercent: 100}}, b)
			r, srv := h.r, h.srv
			for i := range 2 {
				start := time.Now()
				resp, err := srv.Client().Post(srv.URL+"/endpoints/ep/invocations-response-stream", "application/json", strings.NewReader("x"))
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if !afterHeaders && resp.StatusCode < 500 && resp.StatusCode != http.StatusFailedDependency {
						t.Fatalf("call %d: status %d", i, resp.StatusCode)
					}
				}
				if took := time.Since(start); took > 5*time.Second {
					t.Fatalf("call %d took %v: not cut", i, took)
				}
			}
			st, _ := r.Status("ep", "hung")
			if st.Breaker != gobreaker.StateOpen || st.InFlight != 0 {
				t.Fatalf("after two cut calls: breaker %v, in flight %d; want open, 0", st.Breaker, st.InFlight)
			}
		})
	}
}

// TestFirstByteTimeoutPerEndpoint: each endpoint's routing config sets its
// own first-byte timeout, Options.FirstByteTimeout being the default of
// the others, and a new snapshot changes it for the next request.
func TestFirstByteTimeoutPerEndpoint(t *testing.T) {
	b := newBackend(t, "hung")
	b.handler = func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		<-r.Context().Done()
	}
	r, err := New(Options{DefaultEndpoint: "cut", Logger: slog.New(slog.DiscardHandler), FirstByteTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	snap := func(waitMS int) *fleet.Snapshot {
		ins := []fleet.Instance{{ID: "hung", Addr: b.srv.URL}}
		return fleet.NewSnapshot([]fleet.Endpoint{
			{Name: "cut", Config: fleet.RoutingConfig{FirstByteTimeoutInMilliseconds: 50}, Instances: ins},
			{Name: "wait", Config: fleet.RoutingConfig{FirstByteTimeoutInMilliseconds: waitMS}, Instances: ins},
		}, 0, 1, time.Now())
	}
	srv := httptest.NewServer(r)
	defer srv.Close()
	// cut reports whether the router cut the call (its 424) before the
	// client's own 500 ms deadline.
	cut := func(ep string) bool {
		ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/endpoints/"+ep+"/invocations-response-stream", strings.NewReader("x"))
		resp, err := srv.Client().Do(req)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusFailedDependency
	}
	r.Update(snap(0)) // "wait" has no limit of its own: the hour applies
	if !cut("cut") {
		t.Fatal("the endpoint with 50 ms was not cut")
	}
	if cut("wait") {
		t.Fatal("the endpoint without a limit of its own was cut")
	}
	r.Update(snap(50))
	if !cut("wait") {
		t.Fatal("after the new snapshot, the endpoint's 50 ms did not apply")
	}
}

// TestFirstByteTimeoutStartsAtBodyEnd (issue 9): a streamed body's client
// may take longer than FirstByteTimeout to send it; the clock starts when
// the instance has the whole body, so the call is not cut while the client
// sends, and is cut when the instance then sends nothing.
func TestFirstByteTimeoutStartsAtBodyEnd(t *testing.T) {
	const timeout, pieces, gap = 150 * time.Millisecond, 5, 60 * time.Millisecond
	body := invokeBody(256 << 10)
	for _, hang := range []bool{false, true} {
		t.Run(fmt.Sprintf("hang %v", hang), func(t *testing.T) {
			b := newBackend(t, "slow-client")
			b.handler = func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				if hang {
					<-r.Context().Done()
					return
				}
				fmt.Fprint(w, `{"ok":true}`)
			}
			r, err := New(Options{DefaultEndpoint: "ep", Logger: slog.New(slog.DiscardHandler), FirstByteTimeout: timeout})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			r.Update(fleet.NewSnapshot([]fleet.Endpoint{{Name: "ep", Instances: []fleet.Instance{{ID: "slow-client", Addr: b.srv.URL}}}}, 0, 1, time.Now()))
			srv := httptest.NewServer(r)
			defer srv.Close()
			pr, pw := io.Pipe()
			go func() {
				// The client sends its body over pieces*gap, twice the
				// timeout.
				n := len(body) / pieces
				for i := range pieces {
					if i > 0 {
						time.Sleep(gap)
					}
					end := (i + 1) * n
					if i == pieces-1 {
						end = len(body)
					}
					if _, err := pw.Write(body[i*n : end]); err != nil {
						return
					}
				}
				pw.Close()
			}()
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/endpoints/ep/invocations-response-stream", pr)
			req.ContentLength = int64(len(body))
			start := time.Now()
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			took := time.Since(start)
			want := http.StatusOK
			if hang {
				want = http.StatusFailedDependency
			}
			if resp.StatusCode != want {
				t.Fatalf("status %d after %v, want %d", resp.StatusCode, took, want)
			}
			if hang && took < (pieces-1)*gap+timeout {
				t.Fatalf("cut after %v: before the body's end plus the timeout", took)
			}
		})
	}
}
