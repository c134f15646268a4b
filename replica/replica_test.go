package replica

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/prefixrouter/prefixrouter/admin/adminpb"
	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/membership"
	"github.com/prefixrouter/prefixrouter/membership/etcdtest"
	"github.com/prefixrouter/prefixrouter/router"
)

func TestMain(m *testing.M) { testsupport.VerifyNoLeaks(m) }

var quiet = slog.New(slog.DiscardHandler)

// backends starts n loopback model servers answering 200.
func backends(t *testing.T, n int) []fleet.Instance {
	t.Helper()
	var out []fleet.Instance
	for i := range n {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"ok":true}`)
		}))
		t.Cleanup(srv.Close)
		out = append(out, fleet.Instance{ID: fmt.Sprintf("i-%d", i), Addr: srv.URL})
	}
	return out
}

// dialAdmin opens a gRPC client on the replica's admin address.
func dialAdmin(t *testing.T, r *Replica) (adminpb.AdminClient, *grpc.ClientConn) {
	t.Helper()
	conn, err := grpc.NewClient(r.AdminAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return adminpb.NewAdminClient(conn), conn
}

func TestAdminAPIWithEtcd(t *testing.T) {
	e := etcdtest.Start(t)
	cli := etcdtest.Client(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mopts := membership.Options{Logger: quiet}
	insts := backends(t, 3)
	for _, in := range insts {
		reg, err := membership.RegisterInstance(ctx, cli, "chat", in, mopts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { reg.Close(context.Background()) })
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	rep, err := Start(ctx, Options{
		ID: "r-1", Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", Router: router.Options{DefaultEndpoint: "chat"},
		Client: cli, Membership: mopts, Logger: quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := rep.Close(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	ac, _ := dialAdmin(t, rep)

	t.Run("GetFleet", func(t *testing.T) {
		// Registrations may reach the watcher after its first snapshot.
		var got []string
		testsupport.Eventually(t, 5*time.Second, "three instances in GetFleet", func() bool {
			resp, err := ac.GetFleet(ctx, &adminpb.GetFleetRequest{Endpoint: "chat"})
			if err != nil {
				t.Fatal(err)
			}
			got = got[:0]
			for _, in := range resp.GetEndpoints()[0].GetInstances() {
				got = append(got, in.GetId())
				if in.GetState() == nil || in.GetState().GetBreaker() != adminpb.BreakerState_BREAKER_STATE_CLOSED || in.GetState().GetExternalLoad() != -1 {
					t.Fatalf("instance %s state %v", in.GetId(), in.GetState())
				}
			}
			return len(got) == 3
		})
		if !slices.Equal(got, []string{"i-0", "i-1", "i-2"}) {
			t.Fatalf("instances %v", got)
		}
	})

	t.Run("ExplainRoute matches the data plane", func(t *testing.T) {
		tests := []struct {
			path, body string
			hdr        map[string]string
		}{
			{"/endpoints/chat/invocations", strings.Repeat("shared system prompt ", 100) + "q1", map[string]string{"X-Amzn-SageMaker-Prefix-Aware-Id": "tenant-a"}},
			{"/invocations", "another prompt", nil},
			{"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hello there"}]}`, nil},
		}
		seen := map[string]bool{}
		for i := range 40 {
			tests = append(tests, struct {
				path, body string
				hdr        map[string]string
			}{"/endpoints/chat/invocations", fmt.Sprintf("prompt %d", i), nil})
		}
		for _, tc := range tests {
			ex, err := ac.ExplainRoute(ctx, &adminpb.ExplainRouteRequest{
				Endpoint: "chat", Path: tc.path, Headers: tc.hdr,
				Payload: &adminpb.ExplainRouteRequest_BodyText{BodyText: tc.body},
			})
			if err != nil {
				t.Fatal(err)
			}
			if ex.GetInstance() == "" || len(ex.GetCandidates()) != 3 || ex.GetCandidates()[0] != ex.GetInstance() || ex.GetStrategy() != "PREFIX_AWARE" {
				t.Fatalf("explanation %v", ex)
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, rep.URL()+tc.path, strings.NewReader(tc.body))
			for k, v := range tc.hdr {
				req.Header.Set(k, v)
			}
			resp, err := (&http.Client{Transport: tr}).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || resp.Header.Get(router.HeaderInstance) != ex.GetInstance() {
				t.Fatalf("%s: status %d instance %q, ExplainRoute %q", tc.path, resp.StatusCode, resp.Header.Get(router.HeaderInstance), ex.GetInstance())
			}
			seen[ex.GetInstance()] = true
		}
		// Otherwise agreement could come from a one-instance ring.
		if len(seen) != 3 {
			t.Fatalf("43 keys reached only %v", seen)
		}
	})

	t.Run("ExplainRoute errors", func(t *testing.T) {
		for _, tc := range []struct {
			req  *adminpb.ExplainRouteRequest
			want codes.Code
		}{
			{&adminpb.ExplainRouteRequest{Endpoint: "nope"}, codes.NotFound},
			{&adminpb.ExplainRouteRequest{Endpoint: "chat", Path: "/v1/chat/completions", Payload: &adminpb.ExplainRouteRequest_BodyText{BodyText: "{"}}, codes.InvalidArgument},
			{&adminpb.ExplainRouteRequest{Endpoint: "chat", Headers: map[string]string{"X-Amzn-SageMaker-Prefix-Aware-Id": strings.Repeat("t", 65)}}, codes.InvalidArgument},
		} {
			if _, err := ac.ExplainRoute(ctx, tc.req); status.Code(err) != tc.want {
				t.Fatalf("%v: %v, want %v", tc.req, err, tc.want)
			}
		}
	})

	t.Run("SetRoutingConfig", func(t *testing.T) {
		strategy := func() fleet.Strategy {
			return rep.Router().Snapshot().Endpoint("chat").Config.WithDefaults().RoutingStrategy
		}
		for _, s := range []fleet.Strategy{fleet.Random, fleet.LeastOutstanding, fleet.PrefixAware} {
			resp, err := ac.SetRoutingConfig(ctx, &adminpb.SetRoutingConfigRequest{Endpoint: "chat", Strategy: string(s)})
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetConfig().GetStrategy() != string(s) {
				t.Fatalf("written %v", resp.GetConfig())
			}
			testsupport.Eventually(t, time.Second, "strategy "+string(s)+" in the replica's snapshot", func() bool { return strategy() == s })
			got, err := ac.GetRoutingConfig(ctx, &adminpb.GetRoutingConfigRequest{Endpoint: "chat"})
			if err != nil || !got.GetStored() || got.GetConfig().GetStrategy() != string(s) || got.GetApplied().GetStrategy() != string(s) {
				t.Fatalf("GetRoutingConfig %v %v", got, err)
			}
		}
		for _, bad := range []*adminpb.SetRoutingConfigRequest{
			{Endpoint: "chat", Strategy: "ROUND_ROBIN"},
			{Endpoint: "chat", PrefixLength: 100},
		} {
			if _, err := ac.SetRoutingConfig(ctx, bad); status.Code(err) != codes.InvalidArgument {
				t.Fatalf("%v: %v, want InvalidArgument", bad, err)
			}
		}
		if s := strategy(); s != fleet.PrefixAware {
			t.Fatalf("strategy %s after rejected writes", s)
		}
	})

	t.Run("metrics over HTTP/1 on the same port", func(t *testing.T) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+rep.AdminAddr()+"/metrics", nil)
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		want := `grpc_server_handled_total{grpc_code="OK",grpc_method="SetRoutingConfig",grpc_service="prefixrouter.admin.v1.Admin",grpc_type="unary"} 3`
		if resp.StatusCode != http.StatusOK || resp.ProtoMajor != 1 || !strings.Contains(string(b), want) || !strings.Contains(string(b), "prefixrouter_") {
			t.Fatalf("status %d proto %s, want %q in:\n%.2000s", resp.StatusCode, resp.Proto, want, b)
		}
	})
}

