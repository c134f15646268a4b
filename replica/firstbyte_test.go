package replica_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/localfleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/membership"
	"github.com/prefixrouter/prefixrouter/overload"
	"github.com/prefixrouter/prefixrouter/replica"
	"github.com/prefixrouter/prefixrouter/router"
)

// TestFirstByteTimeoutPerEndpointFromEtcd: the first-byte timeout is an
// endpoint's routing setting, changed through etcd without a restart. A
// replica whose own default (--upstream-first-byte-timeout) is an hour
// lets a hung instance hang; once the endpoint's config sets 50 ms, the
// same replica cuts its streamed calls and the instance's breaker opens. An invalid
// value written behind the CLI's back is ignored and counted, and the last
// valid config stays.
func TestFirstByteTimeoutPerEndpointFromEtcd(t *testing.T) {
	ctx := testsupport.Context(t, 30*time.Second)
	f, err := localfleet.Start(ctx, localfleet.Options{Endpoint: "chat", FastEtcd: true, Replica: replica.Options{Router: router.Options{
		FirstByteTimeout: time.Hour,
		// One instance: its breaker opens only without the ejection cap.
		Breaker: overload.BreakerOptions{ConsecutiveFailures: 2, OpenTimeout: time.Hour, MaxEjectionPercent: 100},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	// The instance answers its health check but its generations hang
	// until the router hangs up.
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		<-r.Context().Done()
	}))
	t.Cleanup(hung.Close)
	if _, err := f.Register(ctx, fleet.Instance{ID: "hung", Addr: hung.URL}, 0); err != nil {
		t.Fatal(err)
	}
	rep, err := f.AddReplica(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.WaitFor(ctx, f.HasInstances("hung")); err != nil {
		t.Fatal(err)
	}
	breaker := func() (gobreaker.State, int64) {
		st, ok := rep.Router().Status("chat", "hung")
		if !ok {
			t.Fatal("no status for the hung instance")
		}
		return st.Breaker, st.InFlight
	}
	call := func(clientWait time.Duration) (status int, err error) {
		cctx, cancel := context.WithTimeout(ctx, clientWait)
		defer cancel()
		req, _ := http.NewRequestWithContext(cctx, http.MethodPost, rep.URL()+"/endpoints/chat/invocations-response-stream", strings.NewReader("x"))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil
	}

	// The replica's default (an hour) applies: the router does not cut
	// the call; the client's own 100 ms deadline ends it, and a client
	// that leaves is not the instance's fault.
	if _, err := call(100 * time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("with the replica's hour-long default: %v, want the client's own deadline", err)
	}
	if b, _ := breaker(); b != gobreaker.StateClosed {
		t.Fatalf("breaker %v after a call the client gave up on, want closed", b)
	}

	// An invalid value in etcd is ignored and counted; the config stays.
	if _, err := f.Client().Put(ctx, membership.Layout{}.ConfigKey("chat"), `{"RoutingStrategy":"PREFIX_AWARE","FirstByteTimeoutInMilliseconds":-5}`); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, 10*time.Second, "invalid config counted", func() bool {
		return testsupport.Sum(t, rep.Registry(), "prefixrouter_membership_invalid_records_total", map[string]string{"kind": "config"}) == 1
	})
	if d := rep.Router().Snapshot().Endpoint("chat").Resolved.FirstByteTimeout; d != 0 {
		t.Fatalf("after an invalid config the endpoint's first-byte timeout is %v, want unset", d)
	}

	// Now through the config: 50 ms, applied live.
	if err := f.SetRouting(ctx, fleet.RoutingConfig{RoutingStrategy: fleet.PrefixAware, FirstByteTimeoutInMilliseconds: 50}); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		start := time.Now()
		status, err := call(10 * time.Second)
		if err != nil || (status < 500 && status != http.StatusFailedDependency) {
			t.Fatalf("call %d under the 50 ms limit: status %d, %v; want the router's upstream failure (424 on invoke paths)", i, status, err)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Fatalf("call %d took %v: not cut by the endpoint's limit", i, took)
		}
	}
	if b, inFlight := breaker(); b != gobreaker.StateOpen || inFlight != 0 {
		t.Fatalf("after two cut calls: breaker %v, in flight %d; want open, 0", b, inFlight)
	}
}