// TestStaticFleetAdmin also checks that Close ends a health Watch stream
// promptly and leaves no goroutine behind.
func TestStaticFleetAdmin(t *testing.T) {
	insts := backends(t, 2)
	tr := &http.Transport{}
	ignore := goleak.IgnoreCurrent()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := Start(ctx, Options{
		Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", Router: router.Options{DefaultEndpoint: "chat"},
		Static: insts, Logger: quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	ac, conn := dialAdmin(t, rep)

	if _, err := ac.SetRoutingConfig(ctx, &adminpb.SetRoutingConfigRequest{Endpoint: "chat", Strategy: "RANDOM"}); status.Code(err) != codes.Unavailable {
		t.Fatalf("SetRoutingConfig on a static fleet: %v, want Unavailable", err)
	}
	got, err := ac.GetRoutingConfig(ctx, &adminpb.GetRoutingConfigRequest{Endpoint: "chat"})
	if err != nil || got.GetStored() || got.GetConfig().GetStrategy() != "PREFIX_AWARE" {
		t.Fatalf("GetRoutingConfig %v %v", got, err)
	}
	fl, err := ac.GetFleet(ctx, &adminpb.GetFleetRequest{})
	if err != nil || len(fl.GetEndpoints()) != 1 || len(fl.GetEndpoints()[0].GetInstances()) != 2 {
		t.Fatalf("GetFleet %v %v", fl, err)
	}
	ex, err := ac.ExplainRoute(ctx, &adminpb.ExplainRouteRequest{Endpoint: "chat", Payload: &adminpb.ExplainRouteRequest_Body{Body: []byte("x")}})
	if err != nil || ex.GetInstanceAddr() == "" || len(ex.GetCandidates()) != 2 {
		t.Fatalf("ExplainRoute %v %v", ex, err)
	}
	resp, err := (&http.Client{Transport: tr}).Get("http://" + rep.AdminAddr() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(string(b), "ok static fleet") {
		t.Fatalf("/readyz %d %q", resp.StatusCode, b)
	}

	hc := healthpb.NewHealthClient(conn)
	watch, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if m, err := watch.Recv(); err != nil || m.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("first watch status %v %v", m, err)
	}
	start := time.Now()
	closeCtx, closeCancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer closeCancel()
	if err := rep.Close(closeCtx); err != nil {
		t.Fatal(err)
	}
	// A Watch that held Shutdown would make Close last the whole 20 s.
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Close took %v with a health Watch open", d)
	}
	if m, err := watch.Recv(); err != nil || m.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("watch after Close: %v %v, want NOT_SERVING", m, err)
	}
	if _, err := watch.Recv(); err == nil {
		t.Fatal("watch stream still open after Close")
	}
	conn.Close()
	tr.CloseIdleConnections()
	goleak.VerifyNone(t, ignore)
}

// TestUpstreamHeaderTimeout: an instance that accepts a request and never
// answers is given up on after the header timeout; the client gets an error
// answer, not a hang, and the failure counts against the instance.
func TestUpstreamHeaderTimeout(t *testing.T) {
	release := make(chan struct{})
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer hung.Close()
	defer close(release)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := Start(ctx, Options{
		Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", Logger: quiet,
		Router: router.Options{DefaultEndpoint: "chat", UpstreamHeaderTimeout: 200 * time.Millisecond},
		Static: []fleet.Instance{{ID: "hung", Addr: hung.URL}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer rep.Close(context.Background())
	start := time.Now()
	resp, err := http.Post(rep.URL()+"/invocations", "application/json", strings.NewReader(`{"inputs":"hello"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusFailedDependency || time.Since(start) > 10*time.Second {
		t.Fatalf("status %d after %v; want 424 soon after the 200 ms timeout", resp.StatusCode, time.Since(start))
	}
	st, ok := rep.Router().Status("chat", "hung")
	if !ok || st.InFlight != 0 {
		t.Fatalf("instance state %+v %v: the slot must be released", st, ok)
	}
	if _, err := Start(ctx, Options{Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0",
		Router: router.Options{DefaultEndpoint: "chat", UpstreamHeaderTimeout: -time.Second},
		Static: []fleet.Instance{{ID: "a", Addr: hung.URL}}}); err == nil {
		t.Fatal("a negative timeout must be refused")
	}
}
